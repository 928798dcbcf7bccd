"""Does the speed probe follow the machine's speed as a model's training step feels it?

This VM's speed drifts: the probe (``profiler.speed``) took 2.3 ms and 3.5 ms a unit two
minutes apart on an idle machine, and a kernel profile of gptj-tiny 49.5 ms one day and 66 to
81 ms on the next evening. For each model (one thread, pinned to one core, the model's
micro-batch of 4, AdamW), the probe and ``--steps`` training steps take turns for
``--seconds``; each turn gives the probe's time and the steps' median. Over the turns:

- ``step spread`` and ``probe spread``: the slowest turn over the fastest (p90 / p10);
- ``corr``: the correlation of the turns' step and probe times;
- ``MAPE, unscaled``: each turn's step against the median turn's step (what a replay priced
  at one profile's speed gets wrong from the drift alone);
- ``MAPE, scaled``: the same, the median step scaled by the turn's probe over the median
  probe (what ``RunEntry.speed_ratio`` corrects).

Each figure is given for single turns and for windows of ``--window`` turns (medians of
each), as a launch's probe is the median over its rounds.

    .venv/bin/python benchmarks/speed_probe.py [--models NAME ...] [--seconds 60] [--steps 3]
        [--window 10] [--json FILE]
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from ddlsim.cluster.speed import probe_ms
from ddlsim.data.models import build_model, make_batch, training_loss
from ddlsim.simulator.dataset import dataset_models_v3


def turns(label: str, seconds: float, steps: int) -> list[tuple[float, float]]:
    """``(probe ms, median step ms)`` of each turn."""
    spec = {m.label: m for m in dataset_models_v3()}[label].with_inputs(batch_size=4)
    model = build_model(spec, seed=0)
    batch = make_batch(spec, model, seed=0, device="cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        began = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        training_loss(model, batch).backward()
        opt.step()
        return (time.perf_counter() - began) * 1e3

    for _ in range(3):
        step()
    out = []
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        probe = probe_ms(repeats=1)
        out.append((probe, statistics.median(step() for _ in range(steps))))
    return out


def spread(values: list[float]) -> float:
    if len(values) < 10:
        return max(values) / min(values)
    deciles = statistics.quantiles(values, n=10)
    return deciles[-1] / deciles[0]


def figures(pairs: list[tuple[float, float]]) -> dict[str, float]:
    probes = [p for p, _ in pairs]
    steps = [s for _, s in pairs]
    step_median, probe_median = statistics.median(steps), statistics.median(probes)
    return {
        "turns": len(pairs),
        "step_median_ms": step_median,
        "step_spread": spread(steps),
        "probe_spread": spread(probes),
        "corr": statistics.correlation(probes, steps),
        "mape_unscaled": statistics.fmean(abs(step_median / s - 1) for s in steps),
        "mape_scaled": statistics.fmean(
            abs(step_median * p / probe_median / s - 1) for p, s in pairs
        ),
    }


def windows(pairs: list[tuple[float, float]], size: int) -> list[tuple[float, float]]:
    return [
        (
            statistics.median(p for p, _ in pairs[i : i + size]),
            statistics.median(s for _, s in pairs[i : i + size]),
        )
        for i in range(0, len(pairs) - size + 1, size)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["gptj-tiny", "bert-tiny", "resnet-10-64"])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    rows = []
    print(
        "| model | turns | step median ms | step spread | probe spread | corr | MAPE, unscaled "
        "| MAPE, scaled |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label in args.models:
        pairs = turns(label, args.seconds, args.steps)
        row = {"model": label, "turns": pairs}
        for name, series in (
            ("turn", pairs),
            (f"{args.window} turns", windows(pairs, args.window)),
        ):
            found = figures(series)
            row[name] = found
            print(
                f"| {label} ({name}) | {found['turns']} | {found['step_median_ms']:.1f} "
                f"| {found['step_spread']:.3f} | {found['probe_spread']:.3f} "
                f"| {found['corr']:+.2f} | {found['mape_unscaled']:.3f} "
                f"| {found['mape_scaled']:.3f} |",
                flush=True,
            )
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
