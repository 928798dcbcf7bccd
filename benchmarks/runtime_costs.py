"""Measure what the plans' runtimes add to a rank's compute, and keep it for the replay.

Three measurements, in this one process, single-threaded as a rank computes:

- one copy pass over a buffer (``profiler.runtime_costs.measure_copy``), what DDP's, the
  executor's and DeAR's gradient bucket copies cost (``simulator.runtime``);
- FSDP2's cost per group and DTensor's per split module, and the optimizer's per parameter
  under each (``executor.overheads.measure_plan_overheads``), on ``--model`` (a dataset model)
  at a rank's micro-batch of the dataset's runs on 2 ranks (4 sequences of 64 tokens);
- the fixed cost a gradient bucket adds under the executor's hooks and under DDP
  (``executor.bucket_overheads.measure_bucket_overheads``), on a model of 128 small parameters
  and next to no compute, where a bucket's cost stands out of the step's noise.

``--write`` keeps the result as the shipped costs (``ddlsim/data/simulator/runtime_costs.json``);
``--dataset`` records it in that dataset's meta, next to the runs measured on this machine.

    .venv/bin/python benchmarks/runtime_costs.py [--model NAME] [--write] [--dataset FILE]
        [--buckets-only]
"""

import argparse
import dataclasses
import json
import platform
import time
from importlib import resources
from pathlib import Path

import torch

from ddlsim.executor.bucket_overheads import MANY_SMALL_PARAMETERS, measure_bucket_overheads
from ddlsim.executor.overheads import measure_plan_overheads
from ddlsim.profiler.runtime_costs import measure_copy
from ddlsim.simulator.dataset import dataset_models_v3, load_dataset, save_dataset

SHIPPED = Path(str(resources.files("ddlsim.data") / "simulator" / "runtime_costs.json"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="llama-tiny-8k", help="a dataset model with a TP plan")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--write", action="store_true", help="keep as the shipped costs")
    parser.add_argument("--dataset", type=Path, help="record the costs in this dataset's meta")
    parser.add_argument(
        "--buckets-only",
        action="store_true",
        help="measure the cost a gradient bucket only, keeping the other costs as they are",
    )
    args = parser.parse_args()
    began = time.time()
    models = {m.label: m for m in dataset_models_v3()}
    # a rank's micro-batch when the dataset's global batch of 8 is split over 2 ranks
    spec = models[args.model].with_inputs(batch_size=4)
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(began))
    command = f"benchmarks/runtime_costs.py --model {args.model} --iterations {args.iterations}"
    buckets = measure_bucket_overheads(MANY_SMALL_PARAMETERS, iterations=args.iterations)
    bucket_costs = {
        "hooks_us_per_bucket": buckets["hooks_us_per_bucket"],
        "ddp_us_per_bucket": buckets["ddp_us_per_bucket"],
    }
    if args.buckets_only:
        shipped = json.loads(SHIPPED.read_text(encoding="utf-8"))
        report = {
            **shipped,
            **bucket_costs,
            "measured": {**shipped["measured"], "buckets": {**buckets, "date": date}},
            "buckets_command": f"{command} --buckets-only",
        }
    else:
        alpha_us, per_byte, copies = measure_copy()
        plans = measure_plan_overheads(spec, iterations=args.iterations)
        report = {
            "copy_alpha_us": alpha_us,
            "copy_us_per_byte": per_byte,
            "fsdp_us_per_group": plans["fsdp_us_per_group"],
            "fsdp_us_per_byte": plans["fsdp_us_per_byte"],
            "fsdp_step_us_per_param": plans["fsdp_step_us_per_param"],
            "tp_us_per_module": plans["tp_us_per_module"],
            "tp_step_us_per_param": plans["tp_step_us_per_param"],
            **bucket_costs,
            "measured": {
                "copy_median_us_by_bytes": {str(k): v for k, v in copies.items()},
                "plans": plans,
                "buckets": {**buckets, "date": date},
            },
            "machine": platform.machine(),
            "torch": torch.__version__,
            "date": date,
            "command": command,
        }
    print(json.dumps(report, indent=2))
    if args.write:
        SHIPPED.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {SHIPPED}")
    if args.dataset:
        dataset = load_dataset(args.dataset)
        recorded = dict(dataset.meta.get("runtime_costs") or {})
        if args.buckets_only:  # the dataset's other costs stay as measured with its runs
            recorded.update(bucket_costs)
            recorded["measured"] = {**recorded.get("measured", {}), "buckets": buckets}
        else:
            recorded = report
        meta = {**dataset.meta, "runtime_costs": recorded}
        save_dataset(dataclasses.replace(dataset, meta=meta), args.dataset)
        print(f"recorded the costs in {args.dataset}")


if __name__ == "__main__":
    main()
