"""One conformance suite for every store backend: SQLite always, PostgreSQL when configured.

PostgreSQL runs when ``DDLSIM_TEST_POSTGRES_URL`` is set (``eval "$(bash scripts/postgres.sh)"``
as root sets it); each test gets a fresh schema. Without it the PostgreSQL cases skip, except
under ``CI=true``, where they fail: CI must test both backends.
"""

import dataclasses
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, func, inspect, select, text
from sqlalchemy.orm import Session

from ddlsim.data.errors import DdlsimError, InvalidOptionError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.strategy import ParallelPlan, Strategy, TensorFusionPlan
from ddlsim.data.store import (
    CollectiveProfileRecord,
    KernelProfileRecord,
    MeasurementRecord,
    PredictionRecord,
    Store,
    StoreError,
    add_collective_profile,
    add_graph,
    add_kernel_profile,
    default_url,
    strategy_hash,
)
from ddlsim.data.store.schema import TABLE_PREFIX, VERSION_TABLE, Base, GraphRow
from tests.data.records import collective_profile, kernel_profile, measurement

ROOT = Path(__file__).resolve().parents[2]
URL_FORMS = '"sqlite:///PATH" or "postgresql+psycopg://USER:PASS@HOST/DB"'


# ----- records -----------------------------------------------------------------------------------


Result = TypeVar(
    "Result", KernelProfileRecord, CollectiveProfileRecord, MeasurementRecord, PredictionRecord
)


def _without_store_fields(record: Result) -> Result:
    """The record as it was given: without the id and time the store filled in."""
    return dataclasses.replace(record, id=None, created_at=None)


def _other_graph(graph: IterationGraph) -> IterationGraph:
    return dataclasses.replace(graph, optimizer="adam")


# ----- migrations --------------------------------------------------------------------------------


def test_migrations_create_prefixed_tables_and_version_table(store: Store) -> None:
    tables = set(inspect(store.engine).get_table_names())
    assert tables == set(Base.metadata.tables) | {VERSION_TABLE}
    assert all(name.startswith(TABLE_PREFIX) for name in tables)
    with store.engine.connect() as connection:
        versions = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    assert [row[0] for row in versions] == ["0006"]


def test_migration_matches_the_models(store: Store) -> None:
    with store.engine.connect() as connection:
        context = MigrationContext.configure(
            connection,
            opts={
                "compare_type": True,
                "version_table": VERSION_TABLE,
                "include_name": lambda name, kind, parents: (
                    kind != "table" or (name or "").startswith(TABLE_PREFIX)
                ),
            },
        )
        assert compare_metadata(context, Base.metadata) == []


def test_reopening_is_idempotent(store_url: str, tiny_graph: IterationGraph) -> None:
    with Store.open(store_url) as first:
        graph_hash = first.save_graph(graph=tiny_graph)
    with Store.open(store_url) as second:
        assert second.load_graph(graph_hash=graph_hash) == tiny_graph
        with second.engine.connect() as connection:
            count = connection.execute(text(f"SELECT count(*) FROM {VERSION_TABLE}")).scalar()
    assert count == 1


def test_leaves_other_tables_alone(store_url: str) -> None:
    """Optuna keeps its own ``alembic_version`` and tables in the same database."""
    engine = create_engine(store_url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32))"))
        connection.execute(text("INSERT INTO alembic_version VALUES ('v3.0.0.d')"))
        connection.execute(text("CREATE TABLE studies (study_id INTEGER PRIMARY KEY)"))
    with Store.open(store_url) as opened:
        opened.start_job(key="k", kind="test", spec={})
    with engine.connect() as connection:
        assert connection.execute(text("SELECT version_num FROM alembic_version")).all() == [
            ("v3.0.0.d",)
        ]
    tables = set(inspect(engine).get_table_names())
    engine.dispose()
    assert {"alembic_version", "studies", VERSION_TABLE} <= tables


def test_a_schema_newer_than_the_code_is_refused(store_url: str) -> None:
    with Store.open(store_url) as opened, opened.engine.begin() as connection:
        connection.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '0099'"))
    with pytest.raises(StoreError, match="'0099'; a newer ddlsim migrated it"):
        Store.open(store_url)


def test_concurrent_opens_migrate_once(store_url: str) -> None:
    def open_and_count(_: int) -> int:
        with Store.open(store_url) as opened:
            return len(opened.jobs())

    with ThreadPoolExecutor(max_workers=3) as pool:
        assert list(pool.map(open_and_count, range(3))) == [0, 0, 0]


# ----- graphs and strategies ---------------------------------------------------------------------


def test_graph_round_trip_is_lossless_and_idempotent(
    store: Store, zoo_graph: Callable[[str], IterationGraph]
) -> None:
    graph = zoo_graph("mlp")
    graph_hash = store.save_graph(graph=graph)
    assert graph_hash == graph.graph_hash
    loaded = store.load_graph(graph_hash=graph_hash)
    assert loaded.graph_hash == graph.graph_hash
    assert loaded.to_json() == graph.to_json()
    assert store.save_graph(graph=graph) == graph_hash
    with store.transaction() as session:
        assert session.scalar(select(func.count()).select_from(GraphRow)) == 1
        row = session.get(GraphRow, graph_hash)
        assert row is not None
        assert len(row.graph_json_gz) < len(graph.to_json()) / 3
        assert row.summary == graph.summary()


def test_missing_graph_is_a_lookup_error_naming_the_hash(store: Store) -> None:
    with pytest.raises(StoreError, match="graph f00d is not in the store") as caught:
        store.load_graph(graph_hash="f00d")
    assert isinstance(caught.value, LookupError)
    assert isinstance(caught.value, DdlsimError)


def test_strategy_is_stored_once_under_its_hash(store: Store) -> None:
    strategy = Strategy(
        parallel=ParallelPlan(dp=2), tensor_fusion=TensorFusionPlan(bucket_cap_mb=4.0)
    )
    key = store.save_strategy(strategy=strategy)
    assert (
        key == hashlib.sha256(strategy.to_json().encode()).hexdigest() == strategy_hash(strategy)
    )
    assert store.save_strategy(strategy=strategy) == key
    assert store.load_strategy(strategy_hash=key) == strategy
    with pytest.raises(StoreError, match="strategy beef is not in the store"):
        store.load_strategy(strategy_hash="beef")


# ----- profiles, measurements, predictions -------------------------------------------------------


def test_kernel_profiles_round_trip_and_filter_by_graph(
    store: Store, tiny_graph: IterationGraph
) -> None:
    other = _other_graph(tiny_graph)
    store.save_graph(graph=tiny_graph)
    store.save_graph(graph=other)
    mine = kernel_profile(tiny_graph.graph_hash, trace_path="/tmp/trace.json")
    theirs = kernel_profile(other.graph_hash, node_ms={1: 0.5})
    mine_id = store.save_kernel_profile(profile=mine)
    store.save_kernel_profile(profile=theirs)

    loaded = store.kernel_profiles(graph_hash=tiny_graph.graph_hash)
    assert [p.id for p in loaded] == [mine_id]
    assert _without_store_fields(loaded[0]) == mine
    assert loaded[0].node_ms == {0: 1.25, 3: 0.75}
    created = loaded[0].created_at
    assert created is not None and created.tzinfo is not None
    assert created.utcoffset() == UTC.utcoffset(None)
    assert [p.graph_hash for p in store.kernel_profiles()] == [
        tiny_graph.graph_hash,
        other.graph_hash,
    ]


def test_kernel_profile_of_an_unknown_graph_is_refused(store: Store) -> None:
    with pytest.raises(StoreError, match="graph cafe is not in the store"):
        store.save_kernel_profile(profile=kernel_profile("cafe"))
    assert store.kernel_profiles() == []


def test_collective_profiles_round_trip_and_filter(store: Store) -> None:
    given = [
        collective_profile(),
        collective_profile(world_size=2, rank_cores={0: [0], 1: [1]}),
        collective_profile(bandwidth="none", network="loopback"),
        collective_profile(collective="all_gather", backend="nccl"),
    ]
    for profile in given:
        store.save_collective_profile(profile=profile)

    assert [_without_store_fields(p) for p in store.collective_profiles()] == given
    assert len(store.collective_profiles(collective="all_reduce")) == 3
    assert len(store.collective_profiles(backend="nccl")) == 1
    only = store.collective_profiles(collective="all_reduce", world_size=4, bandwidth="1gbit")
    assert [_without_store_fields(p) for p in only] == [given[0]]
    assert only[0].rank_cores == {0: [0], 1: [1], 2: [0], 3: [1]}
    assert store.collective_profiles(world_size=2)[0].rank_cores == {0: [0], 1: [1]}
    assert store.collective_profiles(backend="mpi") == []


def test_measurements_and_predictions_round_trip(store: Store, tiny_graph: IterationGraph) -> None:
    graph_hash = store.save_graph(graph=tiny_graph)
    key = store.save_strategy(strategy=Strategy())
    run = measurement(graph_hash, key)
    prediction = PredictionRecord(
        model="MLP",
        graph_hash=graph_hash,
        strategy_hash=key,
        cluster={"world_size": 2, "backend": "gloo"},
        iteration_time_ms=305.0,
        breakdown={"compute": 100.0, "comm": 205.0},
        simulator_version="0.1.0",
    )
    measurement_id = store.save_measurement(measurement=run)
    prediction_id = store.save_prediction(prediction=prediction)

    (loaded_measurement,) = store.measurements(graph_hash=graph_hash, strategy_hash=key)
    assert loaded_measurement.id == measurement_id
    assert _without_store_fields(loaded_measurement) == run
    (loaded_prediction,) = store.predictions(strategy_hash=key)
    assert loaded_prediction.id == prediction_id
    assert _without_store_fields(loaded_prediction) == prediction

    unknown = dataclasses.replace(run, strategy_hash="abc")
    with pytest.raises(StoreError, match="strategy abc is not in the store"):
        store.save_measurement(measurement=unknown)


def test_given_times_are_kept_and_naive_ones_refused(store: Store) -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    store.save_collective_profile(profile=collective_profile(created_at=when))
    assert store.collective_profiles()[0].created_at == when
    with pytest.raises(InvalidOptionError, match="must be timezone-aware"):
        collective_profile(created_at=datetime(2026, 1, 2))


# ----- jobs --------------------------------------------------------------------------------------


def test_job_lifecycle_commits_results_with_the_job(
    store: Store, tiny_graph: IterationGraph
) -> None:
    assert store.job_status(key="kernels/mlp") is None
    store.start_job(key="kernels/mlp", kind="kernels", spec={"model": "mlp", "iters": 5})
    assert store.job_status(key="kernels/mlp") == "running"

    def results(session: Session) -> None:
        graph_hash = add_graph(session, graph=tiny_graph)
        add_kernel_profile(session, profile=kernel_profile(graph_hash))
        add_collective_profile(session, profile=collective_profile())

    store.finish_job(key="kernels/mlp", results=results)
    assert store.job_status(key="kernels/mlp") == "done"
    assert store.load_graph(graph_hash=tiny_graph.graph_hash) == tiny_graph
    assert len(store.kernel_profiles(graph_hash=tiny_graph.graph_hash)) == 1
    assert len(store.collective_profiles()) == 1
    (job,) = store.jobs()
    assert (job.key, job.kind, job.status, job.error) == ("kernels/mlp", "kernels", "done", None)
    assert job.spec == {"model": "mlp", "iters": 5}
    assert job.finished_at is not None and job.finished_at >= job.created_at


def test_failing_results_leave_no_rows_and_the_job_running(
    store: Store, tiny_graph: IterationGraph
) -> None:
    store.start_job(key="batch/1", kind="kernels", spec={})

    def results(session: Session) -> None:
        graph_hash = add_graph(session, graph=tiny_graph)
        add_kernel_profile(session, profile=kernel_profile(graph_hash))
        add_collective_profile(session, profile=collective_profile())
        raise RuntimeError("profiler crashed")

    with pytest.raises(RuntimeError, match="profiler crashed"):
        store.finish_job(key="batch/1", results=results)
    assert store.job_status(key="batch/1") == "running"
    assert store.kernel_profiles() == []
    assert store.collective_profiles() == []
    with pytest.raises(StoreError):
        store.load_graph(graph_hash=tiny_graph.graph_hash)


def test_fail_job_records_the_error_and_a_restart_clears_it(store: Store) -> None:
    store.start_job(key="run/4", kind="run", spec={"world_size": 4})
    store.fail_job(key="run/4", error="rank 2 exited with status 1")
    (job,) = store.jobs()
    assert job.status == "failed"
    assert job.error == "rank 2 exited with status 1"
    assert job.finished_at is not None

    store.start_job(key="run/4", kind="run", spec={"world_size": 4, "retry": 1})
    (job,) = store.jobs()
    assert (job.status, job.error, job.finished_at) == ("running", None, None)
    assert job.spec == {"world_size": 4, "retry": 1}


def test_unknown_jobs_cannot_finish_or_fail(store: Store) -> None:
    with pytest.raises(StoreError, match="job 'nope' was never started"):
        store.finish_job(key="nope")
    with pytest.raises(StoreError, match="job 'nope' was never started"):
        store.fail_job(key="nope", error="x")


_CRASHING_CHILD = textwrap.dedent(
    """
    import sys
    import time

    from ddlsim.data.store import CollectiveProfileRecord, Store, add_collective_profile

    PROFILE = CollectiveProfileRecord(
        collective="all_reduce", backend="gloo", world_size=2, bandwidth="none",
        network="loopback", alpha_us=1.0, busbw_gbps=1.0, r2=1.0, samples=[],
        rank_cores={0: [0], 1: [1]}, env={},
    )

    def results(session):
        add_collective_profile(session, profile=PROFILE)
        print("written", flush=True)
        time.sleep(120)

    store = Store.open(sys.argv[1])
    store.start_job(key="crash", kind="test", spec={})
    store.finish_job(key="crash", results=results)
    """
)


def test_a_crash_inside_finish_job_loses_the_results_but_not_the_store(store_url: str) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_CHILD, store_url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "written"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL

    with Store.open(store_url) as reopened:
        assert reopened.job_status(key="crash") == "running"
        assert reopened.collective_profiles() == []
        reopened.finish_job(key="crash")
        assert reopened.job_status(key="crash") == "done"


# ----- URLs --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "mysql://ddlsim:s3cret@localhost/ddlsim",
        "postgresql+psycopg2://ddlsim:s3cret@localhost/ddlsim",
        "postgresql+psycopg://ddlsim:s3cret@127.0.0.1:1/ddlsim",
        "not a url with s3cret",
        "sqlite:////proc/ddlsim-denied/s3cret.db",
    ],
)
def test_bad_urls_give_one_line_without_the_password(url: str) -> None:
    with pytest.raises(StoreError) as caught:
        Store.open(url)
    message = str(caught.value)
    assert "\n" not in message
    assert "s3cret@" not in message
    assert message.startswith("cannot open store ")
    assert message.endswith(f"allowed: {URL_FORMS}")
    if "@" in url:
        assert "ddlsim:***@" in message


def test_default_url_honours_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DDLSIM_DB", "postgresql+psycopg://u:p@db/ddlsim")
    assert default_url() == "postgresql+psycopg://u:p@db/ddlsim"

    monkeypatch.delenv("DDLSIM_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    expected = tmp_path / "xdg" / "ddlsim" / "ddlsim.db"
    assert default_url() == f"sqlite:///{expected}"
    with Store.open() as opened:
        assert opened.url == f"sqlite:///{expected}"
    assert expected.is_file()
