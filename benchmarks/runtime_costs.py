"""Measure what the plans' runtimes add to a rank's compute, and keep it for the replay.

Two measurements, in this one process, single-threaded as a rank computes:

- one copy pass over a buffer (``profiler.runtime_costs.measure_copy``), what DDP's, the
  executor's and DeAR's gradient bucket copies cost (``simulator.runtime``);
- FSDP2's cost per group and DTensor's per split module, and the optimizer's per parameter
  under each (``executor.overheads.measure_plan_overheads``), on ``--model`` (a dataset model)
  at a rank's micro-batch of the dataset's runs on 2 ranks (4 sequences of 64 tokens).

``--write`` keeps the result as the shipped costs (``ddlsim/data/simulator/runtime_costs.json``);
``--dataset`` records it in that dataset's meta, next to the runs measured on this machine.

    .venv/bin/python benchmarks/runtime_costs.py [--model NAME] [--write] [--dataset FILE]
"""

import argparse
import dataclasses
import json
import platform
import time
from importlib import resources
from pathlib import Path

import torch

from ddlsim.executor.overheads import measure_plan_overheads
from ddlsim.profiler.runtime_costs import measure_copy
from ddlsim.simulator.dataset import dataset_models_v3, load_dataset, save_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="llama-tiny-8k", help="a dataset model with a TP plan")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--write", action="store_true", help="keep as the shipped costs")
    parser.add_argument("--dataset", type=Path, help="record the costs in this dataset's meta")
    args = parser.parse_args()
    began = time.time()
    alpha_us, per_byte, copies = measure_copy()
    models = {m.label: m for m in dataset_models_v3()}
    # a rank's micro-batch when the dataset's global batch of 8 is split over 2 ranks
    spec = models[args.model].with_inputs(batch_size=4)
    plans = measure_plan_overheads(spec, iterations=args.iterations)
    costs = {
        "copy_alpha_us": alpha_us,
        "copy_us_per_byte": per_byte,
        "fsdp_us_per_group": plans["fsdp_us_per_group"],
        "fsdp_us_per_byte": plans["fsdp_us_per_byte"],
        "fsdp_step_us_per_param": plans["fsdp_step_us_per_param"],
        "tp_us_per_module": plans["tp_us_per_module"],
        "tp_step_us_per_param": plans["tp_step_us_per_param"],
    }
    report = {
        **costs,
        "measured": {
            "copy_median_us_by_bytes": {str(k): v for k, v in copies.items()},
            "plans": plans,
        },
        "machine": platform.machine(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(began)),
        "command": (
            f"benchmarks/runtime_costs.py --model {args.model} --iterations {args.iterations}"
        ),
    }
    print(json.dumps(report, indent=2))
    if args.write:
        path = Path(str(resources.files("ddlsim.data") / "simulator" / "runtime_costs.json"))
        path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {path}")
    if args.dataset:
        dataset = load_dataset(args.dataset)
        meta = {**dataset.meta, "runtime_costs": report}
        save_dataset(dataclasses.replace(dataset, meta=meta), args.dataset)
        print(f"recorded the costs in {args.dataset}")


if __name__ == "__main__":
    main()
