"""The analytical prior over grid plans: how many simulator evaluations a search needs to reach
its pick with and without it, and whether the pick is the same.

For each model and world size, the grid plans of the search space (``search/plans.py``: every
rows x cols x depth x data the model divides) are priced by the simulator (the shipped cost
model, ``--simulator`` to change it). Without the prior a search walks them as the space lists
them (``in order``) or in a random order (``random``, the median over ``--orders``
permutations); with it, ``search/prior.py`` drops the grids the analytical model finds more than
25 % slower than its fastest and orders the rest by it. *Evaluations to best* is the number of
grids the walk prices until it first meets the best of what it will price; *pick* is the best
grid it prices, and *same pick* whether that is the best grid of the whole space. Optuna's TPE
sampler (``--tpe-seeds`` seeds) searches the same spaces with a budget of as many evaluations as
the space has grids; the table counts the seeds whose pick is the best grid (its convergence
curve starts at DDP's defaults, which beat every grid on this cluster, so the curve's
evaluations to best say nothing of the grids).

    .venv/bin/python benchmarks/grid_prior.py --db sqlite:///bench.db \\
        --models gpt2-tiny llama-tiny bert-tiny --world-sizes 4 8 --json grid_prior.json
"""

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import resolve_model
from ddlsim.plans.feasibility import model_supports
from ddlsim.search.algorithm import SearchBudget, SearchProblem
from ddlsim.search.plans import candidate_plans
from ddlsim.search.prior import grid_prior
from ddlsim.search.registry import search_algorithm
from ddlsim.search.space import Space
from ddlsim.search.strategy_evaluator import StrategyEvaluator
from ddlsim.simulator.costs import rank_spec
from ddlsim.workflows.requests import SearchRequest
from ddlsim.workflows.search import build_evaluator


def to_best(times: list[float]) -> int:
    """Evaluations a walk pricing ``times`` in order needs to first meet their minimum."""
    return times.index(min(times)) + 1


def walks(plans: list[ParallelPlan], prices: dict[ParallelPlan, float], orders: int) -> dict:
    in_order = [prices[p] for p in plans]
    rng = random.Random(0)
    shuffled = []
    for _ in range(orders):
        order = list(plans)
        rng.shuffle(order)
        shuffled.append(to_best([prices[p] for p in order]))
    best = min(plans, key=lambda p: prices[p])
    return {
        "grids": len(plans),
        "in_order_to_best": to_best(in_order),
        "random_to_best_median": statistics.median(shuffled),
        "pick": best.label,
        "pick_ms": prices[best],
    }


def tpe(evaluator: StrategyEvaluator, plans: list[ParallelPlan], seed: int) -> dict[str, Any]:
    graph, _ = evaluator.profiles(
        rank_spec(evaluator.spec, Strategy(), evaluator.cluster.world_size)
    )
    order = [name for name, _ in graph.gradient_sizes]
    sizes = [size for _, size in graph.gradient_sizes]
    space = Space(plans=tuple(plans), total_grad_mb=sum(sizes) / 2**20)
    problem = SearchProblem(evaluator=evaluator, space=space, order=order, sizes=sizes)
    # DDP's defaults, the baseline every search prices first, and the grids
    budget = SearchBudget(evaluations=len(plans) + 1, seed=seed, time_limit_s=600)
    outcome = search_algorithm("tpe").search(problem, budget)
    curve = list(outcome.curve)
    return {
        "seed": seed,
        "to_best": to_best(curve) if curve else 0,
        "pick": outcome.top[0][0].parallel.label if outcome.top else "ddp",
        "pick_ms": outcome.top[0][1] if outcome.top else outcome.baseline_ms,
    }


def run(model: str, world_size: int, args: argparse.Namespace, store: Store) -> dict[str, Any]:
    spec = resolve_model(model).with_inputs(batch_size=args.batch_size)
    request = SearchRequest(
        model=spec,
        world_size=world_size,
        bandwidth=args.bandwidth,
        confidence=None,
        simulator=args.simulator,
    )
    grids = [p for p in candidate_plans(spec, world_size, model_supports) if p.grid]
    evaluator = build_evaluator(request, store)
    started = time.perf_counter()
    prior = [p for p in grid_prior(grids, evaluator.analytic) if p.grid]
    prior_s = time.perf_counter() - started
    started = time.perf_counter()
    prices = dict(
        zip(grids, evaluator.predicted([Strategy(parallel=p) for p in grids]), strict=True)
    )
    simulator_s = time.perf_counter() - started
    best = min(prices.values())
    without, with_prior = walks(grids, prices, args.orders), walks(prior, prices, args.orders)
    row: dict[str, Any] = {
        "model": model,
        "world_size": world_size,
        "batch_size": args.batch_size,
        "bandwidth": args.bandwidth,
        "without_prior": without,
        "with_prior": with_prior,
        "same_pick": with_prior["pick_ms"] <= best,
        "prior_s": prior_s,
        "simulator_s": simulator_s,
        "prior_order": [p.label for p in prior],
    }
    tpe_runs = {}
    for name, space in (("without_prior", grids), ("with_prior", prior)):
        runs = []
        for seed in range(args.tpe_seeds):
            fresh = build_evaluator(request, store)  # a search of its own: no memo shared
            runs.append(tpe(fresh, space, seed))
        tpe_runs[name] = {
            "to_best_median": statistics.median(r["to_best"] for r in runs),
            "picks_best": sum(r["pick_ms"] <= best * (1 + 1e-9) for r in runs),
            "runs": runs,
        }
    row["tpe"] = tpe_runs
    return row


def table(rows: list[dict[str, Any]]) -> None:
    print(
        "| model | ranks | grids (kept) | in order: evaluations to best without / with | "
        "random order: without / with | TPE seeds picking the best grid: without / with "
        "| same pick |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        a, b = row["without_prior"], row["with_prior"]
        ta, tb = row["tpe"]["without_prior"], row["tpe"]["with_prior"]
        seeds = len(ta["runs"])
        print(
            f"| {row['model']} | {row['world_size']} | {a['grids']} ({b['grids']}) | "
            f"{a['in_order_to_best']} / {b['in_order_to_best']} | "
            f"{a['random_to_best_median']:g} / {b['random_to_best_median']:g} | "
            f"{ta['picks_best']}/{seeds} / {tb['picks_best']}/{seeds} | "
            f"{'yes' if row['same_pick'] else 'no'} ({b['pick']}) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db")
    parser.add_argument("--models", nargs="*", default=["gpt2-tiny", "llama-tiny", "bert-tiny"])
    parser.add_argument("--world-sizes", nargs="*", type=int, default=[4, 8])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--simulator")
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument("--tpe-seeds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    with Store.open(args.db) as store:
        for model in args.models:
            for world_size in args.world_sizes:
                rows.append(run(model, world_size, args, store))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    table(rows)


if __name__ == "__main__":
    main()
