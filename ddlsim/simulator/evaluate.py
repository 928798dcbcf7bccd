"""How well predicted iteration times match measured ones: error and ranking metrics.

Search trusts a simulator for its ranking more than for its absolute times, so besides the
absolute percentage error the metrics ask whether strategies come out in the right order:
Kendall's tau over all pairs, and ``pair_accuracy`` over the pairs whose measured times differ
by more than ``PAIR_MARGIN`` (closer pairs are within measurement noise and not counted).
"""

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from ddlsim.data.errors import InvalidOptionError

# Pairs closer than this are not counted: the measurement protocol puts one strategy against
# itself within 0.8 % (median) and 2 % (p90) side by side (BENCHMARKS.md, noise floor).
PAIR_MARGIN = 0.03


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Accuracy:
    mape: float
    p90_ape: float
    kendall_tau: float
    pair_accuracy: float | None
    pairs_counted: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def accuracy(predicted: Sequence[float], measured: Sequence[float]) -> Accuracy:
    """Errors of ``predicted`` against ``measured`` (same order, same units, all positive).

    ``pair_accuracy`` is ``None`` when no pair differs by more than the margin.

    Raises:
        InvalidOptionError: lengths differ, fewer than two values, or a measured time <= 0.
    """
    if len(predicted) != len(measured) or len(measured) < 2:
        raise InvalidOptionError(
            f"need two or more paired times, got {len(predicted)} predicted and "
            f"{len(measured)} measured"
        )
    if min(measured) <= 0:
        raise InvalidOptionError(f"measured times must be > 0, got {min(measured)}")
    errors = sorted(abs(p - m) / m for p, m in zip(predicted, measured, strict=True))
    concordant = discordant = 0
    right = counted = 0
    n = len(measured)
    for i in range(n):
        for j in range(i + 1, n):
            dm = measured[i] - measured[j]
            dp = predicted[i] - predicted[j]
            if dm * dp > 0:
                concordant += 1
            elif dm * dp < 0:
                discordant += 1
            if abs(dm) > PAIR_MARGIN * min(measured[i], measured[j]):
                counted += 1
                right += dm * dp > 0
    pairs = n * (n - 1) // 2
    return Accuracy(
        mape=statistics.fmean(errors),
        p90_ape=quantile(errors, 0.9),
        kendall_tau=(concordant - discordant) / pairs,
        pair_accuracy=right / counted if counted else None,
        pairs_counted=counted,
    )


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of the sorted ``ordered``, interpolated linearly."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def grouped_accuracy(
    predicted: Sequence[float], measured: Sequence[float], groups: Sequence[str]
) -> Accuracy:
    """Errors over all rows; ranking only within groups (one model on one cluster), where
    search compares strategies: ``kendall_tau`` is the mean over groups of two or more rows,
    ``pair_accuracy`` pools the counted pairs of every group.

    Raises:
        InvalidOptionError: lengths differ, fewer than two rows, or a measured time <= 0.
    """
    overall = accuracy(predicted, measured)
    if len(groups) != len(measured):
        raise InvalidOptionError(f"{len(groups)} groups for {len(measured)} rows")
    members: dict[str, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    taus = []
    right = counted = 0
    for rows in members.values():
        if len(rows) < 2:
            continue
        part = accuracy([predicted[i] for i in rows], [measured[i] for i in rows])
        taus.append(part.kendall_tau)
        if part.pair_accuracy is not None:
            right += round(part.pair_accuracy * part.pairs_counted)
            counted += part.pairs_counted
    return Accuracy(
        mape=overall.mape,
        p90_ape=overall.p90_ape,
        kendall_tau=statistics.fmean(taus) if taus else float("nan"),
        pair_accuracy=right / counted if counted else None,
        pairs_counted=counted,
    )
