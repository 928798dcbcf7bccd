"""Runs of tasks in the queue: a parent task (a profiling run) over one child task a job.

The parent is never claimed; every change of a child (claimed, ended, queued again, cancelled)
brings it up to date in the same transaction (:func:`settle_parent`), children locked before
their parent on every path, so that a run's cancel and its jobs' ends never deadlock.
"""

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.store.records import TaskRecord
from ddlsim.data.store.schema import TaskRow, utc_now

ENDED = ("done", "failed", "cancelled")


def new_row(kind: str, request: Mapping[str, Any], *, gpus: int, cluster: str | None) -> TaskRow:
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise InvalidOptionError(f"gpus({gpus!r}) must be an integer >= 0")
    now = utc_now()
    needs = []
    if gpus:
        needs.append(f"{gpus} CUDA GPU(s) (ddlsim worker --devices cuda:{gpus})")
    if cluster:
        needs.append(f"cluster {cluster!r} (ddlsim worker --cluster {cluster})")
    return TaskRow(
        kind=kind,
        status="queued",
        request=dict(request),
        progress=0.0,
        message=f"waits for a worker with {' and '.join(needs)}" if needs else None,
        cancel_requested=False,
        attempts=0,
        gpus=gpus,
        cluster=cluster,
        children=0,
        created_at=now,
        updated_at=now,
    )


def queued(session: Session, task_id: int) -> bool:
    return session.scalar(select(TaskRow.status).where(TaskRow.id == task_id)) == "queued"


def settle_parent(session: Session, parent_id: int) -> None:
    """Bring a run's parent up to date with its children (in the caller's transaction, the one
    that changed a child): running once one runs, ended once all have, with their results."""
    parent = session.get(TaskRow, parent_id, with_for_update=True, populate_existing=True)
    if parent is None or parent.status in ENDED:
        return
    # Read after the lock: a child ended concurrently has committed by now.
    statuses = dict(
        session.execute(
            select(TaskRow.status, func.count())
            .where(TaskRow.parent_id == parent_id)
            .group_by(TaskRow.status)
        ).all()
    )
    total = sum(statuses.values())
    ended = sum(statuses.get(s, 0) for s in ENDED)
    now = utc_now()
    parent.progress = ended / total if total else 1.0
    parent.message = (
        f"{ended} of {total} jobs ended ({statuses.get('running', 0)} running, "
        f"{statuses.get('queued', 0)} queued)"
    )
    parent.updated_at = now
    if statuses.get("running") and parent.status == "queued":
        parent.status, parent.started_at = "running", now
    if ended < total:
        return
    outcome: dict[str, Any] = {"jobs": total, "done": [], "skipped": [], "failed": []}
    children = session.scalars(
        select(TaskRow).where(TaskRow.parent_id == parent_id).order_by(TaskRow.id)
    )
    for child in children:
        result = child.result or {}
        for key in ("done", "skipped", "failed"):
            outcome[key].extend(result.get(key, []))
        if child.status != "done":
            outcome["failed"].append(
                {"key": f"task {child.id}", "error": child.error or child.status}
            )
    parent.result = outcome
    parent.status = "cancelled" if parent.cancel_requested else "done"
    if parent.cancel_requested:
        parent.error = "cancelled on request"
    parent.finished_at = now
    parent.started_at = parent.started_at or now


def cancel_run(session: Session, parent_id: int, now: datetime) -> TaskRecord:
    """Cancel a run: its queued children at once, its running ones at their next report.
    Its children are locked first (by id), then the run itself."""
    children = list(
        session.scalars(
            select(TaskRow)
            .where(TaskRow.parent_id == parent_id)
            .order_by(TaskRow.id)
            .with_for_update()
        )
    )
    parent = session.get(TaskRow, parent_id, with_for_update=True, populate_existing=True)
    assert parent is not None
    if parent.status not in ENDED:
        parent.cancel_requested = True
        for child in children:
            if child.status == "queued":
                child.status, child.error = "cancelled", "cancelled on request"
                child.finished_at = child.updated_at = now
            elif child.status == "running":
                child.cancel_requested = True
        session.flush()
        settle_parent(session, parent_id)
    return parent.to_record()
