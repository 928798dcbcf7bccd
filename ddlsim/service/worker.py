"""The worker: takes tasks from the store's queue and runs them, one at a time.

``search`` runs ``ddlsim search`` with the request's arguments, ``profile`` a profiling batch
(``ddlsim profile batch``), ``execution`` the executor (``ddlsim run``) and the simulator's
prediction of the same strategy, both stored, so the dashboard can set one against the other.
While a task runs, a heartbeat thread keeps it alive in the queue every ``HEARTBEAT_S``; a task
asked to stop stops at its next progress report. A worker told to stop (SIGTERM, Ctrl-C) puts
its task back in the queue for the next worker; one that dies is found by its stale heartbeat
(:meth:`data.store.tasks.TaskQueue.recover`).
"""

import argparse
import contextlib
import functools
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ddlsim.data.errors import DdlsimError, one_line
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store, add_graph, add_prediction, add_strategy, default_url
from ddlsim.data.store.records import TaskRecord
from ddlsim.data.store.tasks import STALE_S, TaskCancelledError, TaskLostError, TaskQueue
from ddlsim.executor.run import RunOptions, run_training
from ddlsim.profiler.batch import JobRunner, parse_batch_data, run_batch
from ddlsim.profiler.cluster import die_with_parent, remove_stale_namespaces
from ddlsim.service.cmd_predict import cost_model_for, normalized_bandwidth, predict_on_store

HEARTBEAT_S = 10.0
TIMELINE_MAX_EVENTS = 4000
Report = Callable[[float | None, str], None]


class WorkerStoppedError(BaseException):
    """The worker was told to stop while a task ran (a ``BaseException``: code that catches
    ``Exception``, such as a profiling batch's job loop, lets it through)."""


class Worker:
    """Runs the queue's tasks against the store at ``db``."""

    def __init__(
        self,
        db: str,
        *,
        name: str | None = None,
        poll_s: float = 1.0,
        stale_s: float = STALE_S,
        simulator: str | None = None,
    ) -> None:
        self.db = db
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.poll_s = poll_s
        self.stale_s = stale_s
        self.simulator = simulator
        self.stop = threading.Event()
        self.in_task = False  # a task's handler is running (SIGTERM may interrupt it)

    def run(self, *, once: bool = False) -> int:
        """Run tasks until :attr:`stop` is set (``once``: until the queue is empty); returns
        how many ran. A failing database is retried (with a pause), not fatal."""
        ran = 0
        with Store.open(self.db) as store:
            queue = TaskQueue(store, stale_s=self.stale_s)
            while not self.stop.is_set():
                try:
                    queue.recover()
                    task = queue.claim(self.name)
                except Exception as exc:  # the database is down or locked: wait, try again
                    _say(f"worker {self.name}: the queue is unreachable ({one_line(exc)})")
                    self.stop.wait(min(30.0, 10 * self.poll_s))
                    continue
                if task is None:
                    if once:
                        break
                    self.stop.wait(self.poll_s)
                    continue
                self._run(queue, store, task)
                ran += 1
        return ran

    def _run(self, queue: TaskQueue, store: Store, task: TaskRecord) -> None:
        cancelled = threading.Event()
        lost = threading.Event()
        done = threading.Event()

        def heartbeat() -> None:
            while not done.wait(HEARTBEAT_S):
                try:
                    queue.report(task)
                except TaskCancelledError:
                    cancelled.set()
                except TaskLostError:
                    lost.set()
                    return
                except Exception:  # a database hiccup: the next beat tries again
                    continue

        def report(fraction: float | None, message: str) -> None:
            if self.stop.is_set():
                raise WorkerStoppedError(f"worker {self.name} is stopping")
            if lost.is_set():
                raise TaskLostError(f"task {task.id} was taken from worker {self.name}")
            if cancelled.is_set():
                raise TaskCancelledError(f"task {task.id} was cancelled")
            queue.report(task, progress=fraction, message=message[:500])

        beat = threading.Thread(target=heartbeat, name=f"ddlsim-heartbeat-{task.id}", daemon=True)
        beat.start()
        ending: Callable[[], bool]
        try:
            self.in_task = True
            try:
                result = HANDLERS[task.kind](self, store, task.request, report)
            finally:
                self.in_task = False
        except TaskCancelledError:
            ending = functools.partial(queue.cancelled, task)
        except TaskLostError:
            ending = lambda: False  # noqa: E731 - another worker owns it now
        except (WorkerStoppedError, KeyboardInterrupt, SystemExit):
            # SystemExit: the emulated cluster turns SIGTERM into one while ranks run.
            message = f"worker {self.name} stopped while it ran; queued again"
            ending = functools.partial(queue.release, task, message)
            self.stop.set()
        except DdlsimError as exc:
            ending = functools.partial(queue.fail, task, one_line(exc, limit=2000))
        except Exception as exc:  # a crashed task must not end the worker
            error = f"{type(exc).__name__}: {one_line(exc, limit=2000)}"
            ending = functools.partial(queue.fail, task, error)
        else:
            ending = functools.partial(queue.finish, task, result)
        finally:
            done.set()
            beat.join()
        _retry(ending, f"task {task.id}")


def _retry(write: Callable[[], bool], what: str, attempts: int = 5) -> None:
    """A task's final status, written again after a pause when the database fails."""
    for attempt in range(attempts):
        try:
            write()
            return
        except Exception as exc:
            _say(f"could not record the end of {what} ({one_line(exc)}); attempt {attempt + 1}")
            time.sleep(min(30.0, 2.0**attempt))
    _say(f"gave up recording the end of {what}: its stale heartbeat will queue it again")


def _say(message: str) -> None:
    print(f"ddlsim worker: {message}", file=sys.stderr, flush=True)


# ----- the tasks ---------------------------------------------------------------------------------


def _search(
    worker: Worker, store: Store, request: dict[str, Any], report: Report
) -> dict[str, Any]:
    from ddlsim.service.cli import build_parser  # the CLI registers this module's command
    from ddlsim.service.cmd_search import run_search

    args = build_parser().parse_args(["search", "placeholder", "--world-size", "2"])
    for key, value in request.items():
        setattr(args, key, value)
    args.model = json.dumps(request["model"])
    args.db = worker.db
    args.json, args.workers, args.storage = True, 1, None
    args.simulator = worker.simulator
    return run_search(args, report=report)


def _profile(
    worker: Worker, store: Store, request: dict[str, Any], report: Report
) -> dict[str, Any]:
    from ddlsim.service.cmd_profile import batch_runners

    jobs = parse_batch_data({k: v for k, v in request.items() if v})
    runners: dict[str, JobRunner] = {
        kind: _reporting(runner, report) for kind, runner in batch_runners().items()
    }

    def show(position: int, total: int, label: str) -> None:
        report(position / total if total else 1.0, label)

    outcome = run_batch(jobs, store=store, runners=runners, progress=show)
    return {**outcome.to_dict(), "jobs": len(jobs)}


def _reporting(runner: JobRunner, report: Report) -> JobRunner:
    @functools.wraps(runner)
    def run(job: Any) -> Callable[[Any], None]:
        report(None, f"running {job.label}"[:500])
        return runner(job)

    return run


def _execution(
    worker: Worker, store: Store, request: dict[str, Any], report: Report
) -> dict[str, Any]:
    from ddlsim.service.cmd_run import add_result

    spec = ModelSpec.from_dict(request["model"])
    strategy = Strategy.from_dict(request["strategy"])
    options = RunOptions(
        world_size=request["world_size"],
        bandwidth=request.get("bandwidth"),
        iters=request["iters"],
        warmup=request["warmup"],
        ci_target=request.get("ci_target", 0.01),
        budget_s=request.get("measure_budget_s", 30.0),
        seed=request.get("seed", 0),
        trace=bool(request.get("trace", True)),
    )
    remove_stale_namespaces()
    report(0.0, f"running {spec.label} on {options.world_size} ranks")
    result = run_training(spec, strategy, options, progress=lambda m: report(None, m))
    with store.transaction() as session:
        measurement_id = add_result(session, result)
    out: dict[str, Any] = {
        "measurement_id": measurement_id,
        "measured_ms": result.median_ms,
        "measured": result.to_json(),
    }
    if options.world_size > 1:
        report(0.9, "predicting the same strategy")
        prediction, _, _ = predict_on_store(
            store,
            spec,
            strategy,
            world_size=options.world_size,
            bandwidth=normalized_bandwidth(options.bandwidth),
            cost_model=cost_model_for(worker.simulator),
        )
        with store.transaction() as session:
            add_graph(session, graph=prediction.graph)
            add_strategy(session, strategy=strategy)
            out["prediction_id"] = add_prediction(session, prediction=prediction.record())
        out["predicted_ms"] = prediction.iteration_time_ms
        out["prediction"] = prediction.to_json()
        out["predicted_timeline"] = [
            {"name": e.name, "lane": e.stream, "start_ms": e.start_ms, "end_ms": e.end_ms}
            for e in prediction.result.timeline[:TIMELINE_MAX_EVENTS]
        ]
    if result.trace is not None:
        out["measured_trace"] = result.trace
    return out


HANDLERS: dict[str, Callable[[Worker, Store, dict[str, Any], Report], dict[str, Any]]] = {
    "search": _search,
    "profile": _profile,
    "execution": _execution,
}


def cmd_worker(args: argparse.Namespace) -> int:
    if args.parent is not None:
        die_with_parent(signal.SIGTERM)  # serve was killed outright: stop too
        if os.getppid() != args.parent:
            return 0
    worker = Worker(args.db or default_url(), poll_s=args.poll, simulator=args.simulator)

    def stop(signum: int, frame: Any) -> None:
        worker.stop.set()
        if worker.in_task:  # out of the running task: it is queued again
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    with contextlib.suppress(KeyboardInterrupt):
        worker.run(once=args.once)
    return 0
