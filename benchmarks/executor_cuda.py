"""The zoo on one GPU: eager against compiled blocks, and per-node kernel times.

For each model, at its zoo inputs unless ``--batch-size`` is given, on one rank:

* ``ddlsim run`` eager and with every repeated block compiled (inductor), in alternating
  rounds so that a slow spell hits both; each cell is the median over rounds of a run's median
  iteration, with the ratio compiled / eager and the compile time kept apart;
* a kernel profile (``ddlsim profile kernels --device cuda``): the device time of every graph
  node, and how much of the iteration the device is busy (``coverage``).

Prints a Markdown table for BENCHMARKS.md and, with ``--out``, writes every sample, loss and
per-node time as gzipped JSON (what ``data/measured/`` keeps).

    python benchmarks/executor_cuda.py --models gpt2-tiny bert-small --rounds 3 \\
        --out data/measured/h100/zoo_cuda.json.gz
"""

import argparse
import gzip
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ddlsim.cluster import ClusterRunError
from ddlsim.data.models import repeated_blocks
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.run import RunOptions, RunResult, run_training
from ddlsim.profiler.kernels import profile_kernels


def _run(spec: ModelSpec, strategy: Strategy, args: argparse.Namespace) -> RunResult:
    options = RunOptions(device=args.device, iters=args.iters, warmup=args.warmup)
    return run_training(spec, strategy, options)


def _record(result: RunResult) -> dict[str, Any]:
    return {
        "samples_ms": result.samples_ms,
        "warmup_ms": result.warmup_ms,
        "losses": result.losses,
        "peak_memory_bytes": result.peak_memory_bytes,
        "compile_time_s": result.compile_time_s,
        "compiled_graphs": result.applied.get("compiled_graphs"),
        "graph_hash": result.graph.graph_hash,
    }


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    spec = ZOO[name].with_inputs(batch_size=args.batch_size)
    blocks = repeated_blocks(spec)
    strategies = {
        "eager": Strategy(),
        "compiled": Strategy.from_dict({"op_fusion": {"compiled": blocks}}),
    }
    runs: dict[str, list[dict[str, Any]]] = {"eager": [], "compiled": []}
    for round_index in range(args.rounds):
        order = list(strategies) if round_index % 2 == 0 else list(reversed(strategies))
        for kind in order:
            try:
                runs[kind].append(_record(_run(spec, strategies[kind], args)))
            except ClusterRunError as exc:
                print(f"{name}, {kind}: run failed: {exc}", file=sys.stderr, flush=True)
    graph, profile = profile_kernels(spec, device=args.device, iters=args.profile_iters)
    return {
        "model": name,
        "inputs": spec.inputs.to_dict(),
        "blocks_compiled": blocks,
        "runs": runs,
        "kernel_profile": {
            **profile.summary(),
            "iteration_samples_ms": list(profile.iteration_samples_ms),
            "node_ms": {str(k): v for k, v in profile.node_ms.items()},
            "nodes": len(graph.nodes),
        },
    }


def _median_of_medians(runs: list[dict[str, Any]]) -> float | None:
    if not runs:
        return None
    return statistics.median(statistics.median(r["samples_ms"]) for r in runs)


def row(entry: dict[str, Any]) -> str:
    eager = _median_of_medians(entry["runs"]["eager"])
    compiled = _median_of_medians(entry["runs"]["compiled"])
    kp = entry["kernel_profile"]
    peak = max(r["peak_memory_bytes"][0] for r in entry["runs"]["eager"]) if eager else 0
    compile_s = [r["compile_time_s"] for r in entry["runs"]["compiled"] if r["compile_time_s"]]
    cells = [
        entry["model"],
        str(entry["inputs"].get("batch_size")),
        f"{eager:.2f} ms" if eager else "failed",
        f"{compiled:.2f} ms" if compiled else "failed",
        f"{compiled / eager:.2f}" if eager and compiled else "-",
        f"{statistics.median(compile_s):.1f} s" if compile_s else "-",
        f"{peak / 2**20:.0f} MiB",
        f"{kp['attributed_ms']:.2f} ms",
        f"{kp['coverage']:.2f}",
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(ZOO), choices=list(ZOO))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile-iters", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=None, help="global batch, every model")
    parser.add_argument("--device", default="cuda", help="cuda (cpu only to try the program)")
    parser.add_argument("--out", type=Path, help="write every measurement here (.json.gz)")
    args = parser.parse_args()
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor()
    print(
        f"device: {device_name}; torch {torch.__version__}; {args.rounds} rounds of "
        f"{args.iters} iterations after {args.warmup} warm-up; one rank",
        flush=True,
    )
    print(
        "| model | batch | eager | compiled blocks | compiled / eager | compile | peak memory "
        "| kernel time (profile) | device busy |"
    )
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    results = []
    for name in args.models:
        start = time.perf_counter()
        entry = measure(name, args)
        entry["wall_s"] = time.perf_counter() - start
        results.append(entry)
        print(row(entry), flush=True)
        if args.out is not None:
            # Written after every model: a run cut short keeps what it measured.
            payload = {
                "device": device_name,
                "torch": torch.__version__,
                "python": platform.python_version(),
                "date": time.strftime("%Y-%m-%d"),
                "settings": {k: v for k, v in vars(args).items() if k != "out"},
                "models": results,
            }
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(args.out, "wt", encoding="utf-8") as f:
                json.dump(payload, f)


if __name__ == "__main__":
    main()
