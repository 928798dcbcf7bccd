"""Does the speed probe follow what the machine's speed does to a model's step?

A shared VM computes slower when its host gives it less of a core. To make that happen on
purpose, a helper process pinned to the same core as the profile spins for a share of every
10 ms (``--loads``) and sleeps for the rest. For each model and load, a kernel profile
(``profiler.kernels``, one thread, the model's micro-batch of 4) records the step's median and
the probe before and after (``profiler.speed``). Against the unloaded profile:

- ``step ratio``: the loaded step's median over the unloaded one (what the replay must follow);
- ``probe ratio``: the loaded probe over the unloaded one (what the replay scales by,
  ``RunEntry.speed_ratio``);
- ``error, unscaled`` and ``error, scaled``: the unloaded step, as is and times the probe
  ratio, against the loaded step.

    .venv/bin/python benchmarks/speed_probe.py [--models NAME ...] [--loads 0.25 0.5]
        [--iters 9] [--json FILE]
"""

import argparse
import json
import multiprocessing
import os
import time
from pathlib import Path

from ddlsim.profiler.kernels import profile_kernels
from ddlsim.simulator.dataset import dataset_models_v3

PERIOD_S = 0.01


def _spin(share: float, core: int, stop: "multiprocessing.synchronize.Event") -> None:
    os.sched_setaffinity(0, {core})
    while not stop.is_set():
        began = time.perf_counter()
        while time.perf_counter() - began < share * PERIOD_S:
            pass
        time.sleep((1 - share) * PERIOD_S)


def profile_under(label: str, share: float, core: int, iters: int) -> dict[str, float]:
    spec = {m.label: m for m in dataset_models_v3()}[label].with_inputs(batch_size=4)
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    helper = context.Process(target=_spin, args=(share, core, stop)) if share > 0 else None
    if helper is not None:
        helper.start()
        time.sleep(0.5)
    try:
        _, profile = profile_kernels(spec, iters=iters, warmup=3)
    finally:
        if helper is not None:
            stop.set()
            helper.join(timeout=10)
            if helper.is_alive():
                helper.kill()
                helper.join()
    return {"step_ms": profile.iteration_time_ms, "probe_ms": float(profile.env["probe_ms"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["gptj-tiny", "bert-tiny", "resnet-10-64"])
    parser.add_argument("--loads", nargs="+", type=float, default=[0.25, 0.5])
    parser.add_argument("--iters", type=int, default=9)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    rows = []
    print(
        "| model | load | step ms | probe ms | step ratio | probe ratio | error, unscaled "
        "| error, scaled |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label in args.models:
        idle = profile_under(label, 0.0, core, args.iters)
        print(f"| {label} | 0 | {idle['step_ms']:.1f} | {idle['probe_ms']:.2f} | 1 | 1 | - | - |")
        for share in args.loads:
            loaded = profile_under(label, share, core, args.iters)
            step_ratio = loaded["step_ms"] / idle["step_ms"]
            probe_ratio = loaded["probe_ms"] / idle["probe_ms"]
            unscaled = idle["step_ms"] / loaded["step_ms"] - 1
            scaled = idle["step_ms"] * probe_ratio / loaded["step_ms"] - 1
            rows.append(
                {
                    "model": label,
                    "load": share,
                    "idle": idle,
                    "loaded": loaded,
                    "step_ratio": step_ratio,
                    "probe_ratio": probe_ratio,
                    "error_unscaled": unscaled,
                    "error_scaled": scaled,
                }
            )
            print(
                f"| {label} | {share:g} | {loaded['step_ms']:.1f} | {loaded['probe_ms']:.2f} "
                f"| {step_ratio:.3f} | {probe_ratio:.3f} | {unscaled:+.3f} | {scaled:+.3f} |",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
