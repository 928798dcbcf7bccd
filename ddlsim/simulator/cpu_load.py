"""The compute a rank loses to its gloo collectives in flight, which the replays charge beside
their compute streams."""

# The most of a rank's core a collective in flight is taken to use: where its measured compute
# exceeds its own duration the collective is CPU-bound, and the rank's compute still advances
# between its steps.
MAX_CPU_SHARE = 0.9


class CpuLoad:
    """The compute a rank loses to its collectives in flight, after their measured CPU cost
    (:meth:`data.comm_model.AlphaBeta.cpu_us`).

    gloo reduces, copies and moves a collective's bytes on the rank's own cores, beside its
    compute: while a collective runs from ``start`` to ``end`` and takes ``cpu_ms`` of compute,
    the rank's compute advances at ``1 - cpu_ms / (end - start)`` of its rate. Collectives on
    one stream do not overlap, so the load is a sequence of disjoint intervals, added in start
    order; compute that runs outside them, or a collective no compute overlaps, loses nothing.
    """

    __slots__ = ("_intervals", "_next")

    def __init__(self) -> None:
        self._intervals: list[tuple[float, float, float]] = []  # (start, end, share)
        self._next = 0  # the first interval that may still end after the last query's start

    def add(self, start_ms: float, end_ms: float, cpu_ms: float) -> None:
        """A collective in flight from ``start_ms`` to ``end_ms`` taking ``cpu_ms`` of compute
        (starts must not decrease from one call to the next)."""
        if end_ms > start_ms and cpu_ms > 0:
            share = min(MAX_CPU_SHARE, cpu_ms / (end_ms - start_ms))
            self._intervals.append((start_ms, end_ms, share))

    def finish(self, start_ms: float, work_ms: float) -> float:
        """When ``work_ms`` of compute started at ``start_ms`` ends."""
        intervals = self._intervals
        # no load, no work, or every collective over before it starts
        if not intervals or work_ms <= 0 or intervals[-1][1] <= start_ms:
            return start_ms + work_ms
        count = len(intervals)
        i = self._next
        if i > 0 and start_ms < intervals[i - 1][1]:
            i = 0  # earlier than the last query: search from the first
        while i < count and intervals[i][1] <= start_ms:
            i += 1
        self._next = i
        clock, left = start_ms, work_ms
        while left > 0:
            if i == count:
                return clock + left
            begin, end, share = intervals[i]
            if clock < begin:  # a gap at the full rate
                if clock + left <= begin:
                    return clock + left
                left -= begin - clock
                clock = begin
            rate = 1.0 - share
            if clock + left / rate <= end:
                return clock + left / rate
            left -= (end - clock) * rate
            clock = end
            i += 1
        return clock
