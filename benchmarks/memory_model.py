"""The peak-memory model against the peak the profiler measures, one rank, DDP's plan.

For each model, one training step (AdamW) runs under ``torch.profiler`` with memory profiling
after a warm-up step; the measured peak is the bytes alive before the step (weights and the
optimizer state) plus the highest running sum of the step's allocations and frees. The model's
estimate (:func:`simulator.memory.peak_memory`) is taken without the gradient buckets, which a
single process does not allocate. The search prunes with the estimate, so it should not fall
below the measurement.

    .venv/bin/python benchmarks/memory_model.py --models mlp gpt2-tiny bert-tiny vgg-mini
"""

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from ddlsim.data.models import build_model, make_batch, training_loss
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import resolve_model
from ddlsim.profiler.capture import capture_graph
from ddlsim.simulator.memory import peak_memory

MIB = 2**20


def measured_peak_bytes(model_name: str) -> int:
    spec = resolve_model(model_name)
    model = build_model(spec)
    batch = make_batch(spec, model)
    optimizer = torch.optim.AdamW(model.parameters())

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        training_loss(model, batch).backward()
        optimizer.step()

    step()
    optimizer.zero_grad(set_to_none=True)
    alive = sum(p.numel() * p.element_size() for p in model.parameters())
    alive += sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as scratch:
        trace = Path(scratch) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text("utf-8"))["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    running = peak = 0
    for event in memory:
        running += int(event["args"]["Bytes"])
        peak = max(peak, running)
    return alive + peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--models", nargs="*", default=["mlp", "gpt2-tiny", "bert-tiny", "vgg-mini", "llama-tiny"]
    )
    args = parser.parse_args()
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    torch.set_num_threads(1)
    print(f"# one rank, AdamW; torch {torch.__version__}; {platform.machine()}")
    print("| model | batch | measured peak MiB | predicted MiB | predicted / measured |")
    print("|---|---|---|---|---|")
    for name in args.models:
        spec = resolve_model(name)
        estimate = peak_memory(capture_graph(spec), Strategy(), world_size=1)
        predicted = estimate.total_bytes - estimate.buffers_bytes
        measured = measured_peak_bytes(name)
        print(
            f"| {name} | {spec.inputs.batch_size} | {measured / MIB:.1f} | "
            f"{predicted / MIB:.1f} | {predicted / measured:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
