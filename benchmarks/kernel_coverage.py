"""Kernel profiles of every zoo model on this CPU: do the node times add up, and repeat?

For each model, two profiles (same graph, same process): the median iteration with the profiler
off, the sum of per-node medians (``attributed``), their ratio (``coverage``), and the median
over heavy nodes (> 1 % of the iteration) of the relative difference between the two profiles.
Prints a Markdown table for BENCHMARKS.md.

    .venv/bin/python benchmarks/kernel_coverage.py [--models mlp bert-base] [--iters 5]
"""

import argparse
import functools
import os
import platform
import statistics
import time

import torch

from ddlsim.data.zoo import ZOO
from ddlsim.profiler.kernels import KernelProfile, profile_kernels


def _repeat_difference(first: KernelProfile, second: KernelProfile) -> float:
    floor = 0.01 * first.iteration_time_ms
    heavy = [n for n, ms in first.node_ms.items() if ms > floor and n in second.node_ms]
    return statistics.median(
        abs(first.node_ms[n] - second.node_ms[n]) / first.node_ms[n] for n in heavy
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(ZOO), choices=list(ZOO))
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {args.threads} threads, "
        f"torch {torch.__version__}, iters {args.iters}, warmup {args.warmup}"
    )
    print(
        "| model | nodes timed | matched events | iteration (profiler off) | attributed "
        "| coverage | 2nd coverage | per-node repeat difference (median) | wall |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        start = time.perf_counter()
        profile = functools.partial(
            profile_kernels, ZOO[name], iters=args.iters, warmup=args.warmup, threads=args.threads
        )
        graph, first = profile()
        _, second = profile(graph=graph)
        wall = time.perf_counter() - start
        print(
            f"| {name} | {first.num_nodes_timed} | {first.matched_fraction:.1%} "
            f"| {first.iteration_time_ms:.1f} ms | {first.attributed_ms:.1f} ms "
            f"| {first.coverage:.3f} | {second.coverage:.3f} "
            f"| {_repeat_difference(first, second):.1%} | {wall:.0f} s |",
            flush=True,
        )


if __name__ == "__main__":
    main()
