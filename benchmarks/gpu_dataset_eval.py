"""Held out by family on a GPU: the roofline alone against the roofline corrected by the GNN.

Each family of a GPU dataset is left out in turn; a cost model trained on the other families'
iterations (:mod:`ddlsim.simulator.gpu.learned`) corrects the held-out family's rooflines.
Prints the MAPE of whole-iteration times of both, by family and over all; ``--out`` writes
every iteration (JSON). Issue 40 asks the corrected MAPE <= 5 % and <= 0.7x the roofline's.

    python benchmarks/gpu_dataset_eval.py --dataset gpu-v1.json.gz        # a collected dataset
    python benchmarks/gpu_dataset_eval.py --zoo-cuda                       # the shipped H100 runs

``--zoo-cuda`` reads ``ddlsim/data/measured/h100/zoo_cuda.json.gz`` (four families, fp32,
eager and compiled, 2026-11-23) as a dataset: each model's graph captured here (the roofline
prices its nodes; the file's per-node times are not used), its kernel profile's iteration and
its eager and compiled runs as one launch.

Time: under a minute for the zoo file on this machine (4 folds, 200 epochs).
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ddlsim.simulator.dataset import load_dataset
from ddlsim.simulator.gpu.learned import evaluate_holdout, gpu_of
from ddlsim.simulator.train import TrainOptions
from ddlsim.workflows.gpu_simulator import gpu_name_of, shipped_gpu_runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", help="a GPU dataset file (ddlsim simulator dataset export)")
    source.add_argument("--zoo-cuda", action="store_true", help="the shipped H100 zoo runs")
    parser.add_argument("--gpu", help="the GPU's name, where the dataset's meta has none")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--out", help="write the report (JSON)")
    args = parser.parse_args(argv)
    if args.zoo_cuda:
        dataset, name = shipped_gpu_runs()
    else:
        dataset = load_dataset(Path(args.dataset))
        name = gpu_name_of(dataset)
    gpu = gpu_of(args.gpu or name)
    report: dict[str, Any] = evaluate_holdout(
        dataset,
        gpu,
        options=TrainOptions(epochs=args.epochs),
        progress=lambda message: print(message, file=sys.stderr),
    )
    print(f"{report['iterations']} iterations of {report['families']} families on {gpu.name}")
    print(f"{'family':<16}{'roofline':>10}{'learned':>10}")
    for family, mape in report["by_family"].items():
        print(f"{family:<16}{mape['roofline']:>10.3f}{mape['learned']:>10.3f}")
    total = report["mape"]
    print(f"{'all':<16}{total['roofline']:>10.3f}{total['learned']:>10.3f}", end="")
    print(f"  ratio {total['ratio']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1), "utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
