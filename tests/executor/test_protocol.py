"""The measurement protocol's rules, on samples made up here (no process is started)."""

import math
import re
import statistics

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.executor.protocol import (
    Speedup,
    StoppingRule,
    median_interval,
    ranks_per_core,
    ratio_interval,
    relative_half_width,
    speedup,
    turn_steps,
)
from ddlsim.service.output import verification_lines


def steps(count: int, scale: float = 1.0) -> list[float]:
    """``count`` step times spread over 100-110 ms (times ``scale``), in no sorted order."""
    return [scale * (100.0 + (i * 37) % 11) for i in range(count)]


def test_median_interval_takes_the_order_statistics_of_95_percent() -> None:
    values = [float(v) for v in range(1, 21)]  # 20 samples: the 6th and 15th
    assert median_interval(values) == (6.0, 15.0)
    assert median_interval([float(v) for v in range(1, 11)]) == (2.0, 9.0)
    # Under 6 samples no pair of order statistics covers 95 %.
    assert median_interval([1.0, 2.0, 3.0]) == (1.0, 3.0)
    assert math.isinf(relative_half_width([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert relative_half_width([100.0] * 6) == 0.0
    with pytest.raises(InvalidOptionError, match=re.escape("samples(0)")):
        median_interval([])


def test_the_interval_narrows_as_samples_accumulate() -> None:
    assert relative_half_width(steps(400)) < relative_half_width(steps(40))


def test_stopping_rule_waits_for_the_minimum_then_the_interval() -> None:
    rule = StoppingRule(min_samples=10, ci_target=0.01, budget_s=30)
    assert rule.stop([[100.0] * 9], elapsed_s=100) is None  # under the minimum
    assert rule.stop([[100.0] * 10], elapsed_s=0) == "interval"
    # Wide samples: go on until the budget, which grows with the strategies side by side.
    wide = [50.0, 150.0] * 10
    assert rule.stop([wide], elapsed_s=29) is None
    assert rule.stop([wide], elapsed_s=30) == "budget"
    assert rule.stop([wide, [100.0] * 20], elapsed_s=59) is None
    assert rule.stop([wide, [100.0] * 20], elapsed_s=60) == "budget"
    # Every strategy must meet the target, not one.
    assert rule.stop([[100.0] * 20, wide], elapsed_s=1) is None
    capped = StoppingRule(min_samples=10, max_iters=20, budget_s=30)
    assert capped.stop([wide], elapsed_s=1) == "max_iters"


def test_warm_up_ends_when_the_step_time_is_stable() -> None:
    rule = StoppingRule(warmup=2, max_warmup=20, budget_s=30)
    assert not rule.warmed_up([300.0], elapsed_s=0)  # under the minimum
    falling = [300.0, 200.0, 150.0, 120.0, 110.0, 105.0]
    assert not rule.warmed_up(falling, elapsed_s=1)  # still 30 % down from the window before
    assert not rule.warmed_up([*falling, 101.0, 100.0, 102.0], elapsed_s=1)  # 8 % down
    assert rule.warmed_up([*falling, 101.0, 100.0, 102.0, 103.0, 101.0, 102.0], elapsed_s=1)
    assert rule.warmed_up([300.0, 100.0] * 10, elapsed_s=1)  # max_warmup
    assert rule.warmed_up([300.0, 100.0], elapsed_s=15)  # half the budget
    assert StoppingRule(warmup=0, budget_s=0).warmed_up([], elapsed_s=0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ci_target": 0.0}, "ci_target(0.0) must be in (0, 1)"),
        ({"budget_s": -1.0}, "budget_s(-1.0) must be a finite number >= 0"),
        ({"budget_s": math.inf}, "budget_s(inf) must be a finite number >= 0"),
        ({"warmup": 5, "max_warmup": 4}, "max_warmup(4) must be >= warmup(5)"),
        ({"min_samples": 0}, "min_samples(0) must be an integer >= 1"),
        ({"min_samples": 10, "max_iters": 5}, "max_iters(5) must be >= the minimum samples(10)"),
    ],
)
def test_bad_settings_are_named(settings: dict, message: str) -> None:
    with pytest.raises(InvalidOptionError, match=re.escape(message)):
        StoppingRule(**settings)


def test_ratio_interval_brackets_the_ratio_of_medians() -> None:
    slow, fast = steps(40), steps(40, 0.9)
    low, high = ratio_interval(slow, fast)
    assert low < statistics.median(slow) / statistics.median(fast) < high
    assert low > 1.0  # 10 % apart with 5 % of spread: clearly faster
    assert ratio_interval(slow, fast) == (low, high)  # a fixed seed
    wide = ratio_interval(steps(8), steps(8, 0.9))
    assert wide[1] - wide[0] > high - low  # fewer steps, less sure
    for bad, expect in (
        (lambda: ratio_interval([], fast), "samples(0, 40)"),
        (lambda: ratio_interval(slow, fast, draws=5), "draws(5) must be >= 20"),
        (
            lambda: ratio_interval(slow, fast, numerator_rounds=[0], denominator_rounds=[0]),
            "rounds(1, 1) must match samples(40, 40)",
        ),
    ):
        with pytest.raises(InvalidOptionError, match=re.escape(expect)):
            bad()


def test_rounds_keep_a_shared_slow_spell_out_of_the_ratio() -> None:
    # Two strategies 5 % apart, side by side; every other round the machine is 30 % slower
    # for both. Drawing whole rounds keeps each spell on both sides: a narrower interval.
    spell = [1.0 + 0.3 * (i % 2) for i in range(10)]
    base = [100.0 * spell[r] + (i % 3) for r in range(10) for i in range(5)]
    fast = [95.0 * spell[r] + (i % 3) for r in range(10) for i in range(5)]
    rounds = [r for r in range(10) for _ in range(5)]
    paired = ratio_interval(base, fast, numerator_rounds=rounds, denominator_rounds=rounds)
    apart = ratio_interval(base, fast)
    assert paired[1] - paired[0] < apart[1] - apart[0]
    assert paired[0] > 1.0


def test_a_ratio_whose_interval_holds_one_is_no_measurable_difference() -> None:
    same = speedup(steps(30), steps(30))
    assert same.interval[0] <= 1.0 <= same.interval[1]
    assert not same.significant
    assert same.verdict == "no measurable difference"
    assert same.describe().startswith("no measurable difference")
    assert "faster" not in same.describe() and "slower" not in same.describe()
    faster = speedup(steps(40), steps(40, 0.8))
    assert faster.significant and faster.verdict == "faster" and faster.ratio > 1.2
    assert "x faster" in faster.describe()
    slower = Speedup(ratio=0.9, interval=(0.85, 0.95))
    assert slower.verdict == "slower"
    assert slower.to_json()["significant"] is True


def test_verification_lines_say_plainly_what_was_measured() -> None:
    kept = {
        "kept_baseline": True,
        "measured_best_ms": 80.0,
        "measured_best_ci95_ms": [79.0, 81.0],
        "measured_baseline_ms": 80.0,
        "measured_baseline_ci95_ms": [79.0, 81.0],
        "answer": "kept DDP's defaults: the fastest of 3 candidates, ...",
    }
    lines = verification_lines(kept)
    assert lines == ["DDP's defaults 80.0 ms (95 % interval 79.0-81.0 ms)", kept["answer"]]
    picked = {**kept, "kept_baseline": False, "measured_best_ms": 70.0, "answer": "picked x"}
    lines = verification_lines(picked)
    assert lines[0].startswith("pick 70.0 ms (95 % interval 79.0-81.0 ms), DDP's defaults 80.0")
    assert lines[-1] == "picked x"
    assert verification_lines({"measured_best_ms": None, "measured_baseline_ms": None}) == [
        "pick not run, DDP's defaults not run"
    ]


def test_ranks_per_core_lists_who_shared_a_core() -> None:
    assert ranks_per_core({0: [0], 1: [1], 2: [0], 3: [1]}) == {0: [0, 2], 1: [1, 3]}


def test_slow_steps_take_shorter_turns() -> None:
    assert turn_steps([50.0, 40.0, 40.0, 40.0], 10) == 10  # 50 steps would fill 2 s: capped
    assert turn_steps([900.0, 880.0, 910.0], 10) == 2  # about 2 s of 0.9 s steps
    assert turn_steps([5000.0, 4000.0, 4500.0], 10) == 1  # never fewer than one
    assert turn_steps([], 7) == 7  # no warm-up to read the step time from
