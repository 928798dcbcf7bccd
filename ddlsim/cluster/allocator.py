"""The memory allocator every timed training step runs under: glibc's malloc keeping what it
frees, so that a step's large tensors reuse the heap instead of new ``mmap`` regions.

With glibc's defaults an allocation above the dynamic ``mmap`` threshold (at most 32 MiB) gets a
region of its own, returned to the system when freed; the next step's tensor of the same size
page-faults on every first touch. The executor's ranks start with ``ALLOCATOR_ENV`` (read by
glibc at process start) and never pay it; a kernel profile taken in a process without it paid
it on every large tensor: models with a tensor of 32 MiB or more (an LM head's logits:
bert-tiny's at batch 16 are 238 MiB) profiled 1.24-1.41x slower than the ranks ran them
(``benchmarks/allocator.py``). :func:`use_rank_allocator` gives a running process the same
setting through ``mallopt``, which takes a C ``int``: in-process the thresholds are 2 GiB, the
largest it accepts, instead of the environment's 4 and 64 GiB.
"""

import ctypes
import ctypes.util
import functools
from collections.abc import Mapping

# glibc malloc tunables: serve every allocation below 4 GiB from the heap, never give freed
# memory back to the system (the next step reuses it without page faults).
ALLOCATOR_ENV: Mapping[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": str(4 * 2**30),
    "MALLOC_TRIM_THRESHOLD_": str(64 * 2**30),
    "MALLOC_TOP_PAD_": str(256 * 2**20),
}

# mallopt's parameters (malloc.h) and the largest value its int takes
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_INT_MAX = 2**31 - 1
_SETTINGS = (
    (_M_MMAP_THRESHOLD, min(int(ALLOCATOR_ENV["MALLOC_MMAP_THRESHOLD_"]), _INT_MAX)),
    (_M_TRIM_THRESHOLD, min(int(ALLOCATOR_ENV["MALLOC_TRIM_THRESHOLD_"]), _INT_MAX)),
    (_M_TOP_PAD, min(int(ALLOCATOR_ENV["MALLOC_TOP_PAD_"]), _INT_MAX)),
)


@functools.cache
def use_rank_allocator() -> bool:
    """Give this process the ranks' allocator setting (once; it lasts as long as the process:
    freed heap up to 2 GiB is kept for reuse, as a rank keeps it). ``False`` where the C
    library has no ``mallopt`` or refuses a value (not glibc): the process keeps its own."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in _SETTINGS)
