"""The service's task queue: claims are exclusive, progress and cancellation reach the worker,
and a task whose worker died is queued again once, then failed, never lost."""

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store, add_measurement
from ddlsim.data.store.schema import utc_now
from ddlsim.data.store.tasks import (
    STALE_S,
    TaskCancelledError,
    TaskLostError,
    TaskNotFoundError,
    TaskQueue,
)
from tests.data import records


def test_a_task_runs_from_queued_to_done(store: Store) -> None:
    queue = TaskQueue(store)
    task = queue.submit("search", {"model": "mlp"})
    assert task.status == "queued" and task.attempts == 0 and task.request == {"model": "mlp"}
    claimed = queue.claim("w1")
    assert claimed is not None and claimed.id == task.id
    assert claimed.status == "running" and claimed.worker == "w1" and claimed.attempts == 1
    assert queue.claim("w2") is None, "one task, claimed once"
    queue.report(claimed, progress=0.5, message="pricing")
    running = queue.get(task.id)
    assert running.progress == 0.5 and running.message == "pricing"
    assert queue.finish(claimed, {"best": 1.0})
    done = queue.get(task.id)
    assert done.status == "done" and done.result == {"best": 1.0} and done.progress == 1.0
    assert done.finished_at is not None
    assert queue.counts() == {("search", "done"): 1}
    assert [t.id for t in queue.list(kind="search")] == [task.id]
    assert queue.list(status="queued") == []


def test_claims_are_exclusive_under_concurrency(store_url: str) -> None:
    with Store.open(store_url) as store:
        queue = TaskQueue(store)
        ids = [queue.submit("execution", {"n": i}).id for i in range(12)]

        def drain(worker: str) -> list[int]:
            got = []
            while (task := queue.claim(worker)) is not None:
                got.append(task.id)
            return got

        with ThreadPoolExecutor(4) as pool:
            claimed = [i for got in pool.map(drain, ["a", "b", "c", "d"]) for i in got]
    assert sorted(claimed) == ids, "every task claimed exactly once"


def test_cancel_stops_queued_and_running_tasks(store: Store) -> None:
    queue = TaskQueue(store)
    waiting = queue.submit("search", {})
    assert queue.cancel(waiting.id).status == "cancelled"
    running = queue.submit("search", {})
    claimed = queue.claim("w")
    assert claimed is not None
    assert queue.cancel(running.id).cancel_requested
    with pytest.raises(TaskCancelledError):
        queue.report(claimed, progress=0.1)
    assert queue.cancelled(claimed)
    assert queue.get(running.id).status == "cancelled"
    # a task asked to stop while its worker hands it back is cancelled, not queued again
    stopping = queue.submit("search", {})
    claimed = queue.claim("w")
    assert claimed is not None and claimed.id == stopping.id
    queue.cancel(stopping.id)
    assert queue.release(claimed, "worker stopping")
    assert queue.get(stopping.id).status == "cancelled"
    assert queue.claim("w") is None, "a cancelled task is never claimed"
    with pytest.raises(TaskNotFoundError, match="no task 999"):
        queue.cancel(999)


def test_a_task_whose_worker_died_is_queued_again_then_failed(store: Store) -> None:
    queue = TaskQueue(store, stale_s=30)
    task = queue.submit("profile", {})
    first = queue.claim("dead")
    assert first is not None
    assert queue.recover().requeued == (), "a fresh heartbeat is left alone"
    later = utc_now() + timedelta(seconds=31)
    assert queue.recover(now=later).requeued == (task.id,)
    again = queue.get(task.id)
    assert again.status == "queued" and "dead" in (again.message or "")
    second = queue.claim("dead-too")
    assert second is not None
    # the first worker comes back: its claim is gone, it can no longer touch the task
    with pytest.raises(TaskLostError):
        queue.report(first, progress=0.9)
    assert not queue.finish(first, {"stale": True})
    assert not queue.release(first, "stopping")
    assert queue.get(task.id).status == "running" and queue.get(task.id).worker == "dead-too"
    assert queue.recover(now=utc_now() + timedelta(seconds=31)).failed == (task.id,)
    failed = queue.get(task.id)
    assert failed.status == "failed" and "dead-too" in (failed.error or "")
    assert failed.attempts == 2


def test_recovery_leaves_a_task_that_ended_meanwhile(store: Store) -> None:
    queue = TaskQueue(store, stale_s=30)
    task = queue.submit("search", {})
    claimed = queue.claim("w")
    assert claimed is not None and queue.finish(claimed, {"ok": 1})
    assert queue.recover(now=utc_now() + timedelta(seconds=31)) == queue.recover()
    assert queue.get(task.id).status == "done"


def test_a_stopping_worker_hands_its_task_back_counted(store: Store) -> None:
    """Each hand-back counts: a task whose worker stops under it twice ends failed (a task that
    kills its worker cannot loop)."""
    queue = TaskQueue(store)
    task = queue.submit("execution", {})
    claimed = queue.claim("w")
    assert claimed is not None and queue.release(claimed, "worker stopping")
    back = queue.get(task.id)
    assert back.status == "queued" and back.attempts == 1 and back.worker is None
    again = queue.claim("w2")
    assert again is not None and queue.release(again, "worker stopping")
    failed = queue.get(task.id)
    assert failed.status == "failed" and "after 2 attempts" in (failed.error or "")
    assert queue.claim("w3") is None


def test_a_task_ends_in_the_transaction_that_stores_its_rows(
    store: Store, tiny_graph: IterationGraph
) -> None:
    """``finish_in``: the task's rows and its "done" commit together, and only under the
    task's current claim: a worker whose task was taken from it stores nothing."""
    queue = TaskQueue(store)
    graph_hash = store.save_graph(graph=tiny_graph)
    key = store.save_strategy(strategy=Strategy())
    task = queue.submit("execution", {})
    first = queue.claim("w1")
    assert first is not None
    # w1 is thought dead: its task is queued again and w2 takes it.
    assert queue.recover(now=utc_now() + timedelta(seconds=STALE_S + 1)).requeued == (task.id,)
    second = queue.claim("w2")
    assert second is not None and second.attempts == 2
    with pytest.raises(TaskLostError), store.transaction() as session:
        add_measurement(session, measurement=records.measurement(graph_hash, key))
        queue.finish_in(session, first, {"measured_ms": 1.0})
    assert store.measurements() == [] and queue.get(task.id).status == "running"
    with store.transaction() as session:
        measurement_id = add_measurement(session, measurement=records.measurement(graph_hash, key))
        queue.finish_in(session, second, {"measurement_id": measurement_id})
    done = queue.get(task.id)
    assert done.status == "done" and done.result == {"measurement_id": measurement_id}
    assert [m.id for m in store.measurements()] == [measurement_id]


# ----- a queue that spans hosts ------------------------------------------------------------------


def test_a_task_that_needs_cuda_waits_for_a_worker_that_offers_it(store: Store) -> None:
    queue = TaskQueue(store)
    cuda = queue.submit("profile-job", {"n": 1}, gpus=2)
    assert cuda.message == "waits for a worker with 2 CUDA GPU(s) (ddlsim worker --devices cuda:2)"
    cpu = queue.submit("profile-job", {"n": 2})
    claimed = queue.claim("cpu-only")
    assert claimed is not None and claimed.id == cpu.id, "the CPU worker passes the CUDA task"
    assert queue.claim("cpu-only") is None, "and never claims it"
    assert queue.claim("one-gpu", gpus=1) is None, "nor does a worker with too few GPUs"
    assert queue.get(cuda.id).status == "queued"
    taken = queue.claim("gpu-host", gpus=8)
    assert taken is not None and taken.id == cuda.id


def test_a_task_for_a_named_cluster_goes_to_its_workers(store: Store) -> None:
    queue = TaskQueue(store)
    task = queue.submit("profile-job", {"n": 1}, cluster="dgx-a")
    assert "cluster 'dgx-a'" in (task.message or "")
    assert queue.claim("elsewhere", cluster="dgx-b") is None
    assert queue.claim("anywhere") is None
    claimed = queue.claim("on-a", cluster="dgx-a")
    assert claimed is not None and claimed.id == task.id


def test_a_run_of_jobs_ends_when_its_last_job_does(store: Store) -> None:
    queue = TaskQueue(store)
    parent = queue.submit_run(
        "profile", {"jobs": 3}, [("profile-job", {"job": i}, 0) for i in range(3)]
    )
    assert parent.children == 3 and parent.status == "queued"
    children = queue.children(parent.id)
    assert [c.parent_id for c in children] == [parent.id] * 3
    first = queue.claim("w1")
    assert first is not None and first.parent_id == parent.id, "the parent is never claimed"
    assert queue.get(parent.id).status == "running"
    assert queue.finish(first, {"done": ["a"], "skipped": [], "failed": []})
    second = queue.claim("w2")
    third = queue.claim("w1")
    assert second is not None and third is not None
    assert queue.claim("w3") is None
    assert queue.fail(second, "boom")
    midway = queue.get(parent.id)
    assert midway.status == "running" and midway.progress == pytest.approx(2 / 3)
    assert queue.finish(third, {"done": ["c"], "skipped": [], "failed": []})
    ended = queue.get(parent.id)
    assert ended.status == "done" and ended.progress == 1.0
    assert ended.result is not None
    assert ended.result["done"] == ["a", "c"]
    assert ended.result["failed"] == [{"key": f"task {second.id}", "error": "boom"}]


def test_cancelling_a_run_cancels_its_jobs(store: Store) -> None:
    queue = TaskQueue(store)
    parent = queue.submit_run("profile", {}, [("profile-job", {"job": i}, 0) for i in range(3)])
    running = queue.claim("w1")
    assert running is not None
    queue.cancel(parent.id)
    statuses = sorted(c.status for c in queue.children(parent.id))
    assert statuses == ["cancelled", "cancelled", "running"]
    assert queue.get(parent.id).status == "running", "until its running job stops"
    with pytest.raises(TaskCancelledError):
        queue.report(running)
    assert queue.cancelled(running)
    assert queue.get(parent.id).status == "cancelled"


def test_a_lost_job_is_queued_again_and_its_run_goes_on(store: Store) -> None:
    queue = TaskQueue(store, stale_s=STALE_S)
    parent = queue.submit_run("profile", {}, [("profile-job", {"job": i}, 0) for i in range(2)])
    lost = queue.claim("dead")
    assert lost is not None
    later = utc_now() + timedelta(seconds=STALE_S + 1)
    assert queue.recover(now=later).requeued == (lost.id,)
    assert queue.get(parent.id).status == "running", "the parent itself is never stale"
    for worker in ("w1", "w2"):
        task = queue.claim(worker)
        assert task is not None
        assert queue.finish(task, {"done": [str(task.id)], "skipped": [], "failed": []})
    assert queue.get(parent.id).status == "done"
    assert sorted(queue.get(parent.id).result["done"]) == sorted(  # type: ignore[index]
        str(c.id) for c in queue.children(parent.id)
    )


def test_postgres_claims_skip_rows_another_worker_holds(store_url: str) -> None:
    if not store_url.startswith("postgresql"):
        pytest.skip("SKIP LOCKED is PostgreSQL's")
    from sqlalchemy import select

    from ddlsim.data.store.schema import TaskRow

    with Store.open(store_url) as store:
        queue = TaskQueue(store)
        first = queue.submit("execution", {"n": 1})
        second = queue.submit("execution", {"n": 2})
        # Another worker is in the middle of claiming the oldest row (it holds its lock).
        with store.transaction() as holding:
            holding.scalar(select(TaskRow.id).where(TaskRow.id == first.id).with_for_update())
            claimed = queue.claim("w2")  # would block on the lock without SKIP LOCKED
            assert claimed is not None and claimed.id == second.id


def test_cancelling_a_run_while_its_jobs_end_is_safe(store_url: str) -> None:
    """Jobs ending lock themselves, then their run; a cancel of the run locks them in the same
    order: on PostgreSQL the two never deadlock, and the run ends either way."""
    with Store.open(store_url) as store:
        queue = TaskQueue(store)
        parent = queue.submit_run(
            "profile", {}, [("profile-job", {"job": i}, 0) for i in range(8)]
        )
        claimed = [queue.claim(f"w{i}") for i in range(8)]
        outcome: dict[str, list[str]] = {"done": [], "skipped": [], "failed": []}
        with ThreadPoolExecutor(4) as pool:
            ends = [pool.submit(queue.finish, task, outcome) for task in claimed if task]
            cancel = pool.submit(queue.cancel, parent.id)
            assert all(end.result() for end in ends)
            cancel.result()
        # Cancelled, or done when every job ended before the cancel came.
        assert queue.get(parent.id).status in ("cancelled", "done")
        assert {c.status for c in queue.children(parent.id)} == {"done"}
