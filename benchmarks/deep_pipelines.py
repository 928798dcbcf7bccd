"""Deep pipelines of the shipped published runs, row by row: where the predicted iteration goes.

Every shipped published row with ``pp >= 8`` (Megatron-LM's SC'21 runs of 8 to 64 stages with
full recomputation and thousands of micro-batches, Megatron-LM's H100 table, NeMo's and
Megatron-Bridge's) predicted as ``benchmarks/published.py`` predicts it, with its breakdown: the
busiest stage's compute and recomputation, exposed communication, the pipeline's bubble (the
schedule's fill and drain, the first and last stages' extra work: embedding, output layer and
loss, and the sends between stages across nodes) and the optimizer step, each as a share of the
iteration; the signed error is predicted over published, less one (positive: predicted fast).

    .venv/bin/python benchmarks/deep_pipelines.py --json
"""

import argparse
import json
from typing import Any

from ddlsim.workflows.published import parse_row, published_files, rows_file, rows_of
from ddlsim.workflows.scale import predict_at_scale

MIN_STAGES = 8


def rows() -> list[dict[str, Any]]:
    out = []
    for name in published_files():
        raw = json.loads(rows_file(f"data/published/{name}").read_text("utf-8"))
        for row in rows_of(raw, name):
            label, request, metric, published = parse_row(row)
            plan = request.plan
            if plan.pp < MIN_STAGES:
                continue
            prediction = predict_at_scale(request)
            predicted = getattr(prediction, metric)
            error = (
                published / predicted - 1 if metric == "iteration_s" else predicted / published - 1
            )
            total = prediction.iteration_s * 1e3
            out.append(
                {
                    "file": name,
                    "name": label,
                    "layout": plan.label(),
                    "signed_error": round(error, 4),
                    "iteration_s": round(prediction.iteration_s, 3),
                    "shares": {
                        key: round(ms / total, 4) for key, ms in prediction.breakdown_ms.items()
                    },
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    found = rows()
    if args.json:
        print(json.dumps(found, indent=1))
        return
    print("| row | layout | error | compute | recompute | comm | bubble | optimizer |")
    print("|---|---|---|---|---|---|---|---|")
    for row in found:
        s = row["shares"]
        comm = s["exposed_comm_node"] + s["exposed_comm_network"]
        print(
            f"| {row['name']} | {row['layout']} | {row['signed_error']:+.1%} | "
            f"{s['compute']:.0%} | {s['recompute']:.0%} | {comm:.1%} | "
            f"{s['pipeline_bubble']:.1%} | {s['optimizer']:.2%} |"
        )
    errors = sorted(abs(row["signed_error"]) for row in found)
    print(
        f"# {len(found)} rows: mean |error| {sum(errors) / len(errors):.3f}, max {errors[-1]:.3f}"
    )


if __name__ == "__main__":
    main()
