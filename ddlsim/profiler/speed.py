"""How fast this machine computes right now: one fixed unit of work, timed.

A shared VM does not keep one speed: the same kernel profile took 49.5 ms one day and 69 to
81 ms on the next evening (``ddlsim/data/datasets/README.md``). A run replayed from kernels
profiled at another speed is priced at that speed, so every kernel profile and every measured
launch records the probe's time beside its own; :func:`simulator.dataset.speed_ratio` turns
the two into the factor by which a run's compute ran slower than its profile's.

The unit is what a small model's step is made of, single-threaded as a rank computes: a
matrix product (256 x 256 by 256 x 1024, float32), GELU and layer norm over its output, and a
softmax over rows; ``repeats`` units, the median kept.
"""

import statistics
import time

import torch

from ddlsim.data.errors import InvalidOptionError

# the probe's shapes: rows x inner @ inner x cols
_ROWS, _INNER, _COLS = 256, 256, 1024


def probe_ms(repeats: int = 7) -> float:
    """The median time of one unit of work on one thread (ms).

    Raises:
        InvalidOptionError: ``repeats < 1``.
    """
    if repeats < 1:
        raise InvalidOptionError(f"repeats({repeats}) must be >= 1")
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
                _unit(a, b)
                times.append((time.perf_counter() - begin) * 1e3)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times)


def _unit(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x = torch.nn.functional.gelu(a @ b)
    x = torch.nn.functional.layer_norm(x, (x.shape[-1],))
    return torch.softmax(x, dim=-1)
