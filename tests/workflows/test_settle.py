"""The answer of the verifying runs: the fastest of the candidates measured faster than DDP's
defaults beyond the noise, DDP's defaults when none is."""

import random
import statistics
from types import SimpleNamespace
from typing import Any

from ddlsim.workflows.verify import _settle


def _run(median: float, spread: float, seed: int, count: int = 40) -> Any:
    rng = random.Random(seed)
    samples = [median + rng.uniform(-spread, spread) for _ in range(count)]
    return SimpleNamespace(
        median_ms=statistics.median(samples),
        samples_ms=samples,
        sample_rounds=[i * 4 // count for i in range(count)],
        ci95_ms=(median - spread / 4, median + spread / 4),
    )


def _named(*names: str) -> dict[str, dict[str, Any]]:
    return {name: {"strategy": {"parallel": {"tp": i + 1}}} for i, name in enumerate(names)}


def test_a_measurably_faster_candidate_is_not_hidden_by_a_noisier_faster_one() -> None:
    named = _named("baseline", "best", "top 2")
    keys = {name: name for name in named}
    runs = {
        "baseline": _run(100.0, 1.0, 0),
        "best": _run(95.0, 40.0, 1, count=6),  # the fastest median, an interval across 1
        "top 2": _run(97.0, 1.0, 2),  # a little slower, measurably faster than the baseline
    }
    out = _settle(named, keys, runs)
    assert out["fastest_candidate"]["name"] == "best"
    low, high = out["fastest_candidate"]["speedup_interval"]
    assert low < 1 < high
    assert out["best"] == named["top 2"] and out["scored_best"] == named["best"]
    assert out["speedup_interval"][0] > 1 and not out.get("kept_baseline")
    assert out["answer"].startswith("picked ") and "the fastest measurably faster" in out["answer"]


def test_none_measurably_faster_keeps_ddps_defaults() -> None:
    named = _named("baseline", "best", "top 2")
    keys = {name: name for name in named}
    runs = {
        "baseline": _run(100.0, 1.0, 0),
        "best": _run(99.0, 40.0, 1, count=6),
        "top 2": _run(104.0, 1.0, 2),  # measurably slower
    }
    out = _settle(named, keys, runs)
    assert out["kept_baseline"] and out["best"] == named["baseline"] and out["speedup"] == 1.0
    assert out["answer"].startswith("kept DDP's defaults")
