"""The Horovod-style autotune baseline: it measures DDP's default cap first, then lets a Gaussian
process propose caps, and finds the best cap of a measured curve within its budget."""

import math

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.search.autotune import autotune_fusion


def test_autotune_finds_the_best_cap_of_a_measured_curve() -> None:
    seen: list[float] = []

    def measure(strategy: Strategy) -> float:
        # a valley around 2 MB on a log scale, as slow links give
        cap = strategy.tensor_fusion.bucket_cap_mb
        seen.append(cap)
        return 100.0 + 10.0 * (math.log(cap) - math.log(2.0)) ** 2

    result = autotune_fusion(measure, total_grad_mb=100.0, budget=12, time_limit_s=60, seed=0)
    assert seen[0] == pytest.approx(25.0)  # DDP's default first: the baseline
    assert result.evaluations == len(set(seen)) <= 12
    assert result.baseline_ms == pytest.approx(measure(Strategy()))
    assert result.best_ms == min(result.curve) and result.best_ms < result.baseline_ms
    assert abs(math.log(result.best.tensor_fusion.bucket_cap_mb / 2.0)) < 0.7
    assert list(result.curve) == sorted(result.curve, reverse=True)


def test_autotune_needs_a_budget() -> None:
    with pytest.raises(InvalidOptionError, match=r"budget\(0\)"):
        autotune_fusion(lambda s: 1.0, total_grad_mb=1.0, budget=0, time_limit_s=1)
