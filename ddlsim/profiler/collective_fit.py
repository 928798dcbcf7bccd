"""Collective samples and their latency-bandwidth fit.

Vocabulary and sizes follow nccl-tests: a sample's size is the tensor's total bytes (for
reduce-scatter and all-gather the full, gathered buffer; for send/recv what each rank sends),
``algbw = size / time`` and ``busbw = algbw * factor`` with the factor of a ring algorithm,
which makes busbw comparable with the link rate whatever the collective and world size:

==============  ============
all_reduce      2 (n - 1) / n
reduce_scatter  (n - 1) / n
all_gather      (n - 1) / n
broadcast       1
sendrecv        1
==============  ============

Bandwidths are in Gbit/s (``busbw_gbps = 1.0`` is the line rate of a ``1gbit`` link), times in
microseconds. The fit per collective is ``time_us = alpha_us + factor * bytes / busbw``, by
least squares on the medians in two steps: the slope by ordinary least squares (the large
messages set the bandwidth), then alpha by least relative error (the small messages set it).
"""

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ddlsim.data.comm_model import LinkFit, bus_factor, fit_cpu_cost
from ddlsim.data.errors import InvalidOptionError


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveSample:
    """One collective at one size: statistics over ``repeats`` timed runs (``times_us``), each
    the slowest rank's time."""

    collective: str
    size_bytes: int
    time_us_median: float
    time_us_p10: float
    time_us_p90: float
    algbw_gbps: float
    busbw_gbps: float
    repeats: int
    times_us: tuple[float, ...] = ()
    # The compute the collective took from its rank, per CPU repeat (us; empty: not measured)
    stolen_us: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveFit(LinkFit):
    """``time_us = alpha_us + factor * bytes / busbw`` for one collective, world size and link,
    measured on ``backend``; ``busbw_gbps`` is ``inf`` when time did not grow with size."""

    backend: str


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveProfile:
    """Fits and raw samples of one profiling run, with where it ran: ``network`` is ``netns``
    (shaped links) or ``loopback`` (no shaping); ``rank_cores`` the cores each rank could use
    and ``rank_last_core`` the one it last ran on."""

    fits: tuple[CollectiveFit, ...]
    samples: tuple[CollectiveSample, ...]
    network: str
    backend: str
    world_size: int
    bandwidth: str
    rank_cores: dict[int, list[int]]
    rank_last_core: dict[int, int] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def fit(self, collective: str) -> CollectiveFit:
        """The fit of ``collective``.

        Raises:
            InvalidOptionError: when the profile has no fit for it.
        """
        for fit in self.fits:
            if fit.collective == collective:
                return fit
        have = ", ".join(f.collective for f in self.fits)
        raise InvalidOptionError(f"no fit for collective {collective!r}; profiled: {have}")

    def to_json_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``busbw_gbps = inf`` becomes ``null``."""
        return {
            "fits": [
                {**dataclasses.asdict(fit), "busbw_gbps": _finite_or_none(fit.busbw_gbps)}
                for fit in self.fits
            ],
            "samples": [
                {
                    **dataclasses.asdict(sample),
                    "times_us": list(sample.times_us),
                    "stolen_us": list(sample.stolen_us),
                }
                for sample in self.samples
            ],
            "network": self.network,
            "backend": self.backend,
            "world_size": self.world_size,
            "bandwidth": self.bandwidth,
            "rank_cores": {str(rank): cores for rank, cores in self.rank_cores.items()},
            "rank_last_core": {str(rank): core for rank, core in self.rank_last_core.items()},
            "notes": list(self.notes),
        }

    @classmethod
    def from_json_dict(cls, raw: Mapping[str, Any]) -> "CollectiveProfile":
        """The inverse of ``to_json_dict``."""
        fits = tuple(
            CollectiveFit(
                **{
                    **fit,
                    "busbw_gbps": math.inf if fit["busbw_gbps"] is None else fit["busbw_gbps"],
                }
            )
            for fit in raw["fits"]
        )
        samples = tuple(
            CollectiveSample(
                **{
                    **sample,
                    "times_us": tuple(sample.get("times_us", ())),
                    "stolen_us": tuple(sample.get("stolen_us", ())),
                }
            )
            for sample in raw["samples"]
        )
        return cls(
            fits=fits,
            samples=samples,
            network=raw["network"],
            backend=raw["backend"],
            world_size=raw["world_size"],
            bandwidth=raw["bandwidth"],
            rank_cores={int(rank): list(cores) for rank, cores in raw["rank_cores"].items()},
            rank_last_core={int(r): int(c) for r, c in raw.get("rank_last_core", {}).items()},
            notes=tuple(raw.get("notes", ())),
        )


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def make_sample(
    collective: str,
    size_bytes: int,
    times_us: Sequence[float],
    *,
    world_size: int,
    stolen_us: Sequence[float] = (),
) -> CollectiveSample:
    """Statistics of one collective at one size from its per-repeat times (microseconds) and
    the compute it took from its rank in each CPU repeat, where measured."""
    times = sorted(float(t) for t in times_us)
    median = statistics.median(times)
    if len(times) >= 2:
        deciles = statistics.quantiles(times, n=10, method="inclusive")
        p10, p90 = deciles[0], deciles[-1]
    else:
        p10 = p90 = median
    algbw_gbps = size_bytes * 8e-3 / median if median > 0 else math.inf
    return CollectiveSample(
        collective=collective,
        size_bytes=size_bytes,
        time_us_median=median,
        time_us_p10=p10,
        time_us_p90=p90,
        algbw_gbps=algbw_gbps,
        busbw_gbps=algbw_gbps * bus_factor(collective, world_size),
        repeats=len(times),
        times_us=tuple(float(t) for t in times_us),
        stolen_us=tuple(float(t) for t in stolen_us),
    )


def expected_us(sample: CollectiveSample) -> float:
    """What one such collective costs on average: the mean of its repeats after dropping the
    highest and lowest tenth (one each way from five repeats; none below five), else the
    median."""
    times = sorted(sample.times_us)
    if len(times) < 5:
        return sample.time_us_median
    trim = max(1, len(times) // 10)
    return statistics.fmean(times[trim : len(times) - trim])


def fit_latency_bandwidth(
    samples: Sequence[CollectiveSample],
    *,
    world_size: int,
    backend: str = "gloo",
    bandwidth: str = "none",
    burst_bytes: int = 0,
) -> CollectiveFit:
    """Fit ``time_us = alpha_us + factor * bytes / busbw`` to the medians of one collective.

    Two least-squares steps, so that large messages determine the bandwidth and small ones the
    latency: the slope (``1 / busbw``) by ordinary least squares, which the largest messages
    dominate; then, for that slope, the alpha of least relative error (weights
    ``1 / time^2``), which the smallest messages dominate, kept >= 0. A single weighted fit
    let the small messages' scheduling noise on a busy 2-core machine (medians of 4-8 ms at
    4-64 KiB with 4 ranks) tilt the slope to 1.1 Gbit/s on a 1 Gbit/s link; this split gives
    0.95, what the large messages show. Exact data is recovered exactly. ``r2`` is the plain
    coefficient of determination of the fitted times against the medians; ``busbw_gbps`` is
    ``inf`` when time does not grow with size.

    The latency is what a collective costs on average (:func:`expected_us`: the trimmed mean
    of its repeats), not its median: a step of many small buckets pays the sum of their
    latencies, and on this 2-core machine a small collective's repeats fall in two modes (about
    0.3-0.7 ms, and 3-5 ms when the ranks' threads wait for a core), so the median jumps
    between them from one profile to the next (alphas of 0.2 and 2.0 ms from two profiles of
    one link) while the mean holds. The bandwidth stays fitted on medians.

    ``burst_bytes`` is what the shaped link lets through at line rate after an idle moment (its
    token bucket, :func:`ddlsim.data.specs.cluster.burst_bytes`): a message below it
    costs its latency alone, and one above it a burst's wire time less than its bytes say.
    The times are fitted as ``alpha_us + slope * max(0, factor * bytes - burst_bytes)``;
    fitted without the burst, a 64 KiB message looks faster than the link and the alpha came
    out clamped to 0, so that a partition of many small buckets was priced as if each one
    were free to start. The fit prices every collective as if the bucket were empty, as it is
    for the back-to-back collectives of a training step's buckets.

    Raises:
        InvalidOptionError: with no samples, samples of several collectives, fewer than two
            distinct sizes, or a non-positive time.

    Long: each step of the fit (slope, latency, burst, the CPU's share) takes the previous one's
    result; they read in order.
    """
    if not samples:
        raise InvalidOptionError("fit_latency_bandwidth needs samples, got none")
    kinds = sorted({s.collective for s in samples})
    if len(kinds) != 1:
        raise InvalidOptionError(f"samples mix collectives {kinds}; fit one collective at a time")
    collective = kinds[0]
    factor = bus_factor(collective, world_size)
    if len({s.size_bytes for s in samples}) < 2:
        raise InvalidOptionError(
            f"fitting {collective} needs at least 2 distinct sizes, got "
            f"{sorted({s.size_bytes for s in samples})}"
        )
    bad = [s.time_us_median for s in samples if not s.time_us_median > 0]
    if bad:
        raise InvalidOptionError(f"sample times must be > 0 us, got {bad}")
    if burst_bytes < 0:
        raise InvalidOptionError(f"burst_bytes({burst_bytes}) must be >= 0")
    # The bytes each rank sends beyond the link's burst (all of them on an unshaped link);
    # the bandwidth is fitted on the messages larger than the burst when two sizes are.
    x_all = [max(0.0, factor * s.size_bytes - burst_bytes) for s in samples]
    y_all = [s.time_us_median for s in samples]
    mean_all = [expected_us(s) for s in samples]
    shaped = [(xi, yi) for xi, yi in zip(x_all, y_all, strict=True) if xi > 0]
    if len({xi for xi, _ in shaped}) < 2:
        shaped = list(zip(x_all, y_all, strict=True))
    x = [xi for xi, _ in shaped]
    y = [yi for _, yi in shaped]
    # Bandwidth: ordinary least squares, which the largest messages dominate.
    x_mean, y_mean = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((xi - x_mean) ** 2 for xi in x)
    slope = sum((xi - x_mean) * (yi - y_mean) for xi, yi in zip(x, y, strict=True)) / sxx
    slope = max(slope, 0.0)
    # Latency: given the slope, the alpha of least relative error (weights 1 / time^2) over
    # every size's mean, which the smallest messages dominate.
    weights = [1.0 / yi**2 for yi in mean_all]
    alpha = sum(
        w * (yi - slope * xi) for w, xi, yi in zip(weights, x_all, mean_all, strict=True)
    ) / sum(weights)
    alpha = max(alpha, 0.0)
    predicted = [alpha + slope * xi for xi in x_all]
    mean = statistics.fmean(y_all)
    ss_tot = sum((yi - mean) ** 2 for yi in y_all)
    ss_res = sum((yi - pi) ** 2 for yi, pi in zip(y_all, predicted, strict=True))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    # slope is microseconds per byte: bytes/us * 8 bits / 1e3 = Gbit/s.
    busbw_gbps = 8e-3 / slope if slope > 0 else math.inf
    cpu_alpha_us, cpu_us_per_byte = fit_cpu_cost(
        (s.size_bytes, statistics.median(s.stolen_us)) for s in samples if s.stolen_us
    )
    return CollectiveFit(
        collective=collective,
        backend=backend,
        world_size=world_size,
        bandwidth=bandwidth,
        alpha_us=alpha,
        busbw_gbps=busbw_gbps,
        r2=r2,
        cpu_alpha_us=cpu_alpha_us,
        cpu_us_per_byte=cpu_us_per_byte,
    )
