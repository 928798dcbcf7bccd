"""``ddlsim search``: finds a strategy no slower than DDP's defaults, keeps to its budget,
verifies with the executor, and refuses bad input in one line."""

import json
import os
import shutil
from pathlib import Path

import optuna
import pytest
from filelock import FileLock
from optuna.storages.journal import JournalFileBackend, JournalStorage

from ddlsim.data.specs.strategy import Strategy
from ddlsim.service.cli import main
from ddlsim.service.output import describe

BASE = ["search", "mlp", "--world-size", "2", "--bandwidth", "1gbit", "--batch-size", "16"]
BASE += ["--profile-iters", "2", "--simulator", "replay"]
# --verify at the protocol's minimums: two measured steps after one warm-up step
VERIFY = ["--verify", "--iters", "2", "--warmup", "1", "--measure-budget", "0"]


def _profile_every_micro_batch(capsys: pytest.CaptureFixture[str]) -> None:
    """Store a kernel profile of every micro-batch a plan of BASE's model can give a rank, so
    that the processes of a search with workers read the same stored profiles: left to profile
    a new size when they meet it, two of them can each take their own live profile of it, and
    their prices then differ by its noise."""
    for batch in (1, 2, 4, 8, 16):
        args = ["profile", "kernels", "mlp", "--batch-size", str(batch), "--iters", "2"]
        assert main([*args, "--warmup", "1"]) == 0
    capsys.readouterr()


@pytest.fixture(scope="session")
def link_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding one profile of BASE's link (every collective a search may price), taken
    once for the test session, by whichever test worker comes first (the others wait for it and
    read the same file): ``--verify`` profiles a link the store has no fit of. One timing of
    the compute each collective takes a size is enough for these tests' prices."""
    shared = tmp_path_factory.getbasetemp().parent  # one folder for every xdist worker
    path = shared / "search-link.db"
    with FileLock(f"{path}.lock"):
        if not path.exists():
            taking = shared / f"search-link-{os.getpid()}.db"
            args = ["profile", "collectives", "--world-size", "2", "--bandwidth", "1gbit"]
            args += ["--sizes", "4KiB:1MiB", "--repeats", "2", "--warmup", "1"]
            args += ["--cpu-repeats", "1", "--collectives"]
            args += ["all_reduce", "sendrecv", "all_gather", "reduce_scatter"]
            args += ["ring_reduce_scatter", "ring_all_gather"]
            assert main([*args, "--db", f"sqlite:///{taking}"]) == 0
            taking.rename(path)
    return path


@pytest.fixture
def linked(link_store: Path, private_store: str) -> None:
    """The test's store starts with the module's link profile."""
    shutil.copy(link_store, private_store.removeprefix("sqlite:///"))


def _search(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*BASE, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("algo", ["backtrack", "random"])
def test_search_finds_no_worse_than_the_baseline(
    capsys: pytest.CaptureFixture[str], algo: str
) -> None:
    out = _search(capsys, "--algo", algo, "--budget", "60")
    assert out["algo"] == algo and out["predictor"] == "replay"
    assert 1 < out["evaluations"] <= 60
    assert out["best"]["predicted_ms"] <= out["baseline"]["predicted_ms"]
    assert out["baseline"]["strategy"] == Strategy().to_dict()
    top = [t["predicted_ms"] for t in out["top"]]
    assert top == sorted(top) and len(top) == 5
    Strategy.from_dict(out["best"]["strategy"])  # a valid strategy
    curve = out["convergence"]
    assert curve == sorted(curve, reverse=True) and curve[-1] == pytest.approx(min(top))


@pytest.mark.usefixtures("linked")
def test_verify_settles_the_answer_by_measurement(capsys: pytest.CaptureFixture[str]) -> None:
    out = _search(capsys, "--budget", "20", *VERIFY, "--verify-top", "3", "--verify-rounds", "2")
    assert out["picked_by"] == "measurement"
    # the baseline and the first three distinct candidates, each run once
    rows = out["verified"]
    keys = {json.dumps(row["strategy"], sort_keys=True) for row in rows}
    assert len(keys) == len(rows) and 3 <= len(rows) <= 4
    scored = out.get("scored_best", out["best"])["strategy"]
    candidates = [scored]
    for row in out["top"]:
        if row["strategy"] not in candidates and len(candidates) < 3:
            candidates.append(row["strategy"])
    ran = [row["strategy"] for row in rows]
    assert all(c in ran for c in candidates) and out["baseline"]["strategy"] in ran
    # Of the candidates measured faster beyond the noise (interval above 1), the fastest is the
    # answer; DDP's defaults when none is.
    measured = {json.dumps(r["strategy"], sort_keys=True): r["measured_ms"] for r in rows}
    fastest = out["fastest_candidate"]
    baseline = out["baseline"]["strategy"]
    others = [r for r in rows if r["strategy"] != baseline]
    assert fastest["measured_ms"] == min(r["measured_ms"] for r in others)
    low, high = fastest["speedup_interval"]
    assert low <= fastest["speedup"] <= high
    winners = [r for r in others if r["speedup_interval"][0] > 1]
    if winners:
        chosen = min(winners, key=lambda r: r["measured_ms"])
        assert out["best"]["strategy"] == chosen["strategy"] and not out.get("kept_baseline")
        ratio = out["measured_baseline_ms"] / out["measured_best_ms"]
        assert out["speedup"] == pytest.approx(ratio) and out["speedup_interval"][0] > 1
        assert out["answer"].startswith("picked ")
    else:
        assert out["best"]["strategy"] == out["baseline"]["strategy"] and out["kept_baseline"]
        assert out["speedup"] == 1.0 and out["answer"].startswith("kept DDP's defaults")
    assert out["measured_best_ms"] == measured[json.dumps(out["best"]["strategy"], sort_keys=True)]
    if out["best"]["strategy"] != scored:
        assert out["scored_best"]["strategy"] == scored
    else:
        assert "scored_best" not in out
    # every candidate's measured speed-up over DDP's defaults, with its interval
    for row in rows:
        if row["strategy"] != baseline:
            low, high = row["speedup_interval"]
            assert low <= row["speedup"] <= high
    # every run stored beside a prediction of its strategy, named on its row
    for row in rows:
        assert isinstance(row["measurement_id"], int) and isinstance(row["prediction_id"], int)
    # Every measured median carries its interval; the speed-up its interval and verdict.
    assert out["measured_best_ms"] > 0 and out["measured_baseline_ms"] > 0
    assert out["speedup"] == pytest.approx(out["measured_baseline_ms"] / out["measured_best_ms"])
    for name in ("best", "baseline"):
        low, high = out[f"measured_{name}_ci95_ms"]
        assert low <= out[f"measured_{name}_ms"] <= high
    if not out.get("kept_baseline"):
        low, high = out["speedup_interval"]
        assert low <= out["speedup"] <= high
        assert out["significant"] == (not low <= 1.0 <= high)
        assert out["verdict"] in ("faster", "slower", "no measurable difference")
    assert out["measurement"]["stopped_by"] == "minimum"


def test_verify_top_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--verify", "--verify-top", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "verify_top(16) must be <= 15" in err[0], err


@pytest.mark.usefixtures("linked")
def test_verify_runs_a_kept_baseline_once(capsys: pytest.CaptureFixture[str]) -> None:
    # a budget of one prices DDP's defaults only: they are the pick and the only candidate
    out = _search(capsys, "--budget", "1", *VERIFY)
    assert out["best"]["strategy"] == Strategy().to_dict() and out["kept_baseline"] is True
    assert out["measured_best_ms"] == out["measured_baseline_ms"] > 0
    assert out["verdict"] == "the pick is DDP's defaults" and out["significant"] is False
    assert len(out["verified"]) == 1 and "fastest_candidate" not in out
    assert out["speedup"] == 1.0 and out["picked_by"] == "measurement"
    assert out["speedup_interval"] == [1.0, 1.0]
    assert [row["verified_as"] for row in out["verified"]] == [["baseline", "best"]]
    assert out["answer"] == "kept DDP's defaults: the search found nothing predicted faster"


def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "mlp", "--world-size", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "world_size(1)" in err[0]
    assert main([*BASE, "--time-limit", "0"]) == 2
    assert "time_limit(0.0)" in capsys.readouterr().err
    assert main([*BASE, "--confidence", "1.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "confidence(1.5) must be in [0.5, 0.99]" in err[0]


@pytest.mark.parametrize("algo", ["tpe", "cmaes"])
def test_optuna_samplers_share_a_study_in_a_database(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, algo: str
) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    args = ["--algo", algo, "--budget", "15", "--storage", storage, "--study-name", "s"]
    _profile_every_micro_batch(capsys)
    first = _search(capsys, *args)
    assert first["best"]["predicted_ms"] <= first["baseline"]["predicted_ms"]
    assert 1 < first["evaluations"] <= 15
    best_after_first = optuna.load_study(study_name="s", storage=storage).best_value
    second = _search(capsys, *args, "--workers", "2")
    # every process priced from the same stored profiles: the second search, which starts
    # from the first's trials, finds no worse
    assert second["best"]["predicted_ms"] <= first["best"]["predicted_ms"] + 1e-9
    # both searches' trials are in the one study: each added its own budget
    study = optuna.load_study(study_name="s", storage=storage)
    assert len(study.trials) >= 30
    assert study.best_value <= best_after_first <= first["best"]["predicted_ms"] + 1e-9
    # the second search's two processes both added trials (worker seeds differ)
    assert second["evaluations"] > first["evaluations"]


def test_nsga2_reports_a_pareto_front(capsys: pytest.CaptureFixture[str]) -> None:
    out = _search(capsys, "--algo", "nsga2", "--budget", "30")
    assert out["pareto"], "NSGA-II's front of time and memory"
    for row in out["pareto"]:
        Strategy.from_dict(row["strategy"])
        assert row["predicted_ms"] > 0 and row["peak_memory_gib"] > 0
    assert out["best"]["predicted_ms"] <= min(r["predicted_ms"] for r in out["pareto"]) + 1e-9


def test_plans_over_the_memory_capacity_are_pruned(capsys: pytest.CaptureFixture[str]) -> None:
    free = _search(capsys, "--budget", "40")
    ddp_gib = free["baseline"]["peak_memory_gib"]
    assert free["space"] == "all" and free["memory_capacity_gib"] > ddp_gib
    # a device a little smaller than DDP's predicted peak: sharded plans or smaller
    # micro-batches fit, DDP's own plan does not
    tight = _search(capsys, "--budget", "40", "--memory-gb", f"{ddp_gib * 0.9:.6f}")
    assert tight["pruned"], "plans over capacity are listed as pruned"
    assert tight["best"]["strategy"] != Strategy().to_dict()
    for row in [tight["best"], *tight["top"]]:
        assert row["peak_memory_gib"] <= ddp_gib * 0.9
        assert row["strategy"]["parallel"] != Strategy().to_dict()["parallel"]
    assert main([*BASE, "--memory-gb", "0"]) == 2
    assert "memory_gb(0.0)" in capsys.readouterr().err


@pytest.mark.usefixtures("linked")
def test_verify_does_not_run_what_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    ddp_gib = _search(capsys, "--budget", "10")["baseline"]["peak_memory_gib"]
    out = _search(
        capsys,
        *("--budget", "30", "--memory-gb", f"{ddp_gib * 0.9:.6f}"),
        *("--verify", "--iters", "1", "--warmup", "1", "--measure-budget", "0"),
    )
    assert not out["baseline"]["fits"] and out["best"]["fits"]
    assert out["measured_baseline_ms"] is None and out["speedup"] is None
    assert out["measured_best_ms"] > 0
    assert "over the capacity" in out["not_run"]["baseline"]
    assert "best" not in out["not_run"]


def test_the_fusion_space_keeps_ddps_plan(capsys: pytest.CaptureFixture[str]) -> None:
    out = _search(capsys, "--space", "fusion", "--budget", "40")
    for row in out["top"]:
        assert row["strategy"]["parallel"] == Strategy().to_dict()["parallel"]
        assert row["strategy"]["op_fusion"]["compiled"] == []


def test_autotune_measures_live_runs(capsys: pytest.CaptureFixture[str]) -> None:
    out = _search(
        capsys, "--algo", "autotune", "--budget", "2", "--iters", "1", "--measure-budget", "0"
    )
    assert out["evaluations"] <= 2
    assert out["best"]["measured_ms"] > 0 and out["best"]["predicted_ms"] > 0
    assert out["baseline"]["measured_ms"] >= out["best"]["measured_ms"]
    assert main([*BASE, "--algo", "autotune", "--workers", "2"]) == 2
    assert "workers(2)" in capsys.readouterr().err


def test_workers_share_a_journal_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    storage = f"journal://{tmp_path / 'study.log'}"
    args = ["--algo", "random", "--budget", "20", "--storage", storage, "--study-name", "j"]
    _profile_every_micro_batch(capsys)
    out = _search(capsys, *args, "--workers", "2")
    assert 1 < out["evaluations"] <= 20
    journal = JournalStorage(JournalFileBackend(str(tmp_path / "study.log")))
    study = optuna.load_study(study_name="j", storage=journal)
    assert len(study.trials) >= 20
    assert out["best"]["predicted_ms"] <= study.best_value + 1e-9


def test_a_bad_storage_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for bad in ("nosuchdb://x", f"journal://{tmp_path / 'no' / 'such' / 'study.log'}"):
        assert main([*BASE, "--algo", "tpe", "--storage", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and bad.removeprefix("journal://") in err[0]


def test_describe_names_the_plan_the_buckets_and_what_is_kept() -> None:
    assert describe(Strategy().to_dict()) == "DDP's defaults"
    pipeline = Strategy.from_dict(
        {"parallel": {"pp": 2, "micro_batches": 4, "pp_schedule": "gpipe"}}
    )
    assert describe(pipeline.to_dict()) == "pp2, gpipe, 4 micro-batches"
    dear = Strategy.from_dict({"tensor_fusion": {"buckets": [["a"], ["b", "c"]], "dear": True}})
    assert describe(dear.to_dict()) == "2 buckets, DeAR"
    capped = Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": 4}})
    assert describe(capped.to_dict()) == "bucket cap 4 MB"
