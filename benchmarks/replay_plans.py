"""The replay of every parallel plan against the executor's runs of it, side by side.

For one model on an emulated cluster: DDP's defaults, FSDP, tensor parallelism, and pipelines
(GPipe, 1F1B, interleaved 1F1B), each predicted by the replay alone (what the list schedule of
the profiled ops and modelled collectives gives, before any learned correction; the cost model's
held-out accuracy by kind of plan is ``benchmarks/simulator_eval.py``'s) and then run for real;
the table gives both medians and the error. Kernel profiles and collective fits come from
``--db`` (profiled there first if missing).

    .venv/bin/python benchmarks/replay_plans.py --model gpt2-tiny --world-size 2 \
        --bandwidth 1gbit --db sqlite:///ds.db
"""

import argparse
import platform
from typing import Any

import torch

from ddlsim.cluster import remove_stale_namespaces
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import resolve_model
from ddlsim.executor.run import RunOptions, run_training
from ddlsim.plans.feasibility import model_supports
from ddlsim.simulator.cost_model import ReplayCostModel
from ddlsim.workflows.predict import predict_on_store

PLANS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("DDP defaults", {}),
    ("FSDP (a group per block)", {"parallel": {"fsdp": True}}),
    ("tensor parallel", {"parallel": {"tp": 2}}),
    (
        "pipeline, GPipe, 4 micro-batches",
        {"parallel": {"pp": 2, "micro_batches": 4, "pp_schedule": "gpipe"}},
    ),
    (
        "pipeline, 1F1B, 4 micro-batches",
        {"parallel": {"pp": 2, "micro_batches": 4, "pp_schedule": "1f1b"}},
    ),
    (
        "pipeline, interleaved 1F1B, 4 micro-batches",
        {"parallel": {"pp": 2, "micro_batches": 4, "pp_schedule": "interleaved_1f1b"}},
    ),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="gpt2-tiny")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--db", required=True)
    args = parser.parse_args()
    spec = resolve_model(args.model).with_inputs(batch_size=args.batch_size)
    remove_stale_namespaces()
    rows = []
    with Store.open(args.db) as store:
        for label, raw in PLANS:
            strategy = Strategy.from_dict(raw)
            if not model_supports(spec, strategy):
                print(f"# {label}: {spec.label} cannot run it (no plan or too few blocks)")
                continue
            predicted, _, _ = predict_on_store(
                store,
                spec,
                strategy,
                world_size=args.world_size,
                bandwidth=args.bandwidth,
                cost_model=ReplayCostModel(),  # the replay alone
            )
            measured = run_training(
                spec,
                strategy,
                RunOptions(
                    world_size=args.world_size,
                    bandwidth=args.bandwidth,
                    iters=args.iters,
                    warmup=2,
                ),
            )
            rows.append(
                (
                    label,
                    predicted.iteration_time_ms,
                    measured.median_ms,
                    predicted.result.bubble_ms,
                )
            )
            print(
                f"# {label}: predicted {rows[-1][1]:.1f} ms, measured {rows[-1][2]:.1f} ms",
                flush=True,
            )
    print(
        f"# {spec.label} batch {args.batch_size}, {args.world_size} ranks, {args.bandwidth}; "
        f"torch {torch.__version__}; {platform.machine()}"
    )
    print("| plan | replayed | measured | error | replayed bubble |")
    print("|---|---|---|---|---|")
    for label, predicted_ms, measured_ms, bubble in rows:
        error = predicted_ms / measured_ms - 1
        print(
            f"| {label} | {predicted_ms:.1f} ms | {measured_ms:.1f} ms | {error:+.1%} | "
            f"{bubble:.1f} ms |"
        )


if __name__ == "__main__":
    main()
