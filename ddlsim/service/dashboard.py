"""What the dashboard shows, from the store: predicted against measured iteration times, the
error by model family and strategy kind, and the convergence of finished searches.

A point pairs one measurement (an executor run) with a prediction of the same model, strategy,
world size and link: an execution job, and a search's verifying runs, store both and name them;
for runs and predictions made apart (``ddlsim run``, ``ddlsim predict``) the prediction closest
in time to the run is taken.
"""

import statistics
from collections import defaultdict
from importlib import resources
from typing import Any

from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.data.store.records import MeasurementRecord, PredictionRecord
from ddlsim.data.store.tasks import TaskQueue
from ddlsim.data.zoo import ZOO


def page(name: str = "dashboard") -> str:
    """A page's HTML: ``dashboard`` (predicted against measured) or ``clusters`` (GPU clusters
    on paper); one file each, its script draws the plots as SVG from the API, no build step."""
    return resources.files("ddlsim.service").joinpath(f"static/{name}.html").read_text("utf-8")


def dashboard_data(store: Store, queue: TaskQueue) -> dict[str, Any]:
    points = _points(store, queue)
    return {
        "points": points,
        "errors": {
            "by_family": _errors(points, "family"),
            "by_kind": _errors(points, "kind"),
        },
        "searches": _searches(queue),
        "timelines": _timelines(queue),
    }


def _points(store: Store, queue: TaskQueue) -> list[dict[str, Any]]:
    measurements = {m.id: m for m in store.measurements() if m.id is not None}
    predictions = store.predictions()
    by_id = {p.id: p for p in predictions if p.id is not None}
    paired: dict[int, PredictionRecord] = {}
    named: list[dict[str, Any]] = []  # results naming a measurement and its prediction
    for task in queue.list(kind="execution", status="done", limit=10_000):
        named.append(task.result or {})
    for task in queue.list(kind="search", status="done", limit=10_000):
        named.extend((task.result or {}).get("verified") or [])
    for result in named:
        m, p = result.get("measurement_id"), result.get("prediction_id")
        if isinstance(m, int) and isinstance(p, int) and m in measurements and p in by_id:
            paired[m] = by_id[p]
    by_key: dict[tuple[str, str, int, str], list[PredictionRecord]] = defaultdict(list)
    for p in predictions:
        cluster = p.cluster
        key = (p.model, p.strategy_hash, int(cluster["world_size"]), str(cluster["bandwidth"]))
        by_key[key].append(p)
    strategies: dict[str, Strategy] = {}
    points = []
    for measurement_id, m in measurements.items():
        prediction = paired.get(measurement_id) or _closest(m, by_key)
        if prediction is None or not m.iteration_time_ms:
            continue
        if m.strategy_hash not in strategies:
            strategies[m.strategy_hash] = store.load_strategy(strategy_hash=m.strategy_hash)
        strategy = strategies[m.strategy_hash]
        measured = statistics.median(m.iteration_time_ms)
        points.append(
            {
                "measurement_id": m.id,
                "prediction_id": prediction.id,
                "model": m.model,
                "family": _family(m.model),
                "kind": strategy.kind,
                "strategy": strategy.to_dict(),
                "world_size": m.world_size,
                "bandwidth": m.bandwidth,
                "measured_ms": measured,
                "predicted_ms": prediction.iteration_time_ms,
                "error": (prediction.iteration_time_ms - measured) / measured,
                "simulator_version": prediction.simulator_version,
                "measured_at": m.created_at.isoformat() if m.created_at else None,
            }
        )
    return points


def _closest(
    m: MeasurementRecord, by_key: dict[tuple[str, str, int, str], list[PredictionRecord]]
) -> PredictionRecord | None:
    candidates = by_key.get((m.model, m.strategy_hash, m.world_size, m.bandwidth), [])
    if not candidates or m.created_at is None:
        return candidates[-1] if candidates else None
    at = m.created_at
    return min(
        candidates,
        key=lambda p: abs((p.created_at - at).total_seconds()) if p.created_at else float("inf"),
    )


def _family(model: str) -> str:
    spec = ZOO.get(model)
    if spec is not None and spec.family:
        return spec.family
    return model.split("-", maxsplit=1)[0]


def _errors(points: list[dict[str, Any]], by: str) -> list[dict[str, Any]]:
    groups: dict[str, list[float]] = defaultdict(list)
    for point in points:
        groups[point[by]].append(point["error"])
    return [
        {
            by: name,
            "points": len(errors),
            "mape": statistics.fmean(abs(e) for e in errors),
            "median_error": statistics.median(errors),
        }
        for name, errors in sorted(groups.items())
    ]


def _searches(queue: TaskQueue) -> list[dict[str, Any]]:
    out = []
    for task in queue.list(kind="search", status="done", limit=50):
        result = task.result or {}
        curve = result.get("convergence") or []
        # Curves are in the search's scores (older results: predictions); DDP's defaults score
        # at their prediction either way.
        baseline = (result.get("baseline") or {}).get("predicted_ms")
        if not curve or not baseline:
            continue
        out.append(
            {
                "id": task.id,
                "model": result.get("model"),
                "world_size": result.get("world_size"),
                "algo": result.get("algo"),
                "baseline_ms": baseline,
                "best_ms": (result.get("best") or {}).get("predicted_ms"),
                "best_scored_ms": (result.get("best") or {}).get("scored_ms"),
                "convergence": curve,
            }
        )
    return out


def _timelines(queue: TaskQueue) -> list[dict[str, Any]]:
    """Executions with both a replayed timeline and a measured trace, newest first (the page
    fetches one's events from ``/v1/executions/{id}``)."""
    out = []
    for task in queue.list(kind="execution", status="done", limit=50):
        result = task.result or {}
        if result.get("predicted_timeline") and result.get("measured_trace"):
            strategy = Strategy.from_dict(task.request["strategy"])
            out.append(
                {
                    "id": task.id,
                    "model": (task.request.get("model") or {}).get("name"),
                    "world_size": task.request.get("world_size"),
                    "kind": strategy.kind,
                    "measured_ms": result.get("measured_ms"),
                    "predicted_ms": result.get("predicted_ms"),
                }
            )
    return out
