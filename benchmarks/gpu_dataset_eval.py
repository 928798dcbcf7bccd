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
import gzip
import json
import sys
from pathlib import Path
from typing import Any

from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.profiler.capture import capture_graph
from ddlsim.simulator.dataset import Dataset, KernelEntry, RunEntry, load_dataset
from ddlsim.simulator.gpu.learned import evaluate_holdout, gpu_of
from ddlsim.simulator.train import TrainOptions

ZOO_CUDA = Path(__file__).resolve().parents[1] / "ddlsim/data/measured/h100/zoo_cuda.json.gz"


def zoo_cuda_dataset(path: Path = ZOO_CUDA) -> tuple[Dataset, str]:
    """The shipped zoo runs on one H100 as a dataset, and the GPU's name."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        raw = json.load(handle)
    kernels = {}
    runs = []
    for model in raw["models"]:
        spec = ZOO[model["model"]].with_inputs(**model["inputs"])
        profile = model["kernel_profile"]
        kernels[(spec.label, spec.inputs.batch_size)] = KernelEntry(
            graph=capture_graph(spec), node_ms={}, iteration_time_ms=profile["iteration_time_ms"]
        )
        for mode, strategy in (("eager", Strategy()), ("compiled", Strategy(compile=True))):
            samples = [ms for run in model["runs"][mode] for ms in run["samples_ms"]]
            runs.append(
                RunEntry(
                    model=spec,
                    strategy=strategy,
                    world_size=1,
                    bandwidth="none",
                    samples_ms=tuple(samples),
                    seed=0,
                    created_at=raw["date"],
                    extra={"launch_id": f"zoo_cuda:{spec.label}"},
                )
            )
    return Dataset(runs=tuple(runs), kernels=kernels, links=(), meta={}), str(raw["device"])


def _gpu_name(dataset: Dataset) -> str:
    sheet = dataset.meta.get("datasheet") or {}
    return str(sheet.get("gpu") or dataset.meta.get("gpu") or "")


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
        dataset, name = zoo_cuda_dataset()
    else:
        dataset = load_dataset(Path(args.dataset))
        name = _gpu_name(dataset)
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
