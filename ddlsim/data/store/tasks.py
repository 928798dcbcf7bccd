"""The service's task queue in the store: requests wait as rows until a worker claims them.

Any number of workers, on one machine or several, share one queue through the database: a
claim is one conditional ``UPDATE`` (``status = 'queued'`` still true), so two workers never
run the same task; on PostgreSQL the candidate row is selected ``FOR UPDATE SKIP LOCKED``, so
workers claiming at once each take a different row instead of queueing on one. A task names
what its worker must offer (``gpus``: CUDA GPUs on one host; ``cluster``: a named cluster
profile) and waits, saying so, until a worker that offers it claims it. A profiling run is a
parent task over one child task a job: workers claim the children one by one, and the child
that ends last ends the parent (in the same transaction).

A running task's worker beats its heartbeat (``updated_at``); a task whose heartbeat is older
than ``stale_s`` has lost its worker (a crash, a restart of the server) and is queued again
once, then failed on the second loss: never silently lost. Every write of a running task names
its claim (worker and attempt), so a worker whose task was taken from it can no longer touch
it. Cancelling a queued task ends it at once; a running one is asked to stop
and stops at its next progress report.
"""

import dataclasses
import socket
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.store.errors import StoreError
from ddlsim.data.store.records import TaskRecord
from ddlsim.data.store.schema import TaskRow, utc_now
from ddlsim.data.store.store import Store
from ddlsim.data.store.task_runs import cancel_run, new_row, queued, settle_parent

STALE_S = 60.0  # a running task whose heartbeat is older has lost its worker
MAX_ATTEMPTS = 2  # claims before a task that keeps losing its worker is failed


class TaskNotFoundError(StoreError):
    """No task has this id."""


class TaskCancelledError(BaseException):
    """Raised inside a running task when it has been asked to stop (a ``BaseException``, as
    ``KeyboardInterrupt`` is, so that code catching ``Exception`` does not swallow it)."""


class TaskLostError(BaseException):
    """Raised inside a running task whose claim is no longer its worker's: its heartbeat went
    stale and the task was queued again (another worker may be running it)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Recovery:
    """What :meth:`TaskQueue.recover` did with tasks that lost their worker."""

    requeued: tuple[int, ...]
    failed: tuple[int, ...]


class TaskQueue:
    """Tasks in ``store``'s database."""

    def __init__(self, store: Store, *, stale_s: float = STALE_S) -> None:
        if stale_s <= 0:
            raise InvalidOptionError(f"stale_s({stale_s}) must be > 0")
        self.store = store
        self.stale_s = stale_s

    def submit(
        self,
        kind: str,
        request: Mapping[str, Any],
        *,
        gpus: int = 0,
        cluster: str | None = None,
    ) -> TaskRecord:
        """Queue a task that needs ``gpus`` CUDA GPUs on one host (0: any worker) and, when
        given, a worker of the named ``cluster``; returns it (with its id)."""
        with self.store.transaction() as session:
            row = new_row(kind, request, gpus=gpus, cluster=cluster)
            session.add(row)
            session.flush()
            return row.to_record()

    def submit_run(
        self,
        kind: str,
        request: Mapping[str, Any],
        children: Sequence[tuple[str, Mapping[str, Any], int]],
    ) -> TaskRecord:
        """Queue a parent task (``request`` kept for the record, never claimed) and its
        ``children`` (``(kind, request, gpus)``, one task each) in one transaction; returns the
        parent. It runs while its children do and ends when the last of them ends.

        Raises:
            InvalidOptionError: no children.
        """
        if not children:
            raise InvalidOptionError("a run of tasks needs at least one child task")
        with self.store.transaction() as session:
            parent = new_row(kind, request, gpus=0, cluster=None)
            parent.children = len(children)
            parent.message = f"0 of {len(children)} jobs done"
            session.add(parent)
            session.flush()
            for child_kind, child_request, gpus in children:
                child = new_row(child_kind, child_request, gpus=gpus, cluster=None)
                child.parent_id = parent.id
                session.add(child)
            session.flush()
            return parent.to_record()

    def children(self, parent_id: int) -> list[TaskRecord]:
        """A run's child tasks, in submission order."""
        query = select(TaskRow).where(TaskRow.parent_id == parent_id).order_by(TaskRow.id)
        with self.store.transaction() as session:
            return [row.to_record() for row in session.scalars(query)]

    def get(self, task_id: int) -> TaskRecord:
        """Raises: TaskNotFoundError."""
        with self.store.transaction() as session:
            row = session.get(TaskRow, task_id)
            if row is None:
                raise TaskNotFoundError(f"no task {task_id}")
            return row.to_record()

    def list(
        self, *, kind: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[TaskRecord]:
        """The newest tasks first, filtered by ``kind`` and ``status`` when given."""
        query = select(TaskRow).order_by(TaskRow.id.desc()).limit(limit)
        if kind is not None:
            query = query.where(TaskRow.kind == kind)
        if status is not None:
            query = query.where(TaskRow.status == status)
        with self.store.transaction() as session:
            return [row.to_record() for row in session.scalars(query)]

    def counts(self) -> dict[tuple[str, str], int]:
        """How many tasks of each (kind, status)."""
        out: dict[tuple[str, str], int] = {}
        with self.store.transaction() as session:
            for kind, status in session.execute(select(TaskRow.kind, TaskRow.status)):
                out[(kind, status)] = out.get((kind, status), 0) + 1
        return out

    def claim(
        self, worker: str | None = None, *, gpus: int = 0, cluster: str | None = None
    ) -> TaskRecord | None:
        """The oldest queued task this worker can run (it offers ``gpus`` CUDA GPUs and, when
        given, the named ``cluster``), now running under ``worker``; ``None`` when none
        waits."""
        worker = worker or f"{socket.gethostname()}"
        while True:
            with self.store.transaction() as session:
                candidate = (
                    select(TaskRow.id)
                    .where(
                        TaskRow.status == "queued",
                        TaskRow.cancel_requested.is_(False),
                        TaskRow.children == 0,
                        TaskRow.gpus <= gpus,
                        or_(TaskRow.cluster.is_(None), TaskRow.cluster == cluster),
                    )
                    .order_by(TaskRow.id)
                    .limit(1)
                )
                if session.get_bind().dialect.name == "postgresql":
                    # Rows another worker is claiming right now are passed over, not waited on.
                    candidate = candidate.with_for_update(skip_locked=True)
                task_id = session.scalar(candidate)
                if task_id is None:
                    return None
                now = utc_now()
                claimed = session.execute(
                    update(TaskRow)
                    .where(TaskRow.id == task_id, TaskRow.status == "queued")
                    .values(
                        status="running",
                        worker=worker,
                        attempts=TaskRow.attempts + 1,
                        started_at=now,
                        updated_at=now,
                        progress=0.0,
                        message=None,
                    )
                )
                if claimed.rowcount == 1:  # type: ignore[attr-defined]
                    row = session.get(TaskRow, task_id, populate_existing=True)
                    assert row is not None
                    if row.parent_id is not None and queued(session, row.parent_id):
                        settle_parent(session, row.parent_id)  # the run starts
                    return row.to_record()
            # another worker took it first: try the next one

    def report(
        self, task: TaskRecord, *, progress: float | None = None, message: str | None = None
    ) -> None:
        """Beat the heartbeat of a task this worker claimed (``task`` as :meth:`claim` gave it),
        with its progress (0 to 1) and what it does.

        Raises:
            TaskCancelledError: the task has been asked to stop (its worker ends it).
            TaskLostError: the claim is no longer this worker's.
        """
        values: dict[str, Any] = {"updated_at": utc_now()}
        if progress is not None:
            values["progress"] = min(1.0, max(0.0, float(progress)))
        if message is not None:
            values["message"] = message
        with self.store.transaction() as session:
            beat = session.execute(update(TaskRow).where(*_owned(task)).values(**values))
            cancel = session.scalar(select(TaskRow.cancel_requested).where(TaskRow.id == task.id))
        if beat.rowcount != 1:  # type: ignore[attr-defined]
            raise TaskLostError(f"task {task.id} is no longer claimed by {task.worker}")
        if cancel:
            raise TaskCancelledError(f"task {task.id} was cancelled")

    def finish(self, task: TaskRecord, result: Mapping[str, Any]) -> bool:
        """Mark the claimed task done with ``result``; ``False`` when the claim was lost."""
        try:
            with self.store.transaction() as session:
                self.finish_in(session, task, result)
        except TaskLostError:
            return False
        return True

    def finish_in(self, session: Session, task: TaskRecord, result: Mapping[str, Any]) -> None:
        """Mark the claimed task done with ``result`` in the caller's ``session``, so that the
        rows the task stored land in the same transaction as its end: a task run again after
        its worker died between the two cannot store them twice.

        Raises:
            TaskLostError: the claim is no longer this worker's (the caller's transaction must
                be rolled back: another attempt owns the task).
        """
        if not _ended(session, task, status="done", result=dict(result), progress=1.0):
            raise TaskLostError(f"task {task.id} is no longer claimed by {task.worker}")

    def fail(self, task: TaskRecord, error: str) -> bool:
        """Mark the claimed task failed with ``error``; ``False`` when the claim was lost."""
        return self._end(task, status="failed", error=error)

    def cancelled(self, task: TaskRecord) -> bool:
        """Mark a claimed task cancelled (its worker stopped it on request)."""
        return self._end(task, status="cancelled", error="cancelled on request")

    def release(self, task: TaskRecord, message: str) -> bool:
        """Put a claimed task back in the queue (its worker is stopping). The claim counts: a
        task that has had :data:`MAX_ATTEMPTS` claims is failed instead, so a task that brings
        its worker down cannot loop; a task asked to stop is cancelled."""
        now = utc_now()
        with self.store.transaction() as session:
            row = session.get(TaskRow, task.id, with_for_update=True)
            if row is None or row.status != "running" or row.worker != task.worker:
                return False
            if row.cancel_requested:
                row.status, row.error, row.finished_at = "cancelled", "cancelled on request", now
            elif row.attempts >= MAX_ATTEMPTS:
                row.status, row.finished_at = "failed", now
                row.error = f"{message}; failed after {row.attempts} attempts"
            else:
                row.status, row.message, row.worker = "queued", message, None
            row.updated_at = now
            if row.parent_id is not None:
                session.flush()
                settle_parent(session, row.parent_id)
        return True

    def cancel(self, task_id: int) -> TaskRecord:
        """Cancel a queued task at once, or ask a running one to stop; a finished task is
        returned as it is.

        Raises:
            TaskNotFoundError: no such task.
        """
        now = utc_now()
        with self.store.transaction() as session:
            children = session.scalar(select(TaskRow.children).where(TaskRow.id == task_id))
            if children:
                # A run's children are locked before it, in the order every child's own
                # change takes them (the child, then its parent): no deadlock with them.
                return cancel_run(session, task_id, now)
            row = session.get(TaskRow, task_id, with_for_update=True)
            if row is None:
                raise TaskNotFoundError(f"no task {task_id}")
            if row.status == "queued":
                row.status = "cancelled"
                row.error = "cancelled on request"
                row.finished_at = now
                row.updated_at = now
                if row.parent_id is not None:
                    session.flush()
                    settle_parent(session, row.parent_id)
            elif row.status == "running":
                row.cancel_requested = True
            return row.to_record()

    def recover(self, *, now: datetime | None = None) -> Recovery:
        """Queue again (once) or fail the running tasks whose heartbeat is stale.

        Each change is a conditional update (still running, still stale), so a task that ends
        meanwhile stays as it ended. Workers' clocks are compared: keep them in sync (NTP).
        """
        now = now or utc_now()
        cutoff = now - timedelta(seconds=self.stale_s)
        requeued: list[int] = []
        failed: list[int] = []
        with self.store.transaction() as session:
            stale = list(
                session.execute(
                    select(
                        TaskRow.id,
                        TaskRow.worker,
                        TaskRow.updated_at,
                        TaskRow.attempts,
                        TaskRow.cancel_requested,
                    ).where(
                        TaskRow.status == "running",
                        TaskRow.updated_at < cutoff,
                        TaskRow.children == 0,
                    )
                )
            )
        for task_id, worker, updated_at, attempts, cancel in stale:
            lost = (
                f"its worker {worker} stopped while it ran (last heard of "
                f"{updated_at.isoformat()})"
            )
            values: dict[str, Any]
            if cancel:
                values = {"status": "cancelled", "error": "cancelled", "finished_at": now}
            elif attempts < MAX_ATTEMPTS:
                values = {"status": "queued", "message": f"queued again: {lost}", "worker": None}
            else:
                values = {"status": "failed", "error": lost, "finished_at": now}
            with self.store.transaction() as session:
                changed = session.execute(
                    update(TaskRow)
                    .where(
                        TaskRow.id == task_id,
                        TaskRow.status == "running",
                        TaskRow.updated_at < cutoff,
                    )
                    .values(updated_at=now, **values)
                )
                parent_id = session.scalar(select(TaskRow.parent_id).where(TaskRow.id == task_id))
                if changed.rowcount == 1 and parent_id is not None:  # type: ignore[attr-defined]
                    settle_parent(session, parent_id)
            if changed.rowcount == 1:  # type: ignore[attr-defined]
                (requeued if values["status"] == "queued" else failed).append(task_id)
        return Recovery(requeued=tuple(requeued), failed=tuple(failed))

    def _end(self, task: TaskRecord, *, status: str, **values: Any) -> bool:
        with self.store.transaction() as session:
            return _ended(session, task, status=status, **values)


def _ended(session: Session, task: TaskRecord, *, status: str, **values: Any) -> bool:
    """End the claimed ``task`` with ``status`` in ``session``; ``False`` when the claim was
    lost."""
    now = utc_now()
    ended = session.execute(
        update(TaskRow)
        .where(*_owned(task))
        .values(status=status, finished_at=now, updated_at=now, **values)
    )
    if ended.rowcount != 1:  # type: ignore[attr-defined]
        return False
    if task.parent_id is not None:
        settle_parent(session, task.parent_id)
    return True


def _owned(task: TaskRecord) -> tuple[Any, ...]:
    """The row of ``task`` while it runs under the claim ``task`` records."""
    return (
        TaskRow.id == task.id,
        TaskRow.status == "running",
        TaskRow.worker == task.worker,
        TaskRow.attempts == task.attempts,
    )
