"""Gradient bucketing and DeAR on an emulated cluster, measured side by side.

Two parts, each printing a Markdown table for BENCHMARKS.md:

* ``parity``: the executor's own buckets (post-accumulate-grad hooks) with DDP's partition
  against ``DistributedDataParallel`` itself, in alternating pairs of runs; the ratio of each
  pair's medians, and the median of those ratios.
* ``table``: for each model, DDP's defaults, a few bucket partitions and DeAR, run one after
  another in rounds (round-robin, so a slow spell of the machine hits every strategy alike);
  each cell is the median over rounds of the run's median iteration, with the ratio to DDP's
  defaults.

    .venv/bin/python benchmarks/executor_fusion.py parity --model gpt2-tiny --pairs 5
    .venv/bin/python benchmarks/executor_fusion.py table --models mlp gpt2-tiny --rounds 3
"""

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any

import torch

from ddlsim.cluster import ClusterRunError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.run import RunOptions, RunResult, run_training

STRATEGIES: dict[str, dict[str, Any]] = {
    "DDP defaults (1 + 25 MiB)": {},
    "one bucket (hooks)": {
        "tensor_fusion": {"bucket_caps_mb": [65536], "implementation": "hooks"}
    },
    "1 MiB buckets (hooks)": {"tensor_fusion": {"bucket_cap_mb": 1, "implementation": "hooks"}},
    "4 MiB buckets (hooks)": {"tensor_fusion": {"bucket_cap_mb": 4, "implementation": "hooks"}},
    "DeAR, 4 MiB buckets": {"tensor_fusion": {"bucket_cap_mb": 4, "dear": True}},
}


def _run(model: str, strategy: dict[str, Any], args: argparse.Namespace) -> RunResult:
    options = RunOptions(
        world_size=args.world_size,
        bandwidth=args.bandwidth,
        iters=args.iters,
        warmup=args.warmup,
    )
    spec = ZOO[model].with_inputs(batch_size=args.batch_size)
    return run_training(spec, Strategy.from_dict(strategy), options)


def _partition(result: RunResult) -> list[frozenset[str]]:
    return sorted((frozenset(b["params"]) for b in result.applied["buckets"]), key=sorted)


def _header(args: argparse.Namespace) -> None:
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; "
        f"{args.world_size} ranks, {args.bandwidth}, {args.iters} iterations after "
        f"{args.warmup} warm-up" + (f"; global batch {args.batch_size}" if args.batch_size else "")
    )


def parity(args: argparse.Namespace) -> None:
    _header(args)
    ddp: dict[str, Any] = {}
    hooks: dict[str, Any] = {"tensor_fusion": {"implementation": "hooks"}}
    ratios = []
    print("| pair | DDP (native) | executor's hooks, same partition | hooks / DDP |")
    print("|---|---|---|---|")
    for pair in range(args.pairs):
        # Alternate which goes first, so warming of the machine does not favour one side.
        first, second = (ddp, hooks) if pair % 2 == 0 else (hooks, ddp)
        a = _run(args.model, first, args)
        b = _run(args.model, second, args)
        native, own = (a, b) if first is ddp else (b, a)
        if _partition(native) != _partition(own):
            raise SystemExit("the two runs launched different bucket partitions")
        ratio = own.median_ms / native.median_ms
        ratios.append(ratio)
        print(
            f"| {pair + 1} | {native.median_ms:.1f} ms | {own.median_ms:.1f} ms | {ratio:.3f} |",
            flush=True,
        )
    print(f"\nbuckets in both: {len(_partition(native))}, identical partitions in every pair")
    print(f"\nmedian ratio hooks / DDP over {args.pairs} pairs: {statistics.median(ratios):.3f}")


def table(args: argparse.Namespace) -> None:
    _header(args)
    names = list(STRATEGIES)
    print("| model | " + " | ".join(names) + " | wall |")
    print("|---|" + "---|" * (len(names) + 1))
    for model in args.models:
        start = time.perf_counter()
        samples: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.rounds):
            for name in names:
                try:
                    samples[name].append(_run(model, STRATEGIES[name], args).median_ms)
                except ClusterRunError as exc:
                    # Reported, not hidden: the cell shows how many runs failed.
                    print(f"{model}, {name}: run failed: {exc}", file=sys.stderr, flush=True)
        if not samples[names[0]]:
            print(f"| {model} | failed |", flush=True)
            continue
        base = statistics.median(samples[names[0]])
        cells = [f"{base:.0f} ms"]
        for name in names[1:]:
            if not samples[name]:
                cells.append("failed")
                continue
            value = statistics.median(samples[name])
            cells.append(f"{value:.0f} ms ({value / base:.2f})")
        failures = sum(args.rounds - len(v) for v in samples.values())
        if failures:
            cells[-1] += f" [{failures} failed runs]"
        wall = time.perf_counter() - start
        print(f"| {model} | " + " | ".join(cells) + f" | {wall:.0f} s |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("part", choices=("parity", "table"))
    parser.add_argument("--model", default="gpt2-tiny", choices=list(ZOO))
    parser.add_argument("--models", nargs="+", default=list(ZOO), choices=list(ZOO))
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=None, help="global batch, every model")
    args = parser.parse_args()
    parity(args) if args.part == "parity" else table(args)


if __name__ == "__main__":
    main()
