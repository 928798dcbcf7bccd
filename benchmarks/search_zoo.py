"""The search's pick against DDP's defaults and the perfect-overlap bound, for every zoo model.

For each model and world size, ``ddlsim search --verify`` finds the fastest strategy with the
simulator and then runs the pick and DDP's defaults through the executor, side by side on the
emulated cluster. Each row gives the measured speed-up of the pick over DDP's defaults and the
pick's measured time as a ratio to the perfect-overlap bound ``max(compute, communication at
line rate)``: ``compute`` is the rank's profiled forward, backward and optimizer time (scaled for
ranks sharing this machine's cores), ``communication`` a ring all-reduce of every gradient at
the link's rate, ``2 (n - 1) / n * grad_bytes / rate``. A ratio of 1 would be perfect overlap at
line rate; no strategy can go below it.

Rows are appended to ``--out`` (JSON lines) as they finish, so a long run cut short keeps what
it measured; ``--table`` prints the Markdown table of a finished file.

    .venv/bin/python benchmarks/search_zoo.py --db sqlite:///bench.db --out zoo.jsonl
    .venv/bin/python benchmarks/search_zoo.py --table zoo.jsonl
"""

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ddlsim.data.specs.cluster import parse_bandwidth_gbps
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import ZOO, resolve_model
from ddlsim.simulator.calibration import risk_kind
from ddlsim.simulator.cost_model import ReplayCostModel
from ddlsim.workflows.predict import predict_on_store


def line_rate_ms(grad_bytes: int, world_size: int, bandwidth_gbps: float) -> float:
    """A ring all-reduce of ``grad_bytes`` at the link's rate, no latency."""
    return 2 * (world_size - 1) / world_size * grad_bytes * 8 / (bandwidth_gbps * 1e9) * 1e3


def bound_ms(model: str, world_size: int, bandwidth: str, db: str) -> dict[str, float]:
    spec = resolve_model(model)
    with Store.open(db) as store:
        prediction, _, _ = predict_on_store(
            store,
            spec,
            Strategy(),
            world_size=world_size,
            bandwidth=bandwidth,
            cost_model=ReplayCostModel(),
        )
    compute = prediction.result.breakdown()["compute_ms"]
    grad_bytes = sum(p.nbytes for p in prediction.graph.params)
    comm = line_rate_ms(grad_bytes, world_size, parse_bandwidth_gbps(bandwidth) or 10.0)
    return {"compute_ms": compute, "line_rate_comm_ms": comm, "bound_ms": max(compute, comm)}


def measure(args: argparse.Namespace, model: str, world_size: int) -> dict[str, Any]:
    command = [
        *(sys.executable, "-m", "ddlsim.service.cli", "search", model),
        *("--world-size", str(world_size), "--bandwidth", args.bandwidth),
        *("--algo", args.algo, "--budget", str(args.budget)),
        *("--iters", str(args.iters), "--warmup", str(args.warmup)),
        *("--db", args.db, "--verify", "--json", *args.search_args),
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
        return {"error": [f"over {args.timeout:.0f} s"]}
    if child.returncode != 0:
        return {"error": stderr.strip().splitlines()[-1:] or ["failed"]}
    row = json.loads(stdout)
    row.update(bound_ms(model, world_size, args.bandwidth, args.db))
    row["wall_s"] = time.perf_counter() - started
    return row


def table(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]
    _rows_table(rows)
    _summary(rows)


def _summary(rows: list[dict[str, Any]]) -> None:
    """The geometric mean of the measured speed-ups, how many picks were more than 5 % faster
    or slower than DDP's defaults, and the same by the kind of the pick."""
    by_kind: dict[str, list[float]] = {}
    for row in rows:
        if "error" in row or row.get("speedup") is None:
            continue
        kind = risk_kind(Strategy.from_dict(row["best"]["strategy"]))
        by_kind.setdefault(kind, []).append(float(row["speedup"]))
    every = [x for values in by_kind.values() for x in values]
    if not every:
        return
    faster = sum(1 for x in every if x > 1.05)
    slower = sum(1 for x in every if x < 1 / 1.05)
    print(
        f"\n{len(every)} rows: geometric mean {_geomean(every):.2f}x; picks more than 5 % faster "
        f"than DDP's defaults: {faster}; more than 5 % slower: {slower}\n"
    )
    print("| pick | rows | geometric mean | worst | best |")
    print("|---|---|---|---|---|")
    for kind, values in sorted(by_kind.items(), key=lambda item: -len(item[1])):
        print(
            f"| {kind} | {len(values)} | {_geomean(values):.2f}x | {min(values):.2f}x | "
            f"{max(values):.2f}x |"
        )


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in values) / len(values))


def _rows_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| model | ranks | pick | predicted speed-up | measured speed-up | pick / bound | "
        "bound is |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['model']} | {row['world_size']} | failed: {row['error'][0]} |||||")
            continue
        best = row["best"]
        predicted = row["baseline"]["predicted_ms"] / best["predicted_ms"]
        what = "compute" if row["compute_ms"] >= row["line_rate_comm_ms"] else "comm"
        if row["speedup"] is None:  # DDP's defaults predicted over the memory capacity
            measured = "DDP over memory, not run"
            predicted_text = "-"
        else:
            measured = f"{row['speedup']:.2f}x"
            predicted_text = f"{predicted:.2f}x"
        pick = Strategy.from_dict(best["strategy"]).describe()
        print(
            f"| {row['model']} | {row['world_size']} | {pick} | "
            f"{predicted_text} | {measured} | "
            f"{row['measured_best_ms'] / row['bound_ms']:.2f} | {what} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path, help="print the table of a finished --out file")
    parser.add_argument("--models", nargs="*", default=list(ZOO))
    parser.add_argument("--world-sizes", nargs="*", type=int, default=[2, 4])
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--algo", default="backtrack")
    parser.add_argument("--budget", type=int, default=2000)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds a model")
    parser.add_argument("search_args", nargs="*", help="more arguments for ddlsim search")
    args = parser.parse_args()
    if args.table:
        table(args.table)
        return
    if not args.db or not args.out:
        parser.error("--db and --out are needed to measure")
    print(f"# torch {torch.__version__}, {platform.machine()}, {args.bandwidth}", flush=True)
    for model in args.models:
        for world_size in args.world_sizes:
            row = measure(args, model, world_size)
            row.setdefault("model", model)
            row.setdefault("world_size", world_size)
            with args.out.open("a", encoding="utf-8") as out:
                out.write(json.dumps(row) + "\n")
            print(
                json.dumps({k: row.get(k) for k in ("model", "world_size", "speedup")}), flush=True
            )


if __name__ == "__main__":
    main()
