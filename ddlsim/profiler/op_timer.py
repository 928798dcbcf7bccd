"""One op timed call by call within a budget: what the per-op GPU benchmarks
(``benchmarks/gpu_ops.py``) measure each case with."""

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


class OutOfBudgetError(Exception):
    """The timer's budget is spent: the case was not run."""


class Timer:
    """Times ``fn`` call by call after ``warmup`` calls: CUDA events around each call on a GPU
    (the device's time, launch queueing excluded), wall time on the CPU; as many calls as fit
    in ``case_s`` (at least 3, at most ``max_calls``), until the budget's deadline."""

    def __init__(self, device: torch.device, budget_s: float, case_s: float) -> None:
        self.device = device
        self.deadline = time.monotonic() + budget_s
        self.case_s = case_s
        self.cuda = device.type == "cuda"

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def time(self, fn: Callable[[], Any], warmup: int = 2, max_calls: int = 30) -> dict[str, Any]:
        """The median and quartiles of ``fn``'s calls (ms) and how many were timed.

        Raises:
            OutOfBudgetError: the deadline has passed (nothing was run).
        """
        if time.monotonic() > self.deadline:
            raise OutOfBudgetError
        for _ in range(warmup):
            fn()
        self._sync()
        samples: list[float] = []
        started = time.monotonic()
        while len(samples) < max_calls:
            if self.cuda:
                begin = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                begin.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(begin.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1e3)
            if len(samples) >= 3 and time.monotonic() - started > self.case_s:
                break
        samples.sort()
        n = len(samples)
        return {
            "median_ms": statistics.median(samples),
            "p25_ms": samples[n // 4],
            "p75_ms": samples[(3 * n) // 4],
            "calls": n,
        }
