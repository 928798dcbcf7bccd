"""The search table: does the search's answer hold when it runs? 12 zoo models of 12 families,
2 and 4 ranks at 1 Gbit/s, 24 rows.

For each model and world size, ``ddlsim search --verify --verify-top 5`` prices the whole plan
space with the shipped simulator and then runs its five best candidates and DDP's defaults side
by side in one launch under the measurement protocol. The store is shared by the rows: the
first search of each world size profiles the link (``--verify`` does where the store has no
fit of it), the others price on that profile. Each row gives:

- the search's own pick (what it answers without ``--verify``): its predicted speed-up over
  DDP's defaults and its measured one with the 95 % interval;
- the answer with ``--verify``: the measured fastest of the five when it beat DDP's defaults
  beyond the noise, else DDP's defaults, and its measured speed-up;
- the measured best of the five and of DDP's defaults, and the answer's time over it.

The acceptance of issue 39: without ``--verify`` no pick measurably slower than DDP's defaults
(its interval wholly below 1); with ``--verify`` none slower and the answer within 3 % of the
measured best of the five.

Rows are appended to ``--out`` (JSON lines) as they finish; a run cut short keeps its rows and
starts again after the last one written; ``--table`` prints a finished file.

    .venv/bin/python benchmarks/search_table.py --db sqlite:////tmp/table.db --out table.jsonl
    .venv/bin/python benchmarks/search_table.py --table table.jsonl
"""

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ddlsim.data.specs.strategy import Strategy

MODELS = (
    "gpt2-tiny",
    "bert-tiny",
    "llama-tiny",
    "t5-tiny",
    "opt-tiny",
    "mistral-tiny",
    "albert-tiny",
    "electra-tiny",
    "bart-tiny",
    "vit-tiny",
    "resnet-18",
    "convnext-atto",
)
"""Twelve zoo models of twelve families, none of them reserved."""


def search(args: argparse.Namespace, model: str, world_size: int) -> dict[str, Any]:
    """One row's search payload (``ddlsim search --verify --verify-top 5 --json``)."""
    command = [
        *(sys.executable, "-m", "ddlsim.service.cli", "search", model),
        *("--world-size", str(world_size), "--bandwidth", args.bandwidth),
        *("--budget", str(args.budget), "--time-limit", str(args.time_limit)),
        *("--verify", "--verify-top", "5", "--iters", str(args.iters)),
        *("--measure-budget", str(args.measure_budget), "--db", args.db, "--json"),
    ]
    started = time.perf_counter()
    # Its own session, so that a search over time is ended with the ranks it started.
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = child.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGTERM)
        child.communicate()
        return {"error": f"over {args.timeout:.0f} s"}
    except BaseException:  # stopped: the search and its ranks end with it
        os.killpg(child.pid, signal.SIGTERM)
        child.communicate()
        raise
    if child.returncode != 0:
        return {"error": (stderr.strip().splitlines() or ["failed"])[-1]}
    payload = json.loads(stdout)
    payload["wall_s"] = time.perf_counter() - started
    return payload


def row_of(model: str, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """The table's row of one search payload."""
    if "error" in payload:
        return {"model": model, "world_size": world_size, "error": payload["error"]}
    baseline_key = json.dumps(payload["baseline"]["strategy"], sort_keys=True)
    verified = {json.dumps(r["strategy"], sort_keys=True): r for r in payload["verified"]}
    scored = payload.get("scored_best", payload["best"])
    scored_row = verified.get(json.dumps(scored["strategy"], sort_keys=True))
    base = verified[baseline_key]
    best = min(payload["verified"], key=lambda r: r["measured_ms"])
    answer = verified[json.dumps(payload["best"]["strategy"], sort_keys=True)]

    def gain(row: dict[str, Any] | None) -> tuple[float | None, list[float] | None]:
        if row is None:
            return None, None
        if row is base:
            return 1.0, [1.0, 1.0]
        return row["speedup"], row["speedup_interval"]

    pick_gain, pick_interval = gain(scored_row)
    answer_gain, answer_interval = gain(answer)
    return {
        "model": model,
        "world_size": world_size,
        "pick": Strategy.from_dict(scored["strategy"]).describe(),
        "pick_is_baseline": scored_row is base,
        "pick_predicted_speedup": payload["baseline"]["predicted_ms"] / scored["predicted_ms"],
        "pick_measured_speedup": pick_gain,
        "pick_measured_interval": pick_interval,
        "answer": Strategy.from_dict(payload["best"]["strategy"]).describe(),
        "answer_kept_baseline": bool(payload.get("kept_baseline")),
        "answer_measured_speedup": answer_gain,
        "answer_measured_interval": answer_interval,
        "answer_over_best": answer["measured_ms"] / best["measured_ms"],
        "best_of_top5": Strategy.from_dict(best["strategy"]).describe(),
        "baseline_ms": base["measured_ms"],
        "best_ms": best["measured_ms"],
        "candidates": len(payload["verified"]),
        "wall_s": payload["wall_s"],
        "payload": payload,
    }


def table(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]
    print(
        "| model | ranks | pick (no --verify) | predicted | measured (95 % interval) | "
        "answer with --verify | measured | answer / best of 5 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    slower = within = done = 0
    for row in rows:
        if "error" in row:
            print(f"| {row['model']} | {row['world_size']} | failed: {row['error']} ||||||")
            continue
        done += 1
        low, high = row["pick_measured_interval"] or (float("nan"), float("nan"))
        slower += high < 1
        within += row["answer_over_best"] <= 1.03
        print(
            f"| {row['model']} | {row['world_size']} | {row['pick']} | "
            f"{row['pick_predicted_speedup']:.2f}x | {row['pick_measured_speedup']:.3f}x "
            f"({low:.3f}-{high:.3f}) | {row['answer']} | {row['answer_measured_speedup']:.3f}x | "
            f"{row['answer_over_best']:.3f} |"
        )
    print(
        f"\n{done} rows: picks measurably slower than DDP's defaults without --verify: "
        f"{slower}; answers with --verify within 3 % of the measured best of the five: "
        f"{within} of {done}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path, help="print the table of a finished --out file")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--world-sizes", nargs="*", type=int, default=[2, 4])
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--budget", type=int, default=2000)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--measure-budget", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a row")
    args = parser.parse_args()
    # Stopped, it stops the search it runs (its own session, with the ranks it started).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.table:
        table(args.table)
        return
    if not args.db or not args.out:
        parser.error("--db and --out are needed to measure")
    done = set()
    if args.out.exists():
        for line in args.out.read_text("utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                done.add((row["model"], row["world_size"]))
    print(f"# torch {torch.__version__}, {platform.machine()}, {args.bandwidth}", flush=True)
    for world_size in args.world_sizes:
        for model in args.models:
            if (model, world_size) in done:
                continue
            row = row_of(model, world_size, search(args, model, world_size))
            with args.out.open("a", encoding="utf-8") as out:
                out.write(json.dumps(row) + "\n")
            shown = ("model", "world_size", "pick_measured_speedup", "answer_over_best", "error")
            print(json.dumps({k: row.get(k) for k in shown}), flush=True)


if __name__ == "__main__":
    main()
