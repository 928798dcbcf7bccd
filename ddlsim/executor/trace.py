"""A rank's step traced for the run's timeline: one more step after the measured ones, under
``torch.profiler`` on the recording rank, whose top-level events the dashboard draws beside the
replayed timeline."""

from typing import Any

import torch


def synchronize(device: torch.device) -> None:
    """Wait for the device: CUDA work is asynchronous, and a step's time ends when its kernels
    have."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


TRACE_MIN_US = 20.0
TRACE_MAX_EVENTS = 4000


def traced_step(trainer: Any, device: torch.device, *, record: bool) -> list[dict[str, Any]]:
    """Run one step; on the recording rank under ``torch.profiler``, whose top-level events of
    each thread come back as ``{name, lane, start_ms, end_ms}`` from the step's start (lane 0 is
    the training thread, the busiest; events under ``TRACE_MIN_US`` are left out)."""
    synchronize(device)
    if not record:
        trainer.step()
        synchronize(device)
        return []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        trainer.step()
        synchronize(device)
    top = [
        e
        for e in prof.events()
        if e.cpu_parent is None and e.time_range.elapsed_us() >= TRACE_MIN_US
    ]
    if not top:
        return []
    busy: dict[int, float] = {}
    for e in top:
        busy[e.thread] = busy.get(e.thread, 0.0) + e.time_range.elapsed_us()
    lanes = {tid: lane for lane, tid in enumerate(sorted(busy, key=lambda t: -busy[t]))}
    top = sorted(top, key=lambda e: -e.time_range.elapsed_us())[:TRACE_MAX_EVENTS]
    origin = min(e.time_range.start for e in top)
    return sorted(
        (
            {
                "name": e.name,
                "lane": lanes[e.thread],
                "start_ms": (e.time_range.start - origin) / 1e3,
                "end_ms": (e.time_range.end - origin) / 1e3,
            }
            for e in top
        ),
        key=lambda row: (row["lane"], row["start_ms"]),
    )
