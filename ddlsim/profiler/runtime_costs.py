"""The cost of one copy pass over a buffer on this machine, what the replay charges a runtime's
gradient copies (:mod:`simulator.runtime`).

One thread, as a rank computes: a buffer of each size is copied into another (one read and one
write of every byte) ``repeats`` times, and ``time_us = alpha_us + us_per_byte * bytes`` is
fitted to the medians by least squares.
"""

import statistics
import time
from collections.abc import Sequence

import torch

from ddlsim.data.comm_model import fit_cpu_cost
from ddlsim.data.errors import InvalidOptionError

MIB = 1024 * 1024
DEFAULT_SIZES: tuple[int, ...] = (256 * 1024, MIB, 4 * MIB, 16 * MIB, 64 * MIB)


def measure_copy(
    sizes: Sequence[int] = DEFAULT_SIZES, *, repeats: int = 9
) -> tuple[float, float, dict[int, float]]:
    """``(alpha_us, us_per_byte, median_us by size)`` of one float32 copy pass.

    Raises:
        InvalidOptionError: fewer than two distinct sizes, a size below 4 bytes, or
            ``repeats < 1``.
    """
    if len(set(sizes)) < 2 or min(sizes) < 4 or repeats < 1:
        raise InvalidOptionError(
            f"sizes({list(sizes)}) need two distinct values >= 4 bytes and repeats({repeats}) >= 1"
        )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        medians = {}
        for size in sizes:
            source = torch.ones(size // 4)
            target = torch.empty_like(source)
            target.copy_(source)  # first touch outside the timing
            times = []
            for _ in range(repeats):
                begin = time.perf_counter()
                target.copy_(source)
                times.append((time.perf_counter() - begin) * 1e6)
            medians[size] = statistics.median(times)
    finally:
        torch.set_num_threads(threads)
    alpha, per_byte = fit_cpu_cost(medians.items())
    return alpha, per_byte, medians
