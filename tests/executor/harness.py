"""Run a function on N gloo ranks in separate processes, for trainer tests without torchrun."""

import dataclasses
import functools
import os
import queue
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddlsim.data.models import build_model, make_batch
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.executor.context import RankContext, disable_dropout, local_loss, make_optimizer
from ddlsim.executor.rank_main import rank_context

RankFn = Callable[[RankContext], Any]
STEPS = 5  # iterations a trainer test runs and compares with single-process training
# Ranks fork from a server that has imported these once per test process: a spawned rank
# spends some 6 s importing torch, transformers' models and the executor, and 1 s training.
PRELOAD = (
    "tests.executor.harness",
    "ddlsim.executor.data_parallel",
    "ddlsim.executor.fsdp",
    "ddlsim.executor.grid",
    "ddlsim.executor.pipeline",
    "ddlsim.executor.tensor_parallel",
    "torch.distributed.fsdp",
    "torch.distributed.pipelining",
    *(
        f"transformers.models.{name}.modeling_{name}"
        for name in ("bert", "gpt2", "llama", "mistral", "qwen3", "t5", "vit")
    ),
)


def _rank_main(  # noqa: PLR0917 (multiprocessing passes positional arguments)
    rank: int,
    world_size: int,
    store_path: str,
    fn: RankFn,
    spec: ModelSpec,
    strategy: Strategy,
    seed: int,
    results: Any,
) -> None:
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=120)
    )
    try:
        ctx = make_context(rank, world_size, spec, strategy, seed)
        results.put((rank, fn(ctx)))
    finally:
        dist.destroy_process_group()
    # As the executor's ranks do (ddlsim/executor/rank_main.py): once the result is delivered, skip
    # interpreter finalization, where gloo's threads now and then abort a finished process.
    results.close()
    results.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def make_context(
    rank: int, world_size: int, spec: ModelSpec, strategy: Strategy, seed: int
) -> RankContext:
    """The context a rank of the executor gets (AdamW, no dropout, on the CPU)."""
    config = {"spec": spec.to_dict(), "seed": seed, "optimizer": "adamw", "dropout": False}
    return rank_context(config, strategy, rank, world_size, torch.device("cpu"))


def run_ranks(
    world_size: int,
    fn: RankFn,
    spec: ModelSpec,
    strategy: Strategy,
    *,
    seed: int = 0,
    timeout_s: float = 300.0,
) -> list[Any]:
    """``fn(ctx)`` on every rank; the results in rank order. ``fn`` must be picklable.

    A rank that fails ends the wait at once (its traceback is on stderr); every rank is stopped.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(
                target=_rank_main,
                args=(rank, world_size, store_path, fn, spec, strategy, seed, results),
            )
            for rank in range(world_size)
        ]
        for proc in procs:
            proc.start()
        out: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(out) < world_size:
                try:
                    rank, value = results.get(timeout=1.0)
                    out[rank] = value
                    continue
                except queue.Empty:
                    pass
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    break
        finally:
            for proc in procs:
                proc.join(timeout=0 if len(out) < world_size else 30)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        codes = [proc.exitcode for proc in procs]
        assert codes == [0] * world_size, f"rank exit codes {codes}"
    return [out[rank] for rank in range(world_size)]


@dataclasses.dataclass
class Losses:
    """Per-step losses a rank saw and what the trainer reported as applied."""

    losses: list[float]
    applied: dict[str, Any]


def train_steps(ctx: RankContext, build: Callable[[RankContext], Any], steps: int) -> Losses:
    """``steps`` iterations of the trainer ``build(ctx)``; losses summed over ranks per step."""
    trainer = build(ctx)
    shares = [trainer.step() for _ in range(steps)]
    trainer.finish()
    stacked = torch.stack([s.detach().float().reshape(()) for s in shares])
    if dist.is_initialized():
        dist.all_reduce(stacked)
    return Losses(losses=[float(x) for x in stacked], applied=trainer.applied())


def run_trainer(
    world_size: int, build: Callable[[RankContext], Any], spec: ModelSpec, strategy: Strategy
) -> list[Losses]:
    """``STEPS`` iterations of the trainer ``build(ctx)`` on every rank (``build`` picklable)."""
    train = functools.partial(train_steps, build=build, steps=STEPS)
    return run_ranks(world_size, train, spec, strategy)


def reference_losses(spec: ModelSpec, steps: int, seed: int = 0) -> list[float]:
    """Single-process training on the whole global batch: the losses every plan must match."""
    torch.manual_seed(seed)
    model = build_model(spec, seed=seed)
    disable_dropout(model)
    batch = make_batch(spec, model, seed=seed)
    opt = make_optimizer("adamw", model.parameters())
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = local_loss(model, batch)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def assert_losses_match(
    got: Sequence[float], want: Sequence[float], rtol: float = 1e-5, atol: float = 0.0
) -> None:
    """Each step's loss within ``rtol`` of ``want``'s, or ``atol`` where a loss has fallen near
    zero (a relative error there measures the kernels' last bits, which differ between CPUs)."""
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert abs(g - w) <= rtol * abs(w) + atol, f"step {step}: {g} != {w} (rtol {rtol})"


def assert_matches_reference(results: Sequence[Losses], spec: ModelSpec) -> None:
    """Each result's losses are single-process training's on ``spec`` for ``STEPS`` steps."""
    want = reference_losses(spec, STEPS)
    for result in results:
        assert_losses_match(result.losses, want)
