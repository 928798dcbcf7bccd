"""The replay of expert-parallel plans against the executor's runs of them, side by side.

For one mixture-of-experts model on an emulated cluster: DDP's defaults (the baseline) and
expert-parallel plans (all-to-all and all-gather dispatch, several ``ep``, micro-batches), each
predicted by the replay alone (the collectives fitted on this link, the routers' imbalance
measured) and then run for real, all plans in one launch (``compare_training``: turns in
shuffled order, the measurement protocol's stopping rule). The table gives the medians with
their 95 % intervals, the error of each prediction and the ratio of each plan to DDP's
defaults, predicted and measured. Collective fits come from ``--db`` (the link is profiled
there first if it has no fit of the all-to-all).

    .venv/bin/python benchmarks/replay_experts.py --model mixtral-tiny --world-size 2 \
        --bandwidth 1gbit --db sqlite:///ds.db
"""

import argparse
import platform
import statistics
from typing import Any

import torch

from ddlsim.cluster import remove_stale_namespaces
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import resolve_model
from ddlsim.executor.run import RunOptions, compare_training
from ddlsim.simulator.cost_model import ReplayCostModel
from ddlsim.workflows.predict import predict_on_store
from ddlsim.workflows.profiles import profile_link

LINK_OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def plans(world_size: int) -> list[tuple[str, dict[str, Any]]]:
    """DDP's defaults, then expert-parallel plans of ``world_size`` ranks."""
    out: list[tuple[str, dict[str, Any]]] = [("DDP defaults", {})]
    for ep in (e for e in (2, 4) if world_size % e == 0):
        edp = world_size // ep
        out.append((f"ep {ep} (edp {edp}), all-to-all", {"parallel": {"ep": ep}}))
        out.append(
            (
                f"ep {ep} (edp {edp}), all-gather",
                {"parallel": {"ep": ep, "dispatcher": "all_gather"}},
            )
        )
    out.append(
        (
            "ep 2, all-to-all, 2 micro-batches",
            {"parallel": {"ep": 2, "micro_batches": 2}},
        )
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="mixtral-tiny")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--link-repeats",
        type=int,
        default=15,
        help="timed runs of each collective and size where the link is profiled",
    )
    parser.add_argument("--db", required=True)
    args = parser.parse_args()
    spec = resolve_model(args.model).with_inputs(batch_size=args.batch_size)
    remove_stale_namespaces()
    labelled = plans(args.world_size)
    strategies = [Strategy.from_dict(raw) for _, raw in labelled]
    predicted = []
    with Store.open(args.db) as store:
        for ranks in sorted({args.world_size, *(s.parallel.ep for s in strategies)} - {1}):
            profile_link(
                store,
                world_size=ranks,
                bandwidth=args.bandwidth,
                collectives=LINK_OPS,
                repeats=args.link_repeats,
            )
        for (label, _), strategy in zip(labelled, strategies, strict=True):
            prediction, _, _ = predict_on_store(
                store,
                spec,
                strategy,
                world_size=args.world_size,
                bandwidth=args.bandwidth,
                cost_model=ReplayCostModel(),  # the replay alone
            )
            predicted.append(prediction.iteration_time_ms)
            print(f"# {label}: predicted {predicted[-1]:.1f} ms", flush=True)
    options = RunOptions(
        world_size=args.world_size, bandwidth=args.bandwidth, iters=args.iters, warmup=2
    )
    results = compare_training(spec, strategies, options, rounds=args.rounds)
    print(
        f"# {spec.label} batch {args.batch_size}, {args.world_size} ranks, {args.bandwidth}; "
        f"side by side in one launch ({results[0].rounds} rounds); torch {torch.__version__}; "
        f"{platform.machine()}"
    )
    header = "| plan | replayed | measured (median, 95 % CI) | error | replayed / DDP |"
    print(f"{header} measured / DDP |")
    print("|---|---|---|---|---|---|")
    errors = []
    for (label, _), ms, result in zip(labelled, predicted, results, strict=True):
        low, high = result.ci95_ms
        error = ms / result.median_ms - 1
        if label != "DDP defaults":
            errors.append(abs(error))
        print(
            f"| {label} | {ms:.1f} ms | {result.median_ms:.1f} ms [{low:.1f}, {high:.1f}] | "
            f"{error:+.1%} | {ms / predicted[0]:.2f} | "
            f"{result.median_ms / results[0].median_ms:.2f} |"
        )
    print(f"# expert-parallel plans: median |error| {statistics.median(errors):.1%}")


if __name__ == "__main__":
    main()
