"""What a replay returns: the iteration's time and where it went, and its timeline (each op,
collective and bubble on its stream, which the dashboard draws and Perfetto opens)."""

import dataclasses
from collections.abc import Iterable
from typing import Any, ClassVar

from ddlsim.data.errors import DdlsimError


class UnsupportedPlanError(DdlsimError, ValueError):
    """The replay cannot (yet) schedule this parallel plan."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """One node of one iteration on the timeline (times in ms from the first iteration)."""

    node: int
    iteration: int
    micro_batch: int
    stream: str
    name: str
    start_ms: float
    end_ms: float

    @classmethod
    def span(cls, stream: str, name: str, start_ms: float, end_ms: float) -> "Event":
        """An event not tied to one graph node (a stage's step, a group's collective)."""
        return cls(
            node=-1,
            iteration=0,
            micro_batch=0,
            stream=stream,
            name=name,
            start_ms=start_ms,
            end_ms=end_ms,
        )


class IterationTimes:
    """Where an iteration's time went, as the replays report it (no state of its own).

    A subclass (a dataclass) holds the four times; ``breakdown`` names them in the order the
    predictions print and store them (``BREAKDOWN``).
    """

    BREAKDOWN: ClassVar[tuple[str, ...]] = (
        "compute_ms",
        "exposed_comm_ms",
        "bubble_ms",
        "comm_ms",
    )
    __slots__ = ()
    compute_ms: float
    exposed_comm_ms: float
    bubble_ms: float
    comm_ms: float

    def breakdown(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.BREAKDOWN}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ReplayResult(IterationTimes):
    """The steady-state iteration and the timeline of the iteration it was read from.

    ``compute_ms`` is the compute stream's busy time in that iteration, ``exposed_comm_ms`` the
    rest of the iteration (the compute stream waiting for communication), ``comm_ms`` the comm
    stream's busy time (overlapped or not); ``bubble_ms`` is pipeline idle time (0 without a
    pipeline; see :mod:`simulator.pipeline`, whose streams are one per stage).
    """

    iteration_time_ms: float
    compute_ms: float
    exposed_comm_ms: float
    comm_ms: float
    bubble_ms: float
    timeline: tuple[Event, ...]

    @classmethod
    def overlapped(
        cls,
        *,
        iteration_time_ms: float,
        compute_ms: float,
        comm_ms: float,
        events: Iterable[Event],
    ) -> "ReplayResult":
        """An iteration of one compute and one comm stream (no pipeline, so no bubble).

        The part of the iteration the compute stream is not busy is exposed communication; the
        timeline is ``events`` ordered by start time, then stream.
        """
        return cls(
            iteration_time_ms=iteration_time_ms,
            compute_ms=compute_ms,
            exposed_comm_ms=max(0.0, iteration_time_ms - compute_ms),
            comm_ms=comm_ms,
            bubble_ms=0.0,
            timeline=tuple(sorted(events, key=lambda e: (e.start_ms, e.stream))),
        )

    def chrome_trace(self) -> dict[str, Any]:
        """The timeline as a Chrome trace (``chrome://tracing``, Perfetto): one thread a stream."""
        streams = sorted({e.stream for e in self.timeline} | {"compute", "comm"})
        tids = {stream: i + 1 for i, stream in enumerate(streams)}
        events: list[dict[str, Any]] = [
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": stream}}
            for stream, tid in tids.items()
        ]
        for e in self.timeline:
            events.append(
                {
                    "name": e.name,
                    "ph": "X",
                    "pid": 0,
                    "tid": tids[e.stream],
                    "ts": e.start_ms * 1e3,
                    "dur": (e.end_ms - e.start_ms) * 1e3,
                    "args": {"node": e.node, "micro_batch": e.micro_batch},
                }
            )
        return {"traceEvents": events, "displayTimeUnit": "ms"}
