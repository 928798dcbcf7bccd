"""The simulator's accuracy figures on a dataset, per plan kind and world size: the numbers that
make a prediction worth acting on, computed without measuring anything.

For every run of a dataset (and of its sessions, each replayed from its own profiles) and each
cost model asked for, a row of figures per ``kind|world_size`` (``all|N`` and ``all|*`` pool):

- ``median_error``: the median of ``predicted / measured - 1`` (negative: predicted too fast);
- ``mape``: the mean of its absolute value;
- ``pair_accuracy``: of the pairs of runs in one launch (one model on one cluster) whose
  measured times differ by more than :data:`simulator.evaluate.PAIR_MARGIN`, at least one of
  the row's kind, the share the prediction orders right (``None`` without such a pair);
- ``speedup_median``, ``speedup_p90``: ``|predicted speed-up / measured speed-up - 1|`` over
  DDP's defaults measured in the same launch, what a search acts on (``None`` without a run
  beside a reference).

The figures are deterministic for a given dataset, code and checkpoint: a test holds them
against the ones recorded beside it (``tests/simulator/accuracy_figures.json``), so a change
to the replay, the fits or the calibration cannot move them unseen.
"""

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from ddlsim.simulator.cost_model import CostModel
from ddlsim.simulator.dataset import Dataset
from ddlsim.simulator.evaluate import PAIR_MARGIN, quantile
from ddlsim.simulator.features import StrategySample
from ddlsim.simulator.train import build_training_set


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class KindFigures:
    """One cost model's figures on the runs of one plan kind at one world size."""

    runs: int
    median_error: float
    mape: float
    pair_accuracy: float | None
    pairs: int
    speedup_median: float | None
    speedup_p90: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            name: round(value, 4) if isinstance(value, float) else value
            for name, value in dataclasses.asdict(self).items()
        }


def accuracy_figures(
    dataset: Dataset, cost_models: Mapping[str, CostModel]
) -> dict[str, dict[str, KindFigures]]:
    """Each of ``cost_models``' figures on every run of ``dataset``, by ``kind|world_size``.

    Returns:
        ``{name: {"kind|N": figures, ..., "all|N": ..., "all|*": ...}}`` for each cost model.
    """
    training = build_training_set(dataset)
    samples = training.samples
    return {
        name: _figures(samples, model.predict_samples(training.graphs, samples))
        for name, model in cost_models.items()
    }


def _figures(
    samples: Sequence[StrategySample], predicted: Sequence[float]
) -> dict[str, KindFigures]:
    errors: dict[str, list[float]] = defaultdict(list)
    for sample, value in zip(samples, predicted, strict=True):
        assert sample.measured_ms is not None
        for key in _keys(sample):
            errors[key].append(value / sample.measured_ms - 1)
    pairs = _pairs(samples, predicted)
    speedups = _speedups(samples, predicted)
    out = {}
    for key in sorted(errors, key=lambda k: (k.startswith("all|"), k)):
        values = errors[key]
        right, counted = pairs.get(key, (0, 0))
        gains = sorted(speedups.get(key, []))
        out[key] = KindFigures(
            runs=len(values),
            median_error=statistics.median(values),
            mape=statistics.fmean(abs(v) for v in values),
            pair_accuracy=right / counted if counted else None,
            pairs=counted,
            speedup_median=statistics.median(gains) if gains else None,
            speedup_p90=quantile(gains, 0.9) if gains else None,
        )
    return out


def _world(sample: StrategySample) -> str:
    return sample.group.split("|")[1]


def _keys(sample: StrategySample) -> tuple[str, ...]:
    world = _world(sample)
    return (f"{sample.kind}|{world}", f"all|{world}", "all|*")


def _pairs(
    samples: Sequence[StrategySample], predicted: Sequence[float]
) -> dict[str, tuple[int, int]]:
    """``(right, counted)`` pairs by key: a pair counts for each kind of its two runs."""
    members: dict[str, list[int]] = defaultdict(list)
    for i, sample in enumerate(samples):
        members[sample.group].append(i)
    right: dict[str, int] = defaultdict(int)
    counted: dict[str, int] = defaultdict(int)
    for rows in members.values():
        for a_index, a in enumerate(rows):
            for b in rows[a_index + 1 :]:
                ma, mb = samples[a].measured_ms, samples[b].measured_ms
                assert ma is not None and mb is not None
                if abs(ma - mb) <= PAIR_MARGIN * min(ma, mb):
                    continue
                ordered = (ma - mb) * (predicted[a] - predicted[b]) > 0
                keys = set(_keys(samples[a])) | set(_keys(samples[b]))
                for key in keys:
                    counted[key] += 1
                    right[key] += ordered
    return {key: (right[key], counted[key]) for key in counted}


def _speedups(
    samples: Sequence[StrategySample], predicted: Sequence[float]
) -> dict[str, list[float]]:
    references = {s.group: i for i, s in enumerate(samples) if s.reference}
    out: dict[str, list[float]] = defaultdict(list)
    for i, sample in enumerate(samples):
        ref = references.get(sample.group)
        if ref is None or ref == i:
            continue
        measured_ref, measured = samples[ref].measured_ms, sample.measured_ms
        assert measured_ref is not None and measured is not None
        error = abs((predicted[ref] / predicted[i]) / (measured_ref / measured) - 1)
        for key in _keys(sample):
            out[key].append(error)
    return out


# How far a recorded figure may move before it counts as changed: well above the last digits
# that differ between hosts (GNN inference on AVX2 and AVX-512 agrees to about 1e-6), well
# below what a worsened replay term moves (a term left out moves a kind by 0.05 or more).
MARGINS: dict[str, float] = {
    "median_error": 0.01,
    "mape": 0.01,
    "pair_accuracy": 0.03,
    "speedup_median": 0.01,
    "speedup_p90": 0.02,
}


def compare_figures(
    recorded: Mapping[str, Mapping[str, Any]],
    current: Mapping[str, KindFigures],
    *,
    margins: Mapping[str, float] = MARGINS,
) -> list[str]:
    """What moved beyond its margin between ``recorded`` (``{"kind|N": figures as JSON}``) and
    ``current``, a line each naming the kind, the figure, both values and whether it is worse
    (further from 0, or a lower pair accuracy) or better; empty when nothing moved. A kind
    recorded and now missing, or new and not recorded, is a line too."""
    lines = []
    for key in sorted(set(recorded) | set(current)):
        if key not in current:
            lines.append(f"{key}: recorded, now missing (its runs no longer replay)")
            continue
        if key not in recorded:
            lines.append(f"{key}: new, not recorded ({current[key].runs} runs)")
            continue
        now = current[key].to_json()
        if now["runs"] != recorded[key]["runs"]:
            lines.append(f"{key}: {recorded[key]['runs']} runs recorded, {now['runs']} now")
        for name, margin in margins.items():
            before, after = recorded[key].get(name), now[name]
            if before is None or after is None:
                if before != after:
                    lines.append(f"{key} {name}: recorded {before}, now {after}")
                continue
            if abs(after - before) <= margin:
                continue
            worse = after < before if name == "pair_accuracy" else abs(after) > abs(before)
            verdict = "worse" if worse else "better"
            lines.append(
                f"{key} {name}: recorded {before:+.4f}, now {after:+.4f} ({verdict} by more "
                f"than {margin})"
            )
    return lines
