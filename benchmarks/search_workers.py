"""One worker against two on one Optuna study: the same budget, the best found and the wall time.

``ddlsim search --workers W`` runs W processes that share a study (a temporary SQLite file),
each with its own simulator and sampler seed; the budget is the study's trials in all. Runs
alternate between one and two workers, ``--repeats`` times each; the table gives the median
wall time of the whole command (start-up of the extra process included) and the median best
price found: two workers should reach at least one worker's best, in less time.

    .venv/bin/python benchmarks/search_workers.py --db sqlite:///bench.db --model gpt2-tiny \
        --algo tpe --budget 600
"""

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

import torch


def run(args: argparse.Namespace, workers: int) -> tuple[float, float]:
    command = [
        *(sys.executable, "-m", "ddlsim.service.cli", "search", args.model),
        *("--world-size", str(args.world_size), "--bandwidth", args.bandwidth),
        *("--algo", args.algo, "--budget", str(args.budget), "--space", args.space),
        *("--time-limit", "600", "--workers", str(workers), "--db", args.db, "--json"),
    ]
    started = time.perf_counter()
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - started
    return wall, float(json.loads(out)["best"]["predicted_ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True)
    parser.add_argument("--model", default="gpt2-tiny")
    parser.add_argument("--world-size", default="2")
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--algo", default="tpe")
    parser.add_argument("--space", default="fusion")
    parser.add_argument("--budget", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    walls: dict[int, list[float]] = {1: [], 2: []}
    bests: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.repeats):
        for workers in (1, 2):
            wall, best = run(args, workers)
            walls[workers].append(wall)
            bests[workers].append(best)
            print(f"# {workers} worker(s): {wall:.1f} s, best {best:.2f} ms", flush=True)
    print(
        f"# {args.model}, {args.world_size} ranks, {args.bandwidth}, {args.algo}, "
        f"{args.space} space, budget {args.budget}; torch {torch.__version__}; "
        f"{platform.machine()}"
    )
    print("| workers | median wall time | median best predicted ms | wall time vs one |")
    print("|---|---|---|---|")
    base = statistics.median(walls[1])
    for workers in (1, 2):
        wall = statistics.median(walls[workers])
        print(
            f"| {workers} | {wall:.1f} s | {statistics.median(bests[workers]):.2f} | "
            f"{wall / base:.2f} |"
        )


if __name__ == "__main__":
    main()
