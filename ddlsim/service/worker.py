"""The worker: takes tasks from the store's queue and runs them, one at a time.

``search`` runs a search (:func:`ddlsim.workflows.search.search`), ``profile`` a profiling batch
(:func:`ddlsim.workflows.profile.profile_batch`), ``execution`` the executor and the simulator's
prediction of the same strategy (:func:`ddlsim.workflows.execute.execute`), both stored, so the
dashboard can set one against the other; ``cluster-search`` the layouts of a GPU cluster on
paper (:func:`ddlsim.workflows.scale_jobs.search_cluster`). A task's rows (measurements,
predictions) and its "done" land in one transaction, which only the task's current claim can
commit: a task run again after its worker died stores them once.
While a task runs, a heartbeat thread keeps it alive in the queue every ``HEARTBEAT_S``; a task
asked to stop stops at its next progress report. A worker told to stop (SIGTERM, Ctrl-C) puts
its task back in the queue for the next worker; one that dies is found by its stale heartbeat
(:meth:`ddlsim.data.store.tasks.TaskQueue.recover`).
"""

import argparse
import contextlib
import dataclasses
import functools
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from ddlsim.cluster import die_with_parent, interrupt, remove_stale_namespaces
from ddlsim.cluster.launcher import Launcher, LocalLauncher
from ddlsim.data.errors import DdlsimError, InvalidOptionError, one_line
from ddlsim.data.store import Store, default_url
from ddlsim.data.store.records import TaskRecord
from ddlsim.data.store.tasks import STALE_S, TaskCancelledError, TaskLostError, TaskQueue
from ddlsim.profiler.batch import parse_batch_data
from ddlsim.service import output
from ddlsim.workflows.execute import Executed, execute
from ddlsim.workflows.profile import profile_batch
from ddlsim.workflows.requests import ExecuteRequest, SearchRequest
from ddlsim.workflows.scale_jobs import LayoutSearchRequest, search_cluster
from ddlsim.workflows.search import search
from ddlsim.workflows.simulator_jobs import (
    EXPORT_KIND,
    TRAINING_KIND,
    ExportJob,
    TrainingJob,
    export_store,
    train_simulator,
)

HEARTBEAT_S = 10.0
DEADLINE_ENV = "DDLSIM_TASK_DEADLINE_S"
DEFAULT_DEADLINE_S = 24 * 3600.0


class TaskDeadlineError(BaseException):
    """A task ran past the worker's deadline (:data:`DEADLINE_ENV`): a ``BaseException``, as
    a cancel is, so that no code catching errors (a search that takes a failing candidate as
    infeasible, a batch that records a failing job and goes on) swallows it."""


def task_deadline_s() -> float:
    """The longest a task may run: ``$DDLSIM_TASK_DEADLINE_S``, else a day.

    Raises:
        InvalidOptionError: naming a value that is not a positive number.
    """
    raw = os.environ.get(DEADLINE_ENV)
    if raw is None:
        return DEFAULT_DEADLINE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InvalidOptionError(f"{DEADLINE_ENV}={raw!r} must be a positive number of seconds")
    return value


TIMELINE_MAX_EVENTS = 4000
Report = Callable[[float | None, str], None]
Finish = Callable[[Session, dict[str, Any]], None]
"""``finish(session, result)``: end the task done with ``result`` in ``session``, the transaction
that stores the task's rows (:meth:`~ddlsim.data.store.tasks.TaskQueue.finish_in`)."""


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
        deadline_s: float | None = None,
        heartbeat_s: float | None = None,
        gpus: int = 0,
        cluster: str | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        self.heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
        if not 0 < 2 * self.heartbeat_s <= stale_s:
            raise InvalidOptionError(
                f"heartbeat_s({self.heartbeat_s:g}) and stale_s({stale_s:g}): a heartbeat must "
                "be > 0 and beat at least twice before a task is taken as lost"
            )
        self.db = db
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.poll_s = poll_s
        self.stale_s = stale_s
        self.simulator = simulator
        self.gpus = gpus
        self.cluster = cluster
        self.launcher = launcher or LocalLauncher()
        self.deadline_s = deadline_s if deadline_s is not None else task_deadline_s()
        self.stop = threading.Event()
        self.in_task = False  # a task's handler is running (SIGTERM may interrupt it)

    def run(self, *, once: bool = False) -> int:
        """Run tasks until :attr:`stop` is set (``once``: until the queue is empty); returns
        how many ran. A failing database is retried (with a pause), not fatal."""
        ran = 0
        # A worker killed outright leaves its runs' namespaces; the next one clears them.
        removed = remove_stale_namespaces()
        if removed:
            _say(f"worker {self.name}: removed {len(removed)} stale network namespace(s)")
        with Store.open(self.db) as store:
            queue = TaskQueue(store, stale_s=self.stale_s)
            while not self.stop.is_set():
                try:
                    queue.recover()
                    task = queue.claim(self.name, gpus=self.gpus, cluster=self.cluster)
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
            while not done.wait(self.heartbeat_s):
                try:
                    queue.report(task)
                except TaskCancelledError:
                    cancelled.set()
                except TaskLostError:
                    lost.set()
                    return
                except Exception:  # a database hiccup: the next beat tries again
                    continue

        started = time.monotonic()

        def check() -> None:
            """Raise if the task must stop: called by its report and, between steps, by the
            long loops of profiling and launches (:mod:`ddlsim.cluster.interrupt`)."""
            if self.stop.is_set():
                raise WorkerStoppedError(f"worker {self.name} is stopping")
            if lost.is_set():
                raise TaskLostError(f"task {task.id} was taken from worker {self.name}")
            if cancelled.is_set():
                raise TaskCancelledError(f"task {task.id} was cancelled")
            if time.monotonic() - started > self.deadline_s:
                raise TaskDeadlineError(
                    f"task {task.id} ran past its deadline of {self.deadline_s:g} s "
                    f"({DEADLINE_ENV}); stopped"
                )

        def report(fraction: float | None, message: str) -> None:
            check()
            queue.report(task, progress=fraction, message=message[:500])

        finished: list[bool] = []

        def finish(session: Session, result: dict[str, Any]) -> None:
            queue.finish_in(session, task, result)
            finished.append(True)

        beat = threading.Thread(target=heartbeat, name=f"ddlsim-heartbeat-{task.id}", daemon=True)
        beat.start()
        ending: Callable[[], bool]
        try:
            self.in_task = True
            installed = interrupt.CHECK.set(check)
            try:
                HANDLERS[task.kind](self, store, task.request, report, finish)
            finally:
                interrupt.CHECK.reset(installed)
                self.in_task = False
        except TaskCancelledError:
            ending = functools.partial(queue.cancelled, task)
        except TaskDeadlineError as exc:
            ending = functools.partial(queue.fail, task, one_line(exc, limit=2000))
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
        else:  # the handler ended the task in the transaction that stored its rows
            ending = lambda: True  # noqa: E731
            if not finished:
                error = f"the {task.kind} handler returned without recording a result"
                ending = functools.partial(queue.fail, task, error)
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
    worker: Worker, store: Store, request: dict[str, Any], report: Report, finish: Finish
) -> None:
    # One process a task, with the worker's own cost model.
    asked = dataclasses.replace(SearchRequest.from_json(request), simulator=worker.simulator)
    launcher = worker.launcher.for_ranks(asked.world_size)
    search(asked, store, report, commit=finish, launcher=launcher)


def _profile(
    worker: Worker, store: Store, request: dict[str, Any], report: Report, finish: Finish
) -> None:
    jobs = parse_batch_data({k: v for k, v in request.items() if v})
    # Each job's rows land with its "done" mark: a batch run again skips what is stored.
    outcome = profile_batch(jobs, store, report)
    with store.transaction() as session:
        finish(session, {**outcome.to_dict(), "jobs": len(jobs)})


def _profile_job(
    worker: Worker, store: Store, request: dict[str, Any], report: Report, finish: Finish
) -> None:
    """One job of a profiling run (a child task): its rows land with its "done" mark, and the
    task's end in the same transaction as that mark's check."""
    jobs = parse_batch_data(request)
    outcome = profile_batch(jobs, store, report)
    with store.transaction() as session:
        finish(session, {**outcome.to_dict(), "jobs": len(jobs), "host": socket.gethostname()})


def _execution(
    worker: Worker, store: Store, request: dict[str, Any], report: Report, finish: Finish
) -> None:
    asked = dataclasses.replace(
        ExecuteRequest.from_json(request, predict=True), simulator=worker.simulator
    )
    execute(
        asked,
        store,
        report,
        commit=lambda session, done: finish(session, _executed(done)),
        launcher=worker.launcher.for_ranks(asked.options.world_size),
    )


def _cluster_search(
    worker: Worker, store: Store, request: dict[str, Any], report: Report, finish: Finish
) -> None:
    result = search_cluster(LayoutSearchRequest.from_json(request), report)
    with store.transaction() as session:
        finish(session, result)


def _simulator_training(
    worker: Worker, store: Store, request: dict[str, Any], report: Report, finish: Finish
) -> None:
    payload = train_simulator(TrainingJob.from_json(request).request(store.url), report)
    with store.transaction() as session:
        finish(session, payload)


def _dataset_export(
    worker: Worker, store: Store, request: dict[str, Any], report: Report, finish: Finish
) -> None:
    payload = export_store(ExportJob.from_json(request).request(), store, report)
    with store.transaction() as session:
        finish(session, payload)


def _executed(done: Executed) -> dict[str, Any]:
    """An execution task's result: the measurement, the prediction and their timelines."""
    out: dict[str, Any] = {
        "measurement_id": done.measurement_id,
        "measured_ms": done.result.median_ms,
        "measured": done.result.to_json(),
    }
    if done.prediction is not None:
        prediction = done.prediction
        out["prediction_id"] = done.prediction_id
        out["predicted_ms"] = prediction.iteration_time_ms
        out["prediction"] = prediction.to_json()
        out["predicted_timeline"] = [
            {"name": e.name, "lane": e.stream, "start_ms": e.start_ms, "end_ms": e.end_ms}
            for e in prediction.result.timeline[:TIMELINE_MAX_EVENTS]
        ]
    if done.result.trace is not None:
        out["measured_trace"] = done.result.trace
    return out


HANDLERS: dict[str, Callable[[Worker, Store, dict[str, Any], Report, Finish], None]] = {
    "search": _search,
    "profile": _profile,
    "profile-job": _profile_job,
    "execution": _execution,
    "cluster-search": _cluster_search,
    TRAINING_KIND: _simulator_training,
    EXPORT_KIND: _dataset_export,
}


def parse_devices(text: str) -> int:
    """``--devices``: ``cpu`` (no GPU: CPU tasks only) or ``cuda:N`` (N GPUs, N >= 1; CPU
    tasks too); the GPUs it offers.

    Raises:
        InvalidOptionError: naming the value and the forms allowed.
    """
    if text == "cpu":
        return 0
    kind, _, count = text.partition(":")
    if kind == "cuda" and count.isdigit() and 1 <= int(count) <= 1024:
        return int(count)
    raise InvalidOptionError(
        f"--devices {text!r} is not a device offer; allowed: cpu, or cuda:N with N GPUs (1 to "
        "1024)"
    )


def cmd_worker(args: argparse.Namespace) -> int:
    if args.parent is not None:
        die_with_parent(signal.SIGTERM)  # serve was killed outright: stop too
        if os.getppid() != args.parent:
            return 0
    worker = Worker(
        args.db or default_url(),
        name=args.name,
        poll_s=args.poll,
        simulator=args.simulator,
        heartbeat_s=args.heartbeat,
        stale_s=args.stale,
        gpus=parse_devices(args.devices),
        cluster=args.cluster,
        launcher=output.launcher_from(args),
    )

    def stop(signum: int, frame: Any) -> None:
        worker.stop.set()
        if worker.in_task:  # out of the running task: it is queued again
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    with contextlib.suppress(KeyboardInterrupt):
        worker.run(once=args.once)
    return 0
