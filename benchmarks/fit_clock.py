"""Fit the sustained SM clock of a power-capped GPU to one published row, and report the other
rows of the file as held out (issue 38: torchtitan's 500 W HBM2e H100s).

The clock is the one number: it scales the GPU's tensor-core peaks (``AcceleratorSpec.clock_mhz``
over ``peak_clock_mhz``); memory bandwidth and the fabric stay as the spec gives them. The fit
bisects the clock until the row's predicted figure equals its published one, then predicts every
other row of the file at that clock.

    .venv/bin/python benchmarks/fit_clock.py data/published/torchtitan_llama3.json \
        --row "torchtitan Llama 3.1 8B on 8 H100, FSDP" --json
"""

import argparse
import dataclasses
import json
import sys
from typing import Any

from ddlsim.data.errors import DdlsimError
from ddlsim.workflows.published import RowError, parse_row, rows_file, rows_of
from ddlsim.workflows.scale import ScaleRequest, predict_at_scale


def _at_clock(request: ScaleRequest, clock_mhz: float) -> ScaleRequest:
    gpu = request.cluster.gpu
    if gpu.peak_clock_mhz is None:
        raise RowError(
            f"GPU {gpu.name!r} states no peak_clock_mhz, so its clock cannot be fitted; give "
            "a GPU spec with clock_mhz and peak_clock_mhz"
        )
    cluster = dataclasses.replace(
        request.cluster, gpu=dataclasses.replace(gpu, clock_mhz=clock_mhz)
    )
    return dataclasses.replace(request, cluster=cluster)


def _predicted(request: ScaleRequest, metric: str, clock_mhz: float) -> float:
    return float(getattr(predict_at_scale(_at_clock(request, clock_mhz)), metric))


def fit(request: ScaleRequest, metric: str, published: float, *, low: float, high: float) -> float:
    """The clock (MHz) at which ``request``'s ``metric`` is ``published``; throughput and
    FLOP rate grow with the clock, iteration time falls."""
    rising = metric != "iteration_s"
    for _ in range(40):
        middle = (low + high) / 2
        above = _predicted(request, metric, middle) > published
        if above == rising:
            high = middle
        else:
            low = middle
    return (low + high) / 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", help="a published-rows file")
    parser.add_argument("--row", required=True, help="the name of the row to fit on")
    parser.add_argument("--low", type=float, default=600.0, help="lowest clock tried (MHz)")
    parser.add_argument("--high", type=float, default=2000.0, help="highest clock tried (MHz)")
    parser.add_argument("--json", action="store_true", help="print the JSON result only")
    args = parser.parse_args(argv)
    try:
        raw = json.loads(rows_file(args.rows).read_text("utf-8"))
        rows = [parse_row(row) for row in rows_of(raw, args.rows)]
        names = [name for name, *_ in rows]
        if args.row not in names:
            raise RowError(f"row {args.row!r} is not in {args.rows}; rows: {', '.join(names)}")
        _, request, metric, published = rows[names.index(args.row)]
        clock = fit(request, metric, published, low=args.low, high=args.high)
        held_out: list[dict[str, Any]] = []
        for name, other, other_metric, other_published in rows:
            if name == args.row:
                continue
            predicted = _predicted(other, other_metric, clock)
            held_out.append(
                {
                    "name": name,
                    "metric": other_metric,
                    "published": other_published,
                    "predicted": round(predicted, 4),
                    "ape": round(abs(predicted - other_published) / other_published, 4),
                }
            )
    except (DdlsimError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    mape = sum(row["ape"] for row in held_out) / len(held_out)
    result = {"fitted_row": args.row, "clock_mhz": round(clock, 1), "held_out": held_out}
    result["held_out_mape"] = round(mape, 4)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"fitted on {args.row!r}: clock {clock:.1f} MHz")
    for row in held_out:
        print(
            f"  {row['name']:60s} published {row['published']:10.4g} predicted "
            f"{row['predicted']:10.4g}  ape {row['ape']:.3f}"
        )
    print(f"held-out mape {mape:.4f} over {len(held_out)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
