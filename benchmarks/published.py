"""Published training runs against ddlsim's predictions for them (issue 21).

Each row of ROWS.json names a model (a ModelSpec), a GPU cluster (a preset with ``:NODES``, or a
GpuClusterSpec), the published layout, the global batch and sequence length, and one published
figure: ``iteration_s``, ``tflops_per_gpu`` or ``tokens_per_s_per_gpu``. The script predicts the
row's iteration on paper (``ddlsim.workflows.scale``) and reports the same figure and its
absolute percentage error; ``--search`` also searches the row's cluster for the fastest layout
and says whether it is predicted faster than the published one.

``tflops_per_gpu`` counts FLOPs as Megatron-LM's papers do: the matrix multiplies (attention's
included) of forward and backward, and of the recomputed forward under full recomputation.

    .venv/bin/python benchmarks/published.py data/published/megatron_sc21.json --json

A path that does not exist from the working directory is looked up in the package's data
folder (``data/published/x.json`` is ``ddlsim/data/published/x.json``).
"""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ddlsim.data.errors import DdlsimError
from ddlsim.data.specs._serde import check_keys
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.scale_plan import ScalePlan
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
ROW_KEYS = {*REQUIRED_KEYS, "notes"}
PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "ddlsim"


class RowError(DdlsimError, ValueError):
    """A row of a published-runs file is malformed."""


def resolve(path: str) -> Path:
    candidate = Path(path)
    if candidate.is_file():
        return candidate
    packaged = PACKAGE_ROOT / path
    if packaged.is_file():
        return packaged
    raise RowError(f"rows file {path!r} exists neither here nor under {PACKAGE_ROOT}")


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", help="a JSON file: a list of rows, or {'rows': [...]}")
    parser.add_argument("--json", action="store_true", help="print the JSON result only")
    parser.add_argument("--search", action="store_true", help="also search each row's cluster")
    args = parser.parse_args(argv)
    try:
        raw = json.loads(resolve(args.rows).read_text("utf-8"))
        rows_raw = raw["rows"] if isinstance(raw, dict) else raw
        if not isinstance(rows_raw, list) or not rows_raw:
            raise RowError(f"{args.rows}: expected a non-empty list of rows")
        rows = [predict_row(row, search=args.search) for row in rows_raw]
    except (DdlsimError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    mape = sum(row["ape"] for row in rows) / len(rows)
    result = {"rows": rows, "mape": round(mape, 4)}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for row in rows:
        extra = ""
        if "search" in row:
            found = row["search"]
            extra = f"  searched: {found['layout']} x{found['speedup_vs_published_layout']}"
        print(
            f"{row['name']:40s} {row['metric']:22s} published {row['published']:10.4g} "
            f"predicted {row['predicted']:10.4g}  ape {row['ape']:.3f}  ({row['layout']}, "
            f"{row['memory_gib']} GiB){extra}"
        )
    print(f"mape {mape:.4f} over {len(rows)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
