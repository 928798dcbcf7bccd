"""The noise floor of the measurement protocol: how well one strategy agrees with itself.

For every (model, plan kind, world size) it runs three launches on the emulated cluster, each
under the protocol (``executor.protocol``): a launch of the strategy alone, a launch holding the
strategy twice side by side (two trainers, turns interleaved), and a second launch alone. Two
ratios come out of it:

- **side by side**: the two copies' medians in the one launch (A against A);
- **separate**: the two lone launches' medians (the same strategy, launched twice).

A ratio far from 1 is noise: nothing differs between the two. The summary gives the median and
the 90th percentile of |ratio - 1| over the pairs of each world size; the headline (the top
level of ``--json``) is the first world size asked for.

    python benchmarks/noise.py --json --out noise.json
    python benchmarks/noise.py --table noise.json      # BENCHMARKS.md's table from a run

Progress goes to stderr; ``--out`` is rewritten after every pair, so an interrupted run keeps
what it measured.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from ddlsim.cluster import remove_stale_namespaces
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import resolve_model
from ddlsim.executor.protocol import speedup
from ddlsim.executor.run import RunOptions, RunResult, compare_training, run_training

MODELS = ("gpt2-tiny", "bert-tiny", "llama-tiny", "t5-tiny", "opt-tiny", "convnext-atto")
KINDS: dict[str, dict[str, Any]] = {
    "ddp": {},
    "fsdp": {"parallel": {"fsdp": True}},
    "dear": {"tensor_fusion": {"bucket_cap_mb": 4, "dear": True}},
    "hooks": {"tensor_fusion": {"bucket_cap_mb": 4, "implementation": "hooks"}},
}
# Images as the dataset takes them: 64 x 64, so that a step takes tens of milliseconds.
IMAGE_SIZE = 64


def _spec(name: str) -> ModelSpec:
    spec = resolve_model(name)
    if spec.inputs.image_size is not None:
        spec = spec.with_inputs(image_size=IMAGE_SIZE)
    return spec


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _measured(run: RunResult) -> dict[str, Any]:
    return {
        "median_ms": run.median_ms,
        "ci95_ms": list(run.ci95_ms),
        "samples": len(run.samples_ms),
        "warmup": len(run.warmup_ms),
        "stopped_by": run.stopped_by,
        "rank_cores": {str(k): v for k, v in run.rank_cores.items()},
    }


def measure_pair(spec: ModelSpec, strategy: Strategy, options: RunOptions) -> dict[str, Any]:
    """The three launches of one (model, strategy, world size): alone, twice side by side,
    alone again."""
    first = run_training(spec, strategy, options)
    a, b = compare_training(spec, [strategy, strategy], options)
    second = run_training(spec, strategy, options)
    together = speedup(
        a.samples_ms,
        b.samples_ms,
        baseline_rounds=a.sample_rounds,
        candidate_rounds=b.sample_rounds,
    )
    return {
        "side_by_side_ratio": a.median_ms / b.median_ms,
        "side_by_side_interval": list(together.interval),
        "side_by_side_verdict": together.verdict,
        "separate_ratio": first.median_ms / second.median_ms,
        "launches": {
            "first": _measured(first),
            "side_by_side": [_measured(a), _measured(b)],
            "second": _measured(second),
        },
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and p90 of |ratio - 1| over ``rows``, side by side and separate."""
    together = [abs(r["side_by_side_ratio"] - 1) for r in rows]
    apart = [abs(r["separate_ratio"] - 1) for r in rows]
    return {
        "pairs": len(rows),
        "side_by_side_median": statistics.median(together),
        "side_by_side_p90": _quantile(together, 0.9),
        "separate_median": statistics.median(apart),
        "separate_p90": _quantile(apart, 0.9),
    }


def table(payload: dict[str, Any]) -> str:
    """The rows of a run as a Markdown table: each launch's median, the side-by-side ratio with
    its interval and verdict, the separate launches' ratio."""
    lines = [
        "| model | plan | ranks | alone, 1st | side by side (A / A) | interval | verdict "
        "| alone, 2nd | separate (1st / 2nd) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in payload["rows"]:
        launches = row["launches"]
        low, high = row["side_by_side_interval"]
        lines.append(
            f"| {row['model']} | {row['kind']} | {row['world_size']} "
            f"| {launches['first']['median_ms']:.1f} ms | {row['side_by_side_ratio']:.4f} "
            f"| {low:.3f}-{high:.3f} | {row['side_by_side_verdict']} "
            f"| {launches['second']['median_ms']:.1f} ms | {row['separate_ratio']:.4f} |"
        )
    for size, summary in payload["by_world_size"].items():
        lines.append("")
        lines.append(
            f"{size} ranks, {summary['pairs']} pairs: side by side median "
            f"{summary['side_by_side_median']:.2%}, p90 {summary['side_by_side_p90']:.2%}; "
            f"separate median {summary['separate_median']:.2%}, p90 "
            f"{summary['separate_p90']:.2%}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--kinds", nargs="+", default=["ddp", "fsdp"], choices=sorted(KINDS))
    parser.add_argument("--world-sizes", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--ci", type=float, default=0.01)
    parser.add_argument("--measure-budget", type=float, default=30.0)
    parser.add_argument("--out", type=Path, help="write the JSON here as pairs finish")
    parser.add_argument("--json", action="store_true", help="print the JSON")
    parser.add_argument("--table", type=Path, help="print a saved run (--out) as Markdown")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(args.table.read_text(encoding="utf-8"))))
        return 0
    remove_stale_namespaces()
    rows: list[dict[str, Any]] = []
    started = time.time()

    def payload() -> dict[str, Any]:
        by_size = {
            str(size): summarize([r for r in rows if r["world_size"] == size])
            for size in args.world_sizes
            if any(r["world_size"] == size for r in rows)
        }
        head = by_size.get(str(args.world_sizes[0]), {})
        return {
            **head,
            "world_size": args.world_sizes[0],
            "by_world_size": by_size,
            "bandwidth": args.bandwidth,
            "protocol": {"iters": args.iters, "ci": args.ci, "budget_s": args.measure_budget},
            "elapsed_s": time.time() - started,
            "rows": rows,
        }

    for size in args.world_sizes:
        options = RunOptions(
            world_size=size,
            bandwidth=args.bandwidth,
            iters=args.iters,
            ci_target=args.ci,
            budget_s=args.measure_budget,
        )
        for name in args.models:
            spec = _spec(name)
            for kind in args.kinds:
                strategy = Strategy.from_dict(KINDS[kind])
                row = {"model": name, "kind": kind, "world_size": size}
                row.update(measure_pair(spec, strategy, options))
                rows.append(row)
                print(
                    f"{name} {kind} {size} ranks: side by side {row['side_by_side_ratio']:.4f}, "
                    f"separate {row['separate_ratio']:.4f} ({time.time() - started:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
                if args.out:
                    args.out.write_text(json.dumps(payload(), indent=2), encoding="utf-8")
    result = payload()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for size, row in result["by_world_size"].items():
            print(
                f"{size} ranks, {row['pairs']} pairs: side by side median "
                f"{row['side_by_side_median']:.2%} p90 {row['side_by_side_p90']:.2%}; separate "
                f"median {row['separate_median']:.2%} p90 {row['separate_p90']:.2%}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
