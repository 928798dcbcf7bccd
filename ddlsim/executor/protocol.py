"""The measurement protocol: how long to warm up, when to stop measuring, how to read a ratio.

Every path that measures training (``ddlsim run``, side-by-side comparisons, ``--verify``, the
dataset's runs, ``simulator validate``, the demo, the autotune baseline) goes through
``executor.run``, whose ranks follow this protocol:

- **Placement.** Rank ``r`` is pinned to core ``r % n`` of the ``n`` cores the launcher may use,
  the whole process (its gloo threads and a plan's helper threads share the rank's core), with
  one intra-op thread. Where ranks outnumber cores the sharing is the same in every run (ranks
  ``r`` and ``r + n`` share a core) and recorded (``rank_cores``, ``ranks_per_core``).
- **Allocator.** glibc's malloc keeps what it frees (``profiler.allocator.ALLOCATOR_ENV``):
  without it, every step's large tensors were new ``mmap`` regions whose first touch
  page-faulted, and one launch's median differed from the next's by up to 10 % on one process.
  Kernel profiles are taken under the same setting (``profiler.allocator``).
- **Warm-up** until the step time is stable: at least ``warmup`` steps, then until the median of
  the last ``WARMUP_WINDOW`` steps is within ``WARMUP_TOLERANCE`` of the window before, or
  ``max_warmup`` steps, or half the time budget.
- **Turns** (side by side): each strategy's turn is ``iters`` steps, fewer where its steps are
  slow (about ``TURN_S`` seconds a turn, at least one step; ``turn_steps``), so that a slow
  spell of the machine falls on several turns of every strategy rather than on one long turn
  of one of them.
- **Samples** in turns until the median's 95 % confidence interval is within
  ``±ci_target`` of it for every strategy of the launch, or the time budget (``budget_s`` a
  strategy) or ``max_iters`` is reached; at least ``rounds`` turns (``min_samples``). The
  interval is distribution-free (order statistics of the samples).
- **Ratios** between strategies come from one launch (side by side, turns interleaved in
  shuffled rounds), with a 95 % bootstrap interval that resamples whole rounds; a ratio whose
  interval holds 1.0 is "no measurable difference".

Every rank takes the same decisions: a step's time is the slowest rank's, reduced before each
decision along with the elapsed time.
"""

import dataclasses
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ddlsim.data.errors import InvalidOptionError

WARMUP_WINDOW = 3
WARMUP_TOLERANCE = 0.05
# About how long one strategy's turn lasts side by side: llama-tiny's 0.9 s steps in turns of
# 10 gave 3 or 4 rounds in a 30 s budget, and two copies of one strategy then differed by up to
# 9 % in one launch (benchmarks/noise.py), a slow spell having fallen on one copy's turns.
TURN_S = 2.0
CONFIDENCE = 0.95
# A stop's reason: the interval target met, the time budget spent, the sample cap reached, or
# the minimum counts were all that was asked for (budget 0).
STOP_REASONS = ("interval", "budget", "max_iters")


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class StoppingRule:
    """When a launch's warm-up and measurement end (the protocol in the module docstring).

    ``budget_s`` is the time a strategy may spend beyond its minimum counts; 0 runs exactly the
    minimums (``warmup`` steps, ``min_samples`` samples), which tests use.
    """

    warmup: int = 2
    max_warmup: int = 50
    min_samples: int = 10
    max_iters: int = 2000
    ci_target: float = 0.01
    budget_s: float = 30.0

    def __post_init__(self) -> None:
        for name, low in (("warmup", 0), ("min_samples", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidOptionError(f"{name}({value!r}) must be an integer >= {low}")
        if self.max_warmup < self.warmup:
            raise InvalidOptionError(
                f"max_warmup({self.max_warmup}) must be >= warmup({self.warmup})"
            )
        if self.max_iters < self.min_samples:
            raise InvalidOptionError(
                f"max_iters({self.max_iters}) must be >= the minimum samples({self.min_samples})"
            )
        if not 0 < self.ci_target < 1:
            raise InvalidOptionError(f"ci_target({self.ci_target}) must be in (0, 1), e.g. 0.01")
        if not self.budget_s >= 0 or math.isinf(self.budget_s):
            raise InvalidOptionError(f"budget_s({self.budget_s}) must be a finite number >= 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "StoppingRule":
        return cls(**raw)

    def warmed_up(self, steps_ms: Sequence[float], elapsed_s: float) -> bool:
        """Whether warm-up may end after ``steps_ms`` (the warm-up steps so far, in order)."""
        count = len(steps_ms)
        if count < self.warmup:
            return False
        if count >= self.max_warmup or elapsed_s >= self.budget_s / 2:
            return True
        if count < 2 * WARMUP_WINDOW:
            return False
        last = statistics.median(steps_ms[-WARMUP_WINDOW:])
        before = statistics.median(steps_ms[-2 * WARMUP_WINDOW : -WARMUP_WINDOW])
        return abs(last / before - 1) <= WARMUP_TOLERANCE

    def stop(self, samples_ms: Sequence[Sequence[float]], elapsed_s: float) -> str | None:
        """Why measuring may stop now, or ``None`` to go on.

        Args:
            samples_ms: every strategy's samples so far (one list a strategy).
            elapsed_s: time spent sampling so far, all strategies together.
        """
        if any(len(s) < self.min_samples for s in samples_ms):
            return None
        if all(relative_half_width(s) <= self.ci_target for s in samples_ms):
            return "interval"
        if elapsed_s >= self.budget_s * len(samples_ms):
            return "budget"
        if any(len(s) >= self.max_iters for s in samples_ms):
            return "max_iters"
        return None


def turn_steps(warmup_ms: Sequence[float], iters: int) -> int:
    """Steps a strategy takes a turn side by side: ``iters``, or as many of its steps as last
    about ``TURN_S`` seconds when that is fewer (the median of its last warm-up steps is the
    step time), at least one."""
    if not warmup_ms:
        return iters
    step_ms = statistics.median(warmup_ms[-WARMUP_WINDOW:])
    if step_ms <= 0:
        return iters
    return max(1, min(iters, round(TURN_S * 1e3 / step_ms)))


def median_interval(
    samples: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """A distribution-free ``confidence`` interval of the median: order statistics ``j`` and
    ``n - 1 - j`` (0-based) with the largest ``j`` whose coverage, from the binomial
    distribution of how many samples fall below the median, is still at least ``confidence``.
    Fewer than 6 samples cannot reach 95 %: then the interval is the samples' whole range and
    ``relative_half_width`` says infinity.

    Raises:
        InvalidOptionError: no samples, or ``confidence`` outside (0, 1).
    """
    if not samples:
        raise InvalidOptionError("samples(0): an interval needs at least one")
    if not 0 < confidence < 1:
        raise InvalidOptionError(f"confidence({confidence}) must be in (0, 1)")
    ordered = sorted(samples)
    count = len(ordered)
    j = _order_index(count, confidence)
    if j is None:
        return ordered[0], ordered[-1]
    return ordered[j], ordered[count - 1 - j]


def relative_half_width(samples: Sequence[float], confidence: float = CONFIDENCE) -> float:
    """Half the median's interval over the median (0.01: within ±1 %); infinity when there are
    too few samples for the interval."""
    if not samples or _order_index(len(samples), confidence) is None:
        return math.inf
    low, high = median_interval(samples, confidence)
    middle = statistics.median(samples)
    return (high - low) / 2 / middle if middle > 0 else math.inf


def _order_index(count: int, confidence: float) -> int | None:
    """The largest ``j`` whose order statistics ``j`` and ``count - 1 - j`` hold the median
    with probability ``P(j + 1 <= B <= count - 1 - j) = 1 - 2 P(B <= j) >= confidence``, where
    ``B ~ Binomial(count, 1/2)`` counts the samples below it; ``None`` when even ``j = 0``
    falls short."""
    best = None
    tail = 0.0  # P(B <= j)
    for j in range(count // 2):
        tail += math.exp(_log_binomial_half(count, j))
        if 1 - 2 * tail < confidence:
            break
        best = j
    return best


def _log_binomial_half(count: int, k: int) -> float:
    """log of P(B = k) for B ~ Binomial(count, 1/2)."""
    return (
        math.lgamma(count + 1)
        - math.lgamma(k + 1)
        - math.lgamma(count - k + 1)
        - count * math.log(2)
    )


def ratio_interval(
    numerator_ms: Sequence[float],
    denominator_ms: Sequence[float],
    *,
    numerator_rounds: Sequence[int] | None = None,
    denominator_rounds: Sequence[int] | None = None,
    confidence: float = CONFIDENCE,
    draws: int = 2000,
) -> tuple[float, float]:
    """A bootstrap interval of ``median(numerator_ms) / median(denominator_ms)``.

    With the rounds each sample was taken in (side by side), whole rounds are drawn with
    replacement and both lists keep their samples of the rounds drawn, so that a slow spell
    shared by both stays shared; without them each list is resampled on its own. The seed is
    fixed: the same samples give the same interval.

    Raises:
        InvalidOptionError: an empty list, rounds that do not match their samples, ``draws`` <
            20 or ``confidence`` outside (0, 1).
    """
    if not numerator_ms or not denominator_ms:
        raise InvalidOptionError(
            f"samples({len(numerator_ms)}, {len(denominator_ms)}): both need at least one"
        )
    if draws < 20:
        raise InvalidOptionError(f"draws({draws}) must be >= 20")
    if not 0 < confidence < 1:
        raise InvalidOptionError(f"confidence({confidence}) must be in (0, 1)")
    rng = random.Random(0)
    top, bottom = list(numerator_ms), list(denominator_ms)
    if numerator_rounds is None or denominator_rounds is None:
        ratios = [
            statistics.median(rng.choices(top, k=len(top)))
            / statistics.median(rng.choices(bottom, k=len(bottom)))
            for _ in range(draws)
        ]
    else:
        if len(numerator_rounds) != len(top) or len(denominator_rounds) != len(bottom):
            raise InvalidOptionError(
                f"rounds({len(numerator_rounds)}, {len(denominator_rounds)}) must match "
                f"samples({len(top)}, {len(bottom)})"
            )
        by_round_top = _by_round(top, numerator_rounds)
        by_round_bottom = _by_round(bottom, denominator_rounds)
        shared = sorted(set(by_round_top) & set(by_round_bottom))
        if not shared:
            raise InvalidOptionError("the two sample lists share no round")
        ratios = []
        for _ in range(draws):
            drawn = rng.choices(shared, k=len(shared))
            ratios.append(
                statistics.median([x for r in drawn for x in by_round_top[r]])
                / statistics.median([x for r in drawn for x in by_round_bottom[r]])
            )
    ratios.sort()
    tail = (1 - confidence) / 2
    return ratios[int(tail * draws)], ratios[math.ceil((1 - tail) * draws) - 1]


def _by_round(samples: Sequence[float], rounds: Sequence[int]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for value, round_index in zip(samples, rounds, strict=True):
        out.setdefault(int(round_index), []).append(value)
    return out


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class Speedup:
    """How much faster ``candidate`` ran than ``baseline``: ``ratio`` is baseline's median over
    candidate's (above 1: faster), ``interval`` its 95 % bootstrap interval, ``significant``
    whether the interval leaves out 1.0."""

    ratio: float
    interval: tuple[float, float]

    @property
    def significant(self) -> bool:
        low, high = self.interval
        return not low <= 1.0 <= high

    @property
    def verdict(self) -> str:
        """``faster``, ``slower`` or ``no measurable difference``."""
        if not self.significant:
            return "no measurable difference"
        return "faster" if self.ratio > 1 else "slower"

    def describe(self) -> str:
        """One phrase for a person: the speed-up with its interval, or that there is none."""
        low, high = self.interval
        span = f"95 % interval {low:.3f}-{high:.3f}"
        if not self.significant:
            return f"no measurable difference ({self.ratio:.3f}x, {span})"
        return f"{self.ratio:.3f}x {self.verdict} ({span})"

    def to_json(self) -> dict[str, Any]:
        return {
            "ratio": self.ratio,
            "interval": list(self.interval),
            "significant": self.significant,
            "verdict": self.verdict,
        }


def speedup(
    baseline_ms: Sequence[float],
    candidate_ms: Sequence[float],
    *,
    baseline_rounds: Sequence[int] | None = None,
    candidate_rounds: Sequence[int] | None = None,
) -> Speedup:
    """The candidate's speed-up over the baseline from their samples (side by side: pass the
    rounds, see ``ratio_interval``)."""
    ratio = statistics.median(baseline_ms) / statistics.median(candidate_ms)
    interval = ratio_interval(
        baseline_ms,
        candidate_ms,
        numerator_rounds=baseline_rounds,
        denominator_rounds=candidate_rounds,
    )
    return Speedup(ratio=ratio, interval=interval)


def ranks_per_core(rank_cores: Mapping[int, Sequence[int]]) -> dict[int, list[int]]:
    """Which ranks each core hosted (a rank allowed on several cores is listed on each)."""
    out: dict[int, list[int]] = {}
    for rank, cores in sorted(rank_cores.items()):
        for core in cores:
            out.setdefault(int(core), []).append(int(rank))
    return dict(sorted(out.items()))
