"""Kernel profiles under glibc's default allocator against the ranks' allocator, side by side.

The executor's ranks run with glibc's malloc keeping freed memory (``profiler.allocator``); the
kernel profiles the replay prices compute from were taken, until that module, under glibc's
defaults, where every tensor above 32 MiB is a fresh ``mmap`` region whose pages fault on first
touch each step. For each ``MODEL:BATCH`` this program profiles the model (``profile_kernels``,
one thread, pinned to one core) in a fresh process per profile, alternating the two allocators
for ``--rounds`` rounds, and reports each one's median iteration (profiler off) and the ratio
default over rank with its 95 % interval (rounds resampled, ``executor.protocol.speedup``):
above 1, the default allocator's profile overstates the step a rank computes. Beside each: the
largest tensor of the model's graph.

    .venv/bin/python benchmarks/allocator.py --models bert-tiny:4 bert-tiny:16 llama-tiny:2 \\
        llama-tiny:8 gpt2-tiny:16 --rounds 3 --json allocator.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from ddlsim.data.zoo import resolve_model
from ddlsim.executor.protocol import speedup
from ddlsim.profiler.capture import capture_graph

# One profile in a fresh process: "default" keeps glibc's defaults (the profiler as it was).
_CHILD = """
import json, os, sys
os.sched_setaffinity(0, {0})
from ddlsim.data.zoo import resolve_model
from ddlsim.profiler import kernels
model, batch, mode, iters = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
if mode == "default":
    kernels.use_rank_allocator = lambda: False
spec = resolve_model(model).with_inputs(batch_size=batch)
_, profile = kernels.profile_kernels(spec, iters=iters, warmup=2)
print(json.dumps(list(profile.iteration_samples_ms)))
"""
MODES = ("default", "rank")


def _profile(model: str, batch: int, mode: str, iters: int) -> list[float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, model, str(batch), mode, str(iters)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    return [float(x) for x in json.loads(done.stdout.strip().splitlines()[-1])]


def _parse(item: str) -> tuple[str, int]:
    model, _, batch = item.partition(":")
    try:
        resolve_model(model)
        size = int(batch)
    except ValueError as exc:  # an unknown model, or a batch that is not a number
        message = f"--models item {item!r}: expected ZOO_NAME:BATCH, e.g. bert-tiny:16 ({exc})"
        raise SystemExit(message) from None
    if size < 1:
        raise SystemExit(f"--models item {item!r}: the batch must be >= 1")
    return model, size


def measure(model: str, batch: int, rounds: int, iters: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    sample_rounds: dict[str, list[int]] = {mode: [] for mode in MODES}
    for index in range(rounds):
        order = MODES if index % 2 == 0 else MODES[::-1]
        for mode in order:
            times = _profile(model, batch, mode, iters)
            samples[mode] += times
            sample_rounds[mode] += [index] * len(times)
    # median(default) / median(rank): above 1, the default allocator's profile is slower
    ratio = speedup(
        samples["default"],
        samples["rank"],
        baseline_rounds=sample_rounds["default"],
        candidate_rounds=sample_rounds["rank"],
    )
    graph = capture_graph(resolve_model(model).with_inputs(batch_size=batch))
    largest = max((t.nbytes for n in graph.nodes for t in n.outputs), default=0)
    return {
        "model": model,
        "batch_size": batch,
        "largest_tensor_mib": round(largest / 2**20, 1),
        "default_ms": statistics.median(samples["default"]),
        "rank_ms": statistics.median(samples["rank"]),
        "default_over_rank": ratio.ratio,
        "interval": list(ratio.interval),
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert-tiny:16", "llama-tiny:8"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.rounds < 2 or args.iters < 1:
        raise SystemExit(f"--rounds({args.rounds}) must be >= 2 and --iters({args.iters}) >= 1")
    rows = []
    print("| model | batch | largest tensor MiB | default ms | rank ms | default / rank (95 %) |")
    print("|---|---|---|---|---|---|")
    for item in args.models:
        model, batch = _parse(item)
        row = measure(model, batch, args.rounds, args.iters)
        rows.append(row)
        low, high = row["interval"]
        print(
            f"| {model} | {batch} | {row['largest_tensor_mib']} | {row['default_ms']:.0f} | "
            f"{row['rank_ms']:.0f} | {row['default_over_rank']:.2f}x ({low:.2f}-{high:.2f}) |",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
