"""Time graph capture of ~100M-parameter zoo models on this machine.

For each model: the median wall time of ``capture_graph`` over ``--repeats`` runs in a warm
process, of the whole ``ddlsim graph MODEL --json`` command in a fresh process (imports
included), and two baselines measured in the same run: a bare forward+backward under
``FakeTensorMode`` (the dispatch cost capture cannot avoid) and one real eager training
iteration on the CPU (what a profiler would have to run).
Prints a Markdown table for BENCHMARKS.md.

    .venv/bin/python benchmarks/capture_time.py [--models gpt2-small bert-base] [--repeats 5]
"""

import argparse
import functools
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from ddlsim.data.models import build_model, count_parameters, make_batch, training_loss
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.zoo import ZOO
from ddlsim.profiler.capture import capture_graph
from ddlsim.profiler.fake import fake_model

DEFAULT_MODELS = ("gpt2-small", "bert-base", "vit-base", "llama-160m")


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _bare_fake_iteration(spec: ModelSpec) -> None:
    fake = fake_model(spec)
    with fake.mode:
        training_loss(fake.model, fake.batch).backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=list(ZOO))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--real-repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"python {platform.python_version()}"
    )
    print(
        "| model | parameters | nodes | capture (median) | `ddlsim graph` process | "
        "bare fake fwd+bwd | capture / bare | real eager iteration | capture / real |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        spec = ZOO[name]
        capture_graph(spec)  # warm-up: imports, dispatch caches
        capture_s = _median_seconds(functools.partial(capture_graph, spec), args.repeats)
        nodes = len(capture_graph(spec).nodes)
        command = [sys.executable, "-m", "ddlsim.service.cli", "graph", name, "--json"]
        process_s = _median_seconds(
            functools.partial(subprocess.run, command, check=True, capture_output=True),
            args.real_repeats,
        )
        bare_s = _median_seconds(functools.partial(_bare_fake_iteration, spec), args.repeats)
        model = build_model(spec)
        batch = make_batch(spec, model)
        params = count_parameters(model)

        def real_step(model: torch.nn.Module = model, batch: dict = batch) -> None:
            model.zero_grad(set_to_none=True)
            training_loss(model, batch).backward()

        real_step()  # warm-up
        real_s = _median_seconds(real_step, args.real_repeats)
        del model, batch
        print(
            f"| {name} | {params / 1e6:.1f} M | {nodes} | {capture_s:.2f} s | {process_s:.2f} s "
            f"| {bare_s:.2f} s "
            f"| {capture_s / bare_s:.2f} | {real_s:.2f} s | {capture_s / real_s:.2f} |"
        )


if __name__ == "__main__":
    main()
