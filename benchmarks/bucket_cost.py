"""What a gradient bucket costs a data-parallel step, measured side by side and priced by the
replay: the per-bucket term the replay charges, checked against the runs.

One model on ``--world-size`` ranks over ``--bandwidth``: the gradients cut into 1, 2, 4, ...
contiguous buckets of about equal bytes in ready order (the executor's hooks), and DDP with its
default caps and with a cap every gradient exceeds (one bucket a gradient), all run in one
launch under the measurement protocol (``compare_training``) and predicted by the replay alone
from the store's kernel profile and link fits. The slope of time over the number of buckets,
measured and predicted (least squares over the hooks' partitions), is what a bucket costs; the
difference between the two slopes is what the replay misses a bucket.

    .venv/bin/python benchmarks/bucket_cost.py --db sqlite:////tmp/bucket.db \\
        --model gpt2-tiny --counts 1 2 4 8 16 --json bucket.json
    cp /tmp/bucket.db /tmp/sweep.db
    .venv/bin/python benchmarks/bucket_cost.py --db sqlite:////tmp/sweep.db --sweep bucket.json

``--sweep`` re-prices a measured file's strategies with the store's all-reduce latency set to
each of ``--alphas``: which latency the measured speed-ups of many small buckets call for.
"""

import argparse
import dataclasses
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import resolve_model
from ddlsim.executor.run import RunOptions, compare_training
from ddlsim.search.partitions import even_cuts
from ddlsim.simulator.costs import rank_spec
from ddlsim.workflows.profiles import normalized_bandwidth
from ddlsim.workflows.requests import SearchRequest
from ddlsim.workflows.search import build_evaluator


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``y`` over ``x``."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_mean, y_mean = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - x_mean) ** 2 for x in xs)
    return sum((x - x_mean) * (y - y_mean) for x, y in points) / sxx


def partitions(order: list[str], sizes: list[int], counts: list[int]) -> dict[str, Strategy]:
    """Hooks strategies cutting the ready order into each of ``counts`` buckets."""
    out: dict[str, Strategy] = {}
    for count in counts:
        if count > len(order):
            continue
        cuts = (0, *even_cuts(sizes, count), len(order))
        groups = [order[a:b] for a, b in itertools.pairwise(cuts) if b > a]
        tf = {"buckets": groups, "implementation": "hooks"}
        out[f"hooks x{len(groups)}"] = Strategy.from_dict({"tensor_fusion": tf})
    return out


def strategies_of(
    spec: ModelSpec, store: Store, args: argparse.Namespace
) -> tuple[dict[str, Strategy], dict[str, float]]:
    """The strategies of the comparison and the replay's prediction of each."""
    request = SearchRequest(
        model=spec,
        world_size=args.world_size,
        bandwidth=args.bandwidth,
        confidence=None,
        simulator="replay",
    )
    evaluator = build_evaluator(request, store)
    graph, _ = evaluator.profiles(rank_spec(spec, Strategy(), args.world_size))
    order = [name for name, _ in graph.gradient_sizes]
    sizes = [size for _, size in graph.gradient_sizes]
    strategies = partitions(order, sizes, args.counts)
    strategies["ddp defaults"] = Strategy()
    tiny = {"bucket_cap_mb": 1e-6, "first_bucket_cap_mb": 1e-6, "implementation": "ddp"}
    strategies[f"ddp x{len(order)}"] = Strategy.from_dict({"tensor_fusion": tiny})
    predicted = evaluator.predicted(list(strategies.values()))
    return strategies, dict(zip(strategies, predicted, strict=True))


def sweep(spec: ModelSpec, args: argparse.Namespace) -> None:
    """The replay's speed-up errors over DDP's defaults on the measured rows of ``args.sweep``
    with the store's all-reduce latency set to each of ``args.alphas`` (a copy of the store)."""
    measured = {
        r["strategy"]: r["measured_ms"] for r in json.loads(args.sweep.read_text())["rows"]
    }
    with Store.open(args.db) as store:
        fits = store.collective_profiles(
            collective="all_reduce", world_size=args.world_size, bandwidth=args.bandwidth
        )
        fit = fits[-1]
        print(
            f"the store's all-reduce fit: alpha {fit.alpha_us:.0f} us, {fit.busbw_gbps:.3f} Gb/s"
        )
        print("| alpha us | " + " | ".join(measured) + " |")
        print("|---|" + "---|" * len(measured))
        for alpha in args.alphas:
            store.save_collective_profile(
                profile=dataclasses.replace(fit, id=None, created_at=None, alpha_us=alpha)
            )
            _, predicted = strategies_of(spec, store, args)
            base_m, base_p = measured["ddp defaults"], predicted["ddp defaults"]
            cells = [
                f"{(base_p / predicted[k]) / (base_m / measured[k]) - 1:+.3f}" for k in measured
            ]
            print(f"| {alpha:.0f} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True, help="the store of profiles and link fits")
    parser.add_argument("--model", default="gpt2-tiny")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--measure-budget", type=float, default=60.0)
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument(
        "--sweep",
        type=Path,
        help="a --json file measured before: no runs, the replay's speed-up errors on its rows "
        "with the all-reduce latency set to each of --alphas (the store is changed: use a copy)",
    )
    parser.add_argument("--alphas", type=float, nargs="+", default=[0, 250, 500, 1000, 1500, 2000])
    args = parser.parse_args()
    began = time.time()
    spec = resolve_model(args.model)
    if args.sweep:
        sweep(spec, args)
        return
    with Store.open(args.db) as store:
        strategies, predicted = strategies_of(spec, store, args)
    options = RunOptions(
        world_size=args.world_size,
        bandwidth=normalized_bandwidth(args.bandwidth),
        iters=args.iters,
        budget_s=args.measure_budget,
    )
    runs = compare_training(spec, list(strategies.values()), options, rounds=args.rounds)
    rows: list[dict[str, Any]] = []
    for (name, strategy), run in zip(strategies.items(), runs, strict=True):
        buckets = len(run.applied.get("buckets", [])) or int(name.split("x")[-1])
        rows.append(
            {
                "strategy": name,
                "buckets": buckets,
                "measured_ms": run.median_ms,
                "ci95_ms": list(run.ci95_ms),
                "predicted_ms": predicted[name],
                "tensor_fusion": strategy.to_dict()["tensor_fusion"]["implementation"],
            }
        )
    hooks = [r for r in rows if r["strategy"].startswith("hooks")]
    measured_slope = slope([(r["buckets"], r["measured_ms"]) for r in hooks])
    predicted_slope = slope([(r["buckets"], r["predicted_ms"]) for r in hooks])
    print(f"{args.model} on {args.world_size} ranks at {args.bandwidth}, side by side:")
    print("| strategy | buckets | measured ms (95 % interval) | replay ms | replay / measured |")
    print("|---|---|---|---|---|")
    for r in rows:
        low, high = r["ci95_ms"]
        print(
            f"| {r['strategy']} | {r['buckets']} | {r['measured_ms']:.1f} ({low:.1f}-{high:.1f}) "
            f"| {r['predicted_ms']:.1f} | {r['predicted_ms'] / r['measured_ms']:.3f} |"
        )
    print(
        f"a bucket (hooks): measured {measured_slope:.3f} ms, replay {predicted_slope:.3f} ms, "
        f"missing {measured_slope - predicted_slope:.3f} ms"
    )
    if args.json:
        report = {
            "model": args.model,
            "world_size": args.world_size,
            "bandwidth": args.bandwidth,
            "rows": rows,
            "measured_ms_per_bucket": measured_slope,
            "replay_ms_per_bucket": predicted_slope,
            "rank_cores": {str(k): v for k, v in runs[0].rank_cores.items()},
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(began)),
        }
        args.json.write_text(json.dumps(report, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
