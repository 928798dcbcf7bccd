"""Eager 1F1B against torch's 1F1B on pipelines whose stages differ in layout, predicted and
measured side by side.

Eager 1F1B (Alpa's) warms a stage up with ``2 * (pp - stage) - 1`` forwards instead of
``pp - stage``, so that the next micro-batches' activations, resharded from the tensor-parallel
stage's layout to the batch-split one on the way, are already in flight while the stage runs its
backwards; it holds more activations in exchange. For each model, on 4 ranks over
``--bandwidth``, two pipelines of two stages (a tensor-parallel stage then a batch-split one,
``parallel.stages``; and two batch-split stages) run under both schedules with
``--micro-batches`` micro-batches, beside DDP's defaults, in one launch under the measurement
protocol (``compare_training``). Each row gives the shipped cost model's predicted gain of eager
over 1F1B (1F1B's predicted time over eager's) beside the measured one with its 95 % interval.

    .venv/bin/python benchmarks/eager_1f1b.py --db sqlite:///bench.db \\
        --models gpt2-tiny llama-tiny --out eager.jsonl
"""

import argparse
import json
import time
from pathlib import Path
from typing import Any

from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import resolve_model
from ddlsim.executor.protocol import speedup
from ddlsim.executor.run import RunOptions, compare_training
from ddlsim.workflows.profiles import normalized_bandwidth
from ddlsim.workflows.requests import SearchRequest
from ddlsim.workflows.search import build_evaluator

WORLD_SIZE = 4
LAYOUTS: dict[str, list[str]] = {"tp-batch": ["tp", "batch"], "batch-batch": []}


def pipeline(schedule: str, layouts: list[str], micro_batches: int) -> Strategy:
    parallel: dict[str, Any] = {"pp": 2, "micro_batches": micro_batches, "pp_schedule": schedule}
    if layouts:
        parallel["stages"] = layouts
    return Strategy.from_dict({"parallel": parallel})


def run_model(model: str, args: argparse.Namespace, store: Store) -> list[dict[str, Any]]:
    spec = resolve_model(model)
    if args.batch_size:
        spec = spec.with_inputs(batch_size=args.batch_size)
    pairs = {
        name: (
            pipeline("1f1b", layouts, args.micro_batches),
            pipeline("eager_1f1b", layouts, args.micro_batches),
        )
        for name, layouts in LAYOUTS.items()
    }
    request = SearchRequest(
        model=spec, world_size=WORLD_SIZE, bandwidth=args.bandwidth, confidence=None
    )
    evaluator = build_evaluator(request, store)
    strategies = [s for pair in pairs.values() for s in pair] + [Strategy()]
    predicted = dict(zip(strategies, evaluator.predicted(strategies), strict=True))
    options = RunOptions(
        world_size=WORLD_SIZE,
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
    rows = []
    for name, (lazy, eager) in pairs.items():
        got = speedup(
            runs[lazy].samples_ms,
            runs[eager].samples_ms,
            baseline_rounds=runs[lazy].sample_rounds,
            candidate_rounds=runs[eager].sample_rounds,
        )
        rows.append(
            {
                "model": model,
                "batch_size": spec.inputs.batch_size,
                "stages": name,
                "micro_batches": args.micro_batches,
                "bandwidth": args.bandwidth,
                "predicted_ms": {"1f1b": predicted[lazy], "eager_1f1b": predicted[eager]},
                "measured_ms": {"1f1b": runs[lazy].median_ms, "eager_1f1b": runs[eager].median_ms},
                "ddp_measured_ms": runs[Strategy()].median_ms,
                "predicted_gain": predicted[lazy] / predicted[eager],
                "measured_gain": {
                    "ratio": got.ratio,
                    "interval": list(got.interval),
                    "verdict": got.verdict,
                },
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> None:
    print(
        "| model | stages | micro-batches | 1F1B measured ms | eager measured ms | predicted gain "
        "| measured gain (95 % interval) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        got = row["measured_gain"]
        low, high = got["interval"]
        print(
            f"| {row['model']} | {row['stages']} | {row['micro_batches']} | "
            f"{row['measured_ms']['1f1b']:.0f} | {row['measured_ms']['eager_1f1b']:.0f} | "
            f"{row['predicted_gain']:.3f}x | {got['ratio']:.3f}x ({low:.3f}-{high:.3f}), "
            f"{got['verdict']} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db")
    parser.add_argument("--models", nargs="*", default=["gpt2-tiny", "llama-tiny"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--micro-batches", type=int, default=4)
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
