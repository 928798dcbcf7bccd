"""A CPU rank's peak memory as its allocator reports it.

On a GPU, ``torch.cuda.max_memory_allocated`` is the caching allocator's own peak of live
tensors. The CPU allocator keeps no such statistic, but it reports every allocation and free to
``torch.profiler`` (``profile_memory``): their running sum, from a start before the rank builds
anything, is the bytes of live tensors at every moment, and its maximum the peak. That is what
the memory model predicts (weights, gradients, optimizer state, buffers, activations); a
resident-set size also counts the interpreter, the libraries and freed pages the C library keeps.
"""

import contextlib
from collections.abc import Iterator

from torch.profiler import ProfilerActivity, profile

# Steps of every strategy run under the profile: the first builds the optimizer's state and the
# buckets, the second is a step in its steady state.
MEMORY_STEPS = 2


class AllocatorPeak:
    """The peak live bytes seen while :meth:`watch` was open (0 before)."""

    def __init__(self) -> None:
        self.peak_bytes = 0

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            yield
        events = sorted(
            (event.start_ns(), event.nbytes())
            for event in prof.profiler.kineto_results.events()
            if event.name() == "[memory]"
        )
        running = peak = 0
        for _, nbytes in events:
            running += nbytes
            peak = max(peak, running)
        self.peak_bytes = peak
