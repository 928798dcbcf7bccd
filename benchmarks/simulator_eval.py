"""Held-out accuracy of the simulator on the shipped dataset, one model family held out at a time.

For each family: the cost model is trained on the other families' runs and evaluated on the held
out one; the tables give, for the replay, the GNN and their blend, the mean and 90th-percentile
absolute percentage error, Kendall's tau within each (model, cluster) group and the share of
strategy pairs (measured more than 3 % apart) ordered right; a last row pools every fold's runs,
and a second table splits the pooled runs by strategy kind (buckets, DeAR, compiled blocks, FSDP,
tensor parallel, pipelines).
Also the duration head's median error on the held-out family's ops (durations hidden), the
fused-block head's median error on the held-out family's compiled blocks (against taking their
eager time for the compiled one), the dataset's noise (repeat runs of DDP's defaults) and the
training time per fold. Where the runs recorded their median's 95 % interval (cpu-v3), each
fold's row also gives its labels' own noise: the median and 90th percentile of that interval's
half-width over the median, the error no predictor can be shown to beat.

    .venv/bin/python benchmarks/simulator_eval.py [--dataset FILE] [--epochs N] [--workers W]
        [--out FILE.json]
"""

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from ddlsim.simulator.cost_model import PREDICTORS
from ddlsim.simulator.dataset import Dataset, load_dataset
from ddlsim.simulator.default import shipped_dataset
from ddlsim.simulator.evaluate import Accuracy
from ddlsim.simulator.gnn import CostModelConfig
from ddlsim.simulator.holdout import (
    cross_validate,
    label_noise,
    metrics_by_kind,
    speedup_error,
    speedup_error_by_world_size,
)
from ddlsim.simulator.train import TrainOptions


def noise(dataset: Dataset) -> tuple[float, int]:
    """Median relative difference between a run of DDP's defaults and its repeat (seed 1)."""
    first: dict[tuple[str, int, str], float] = {}
    again: dict[tuple[str, int, str], float] = {}
    for run in dataset.runs:
        if run.strategy.to_dict() != type(run.strategy)().to_dict():
            continue
        key = (run.model.label, run.world_size, run.bandwidth)
        (again if run.seed == 1 else first)[key] = run.measured_ms
    pairs = [abs(again[k] - first[k]) / first[k] for k in again if k in first]
    return (statistics.median(pairs) if pairs else float("nan")), len(pairs)


def _noise_cell(rows: list[dict]) -> str:
    noise = label_noise(rows)
    if noise["median"] is None:
        return "-"
    return f"±{noise['median']:.3f} (p90 ±{noise['p90']:.3f})"


def _speedup_cell(rows: list[dict], predictor: str) -> str:
    error = speedup_error(rows, predictor)
    if error["median"] is None:
        return "-"
    return f"{error['median']:.3f} (p90 {error['p90']:.3f})"


def _cells(m: Accuracy) -> str:
    pairs = "-" if m.pair_accuracy is None else f"{m.pair_accuracy:.2f}"
    return f"{m.mape:.3f} | {m.p90_ape:.3f} | {m.kendall_tau:.2f} | {pairs}"


def main() -> None:
    """Long: the benchmark's steps in the order they run (folds, predictors, the report)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", type=Path, default=shipped_dataset())
    parser.add_argument("--epochs", type=int, default=TrainOptions().epochs)
    parser.add_argument("--out", type=Path, help="write every fold's rows as JSON here")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="folds trained at once"
    )
    args = parser.parse_args()
    dataset = load_dataset(args.dataset)
    started = time.perf_counter()
    reports, pooled = cross_validate(
        dataset,
        config=CostModelConfig(),
        options=TrainOptions(epochs=args.epochs),
        progress=lambda message: print(f"# {message}", flush=True),
        workers=args.workers,
    )
    elapsed = time.perf_counter() - started
    spread, repeats = noise(dataset)
    print(
        f"# {len(dataset.runs)} runs, {len(dataset.families)} families; torch "
        f"{torch.__version__}; {platform.machine()}; {elapsed:.0f} s in all"
    )
    print(
        f"# noise: median |repeat - first| / first of DDP's defaults = {spread:.3f} "
        f"over {repeats} pairs"
    )
    header = " | ".join(f"{p} MAPE | {p} p90 | {p} tau | {p} pairs" for p in PREDICTORS)
    print(
        f"| held out | runs | label noise | {header} | blend speed-up error | op-time MdAPE | "
        "compiled blocks | fused MdAPE (eager as fused) | train |"
    )
    print("|---|---|---|" + "---|" * (4 * len(PREDICTORS)) + "---|---|---|---|---|")
    for report in reports:
        cells = " | ".join(_cells(report.metrics[p]) for p in PREDICTORS)
        print(
            f"| {', '.join(report.holdout)} | {len(report.rows)} | "
            f"{_noise_cell(list(report.rows))} | {cells} | "
            f"{_speedup_cell(list(report.rows), 'blend')} | "
            f"{report.duration_mdape:.2f} | {report.fused_blocks} | "
            f"{report.fused_mdape:.3f} ({report.fused_mdape_unfused:.3f}) | "
            f"{report.train_seconds:.0f} s |"
        )
    cells = " | ".join(_cells(pooled[p]) for p in PREDICTORS)
    total = sum(len(r.rows) for r in reports)
    rows = [row for report in reports for row in report.rows]
    print(
        f"| **all folds** | {total} | {_noise_cell(rows)} | {cells} | "
        f"{_speedup_cell(rows, 'blend')} | | | | |"
    )
    for predictor in PREDICTORS:
        error = speedup_error(rows, predictor)
        print(f"# {predictor} speed-up error over DDP's defaults: {error}")
    print("\nSpeed-up over DDP's defaults of the same launch, |predicted / measured - 1|:\n")
    print("| predictor | ranks | runs | median | p90 |")
    print("|---|---|---|---|---|")
    for predictor in PREDICTORS:
        for size, error in speedup_error_by_world_size(rows, predictor).items():
            if error["median"] is not None:
                print(
                    f"| {predictor} | {size} | {error['runs']} | {error['median']:.3f} | "
                    f"{error['p90']:.3f} |"
                )
    print("\nAll folds' runs by strategy kind (MAPE | p90 | tau | pairs):\n")
    print(f"| kind | runs | {header} |")
    print("|---|---|" + "---|" * (4 * len(PREDICTORS)))
    for kind, metrics in metrics_by_kind(rows).items():
        count = sum(row["kind"] == kind for row in rows)
        print(f"| {kind} | {count} | {' | '.join(_cells(metrics[p]) for p in PREDICTORS)} |")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "folds": [r.to_json() for r in reports],
                    "pooled": {p: m.to_json() for p, m in pooled.items()},
                    "noise": spread,
                    "label_noise": label_noise(rows),
                    "speedup_error": {p: speedup_error(rows, p) for p in PREDICTORS},
                    "speedup_error_by_world_size": {
                        p: speedup_error_by_world_size(rows, p) for p in PREDICTORS
                    },
                },
                indent=1,
            ),
            "utf-8",
        )


if __name__ == "__main__":
    main()
