"""Convergence of each search algorithm: the best predicted iteration time after N evaluations.

For one model on one cluster setting, every algorithm of ``ddlsim search`` (backtracking,
Optuna's TPE and CMA-ES, random search) runs with the same budget on the same simulator (the
shipped cost model unless ``--simulator replay``); the table gives the best price found after
each checkpoint of evaluations, as a ratio to DDP's defaults, and each run's wall time. Kernel
profiles and link fits come from ``--db`` (the rank's micro-batch is profiled there if missing).

    .venv/bin/python benchmarks/search_convergence.py --model gpt2-tiny --world-size 2 \
        --bandwidth 1gbit --batch-size 8 --seq-len 64 --budget 500 --db sqlite:///ds.db
"""

import argparse
import json
import platform
import subprocess
import sys

import torch

ALGORITHMS = ("backtrack", "tpe", "cmaes", "random")
CHECKPOINTS = (10, 25, 50, 100, 250, 500, 1000, 2000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="gpt2-tiny")
    parser.add_argument("--world-size", default="2")
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--batch-size", default="8")
    parser.add_argument("--seq-len", default="64")
    parser.add_argument("--budget", type=int, default=500)
    parser.add_argument("--simulator")
    parser.add_argument("--db", required=True)
    args = parser.parse_args()
    rows = {}
    for algo in ALGORITHMS:
        command = [
            *(sys.executable, "-m", "service.cli", "search", args.model),
            *("--world-size", args.world_size, "--bandwidth", args.bandwidth),
            *("--batch-size", args.batch_size, "--seq-len", args.seq_len),
            *("--algo", algo, "--budget", str(args.budget), "--time-limit", "600"),
            *("--db", args.db, "--json"),
            *(("--simulator", args.simulator) if args.simulator else ()),
        ]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows[algo] = json.loads(out)
        print(f"# {algo}: {rows[algo]['evaluations']} evaluations", flush=True)
    baseline = rows["backtrack"]["baseline"]["predicted_ms"]
    first = rows["backtrack"]
    print(
        f"# {first['model']}, {first['world_size']} ranks, {first['bandwidth']}; predictor "
        f"{first['predictor']}; DDP's defaults {baseline:.1f} ms; torch {torch.__version__}; "
        f"{platform.machine()}"
    )
    marks = [c for c in CHECKPOINTS if c <= args.budget]
    print("| algorithm | " + " | ".join(f"after {c}" for c in marks) + " | wall time |")
    print("|---|" + "---|" * (len(marks) + 1))
    for algo, row in rows.items():
        curve = row["convergence"]
        cells = [f"{curve[min(c, len(curve) - 1)] / baseline:.3f}" for c in marks]
        print(f"| {algo} | " + " | ".join(cells) + f" | {row['elapsed_s']:.1f} s |")


if __name__ == "__main__":
    main()
