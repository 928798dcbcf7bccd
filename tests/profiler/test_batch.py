"""Batch files, and runs that skip what is done, redo what was cut short, record failures."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddlsim.data.store import Store
from ddlsim.profiler.batch import InvalidBatchError, Job, parse_batch, run_batch


def test_parse_list_and_product(tmp_path: Path) -> None:
    path = tmp_path / "batch.yaml"
    path.write_text(
        "jobs:\n"
        "  - {kind: kernels, model: mlp}\n"
        "product:\n"
        "  - kind: [kernels]\n"
        "    model: [mlp, gpt2-tiny]\n"
        "    batch_size: [2, 4]\n"
        "  - {kind: [collectives], world_size: [2, 4], bandwidth: [1gbit]}\n"
    )
    jobs = parse_batch(str(path))
    assert len(jobs) == 1 + 4 + 2
    assert jobs[1].settings == {"model": "mlp", "batch_size": 2}
    assert {j.kind for j in jobs} == {"kernels", "collectives"}
    assert len({j.key for j in jobs}) == len(jobs)


def test_duplicates_run_once() -> None:
    text = json.dumps({"jobs": [{"kind": "kernels", "model": "mlp"}] * 3})
    assert len(parse_batch(text)) == 1


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"jobs": [{"kind": "train", "model": "mlp"}]}, r"jobs\[0\].kind 'train' is not a job"),
        ({"jobs": [{"kind": "kernels"}]}, r"jobs\[0\] \(kernels\) needs 'model'"),
        ({"jobs": [{"kind": "kernels", "model": "mlp", "itres": 3}]}, "unknown key 'itres'"),
        (
            {"product": [{"kind": "kernels", "model": ["mlp"]}]},
            r"product\[0\].kind must be a list",
        ),
        ({"jobs": []}, "holds no jobs"),
        ({"tasks": []}, "unknown key 'tasks' in batch file"),
    ],
)
def test_bad_batch_files(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidBatchError, match=message):
        parse_batch(json.dumps(raw))


def _jobs(*names: str) -> list[Job]:
    return [Job(kind="kernels", settings={"model": name}) for name in names]


def test_run_skips_done_and_records_failures(private_store: str) -> None:
    ran: list[str] = []

    def runner(job: Job) -> Callable[[Any], None]:
        ran.append(job.settings["model"])
        if job.settings["model"] == "bad":
            raise ValueError("this model cannot run")
        return lambda session: None

    jobs = _jobs("a", "bad", "b")
    with Store.open(private_store) as store:
        first = run_batch(jobs, store=store, runners={"kernels": runner})
        assert len(first.done) == 2
        assert first.failed == ((jobs[1].key, "ValueError: this model cannot run"),)
        assert store.job_status(key=jobs[1].key) == "failed"
        second = run_batch(jobs, store=store, runners={"kernels": runner})
    assert set(second.skipped) == {jobs[0].key, jobs[2].key}
    assert ran == ["a", "bad", "b", "bad"]  # failed jobs are tried again, done ones are not


def test_interrupted_job_is_redone(private_store: str) -> None:
    calls: list[str] = []

    def interrupted(job: Job) -> Callable[[Any], None]:
        calls.append(job.settings["model"])
        raise KeyboardInterrupt

    jobs = _jobs("a")
    with Store.open(private_store) as store:
        with pytest.raises(KeyboardInterrupt):
            run_batch(jobs, store=store, runners={"kernels": interrupted})
        assert store.job_status(key=jobs[0].key) == "running"
        outcome = run_batch(jobs, store=store, runners={"kernels": lambda job: lambda s: None})
    assert outcome.done == (jobs[0].key,)


def test_results_and_done_mark_commit_together(private_store: str) -> None:
    def broken_write(job: Job) -> Callable[[Any], None]:
        def write(session: Any) -> None:
            raise RuntimeError("disk full")

        return write

    jobs = _jobs("a")
    with Store.open(private_store) as store:
        with pytest.raises(RuntimeError, match="disk full"):
            run_batch(jobs, store=store, runners={"kernels": broken_write})
        assert store.job_status(key=jobs[0].key) == "running"
