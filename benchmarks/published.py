"""Published training runs against ddlsim's predictions for them (issue 21).

Each row of ROWS.json names a model (a ModelSpec), a GPU cluster (a preset with ``:NODES``, or a
GpuClusterSpec), the published layout, the global batch and sequence length, and one published
figure: ``iteration_s``, ``tflops_per_gpu`` or ``tokens_per_s_per_gpu``. The script predicts the
row's iteration on paper (``ddlsim.workflows.scale``) and reports the same figure and its
absolute percentage error; ``--search`` also searches the row's cluster for the fastest layout
and says whether it is predicted faster than the published one. Rows are read and predicted by
:mod:`ddlsim.workflows.published`, as the service's ``/v1/published`` predicts them.

``tflops_per_gpu`` counts FLOPs as Megatron-LM's papers do: the matrix multiplies (attention's
included) of forward and backward, and of the recomputed forward under full recomputation.

    .venv/bin/python benchmarks/published.py data/published/megatron_sc21.json --json

A path that does not exist from the working directory is looked up in the package's data
folder (``data/published/x.json`` is ``ddlsim/data/published/x.json``).

``--hold-out-source`` predicts every file (all the shipped ones when none is named) with the GPU
path's fitted numbers (:mod:`ddlsim.simulator.gpu.calibration`) fitted on the other files only,
beside the same file predicted in sample, per file and pooled over every row
(:mod:`ddlsim.workflows.calibration`):

    .venv/bin/python benchmarks/published.py --hold-out-source
"""

import argparse
import json
import sys

from ddlsim.data.errors import DdlsimError
from ddlsim.workflows.calibration import hold_out_by_file
from ddlsim.workflows.published import (
    METRICS,
    REQUIRED_KEYS,
    ROW_KEYS,
    RowError,
    parse_row,
    predict_row,
    published_files,
    rows_file,
    rows_of,
)

__all__ = ["METRICS", "REQUIRED_KEYS", "ROW_KEYS", "RowError", "parse_row", "predict_row"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "rows", nargs="*", help="JSON files: a list of rows, or {'rows': [...]}, each"
    )
    parser.add_argument("--json", action="store_true", help="print the JSON result only")
    parser.add_argument("--search", action="store_true", help="also search each row's cluster")
    parser.add_argument(
        "--hold-out-source",
        action="store_true",
        help="predict each file with the numbers fitted on the other files (default: all shipped)",
    )
    args = parser.parse_args(argv)
    if args.hold_out_source:
        return _hold_out(args.rows or [f"data/published/{n}" for n in published_files()], args)
    if len(args.rows) != 1:
        parser.error("give one rows file (several only with --hold-out-source)")
    try:
        raw = json.loads(rows_file(args.rows[0]).read_text("utf-8"))
        rows = [predict_row(row, search=args.search) for row in rows_of(raw, args.rows[0])]
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


def _hold_out(paths: list[str], args: argparse.Namespace) -> int:
    def progress(message: str) -> None:
        print(f"# {message}", file=sys.stderr, flush=True)

    try:
        files = {}
        for path in paths:
            raw = json.loads(rows_file(path).read_text("utf-8"))
            files[path.rsplit("/", 1)[-1]] = [parse_row(row) for row in rows_of(raw, path)]
        report = hold_out_by_file(files, progress=progress)
    except (DdlsimError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{'file':28s} {'rows':>4s} {'held out':>9s} {'in sample':>9s}  numbers held out")
    for entry in report["files"]:
        print(
            f"{entry['name']:28s} {len(entry['rows']):4d} {entry['held_out_mape']:9.4f} "
            f"{entry['in_sample_mape']:9.4f}  {entry['held_out_calibration']}"
        )
    rows = sum(len(entry["rows"]) for entry in report["files"])
    print(
        f"{'all rows':28s} {rows:4d} {report['held_out_mape']:9.4f} "
        f"{report['in_sample_mape']:9.4f}  in sample: {report['in_sample_calibration']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
