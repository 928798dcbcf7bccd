"""Held-out evaluation: train without some model families, measure the error on them.

A family held out is one the cost model has never seen (another architecture, not only another
size), which is the case that matters: users bring their own models. Cross-validation holds
out each family in turn and pools the rows; the predictor with the lowest pooled error becomes
the default that ``ddlsim predict`` uses.
"""

import dataclasses
import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from ddlsim.data.errors import InvalidOptionError
from ddlsim.simulator.cost_model import PREDICTORS, cost_model
from ddlsim.simulator.dataset import Dataset
from ddlsim.simulator.evaluate import Accuracy, grouped_accuracy, quantile
from ddlsim.simulator.gnn import CostModelConfig, IterationCostModel
from ddlsim.simulator.train import (
    TrainOptions,
    build_training_set,
    duration_error,
    fusion_error,
    train_cost_model,
)

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class HoldoutReport:
    """Rows (one a held-out run) and the metrics of each predictor on them."""

    holdout: tuple[str, ...]
    train_runs: int
    rows: tuple[dict[str, Any], ...]
    metrics: dict[str, Accuracy]
    duration_mdape: float
    train_seconds: float
    fused_blocks: int = 0
    fused_mdape: float = float("nan")
    fused_mdape_unfused: float = float("nan")

    def to_json(self) -> dict[str, Any]:
        return {
            "holdout": list(self.holdout),
            "train_runs": self.train_runs,
            "test_runs": len(self.rows),
            "metrics": {name: m.to_json() for name, m in self.metrics.items()},
            "by_kind": {
                kind: {name: m.to_json() for name, m in metrics.items()}
                for kind, metrics in metrics_by_kind(self.rows).items()
            },
            "duration_mdape": self.duration_mdape,
            "fused_blocks": self.fused_blocks,
            "fused_mdape": _finite_or_none(self.fused_mdape),
            "fused_mdape_unfused": _finite_or_none(self.fused_mdape_unfused),
            "train_seconds": self.train_seconds,
            "label_noise": label_noise(self.rows),
            "speedup_error": {name: speedup_error(self.rows, name) for name in self.metrics},
            "rows": list(self.rows),
        }


def speedup_error(rows: Sequence[dict[str, Any]], predictor: str) -> dict[str, float | int | None]:
    """How far ``predictor``'s speed-ups over DDP's defaults are from the measured ones: the
    median and 90th percentile of ``|predicted / measured - 1|`` over the runs whose group (one
    launch of cpu-v3: the reference measured beside them) holds a reference run, and how many.
    The search ranks strategies by these ratios, so this is the error it acts on."""
    references = {r["group"]: r for r in rows if r.get("reference")}
    errors = []
    for row in rows:
        reference = references.get(row["group"])
        if reference is None or row is reference:
            continue
        measured = reference["measured_ms"] / row["measured_ms"]
        predicted = reference[f"{predictor}_ms"] / row[f"{predictor}_ms"]
        errors.append(abs(predicted / measured - 1))
    return _spread(errors)


def speedup_error_by_world_size(
    rows: Sequence[dict[str, Any]], predictor: str
) -> dict[int, dict[str, float | int | None]]:
    """:func:`speedup_error` of the rows of each world size (a group's runs share one)."""
    sizes: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        sizes.setdefault(group_world_size(row["group"]), []).append(row)
    return {size: speedup_error(members, predictor) for size, members in sorted(sizes.items())}


def group_world_size(group: str) -> int:
    """The ranks of a run's group (``[session/]model|world_size|...``)."""
    return int(group.split("|")[1])


def label_noise(rows: Sequence[dict[str, Any]]) -> dict[str, float | int | None]:
    """How well the rows' labels are known: the median and 90th percentile, over the rows that
    recorded an interval, of half the measured median's 95 % interval over the median (0.01:
    ±1 %), and how many rows recorded one. An error near these figures is as small as the
    measurements can show."""
    return _spread([float(r["label_noise"]) for r in rows if r.get("label_noise") is not None])


def _spread(values: list[float]) -> dict[str, float | int | None]:
    """The median and 90th percentile of ``values`` and how many there are (``None`` for none)."""
    if not values:
        return {"median": None, "p90": None, "runs": 0}
    ordered = sorted(values)
    return {"median": quantile(ordered, 0.5), "p90": quantile(ordered, 0.9), "runs": len(ordered)}


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def metrics_of(rows: Sequence[dict[str, Any]]) -> dict[str, Accuracy]:
    """Each predictor's accuracy on ``rows`` (``measured_ms``, ``<predictor>_ms``, ``group``)."""
    measured = [r["measured_ms"] for r in rows]
    groups = [r["group"] for r in rows]
    return {
        name: grouped_accuracy([r[f"{name}_ms"] for r in rows], measured, groups)
        for name in PREDICTORS
    }


def evaluate_holdout(
    dataset: Dataset,
    holdout: Sequence[str],
    *,
    config: CostModelConfig | None = None,
    options: TrainOptions | None = None,
    progress: Progress | None = None,
) -> tuple[HoldoutReport, IterationCostModel]:
    """Train on every family but ``holdout``, evaluate on ``holdout``.

    Raises:
        InvalidOptionError: a held-out family the dataset does not have, or nothing left to
            train on or to test.
    """
    unknown = sorted(set(holdout) - set(dataset.families))
    if unknown:
        raise InvalidOptionError(
            f"family {', '.join(unknown)} is not in the dataset; it has: "
            f"{', '.join(dataset.families)}"
        )
    train = build_training_set(dataset, dataset.select(exclude=holdout).runs)
    test = build_training_set(dataset, dataset.select(families=holdout).runs)
    if not train.samples or len(test.samples) < 2:
        raise InvalidOptionError(
            f"holding out {', '.join(holdout)} leaves {len(train.samples)} runs to train on "
            f"and {len(test.samples)} to test"
        )
    if progress is not None:
        progress(
            f"training without {', '.join(holdout)}: {len(train.samples)} runs, "
            f"{len(train.graphs)} graphs"
        )
    start = time.perf_counter()
    model = train_cost_model(train, config=config, options=options)
    seconds = time.perf_counter() - start
    predictions = {
        name: cost_model(name, network=model).predict_samples(test.graphs, test.samples)
        for name in PREDICTORS
    }
    rows = tuple(
        {
            "group": sample.group,
            "family": sample.family,
            "kind": sample.kind,
            "risk_kind": sample.risk_kind,
            "model_key": sample.model_key,
            "measured_ms": float(sample.measured_ms or 0.0),
            "label_noise": sample.label_noise,
            "reference": sample.reference,
            **{f"{name}_ms": predictions[name][i] for name in PREDICTORS},
        }
        for i, sample in enumerate(test.samples)
    )
    fused, unfused = fusion_error(model, test.graphs, test.blocks)
    report = HoldoutReport(
        holdout=tuple(holdout),
        train_runs=len(train.samples),
        rows=rows,
        metrics=metrics_of(rows),
        duration_mdape=duration_error(model, test.graphs),
        train_seconds=seconds,
        fused_blocks=sum(1 for b in test.blocks if b.measured_ratio),
        fused_mdape=fused,
        fused_mdape_unfused=unfused,
    )
    return report, model


def cross_validate(
    dataset: Dataset,
    *,
    config: CostModelConfig | None = None,
    options: TrainOptions | None = None,
    progress: Progress | None = None,
    workers: int = 1,
) -> tuple[list[HoldoutReport], dict[str, Accuracy]]:
    """Hold out each family in turn; the reports and the metrics of all folds' rows pooled.

    With ``workers`` > 1 the folds train in that many processes at once (each on one thread:
    on a two-core machine two workers halve the time); the results are the same as in one.
    """
    families = dataset.families
    if workers <= 1 or len(families) < 2:
        reports = [
            evaluate_holdout(dataset, [f], config=config, options=options, progress=progress)[0]
            for f in families
        ]
    else:
        reports = []
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            max_workers=min(workers, len(families)),
            mp_context=context,
            initializer=_keep_dataset,
            initargs=(dataset,),
        ) as pool:
            futures = [pool.submit(_fold, family, config, options) for family in families]
            for family, future in zip(families, futures, strict=True):
                reports.append(future.result())
                if progress is not None:
                    progress(f"held out {family}: done ({len(reports)}/{len(families)})")
    pooled = [row for report in reports for row in report.rows]
    return reports, metrics_of(pooled)


_WORKER_DATASET: list[Dataset] = []


def _keep_dataset(dataset: Dataset) -> None:
    """A fold worker's start: the dataset, sent once, for all its folds."""
    _WORKER_DATASET[:] = [dataset]


def _fold(
    family: str, config: CostModelConfig | None, options: TrainOptions | None
) -> HoldoutReport:
    report, _ = evaluate_holdout(_WORKER_DATASET[0], [family], config=config, options=options)
    return report


def metrics_by_kind(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Accuracy]]:
    """:func:`metrics_of` for the rows of each strategy kind (``kind``) that has two or more."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        kinds.setdefault(str(row.get("kind", "")), []).append(row)
    return {
        kind: metrics_of(members) for kind, members in sorted(kinds.items()) if len(members) > 1
    }


# Held-out MAPEs this close are a tie: below the labels' own noise (their medians' intervals
# are ±1.9 % in median on cpu-v3).
MAPE_TIE = 0.01


def best_predictor(metrics: dict[str, Accuracy]) -> str:
    """The predictor with the lowest mean absolute percentage error; among those within
    ``MAPE_TIE`` of it, the one that orders the most pairs of strategies right (what a search
    acts on), then the lowest error."""
    lowest = min(m.mape for m in metrics.values())
    tied = [name for name, m in metrics.items() if m.mape <= lowest + MAPE_TIE]
    return max(tied, key=lambda name: (metrics[name].pair_accuracy or 0.0, -metrics[name].mape))
