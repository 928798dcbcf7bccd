"""Per-layer placements against the best uniform plan, predicted and then measured side by side.

For each model, on ``--world-size`` ranks over ``--bandwidth``, with the shipped cost model:

1. every parallel plan of the search space (DDP with accumulation, FSDP, tensor parallelism,
   pipelines; DDP's bucket defaults) is predicted, and the fastest is the best *uniform* plan;
2. under each tensor-parallel plan, :func:`ddlsim.search.backtrack.explore_layers` places the
   blocks (and the vocabulary) on the tensor-parallel ranks; the fastest is the best
   *per-layer* plan;
3. the best uniform plan, the best per-layer plan and DDP's defaults run side by side in one
   launch under the measurement protocol (``compare_training``): each row gives the predicted
   and the measured speed-up of the per-layer plan over the uniform one, with the measured
   speed-up's 95 % interval.

Issue 19's acceptance: where the per-layer plan is predicted more than 10 % faster than the
best uniform plan, it is measured more than 5 % faster. Prints a Markdown table; ``--out``
writes every row (JSON lines, appended as each model finishes).

    .venv/bin/python benchmarks/layer_placements.py --db sqlite:///bench.db \\
        --models gpt2-tiny bert-tiny llama-tiny --out layers.jsonl
"""

import argparse
import json
import time
from pathlib import Path
from typing import Any

from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import resolve_model
from ddlsim.executor.protocol import speedup
from ddlsim.executor.run import RunOptions, compare_training
from ddlsim.plans.feasibility import model_supports
from ddlsim.plans.tp_plans import check_layouts
from ddlsim.search.backtrack import explore_layers
from ddlsim.search.plans import candidate_plans
from ddlsim.search.space import Space
from ddlsim.workflows.profiles import normalized_bandwidth
from ddlsim.workflows.requests import SearchRequest
from ddlsim.workflows.search import build_evaluator


def plan_pair(model: str, args: argparse.Namespace, store: Store) -> dict[str, Any]:
    """The best uniform and the best per-layer strategy of ``model`` by prediction."""
    spec = resolve_model(model)
    request = SearchRequest(
        model=spec, world_size=args.world_size, bandwidth=args.bandwidth, confidence=None
    )
    evaluator = build_evaluator(request, store)
    plans = candidate_plans(spec, args.world_size, model_supports)
    uniform = [Strategy(parallel=p) for p in plans]
    uniform = [s for s in uniform if evaluator.feasible(s)]
    uniform_ms = evaluator.predicted(uniform)
    best_uniform, best_uniform_ms = min(zip(uniform, uniform_ms, strict=True), key=lambda x: x[1])
    space = Space(
        plans=tuple(plans),
        total_grad_mb=1.0,
        layer_blocks=len(check_layouts(spec, ParallelPlan(tp=2), rank_batch=None))
        if any(p.tp > 1 for p in plans)
        else 0,
        batch_size=spec.inputs.batch_size,
        world_size=args.world_size,
    )
    layered: list[tuple[Strategy, float]] = []
    for base in uniform:
        layouts = space.layer_layouts(base.parallel)
        if not layouts:
            continue
        best = explore_layers(
            base,
            layouts,
            space.layer_blocks,
            price=lambda strategies: list(evaluator.predicted(strategies)),
            done=lambda: False,
        )
        if best.parallel.per_layer:
            layered.append((best, evaluator.predicted([best])[0]))
    if not layered:
        return {"model": model, "error": "no tensor-parallel plan to place layers under"}
    best_layered, best_layered_ms = min(layered, key=lambda x: x[1])
    return {
        "model": model,
        "world_size": args.world_size,
        "uniform": best_uniform.to_dict(),
        "uniform_predicted_ms": best_uniform_ms,
        "layered": best_layered.to_dict(),
        "layered_predicted_ms": best_layered_ms,
        "ddp_predicted_ms": evaluator.predicted([Strategy()])[0],
        "predicted_speedup": best_uniform_ms / best_layered_ms,
    }


def measure(model: str, row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    spec = resolve_model(model)
    uniform, layered = Strategy.from_dict(row["uniform"]), Strategy.from_dict(row["layered"])
    strategies = list(dict.fromkeys([uniform, layered, Strategy()]))
    options = RunOptions(
        world_size=args.world_size,
        bandwidth=normalized_bandwidth(args.bandwidth),
        iters=args.iters,
        warmup=args.warmup,
    )
    runs = dict(
        zip(
            strategies,
            compare_training(spec, strategies, options, rounds=args.rounds),
            strict=True,
        )
    )

    def gain(baseline: Strategy, candidate: Strategy) -> dict[str, Any]:
        a, b = runs[baseline], runs[candidate]
        got = speedup(
            a.samples_ms,
            b.samples_ms,
            baseline_rounds=a.sample_rounds,
            candidate_rounds=b.sample_rounds,
        )
        return {"ratio": got.ratio, "interval": list(got.interval), "verdict": got.verdict}

    return {
        "measured_ms": {s.describe(): runs[s].median_ms for s in strategies},
        "measured_speedup": gain(uniform, layered),
        "layered_over_ddp": gain(Strategy(), layered),
        "uniform_over_ddp": gain(Strategy(), uniform),
    }


def table(rows: list[dict[str, Any]]) -> None:
    print(
        "| model | ranks | best uniform | best per-layer | predicted | measured (95 % interval) "
        "| per-layer / DDP |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['model']} | | {row['error']} |||||")
            continue
        got = row["measured_speedup"]
        low, high = got["interval"]
        ddp = row["layered_over_ddp"]["ratio"]
        print(
            f"| {row['model']} | {row['world_size']} | "
            f"{Strategy.from_dict(row['uniform']).describe()} | "
            f"{Strategy.from_dict(row['layered']).describe()} | "
            f"{row['predicted_speedup']:.2f}x | {got['ratio']:.2f}x ({low:.2f}-{high:.2f}) | "
            f"{ddp:.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db")
    parser.add_argument("--models", nargs="*", default=["gpt2-tiny", "bert-tiny", "llama-tiny"])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path, help="print the table of a finished --out file")
    args = parser.parse_args()
    if args.table:
        table([json.loads(line) for line in args.table.read_text("utf-8").splitlines()])
        return
    rows = []
    for model in args.models:
        started = time.perf_counter()
        with Store.open(args.db) as store:
            row = plan_pair(model, args, store)
        if "error" not in row:
            row.update(measure(model, row, args))
        row["wall_s"] = time.perf_counter() - started
        rows.append(row)
        if args.out:
            with args.out.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
    table(rows)


if __name__ == "__main__":
    main()
