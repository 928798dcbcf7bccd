"""Convergence of each search algorithm: the best score after N evaluations.

For one model on one cluster setting, every algorithm of ``ddlsim search`` (backtracking,
Optuna's TPE and CMA-ES, random search) runs with the same budget on the same simulator (the
shipped cost model unless ``--simulator replay``); the table gives the best score found after
each checkpoint of evaluations (the predicted time times the kind's calibration factor, as the
search ranks; ``--confidence off``: the prediction), as a ratio to DDP's
defaults, and each run's wall time. Kernel
profiles and link fits come from ``--db`` (the rank's micro-batch is profiled there if missing).

    .venv/bin/python benchmarks/search_convergence.py --model gpt2-tiny --world-size 2 \
        --bandwidth 1gbit --batch-size 8 --seq-len 64 --budget 500 --db sqlite:///ds.db
"""

import argparse
import json
import math
import platform
import subprocess
import sys
from pathlib import Path

import torch

ALGORITHMS = ("backtrack", "tpe", "cmaes", "nsga2", "random")
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
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
    parser.add_argument("--space", default="all")
    parser.add_argument("--confidence", default="0.8", help="as ddlsim search's, or off")
    parser.add_argument("--plot", help="write the curves here (SVG)")
    parser.add_argument("--db", required=True)
    args = parser.parse_args()
    rows = {}
    for algo in ALGORITHMS:
        command = [
            *(sys.executable, "-m", "ddlsim.service.cli", "search", args.model),
            *("--world-size", args.world_size, "--bandwidth", args.bandwidth),
            *("--batch-size", args.batch_size, "--seq-len", args.seq_len),
            *("--algo", algo, "--budget", str(args.budget), "--time-limit", "600"),
            *("--db", args.db, "--json", "--space", args.space),
            *("--confidence", args.confidence),
            *(("--simulator", args.simulator) if args.simulator else ()),
        ]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows[algo] = json.loads(out)
        print(f"# {algo}: {rows[algo]['evaluations']} evaluations", flush=True)
    baseline = rows["backtrack"]["baseline"]["scored_ms"]
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
    if args.plot:
        curves = {a: [v / baseline for v in r["convergence"]] for a, r in rows.items()}
        title = f"{first['model']}, {first['world_size']} ranks"
        Path(args.plot).write_text(svg(curves, title=title), "utf-8")


def svg(curves: dict[str, list[float]], *, title: str) -> str:
    """Best price / DDP's defaults against evaluations (log scale), one line a search."""
    width, height, pad = 640, 400, 50
    longest = max(len(c) for c in curves.values())
    low = min(min(c) for c in curves.values())
    top = 1.0 + 0.02

    def x(i: int) -> float:
        return pad + (width - 2 * pad) * math.log10(i + 1) / math.log10(max(longest, 2))

    def y(v: float) -> float:
        return pad + (height - 2 * pad) * (top - v) / max(top - low, 1e-9)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
        f'<text x="{pad}" y="20" font-size="14">{title}: best score / DDP defaults</text>',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
        'stroke="black"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
        f'<text x="{width / 2}" y="{height - 10}" font-size="12">evaluations (log)</text>',
        f'<text x="5" y="{pad}" font-size="11">{top:.2f}</text>',
        f'<text x="5" y="{height - pad}" font-size="11">{low:.2f}</text>',
    ]
    for index, (name, curve) in enumerate(curves.items()):
        colour = COLOURS[index % len(COLOURS)]
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(curve))
        parts.append(f'<polyline fill="none" stroke="{colour}" points="{points}"/>')
        parts.append(
            f'<text x="{width - pad - 80}" y="{pad + 16 * index}" fill="{colour}" '
            f'font-size="12">{name}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    main()
