"""The latency-bandwidth (alpha-beta) model of a collective, shared by profiler and simulator.

Following nccl-tests, a collective over ``size`` bytes that takes ``time`` has an algorithm
bandwidth ``size / time`` and a bus bandwidth ``busbw = algbw * factor``, where ``factor`` is what
a ring algorithm moves per rank relative to ``size``. The profiler fits
``time_us = alpha_us + factor * bytes / busbw`` to measured samples; the simulator evaluates it.
"""

import dataclasses
import functools
import statistics
from collections.abc import Iterable

from ddlsim.data.errors import InvalidOptionError

COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "sendrecv",
    "ring_reduce_scatter",
    "ring_all_gather",
    "all_to_all",
)


@functools.cache
def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' busbw factor of ``collective`` on ``world_size`` ranks.

    Raises:
        InvalidOptionError: for an unknown collective.
    """
    n = world_size
    factors = {
        "all_reduce": 2 * (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_gather": (n - 1) / n,
        "broadcast": 1.0,
        "sendrecv": 1.0,
        "ring_reduce_scatter": (n - 1) / n,
        "ring_all_gather": (n - 1) / n,
        # Each rank keeps 1/n of its buffer and sends the rest, a share to every other rank.
        "all_to_all": (n - 1) / n,
    }
    if collective not in factors:
        raise InvalidOptionError(
            f"collective {collective!r} is not supported; allowed: {', '.join(COLLECTIVES)}"
        )
    return factors[collective]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AlphaBeta:
    """``time_us = alpha_us + factor(collective, world_size) * bytes / busbw``.

    ``busbw_gbps`` is in Gbit/s (``inf``: time does not grow with size). ``world_size`` is the
    number of ranks the collective spans. ``cpu_us`` is the compute the collective takes from
    each rank while in flight (:class:`LinkFit`); 0 where not measured.
    """

    collective: str
    world_size: int
    alpha_us: float
    busbw_gbps: float
    cpu_alpha_us: float = 0.0
    cpu_us_per_byte: float = 0.0

    def __post_init__(self) -> None:
        bus_factor(self.collective, self.world_size)  # refuses unknown collectives
        if self.world_size < 1:
            raise InvalidOptionError(f"world_size({self.world_size}) must be >= 1")
        if not self.busbw_gbps > 0 or self.alpha_us < 0:
            raise InvalidOptionError(
                f"busbw_gbps({self.busbw_gbps}) must be > 0 and alpha_us({self.alpha_us}) >= 0"
            )

    def time_us(self, nbytes: int) -> float:
        """Predicted duration of one collective over ``nbytes`` bytes (0 on a single rank)."""
        if self.world_size == 1 or nbytes <= 0:
            return 0.0
        factor = bus_factor(self.collective, self.world_size)
        # Gbit/s -> bytes/us: 1e9 / 8 / 1e6 = 125.
        return self.alpha_us + factor * nbytes / (self.busbw_gbps * 125.0)

    def terms(self) -> tuple[float, float, float, float, float]:
        """``(alpha_us, factor, bytes_per_us, cpu_alpha_us, cpu_us_per_byte)``, from which a
        caller pricing many sizes in a loop computes :meth:`time_us` (``alpha_us + factor *
        nbytes / bytes_per_us``) and :meth:`cpu_us` itself, for ``nbytes > 0``: all zero on
        one rank."""
        if self.world_size == 1:
            return 0.0, 0.0, 1.0, 0.0, 0.0
        factor = bus_factor(self.collective, self.world_size)
        return (
            self.alpha_us,
            factor,
            self.busbw_gbps * 125.0,
            self.cpu_alpha_us,
            self.cpu_us_per_byte,
        )

    def cpu_us(self, nbytes: int) -> float:
        """The compute one collective over ``nbytes`` takes from each rank (0 on one rank)."""
        if self.world_size == 1 or nbytes <= 0:
            return 0.0
        return self.cpu_alpha_us + self.cpu_us_per_byte * nbytes


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LinkFit:
    """A collective's fitted latency-bandwidth model on one cluster setting: ``world_size``
    ranks on links of ``bandwidth`` (``"1gbit"``, ``"none"``), ``r2`` the fit's quality.
    ``cpu_alpha_us + cpu_us_per_byte * bytes`` is the compute one such collective takes from
    each rank while it is in flight (gloo's reductions, copies and socket work on the rank's
    cores), measured beside it; both 0 where it was not measured.

    Unlike :class:`AlphaBeta` it checks nothing: ``busbw_gbps`` is ``inf`` when time did not grow
    with size, and a fit whose bandwidth is not positive is the caller's to skip.
    """

    collective: str
    world_size: int
    bandwidth: str
    alpha_us: float
    busbw_gbps: float
    r2: float
    cpu_alpha_us: float = 0.0
    cpu_us_per_byte: float = 0.0


def fit_cpu_cost(points: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """``(cpu_alpha_us, cpu_us_per_byte)`` of ``stolen_us = alpha + per_byte * bytes`` over
    ``(bytes, stolen_us)`` points (one a message size, the median of its repeats), by ordinary
    least squares, both kept >= 0; ``(0, 0)`` with fewer than two distinct sizes."""
    pairs = [(float(x), float(y)) for x, y in points]
    if len({x for x, _ in pairs}) < 2:
        return 0.0, 0.0
    x_mean = statistics.fmean(x for x, _ in pairs)
    y_mean = statistics.fmean(y for _, y in pairs)
    sxx = sum((x - x_mean) ** 2 for x, _ in pairs)
    slope = max(0.0, sum((x - x_mean) * (y - y_mean) for x, y in pairs) / sxx)
    return max(0.0, y_mean - slope * x_mean), slope
