"""How fast this machine computes right now: one fixed unit of work, timed.

A shared VM does not keep one speed: the same kernel profile took 49.5 ms one day and 69 to
81 ms on the next evening (``ddlsim/data/datasets/README.md``). A run replayed from kernels
profiled at another speed is priced at that speed, so every kernel profile and every measured
launch records the probe's time beside its own; :func:`simulator.dataset.speed_ratio` turns
the two into the factor by which a run's compute ran slower than its profile's.

The unit is what a small model's step is made of, single-threaded as a rank computes: a
matrix product (256 x 256 by 256 x 1024, float32), GELU and layer norm over its output, and a
softmax over rows, about 4 ms. A sample runs ``units`` of them back to back (about 30 ms, longer
than the slices a scheduler shares a core in: a single unit mostly fits between another
process's slices and sees the full core, where a model's step sees its share of it); the
probe is the median sample's time a unit.
"""

import statistics
import time

import torch

from ddlsim.data.errors import InvalidOptionError

# the probe's shapes: rows x inner @ inner x cols
_ROWS, _INNER, _COLS = 256, 256, 1024


def probe_ms(repeats: int = 5, units: int = 8) -> float:
    """One unit of work's time on one thread (ms): the median of ``repeats`` samples of
    ``units`` units each.

    Raises:
        InvalidOptionError: ``repeats`` or ``units`` below 1.
    """
    if repeats < 1 or units < 1:
        raise InvalidOptionError(f"repeats({repeats}) and units({units}) must be >= 1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        a = torch.randn(_ROWS, _INNER, generator=generator)
        b = torch.randn(_INNER, _COLS, generator=generator)
        with torch.no_grad():
            _unit(a, b)  # first touch outside the timing
            times = []
            for _ in range(repeats):
                begin = time.perf_counter()
                for _ in range(units):
                    _unit(a, b)
                times.append((time.perf_counter() - begin) * 1e3 / units)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times)


def _unit(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x = torch.nn.functional.gelu(a @ b)
    x = torch.nn.functional.layer_norm(x, (x.shape[-1],))
    return torch.softmax(x, dim=-1)
