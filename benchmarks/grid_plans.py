"""Grid tensor parallelism (AxoNN's 3-D split): every grid of 4 ranks measured side by side,
with overlap on and off, beside the replay's, the analytical model's and the shipped cost
model's predictions.

For each model, every factorisation of the 4 ranks into rows x cols x depth x data that the
model's heads and widths divide runs with overlap on, the tensor-parallel-4 grids also with
overlap off, beside DDP's defaults, in one launch under the measurement protocol
(``compare_training``, at most 16 strategies). Each row holds the measured median (ms) with its
95 % interval and the three predictions; the summary gives, per model and pooled, Kendall's tau
of the analytical model and of the replay against the measured times, the replay's median
error, and for each grid with both overlap settings the predicted gain of overlap beside the
measured one. The runs are stored in ``--db`` as a batch's ``compare`` job stores them, so that
``ddlsim simulator dataset export`` takes them into the dataset.

    .venv/bin/python benchmarks/grid_plans.py --db sqlite:///bench.db \\
        --models gpt2-tiny llama-tiny bert-tiny --out grid.jsonl
    .venv/bin/python benchmarks/grid_plans.py --table grid.jsonl
"""

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import resolve_model
from ddlsim.executor.protocol import speedup
from ddlsim.executor.run import RunOptions, compare_training
from ddlsim.plans.grid import grid_layers
from ddlsim.workflows.execute import add_result
from ddlsim.workflows.profiles import normalized_bandwidth
from ddlsim.workflows.requests import SearchRequest
from ddlsim.workflows.search import build_evaluator

WORLD_SIZE = 4
PREDICTORS = ("replay", "analytic", "shipped")


def grids(world_size: int) -> list[tuple[int, int, int]]:
    """Every ``(rows, cols, depth)`` whose product divides ``world_size`` and exceeds 1."""
    sizes = range(1, world_size + 1)
    return [
        (r, c, d)
        for r, c, d in itertools.product(sizes, sizes, sizes)
        if r * c * d > 1 and world_size % (r * c * d) == 0
    ]


def grid_strategy(grid: tuple[int, ...], overlap: bool) -> Strategy:
    return Strategy(parallel=ParallelPlan(grid=grid, grid_overlap=overlap))


def strategies_of(model: str, batch_size: int) -> list[Strategy]:
    spec = resolve_model(model).with_inputs(batch_size=batch_size)
    out = []
    for grid in grids(WORLD_SIZE):
        strategy = grid_strategy(grid, True)
        try:
            grid_layers(spec, strategy.parallel.grid_axes)
            strategy.parallel.rank_batch_size(batch_size, WORLD_SIZE)
        except InvalidStrategyError:
            continue
        out.append(strategy)
    whole = [s for s in out if s.parallel.tp == WORLD_SIZE]
    return out + [grid_strategy(s.parallel.grid, False) for s in whole]


def run_model(model: str, args: argparse.Namespace, store: Store) -> list[dict[str, Any]]:
    spec = resolve_model(model).with_inputs(batch_size=args.batch_size)
    plans = strategies_of(model, args.batch_size)
    if args.grids:
        wanted = set(args.grids)
        plans = [s for s in plans if s.parallel.grid in wanted and s.parallel.grid_overlap]
    strategies = [*plans, Strategy()]
    predicted: dict[str, list[float]] = {}
    for name in PREDICTORS:
        request = SearchRequest(
            model=spec,
            world_size=WORLD_SIZE,
            bandwidth=args.bandwidth,
            confidence=None,
            simulator=None if name == "shipped" else name,
        )
        predicted[name] = build_evaluator(request, store).predicted(strategies)
    by_strategy = {
        strategy.to_json(): {name: predicted[name][i] for name in PREDICTORS}
        for i, strategy in enumerate(strategies)
    }

    def predicted_of(launch: list[Strategy]) -> dict[str, dict[str, float]]:
        return {s.to_json(): by_strategy[s.to_json()] for s in [*launch, Strategy()]}

    options = RunOptions(
        world_size=WORLD_SIZE,
        bandwidth=normalized_bandwidth(args.bandwidth),
        iters=args.iters,
        warmup=args.warmup,
    )
    rows = []
    for launch in launches(plans, args.per_launch):
        rows += measure(
            spec,
            model,
            strategies=[*launch, Strategy()],
            predicted=predicted_of(launch),
            args=args,
            options=options,
            store=store,
        )
    return rows


def launches(plans: list[Strategy], per_launch: int) -> list[list[Strategy]]:
    """``plans`` cut into launches of at most ``per_launch`` (each then run beside DDP's
    defaults), a grid's overlap-on and -off runs always in the same launch."""
    pairs: dict[tuple[int, ...], list[Strategy]] = {}
    for strategy in plans:
        pairs.setdefault(strategy.parallel.grid, []).append(strategy)
    out: list[list[Strategy]] = [[]]
    for group in pairs.values():
        if out[-1] and len(out[-1]) + len(group) > per_launch:
            out.append([])
        out[-1].extend(group)
    return out


def measure(
    spec: Any,
    model: str,
    *,
    strategies: list[Strategy],
    predicted: dict[str, dict[str, float]],
    args: argparse.Namespace,
    options: RunOptions,
    store: Store,
) -> list[dict[str, Any]]:
    """One launch: ``strategies`` (DDP's defaults last) side by side, stored, as rows."""
    runs = compare_training(spec, strategies, options, rounds=args.rounds)
    # Stored as a batch's compare job stores them, so that the session can be exported into
    # the dataset (``ddlsim simulator dataset export``).
    with store.transaction() as session:
        for run in runs:
            add_result(session, run)
    ddp = runs[-1]
    ddp_predicted = predicted[Strategy().to_json()]
    rows = []
    for strategy, run in zip(strategies[:-1], runs, strict=False):
        against_ddp = speedup(
            ddp.samples_ms,
            run.samples_ms,
            baseline_rounds=ddp.sample_rounds,
            candidate_rounds=run.sample_rounds,
        )
        rows.append(
            {
                "model": model,
                "batch_size": args.batch_size,
                "bandwidth": args.bandwidth,
                "grid": list(strategy.parallel.grid),
                "dp": strategy.parallel.resolve_dp(WORLD_SIZE),
                "overlap": strategy.parallel.grid_overlap,
                "strategy": strategy.to_dict(),
                "measured_ms": run.median_ms,
                "samples_ms": run.samples_ms,
                "sample_rounds": run.sample_rounds,
                "speedup_vs_ddp": {
                    "ratio": against_ddp.ratio,
                    "interval": list(against_ddp.interval),
                },
                "ddp_measured_ms": ddp.median_ms,
                **{f"{name}_ms": predicted[strategy.to_json()][name] for name in PREDICTORS},
                "ddp_predicted_ms": ddp_predicted,
                "launch_id": run.launch_id,
            }
        )
    return rows


def kendall_tau(xs: list[float], ys: list[float]) -> float:
    """Kendall's tau-b of two equally long sequences."""
    concordant = discordant = ties_x = ties_y = 0
    for (x1, y1), (x2, y2) in itertools.combinations(zip(xs, ys, strict=True), 2):
        dx, dy = x1 - x2, y1 - y2
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            ties_x += 1
        elif dy == 0:
            ties_y += 1
        elif (dx > 0) == (dy > 0):
            concordant += 1
        else:
            discordant += 1
    n0 = concordant + discordant
    denominator = ((n0 + ties_x) * (n0 + ties_y)) ** 0.5
    return (concordant - discordant) / denominator if denominator else 0.0


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Kendall's tau and the replay's error per model and pooled; overlap gains."""
    out: dict[str, Any] = {"models": {}}
    by_model: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_model.setdefault(row["model"], []).append(row)
    for model, group in [*by_model.items(), ("pooled", rows)]:
        measured = [r["measured_ms"] for r in group]
        out["models"][model] = {
            "plans": len(group),
            **{
                f"tau_{name}": kendall_tau([r[f"{name}_ms"] for r in group], measured)
                for name in PREDICTORS
            },
            **{
                f"median_error_{name}": statistics.median(
                    r[f"{name}_ms"] / r["measured_ms"] - 1 for r in group
                )
                for name in PREDICTORS
            },
        }
    gains = []
    for model, group in by_model.items():
        pairs: dict[tuple[int, ...], dict[bool, dict[str, Any]]] = {}
        for row in group:
            pairs.setdefault(tuple(row["grid"]), {})[row["overlap"]] = row
        for grid, pair in pairs.items():
            if len(pair) < 2:
                continue
            on, off = pair[True], pair[False]
            got = speedup(
                off["samples_ms"],
                on["samples_ms"],
                baseline_rounds=off["sample_rounds"],
                candidate_rounds=on["sample_rounds"],
            )
            gains.append(
                {
                    "model": model,
                    "grid": list(grid),
                    "predicted_gain": off["replay_ms"] / on["replay_ms"],
                    "measured_gain": got.ratio,
                    "interval": list(got.interval),
                    "verdict": got.verdict,
                }
            )
    out["overlap"] = gains
    return out


def table(rows: list[dict[str, Any]]) -> None:
    print(
        "| model | grid r x c x d | dp | overlap | measured ms (vs DDP, 95 % interval) "
        "| replay ms | analytic ms | shipped ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        ratio = row["speedup_vs_ddp"]
        low, high = ratio["interval"]
        print(
            f"| {row['model']} | {'x'.join(map(str, row['grid']))} | {row['dp']} | "
            f"{'on' if row['overlap'] else 'off'} | {row['measured_ms']:.0f} "
            f"({ratio['ratio']:.2f}x, {low:.2f}-{high:.2f}) | {row['replay_ms']:.0f} | "
            f"{row['analytic_ms']:.0f} | {row['shipped_ms']:.0f} |"
        )
    result = summary(rows)
    print()
    print(
        "| model | plans | tau analytic | tau replay | tau shipped | replay error "
        "| shipped error |"
    )
    print("|---|---|---|---|---|---|---|")
    for model, s in result["models"].items():
        print(
            f"| {model} | {s['plans']} | {s['tau_analytic']:.2f} | {s['tau_replay']:.2f} | "
            f"{s['tau_shipped']:.2f} | {s['median_error_replay']:+.1%} | "
            f"{s['median_error_shipped']:+.1%} |"
        )
    print()
    print("| model | grid | predicted gain of overlap | measured gain (95 % interval) |")
    print("|---|---|---|---|")
    for gain in result["overlap"]:
        low, high = gain["interval"]
        print(
            f"| {gain['model']} | {'x'.join(map(str, gain['grid']))} | "
            f"{gain['predicted_gain']:.3f}x | {gain['measured_gain']:.3f}x ({low:.3f}-{high:.3f})"
            f", {gain['verdict']} |"
        )


def grid_argument(text: str) -> tuple[int, int, int]:
    parts = text.split("x")
    if len(parts) != 3 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise argparse.ArgumentTypeError(
            f"a grid is rows x cols x depth, e.g. 2x1x2; got {text!r}"
        )
    rows, cols, depth = (int(part) for part in parts)
    return rows, cols, depth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db")
    parser.add_argument("--models", nargs="*", default=["gpt2-tiny", "llama-tiny", "bert-tiny"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--per-launch",
        type=int,
        default=15,
        help="grid plans a launch runs beside DDP's defaults (each rank's process holds a "
        "model and optimizer a plan: llama-tiny's 32k vocabulary runs out of memory at 13)",
    )
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--grids",
        nargs="*",
        type=grid_argument,
        metavar="RxCxD",
        help="only these grids (overlap on), e.g. 2x1x2; default: every grid of the model",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path, help="print the tables of a finished --out file")
    args = parser.parse_args()
    if args.table:
        table([json.loads(line) for line in args.table.read_text("utf-8").splitlines()])
        return
    rows = []
    for model in args.models:
        started = time.perf_counter()
        with Store.open(args.db) as store:
            got = run_model(model, args, store)
        for row in got:
            row["wall_s"] = time.perf_counter() - started
            if args.out:
                with args.out.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(row) + "\n")
        rows.extend(got)
    table(rows)


if __name__ == "__main__":
    main()
