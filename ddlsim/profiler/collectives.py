"""Collective microbenchmarks on an emulated cluster and their latency-bandwidth fit.

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

What is measured is what ``torch.distributed`` does, not what a collective ideally costs: on
gloo (torch 2.13) ``reduce_scatter_tensor`` runs a full all-reduce internally, so its busbw
comes out at about half the link's, and ``broadcast`` sends the whole buffer from the root to
each other rank (busbw about the link's / (n - 1)); the profile says so in ``notes``. Measured
at 1gbit, 4 ranks, 4 KiB-256 MiB: all_reduce 0.95, reduce_scatter 0.40, all_gather 0.83,
broadcast 0.32, sendrecv 0.91 Gbit/s busbw.
"""

import dataclasses
import json
import math
import re
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ddlsim.data.comm_model import COLLECTIVES, bus_factor
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.cluster import BACKENDS, parse_bandwidth_gbps
from ddlsim.profiler.cluster import EmulatedCluster

RANK_MODULE = "ddlsim.profiler.collective_rank"

_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_DEFAULT_RANGE_FACTOR = 4


class InvalidSizesError(InvalidOptionError):
    """A message-size list or range cannot be parsed."""


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


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveFit:
    """``time_us = alpha_us + factor * bytes / busbw`` for one collective, backend, world size
    and link; ``busbw_gbps`` is ``inf`` when time did not grow with size."""

    collective: str
    backend: str
    world_size: int
    bandwidth: str
    alpha_us: float
    busbw_gbps: float
    r2: float


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
                {**dataclasses.asdict(sample), "times_us": list(sample.times_us)}
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
            CollectiveSample(**{**sample, "times_us": tuple(sample.get("times_us", ()))})
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


def default_sizes() -> list[int]:
    """Powers of 4 from 4 KiB to 256 MiB (9 sizes)."""
    return [4 * 1024 * 4**i for i in range(9)]


def _parse_one_size(text: str, whole: str) -> int:
    match = _SIZE.match(text)
    if match is None:
        raise InvalidSizesError(
            f"size {text.strip()!r} in {whole!r} is not a size; allowed: a byte count with an "
            "optional unit k/m/g (binary: 4k = 4KiB = 4KB = 4096), e.g. '4KiB,1MiB,64MiB' or "
            "a range '4k:256m' (x4 steps) or '4k:256m:2'"
        )
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value < 1 or value != int(value):
        raise InvalidSizesError(
            f"size {text.strip()!r} in {whole!r} must be a whole number of bytes >= 1"
        )
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """Message sizes from text: a comma-separated list of sizes and ranges, sorted and unique.

    A size is a byte count with an optional binary unit (``4096``, ``4k``, ``4KiB``, ``1.5m``;
    k/KB/KiB all mean 1024, as in nccl-tests). A range ``START:END[:FACTOR]`` is START, START *
    FACTOR, ... up to END (FACTOR defaults to 4): ``4k:256m`` is the default set.

    Raises:
        InvalidSizesError: naming the part that is not a size or range.
    """
    sizes: set[int] = set()
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise InvalidSizesError(f"sizes {text!r} is empty; allowed: e.g. '4KiB,1MiB' or '4k:256m'")
    for item in items:
        parts = item.split(":")
        if len(parts) == 1:
            sizes.add(_parse_one_size(parts[0], text))
            continue
        if len(parts) > 3:
            raise InvalidSizesError(
                f"range {item.strip()!r} in {text!r} has {len(parts)} parts; allowed: "
                "START:END or START:END:FACTOR"
            )
        start, end = _parse_one_size(parts[0], text), _parse_one_size(parts[1], text)
        factor_text = parts[2].strip() if len(parts) == 3 else str(_DEFAULT_RANGE_FACTOR)
        if not factor_text.isdigit() or int(factor_text) < 2:
            raise InvalidSizesError(
                f"range factor {factor_text!r} in {item.strip()!r} must be an integer >= 2"
            )
        if start > end:
            raise InvalidSizesError(
                f"range {item.strip()!r} in {text!r} starts above its end ({start} > {end})"
            )
        size = start
        while size <= end:
            sizes.add(size)
            size *= int(factor_text)
    return sorted(sizes)


def make_sample(
    collective: str, size_bytes: int, times_us: Sequence[float], *, world_size: int
) -> CollectiveSample:
    """Statistics of one collective at one size from its per-repeat times (microseconds)."""
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
    )


def fit_latency_bandwidth(
    samples: Sequence[CollectiveSample],
    *,
    world_size: int,
    backend: str = "gloo",
    bandwidth: str = "none",
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

    Raises:
        InvalidOptionError: with no samples, samples of several collectives, fewer than two
            distinct sizes, or a non-positive time.
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
    x = [factor * s.size_bytes for s in samples]
    y = [s.time_us_median for s in samples]
    # Bandwidth: ordinary least squares, which the largest messages dominate.
    x_mean, y_mean = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((xi - x_mean) ** 2 for xi in x)
    slope = sum((xi - x_mean) * (yi - y_mean) for xi, yi in zip(x, y, strict=True)) / sxx
    slope = max(slope, 0.0)
    # Latency: given the slope, the alpha of least relative error (weights 1 / time^2), which
    # the smallest messages dominate.
    weights = [1.0 / yi**2 for yi in y]
    alpha = sum(w * (yi - slope * xi) for w, xi, yi in zip(weights, x, y, strict=True)) / sum(
        weights
    )
    alpha = max(alpha, 0.0)
    predicted = [alpha + slope * xi for xi in x]
    mean = statistics.fmean(y)
    ss_tot = sum((yi - mean) ** 2 for yi in y)
    ss_res = sum((yi - pi) ** 2 for yi, pi in zip(y, predicted, strict=True))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    # slope is microseconds per byte: bytes/us * 8 bits / 1e3 = Gbit/s.
    busbw_gbps = 8e-3 / slope if slope > 0 else math.inf
    return CollectiveFit(
        collective=collective,
        backend=backend,
        world_size=world_size,
        bandwidth=bandwidth,
        alpha_us=alpha,
        busbw_gbps=busbw_gbps,
        r2=r2,
    )


def _check_options(
    *,
    world_size: int,
    backend: str,
    sizes: Sequence[int],
    collectives: Sequence[str],
    warmup: int,
    repeats: int,
    timeout_s: float,
) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise InvalidOptionError(
            f"world_size({world_size!r}) is not supported; allowed: an integer >= 2"
        )
    if backend not in BACKENDS:
        raise InvalidOptionError(
            f"backend {backend!r} is not supported; allowed: {', '.join(BACKENDS)}"
        )
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise InvalidOptionError(
                "backend 'nccl' needs CUDA, which is not available here; use backend 'gloo'"
            )
        if torch.cuda.device_count() < world_size:
            raise InvalidOptionError(
                f"backend 'nccl' needs one CUDA device per rank: world_size({world_size}) > "
                f"{torch.cuda.device_count()} devices"
            )
    unknown = [c for c in collectives if c not in COLLECTIVES]
    if unknown or not collectives:
        raise InvalidOptionError(
            f"collectives {list(collectives)} are not supported; allowed: a non-empty subset "
            f"of {', '.join(COLLECTIVES)}"
        )
    bad_sizes = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or s < 1]
    if bad_sizes or not sizes:
        raise InvalidSizesError(
            f"sizes {list(sizes)} are not usable; allowed: integers >= 1 (bytes), at least one"
        )
    if warmup < 0:
        raise InvalidOptionError(f"warmup({warmup}) must be >= 0")
    if repeats < 1:
        raise InvalidOptionError(f"repeats({repeats}) must be >= 1")
    if not timeout_s > 0:
        raise InvalidOptionError(f"timeout_s({timeout_s}) must be > 0")


def profile_collectives(
    *,
    world_size: int,
    backend: str = "gloo",
    bandwidth: str | None = "1gbit",
    sizes: Sequence[int] | None = None,
    collectives: Sequence[str] = COLLECTIVES,
    warmup: int = 2,
    repeats: int = 5,
    timeout_s: float = 600,
    progress: Callable[[str], None] | None = None,
) -> CollectiveProfile:
    """Benchmark ``collectives`` over ``sizes`` on an emulated cluster and fit each.

    Starts ``world_size`` ranks (one namespace each, links shaped to ``bandwidth``; loopback
    with a warning where namespaces are unavailable), runs ``warmup`` untimed and ``repeats``
    timed iterations per collective and size, and fits the medians (a collective needs two
    distinct sizes to be fitted; otherwise ``notes`` says so). ``progress`` receives one
    line per finished size. ``sizes`` defaults to ``default_sizes()``; each is rounded down to
    whole float32 elements (and a multiple of the world size for reduce-scatter and
    all-gather), and samples report the size used.

    Raises:
        InvalidOptionError: a bad world size, backend, collective, size list, count or timeout
            (``InvalidSizesError`` for sizes), before any process starts.
        InvalidClusterError: ``bandwidth`` is not a rate.
        ClusterRunError: a rank failed or the run passed ``timeout_s``.
    """
    size_list = list(default_sizes() if sizes is None else sizes)
    collective_list = list(collectives)
    _check_options(
        world_size=world_size,
        backend=backend,
        sizes=size_list,
        collectives=collective_list,
        warmup=warmup,
        repeats=repeats,
        timeout_s=timeout_s,
    )
    parse_bandwidth_gbps("none" if bandwidth is None else bandwidth)
    env: dict[str, str] = {}
    if backend == "nccl":
        # Only the network transport crosses the shaped links; P2P and shared memory would not.
        env = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket"}
    with tempfile.TemporaryDirectory(prefix="ddlsim-collectives-") as tmp:
        output = Path(tmp) / "collectives.json"
        args = [
            "--output",
            str(output),
            "--backend",
            backend,
            "--collectives",
            ",".join(collective_list),
            "--sizes",
            ",".join(str(s) for s in size_list),
            "--warmup",
            str(warmup),
            "--repeats",
            str(repeats),
            "--timeout-s",
            str(timeout_s),
        ]
        with EmulatedCluster(world_size, bandwidth) as cluster:
            result = cluster.launch(
                RANK_MODULE,
                args,
                env,
                timeout_s=timeout_s,
                output_paths=[output],
                stdout_callback=progress,
            )
            link = cluster.bandwidth
        raw = json.loads(output.read_text(encoding="utf-8"))
    samples = tuple(
        make_sample(s["collective"], s["size_bytes"], s["times_us"], world_size=world_size)
        for s in raw["samples"]
    )
    fits = []
    notes = []
    for collective in collective_list:
        mine = [s for s in samples if s.collective == collective]
        if len({s.size_bytes for s in mine}) < 2:
            notes.append(f"no fit for {collective}: it needs at least 2 distinct sizes")
            continue
        fits.append(
            fit_latency_bandwidth(mine, world_size=world_size, backend=backend, bandwidth=link)
        )
    if result.network == "loopback":
        notes.append(f"loopback fallback: bandwidth {link!r} was not enforced")
    if backend == "gloo" and "reduce_scatter" in collective_list:
        notes.append(
            "gloo's reduce_scatter_tensor runs a full all-reduce internally: its busbw "
            "(factor (n-1)/n) is about half the link's"
        )
    if backend == "gloo" and "broadcast" in collective_list and world_size > 2:
        notes.append(
            "gloo's broadcast sends the whole buffer from the root to each other rank: its "
            "busbw (factor 1) is about the link's / (n-1)"
        )
    return CollectiveProfile(
        fits=tuple(fits),
        samples=samples,
        network=result.network,
        backend=backend,
        world_size=world_size,
        bandwidth=link,
        rank_cores=result.rank_cores,
        rank_last_core=result.last_cores,
        notes=tuple(notes),
    )
