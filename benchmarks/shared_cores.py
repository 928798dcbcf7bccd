"""How much slower a training step computes when ranks share cores, beside the speed probe.

The replay prices a rank's compute as its one-process kernel profile times
``simulator.costs.compute_scale`` (4 ranks on 2 cores: 2x) times the speed probe's ratio
(``profiler.speed``). This program checks both factors on whole steps of zoo models: for each
(model, batch) it times the training step (forward, backward, AdamW; one thread) in one process
pinned to one core, then in ``--ranks`` processes pinned round-robin to the machine's cores
(no communication), and records the speed probe taken before them. ``shared_scale`` (shared
over alone) checks the first factor; comparing ``alone_ms`` and ``probe_ms`` with a kernel
profile of the same model and batch (its ``iteration_time_ms`` and ``probe_ms``) checks the
second: a step that slows less or more than the probe says.

    .venv/bin/python benchmarks/shared_cores.py --models bert-tiny:4 bert-tiny:16 \\
        gpt2-tiny:16 --json shared_cores.json
"""

import argparse
import json
import multiprocessing as mp
import os
import queue as queue_module
import statistics
import time
from pathlib import Path
from typing import Any


def _worker(core: int, model: str, batch: int, steps: int, queue: Any) -> None:
    os.sched_setaffinity(0, {core})
    import torch

    from ddlsim.cluster.allocator import use_rank_allocator
    from ddlsim.data.models import build_model, make_batch, training_loss
    from ddlsim.data.zoo import resolve_model

    use_rank_allocator()  # as the executor's ranks allocate

    torch.set_num_threads(1)
    spec = resolve_model(model).with_inputs(batch_size=batch)
    net = build_model(spec)
    data = make_batch(spec, net)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, foreach=False)

    def step() -> None:
        training_loss(net, data).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        step()
        times.append((time.perf_counter() - began) * 1e3)
    queue.put(statistics.median(times))


def timed(
    model: str, batch: int, cores: list[int], steps: int, timeout_s: float = 900.0
) -> list[float]:
    """Each process's median step (ms), one process a listed core, all started together.

    Raises:
        SystemExit: a process failed or took longer than ``timeout_s`` (all are stopped).
    """
    context = mp.get_context("spawn")
    queue: Any = context.Queue()
    processes = [
        context.Process(target=_worker, args=(c, model, batch, steps, queue)) for c in cores
    ]
    for process in processes:
        process.start()
    try:
        got = [queue.get(timeout=timeout_s) for _ in processes]
    except queue_module.Empty:
        raise SystemExit(
            f"{model} batch {batch}: a process failed or ran past {timeout_s} s"
        ) from None
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
    return got


def parse_item(item: str) -> tuple[str, int]:
    """``MODEL[:BATCH]`` (batch 8 when left out)."""
    model, _, batch = item.partition(":")
    if not model or (batch and (not batch.isdigit() or int(batch) < 1)):
        raise SystemExit(f"--models item {item!r}: expected MODEL or MODEL:BATCH, BATCH >= 1")
    return model, int(batch or 8)


def main() -> None:
    from ddlsim.cluster.speed import probe_ms

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["bert-tiny:4", "bert-tiny:16"])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    rows = []
    for model, batch in [parse_item(item) for item in args.models]:
        probe = probe_ms()
        alone = timed(model, batch, cores[:1], args.steps)[0]
        shared = timed(
            model, batch, [cores[i % len(cores)] for i in range(args.ranks)], args.steps
        )
        row = {
            "model": model,
            "batch_size": batch,
            "probe_ms": probe,
            "alone_ms": alone,
            "shared_ms": shared,
            "shared_scale": statistics.median(shared) / alone,
            "ranks": args.ranks,
            "cores": len(cores),
        }
        rows.append(row)
        print(
            f"{model} batch {row['batch_size']}: alone {alone:.1f} ms, {args.ranks} ranks on "
            f"{len(cores)} cores {statistics.median(shared):.1f} ms "
            f"({row['shared_scale']:.2f}x); probe {probe:.2f} ms",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
