"""Published training runs set against ddlsim's predictions of them: the rows of
``ddlsim/data/published/*.json`` (their schema: that folder's README), read and predicted one
way for ``benchmarks/published.py`` and the service's ``/v1/published``.

A row names a model (a ModelSpec), a GPU cluster (a preset with ``:NODES``, or a
GpuClusterSpec), the published layout, the global batch and sequence length, and one published
figure: ``iteration_s``, ``tflops_per_gpu`` or ``tokens_per_s_per_gpu``. Its prediction is the
same figure on paper (:mod:`ddlsim.workflows.scale`) and its absolute percentage error.
"""

import hashlib
import json
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any

from ddlsim.data.errors import DdlsimError, one_line
from ddlsim.data.specs._serde import check_keys
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.search.scale_plans import SpaceLimits
from ddlsim.workflows.scale import ScaleRequest, predict_at_scale, search_at_scale

METRICS = ("iteration_s", "tflops_per_gpu", "tokens_per_s_per_gpu")
REQUIRED_KEYS = (
    "name",
    "source",
    "model",
    "cluster",
    "strategy",
    "global_batch",
    "seq_len",
    "published",
)
# ``search_space``: what the row's framework offers the search (SpaceLimits' keys), where less
# than everything; the searched layout is compared with the published one within it.
ROW_KEYS = {*REQUIRED_KEYS, "notes", "search_space"}


class RowError(DdlsimError, ValueError):
    """A row of a published-runs file is malformed."""


_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def rows_file(path: str) -> Path:
    """A rows file: ``path`` from the working directory, else under the package
    (``data/published/x.json`` is ``ddlsim/data/published/x.json``).

    Raises:
        RowError: when it is in neither place.
    """
    for candidate in (Path(path), _PACKAGE_ROOT / path):
        if candidate.is_file():
            return candidate
    raise RowError(f"rows file {path!r} exists neither here nor under {_PACKAGE_ROOT}")


def rows_of(raw: Any, where: str) -> list[dict[str, Any]]:
    """The rows of a published-runs file's JSON: a list of rows, or ``{"rows": [...]}``.

    Raises:
        RowError: when there are none, naming ``where``.
    """
    rows = raw.get("rows") if isinstance(raw, dict) else raw
    if not isinstance(rows, list) or not rows:
        raise RowError(f"{where}: expected a non-empty list of rows")
    return rows


def parse_row(raw: dict[str, Any]) -> tuple[str, ScaleRequest, str, float]:
    """The row's name, request, published metric and value.

    Raises:
        RowError, and the specs' own errors, naming the bad value.
    """
    check_keys(raw, ROW_KEYS, f"row {raw.get('name', '?')!r}", RowError)
    for key in REQUIRED_KEYS:
        if key not in raw:
            raise RowError(f"row {raw.get('name', '?')!r} misses {key!r}")
    published = raw["published"]
    check_keys(published, set(METRICS), f"row {raw['name']!r} published", RowError)
    if len(published) != 1:
        raise RowError(f"row {raw['name']!r}: give exactly one of {', '.join(METRICS)}")
    ((metric, value),) = published.items()
    seq_len = int(raw["seq_len"])
    model = ModelSpec.from_dict(raw["model"]).with_inputs(seq_len=seq_len)
    cluster_raw = raw["cluster"]
    cluster = (
        GpuClusterSpec.parse(cluster_raw)
        if isinstance(cluster_raw, str)
        else GpuClusterSpec.from_dict(cluster_raw)
    )
    request = ScaleRequest(
        model=model,
        cluster=cluster,
        plan=ScalePlan.from_dict(raw["strategy"]),
        global_batch=int(raw["global_batch"]),
        seq_len=seq_len,
    )
    return raw["name"], request, metric, float(value)


def predict_row(raw: dict[str, Any], *, search: bool) -> dict[str, Any]:
    """The row's published figure, ddlsim's prediction of it and their absolute percentage
    error (``ape``), with the layout, its iteration time and memory; with ``search``, also the
    fastest layout searched on the row's cluster.

    Raises:
        RowError, and the specs' and the simulator's own errors, naming the bad value.
    """
    name, request, metric, published = parse_row(raw)
    started = time.perf_counter()
    prediction = predict_at_scale(request)
    predicted = getattr(prediction, metric)
    row: dict[str, Any] = {
        "name": name,
        "metric": metric,
        "published": published,
        "predicted": round(predicted, 4),
        "ape": round(abs(predicted - published) / published, 4),
        "layout": request.plan.label(),
        "iteration_s": round(prediction.iteration_s, 4),
        "memory_gib": round(prediction.memory.total_gib, 1),
        "fits": prediction.fits,
        "seconds": round(time.perf_counter() - started, 2),
    }
    if search:
        found = search_at_scale(
            request.model,
            request.cluster,
            global_batch=request.global_batch,
            seq_len=request.seq_len,
            precision=request.plan.precision,
            compile=request.plan.compile,
            allow_async_tp=request.plan.async_tp,
            kernels=request.plan.kernels,
            limits=SpaceLimits.from_dict(raw["search_space"]) if "search_space" in raw else None,
        )
        if found.best is not None:
            row["search"] = {
                "layout": found.best.plan.label(),
                "iteration_s": round(found.best.iteration_s, 4),
                "speedup_vs_published_layout": round(
                    prediction.iteration_s / found.best.iteration_s, 3
                ),
                "evaluated": found.evaluated,
                "seconds": round(found.seconds, 1),
            }
    return row


# ----- the shipped files, predicted once a process -----------------------------------------------

_FOLDER = "published"
_CACHE: dict[tuple[str, str], dict[str, Any]] = {}
_CACHE_LOCK = threading.Lock()


def published_files() -> list[str]:
    """The shipped published-runs files (``ddlsim/data/published/*.json``), by name."""
    folder = resources.files("ddlsim.data") / _FOLDER
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if entry.is_file() and entry.name.endswith(".json")
    )


def _read(name: str) -> str:
    """Raises: RowError naming ``name`` and the shipped files when it is not one of them."""
    names = published_files()
    if name not in names:
        raise RowError(f"published file {name!r} is not shipped; allowed: {', '.join(names)}")
    return (resources.files("ddlsim.data") / _FOLDER / name).read_text("utf-8")


def describe_published(name: str) -> dict[str, Any]:
    """A shipped file's name, what it holds (``about``) and how many rows, without predicting.

    Raises:
        RowError: an unknown name or a file without rows.
    """
    raw = json.loads(_read(name))
    return {
        "name": name,
        "about": raw.get("about") if isinstance(raw, dict) else None,
        "rows": len(rows_of(raw, name)),
    }


def predict_published(name: str) -> dict[str, Any]:
    """Every row of the shipped file ``name`` predicted (:func:`predict_row`, no search), with
    the rows' mean APE (``mape``); a row that cannot be predicted is kept with its ``error``
    (and left out of the mean). Computed once
    a process for each version of the file (several seconds a file), then answered from memory.

    Raises:
        RowError: an unknown name or a file without rows.
    """
    text = _read(name)
    key = (name, hashlib.sha256(text.encode()).hexdigest())
    with _CACHE_LOCK:  # one computation at a time: the first asker computes, the others wait
        if key not in _CACHE:
            _CACHE[key] = predict_rows(json.loads(text), name)
        return _CACHE[key]


def predict_rows(raw: Any, name: str) -> dict[str, Any]:
    """The rows of a published-runs file's JSON (named ``name``) predicted as
    :func:`predict_published` answers them.

    Raises:
        RowError: a file without rows.
    """
    rows = []
    for index, row in enumerate(rows_of(raw, name)):
        label = row.get("name") if isinstance(row, dict) else None
        try:
            if not isinstance(row, dict):
                raise RowError(f"row {index} is not an object")
            predicted = {**predict_row(row, search=False), "source": row.get("source")}
        except DdlsimError as exc:
            predicted = {"name": label or f"row {index}", "error": one_line(exc)}
        rows.append(predicted)
    errors = [row["ape"] for row in rows if "ape" in row]
    return {
        "name": name,
        "about": raw.get("about") if isinstance(raw, dict) else None,
        "rows": rows,
        "mape": round(sum(errors) / len(errors), 4) if errors else None,
    }
