"""One rank of an executor run; started on each emulated host by ``executor.run``.

Reads the run's JSON config (model spec, the strategies with their bucket partitions,
iterations), trains, and on rank 0 writes the result JSON to ``--output``. Iteration ``i``'s
time is the maximum over ranks of the wall time of its ``step()`` (stragglers count); the loss of
step ``i`` is the sum of every rank's share (the loss of the whole global batch). Warm-up steps
are timed apart: with compiled blocks the first one includes the compilation.

A launch holds one or several strategies (``variants`` in the config) and follows the
measurement protocol (``executor.protocol``): each strategy warms up in turn until its step time
is stable, then rounds follow; in each round every strategy takes one turn, in an order shuffled
anew (the same on every rank), of ``settle`` steps that are not kept (side by side only) and
``iters`` that are (fewer for slow steps: ``executor.protocol.turn_steps``), until the stopping
rule holds for every strategy. A slow spell of the machine then falls on all of them alike, and
their ratios are steadier than those of separate launches. The result's ``variants`` holds
each one's samples with the round of each, warm-up, losses (every step it ran, in order) and
``applied``; ``rounds`` and ``stopped_by`` say how measuring ended; peak memory is the
process's, all of the strategies together.
"""

import argparse
import gc
import json
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddlsim.cluster import groups
from ddlsim.cluster.placement import report_placement
from ddlsim.cluster.processes import die_with_parent
from ddlsim.cluster.speed import probe_ms
from ddlsim.data.errors import DdlsimError, one_line
from ddlsim.data.models import build_model, make_batch
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Bucket, Strategy
from ddlsim.executor.context import RankContext
from ddlsim.executor.memory_profile import MEMORY_STEPS, AllocatorPeak
from ddlsim.executor.plan import build_trainer
from ddlsim.executor.protocol import StoppingRule, relative_half_width, turn_steps
from ddlsim.executor.trace import synchronize, traced_step


def rank_context(
    config: dict[str, Any],
    strategy: Strategy,
    rank: int,
    world_size: int,
    device: torch.device,
) -> RankContext:
    """Rank ``rank``'s context for ``strategy`` from the launch's ``config`` (``spec``, ``seed``,
    ``optimizer``, ``dropout`` and optionally ``frozen``).

    ``dp`` is resolved from the world size; with more than one rank the mesh is the plan's
    ``(pp, dp, tp)`` mesh over the initialised process group. The global batch is drawn from the
    seed on ``device`` (the model is built on the meta device only for its shapes).

    Raises:
        InvalidStrategyError: when ``dp * tp * pp != world_size``.
    """
    spec = ModelSpec.from_dict(config["spec"])
    plan = strategy.parallel
    dp = plan.resolve_dp(world_size)
    mesh = None
    if world_size > 1 and plan.cp > 1:
        shape = (plan.pp, dp, plan.cp, plan.tp)
        mesh = groups.mesh(device.type, shape, ("pp", "dp", "cp", "tp"))
    elif world_size > 1:
        mesh = groups.mesh(device.type, (plan.pp, dp, plan.tp), ("pp", "dp", "tp"))
    with torch.device("meta"):
        shape_model = build_model(spec)
    return RankContext(
        rank=rank,
        world_size=world_size,
        dp=dp,
        tp=plan.tp,
        pp=plan.pp,
        cp=plan.cp,
        spec=spec,
        strategy=strategy,
        seed=int(config["seed"]),
        device=device,
        global_batch=make_batch(spec, shape_model, seed=int(config["seed"]), device=device),
        mesh=mesh,
        optimizer=str(config["optimizer"]),
        dropout=bool(config["dropout"]),
        frozen=tuple(config.get("frozen", ())),
    )


def _peak_memory_bytes(device: torch.device) -> int:
    """The peak of this rank's device memory: tensors allocated on its GPU, or on the CPU the
    resident set of its process (``ru_maxrss``, KiB on Linux)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _order(count: int, round_index: int, seed: int) -> list[int]:
    """The order the variants take their turns in, in round ``round_index``: a permutation
    shuffled from ``seed`` and the round (every rank draws the same)."""
    names = list(range(count))
    if count > 1:
        random.Random(seed * 1_000_003 + round_index).shuffle(names)
    return names


class _Agreement:
    """Step times and elapsed times every rank agrees on: the slowest rank's, reduced with one
    small all-reduce before each decision of the stopping rule, so that every rank decides the
    same (a rank that stopped alone would hang the others)."""

    def __init__(self, world_size: int, device: torch.device) -> None:
        self._world_size = world_size
        self._device = device

    def __call__(self, steps_ms: list[float], elapsed_s: float) -> tuple[list[float], float]:
        if self._world_size == 1:
            return steps_ms, elapsed_s
        values = torch.tensor([*steps_ms, elapsed_s], dtype=torch.float64, device=self._device)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        out = values.cpu().tolist()
        return out[:-1], out[-1]


def _join(config: dict[str, Any]) -> tuple[int, int, torch.device]:
    """This rank's number, the world size and its device, in the process group."""
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if not config.get("device_by_local_rank"):
        # Ranks of this machine's launches share its cores, one each; an external launcher
        # sets the threads of its own ranks (torchrun: OMP_NUM_THREADS).
        torch.set_num_threads(1)
    device = groups.rank_device(
        str(config.get("device", "cpu")),
        rank,
        by_local_rank=bool(config.get("device_by_local_rank")),
    )
    if world_size > 1:
        groups.join(str(config.get("backend", "gloo")), float(config["collective_timeout_s"]))
    report_placement()
    return rank, world_size, device


class _Launch:
    """One launch's strategies on this rank: their trainers, every step they ran (variant,
    kind, ms, loss share, round; kind ``warmup``, ``settle`` or ``sample``) and the protocol
    that times them."""

    def __init__(
        self, config: dict[str, Any], rank: int, world_size: int, device: torch.device
    ) -> None:
        self.rank, self.world_size, self.device = rank, world_size, device
        self.contexts: list[RankContext] = []
        self.trainers: list[Any] = []
        for variant in config["variants"]:
            ctx = rank_context(
                config, Strategy.from_dict(variant["strategy"]), rank, world_size, device
            )
            buckets = [
                Bucket(index=i, params=tuple(b["params"]), grad_bytes=int(b["grad_bytes"]))
                for i, b in enumerate(variant["buckets"])
            ]
            self.contexts.append(ctx)
            self.trainers.append(build_trainer(ctx, buckets))
        self.count = len(self.trainers)
        self.rule = StoppingRule.from_dict(config["rule"])
        self.iters = int(config["iters"])
        self.seed = int(config["seed"])
        self.agree = _Agreement(world_size, device)
        # Steps run and not kept at the start of every turn (side by side only): the previous
        # strategy's model has just had the caches.
        self.settle = int(config.get("settle", 1)) if self.count > 1 else 0
        self.steps: list[tuple[int, str, float, torch.Tensor, int]] = []

    def timed(self, index: int, kind: str, round_index: int = -1) -> float:
        """One step of strategy ``index``, timed and kept in :attr:`steps`; its ms."""
        synchronize(self.device)
        start = time.perf_counter()
        share = self.trainers[index].step()
        synchronize(self.device)
        ms = (time.perf_counter() - start) * 1e3
        self.steps.append((index, kind, ms, share, round_index))
        return ms

    def warm_up(self) -> list[int]:
        """Each strategy's warm-up until the rule finds it stable; the steps a turn each then
        takes (shorter turns for slow steps: ``executor.protocol``)."""
        per_turn: list[int] = []
        for index in range(self.count):
            warm: list[float] = []
            began = time.perf_counter()
            while True:
                agreed_warm, warm_s = self.agree(warm, time.perf_counter() - began)
                if self.rule.warmed_up(agreed_warm, warm_s):
                    multi = self.count > 1
                    per_turn.append(turn_steps(agreed_warm, self.iters) if multi else self.iters)
                    break
                warm.append(self.timed(index, "warmup"))
                if self.rank == 0:
                    label = f" of strategy {index + 1}/{self.count}" if self.count > 1 else ""
                    print(f"warm-up {len(warm)}{label}: {warm[-1]:.1f} ms on rank 0", flush=True)
            self.trainers[index].drain()
            gc.collect()
        return per_turn

    def measure(self, per_turn: list[int]) -> tuple[int, str, list[float]]:
        """Rounds of turns until the stopping rule holds for every strategy: the rounds run,
        what stopped them, and the speed probe rank 0 timed after each round while the others
        waited (the replay scales a run's kernel profile by two probes' ratio)."""
        samples: list[list[float]] = [[] for _ in range(self.count)]
        sampling_s = 0.0
        round_index = 0
        probes: list[float] = []
        while True:
            began = time.perf_counter()
            kept: list[tuple[int, float]] = []
            for index in _order(self.count, round_index, self.seed):
                for _ in range(self.settle):
                    self.timed(index, "settle", round_index)
                for _ in range(per_turn[index]):
                    kept.append((index, self.timed(index, "sample", round_index)))
                if self.count > 1:
                    self.trainers[index].drain()
            gc.collect()
            if self.rank == 0:
                probes.append(probe_ms(repeats=3))
            agreed, sampling_s = self.agree(
                [ms for _, ms in kept], sampling_s + time.perf_counter() - began
            )
            for (index, _), ms in zip(kept, agreed, strict=True):
                samples[index].append(ms)
            round_index += 1
            if self.rank == 0:
                _report_round(round_index, samples, sampling_s)
            reason = self.rule.stop(samples, sampling_s)
            if reason is not None:
                # Budget 0 asked for the minimums alone.
                budget_only = reason == "budget" and self.rule.budget_s == 0
                return round_index, "minimum" if budget_only else reason, probes


def _report_round(round_index: int, samples: list[list[float]], sampling_s: float) -> None:
    print(
        f"round {round_index}: "
        + ", ".join(
            f"{statistics.median(s):.1f} ms ±{relative_half_width(s):.1%}" for s in samples
        )
        + f" ({sum(len(s) for s in samples)} samples, {sampling_s:.0f} s)",
        flush=True,
    )


def _gather(
    launch: _Launch, allocator: "AllocatorPeak | None" = None
) -> tuple[list[float], list[float], list[Any]]:
    """Every step's time (the slowest rank's) and loss (the ranks' shares summed), and what
    each rank applied, its peak memory (the allocator's where it was watched) and its cores."""
    device, world_size = launch.device, launch.world_size
    # NCCL reduces device tensors only; gloo takes either.
    losses = torch.stack(
        [step[3].detach().float().reshape(()).to(device) for step in launch.steps]
    )
    times = torch.tensor([step[2] for step in launch.steps], dtype=torch.float64, device=device)
    gathered: list[Any] = [None] * world_size
    mine = {
        "peak_memory_bytes": (
            _peak_memory_bytes(device) if allocator is None else allocator.peak_bytes
        ),
        "applied": [trainer.applied() for trainer in launch.trainers],
        "cores": sorted(os.sched_getaffinity(0)),
    }
    if world_size > 1:
        dist.all_reduce(losses)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        dist.all_gather_object(gathered, mine)
    else:
        gathered = [mine]
    return times.cpu().tolist(), losses.cpu().tolist(), gathered


def _variant_results(
    launch: _Launch, step_ms: list[float], step_loss: list[float], gathered: list[Any]
) -> list[dict[str, Any]]:
    """Each strategy's warm-up, samples with their rounds, losses and what it applied."""
    compiled_graphs = None
    if any(ctx.strategy.op_fusion.compiled for ctx in launch.contexts):
        from torch._dynamo.utils import counters

        # Graphs dynamo really compiled on rank 0: proof the blocks ran compiled.
        compiled_graphs = int(counters["stats"]["unique_graphs"])
    device, steps = launch.device, launch.steps
    results = []
    for index, ctx in enumerate(launch.contexts):
        applied = dict(gathered[0]["applied"][index])
        per_rank = [g["applied"][index] for g in gathered]
        if any(other != applied for other in per_rank[1:]):
            applied["per_rank"] = per_rank
        applied["device"] = (
            torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        )
        applied["backend"] = dist.get_backend() if launch.world_size > 1 else None
        applied["compiled"] = list(ctx.strategy.op_fusion.compiled)
        if applied["compiled"]:
            applied["compiled_graphs"] = compiled_graphs
        mine_steps = [k for k, step in enumerate(steps) if step[0] == index]
        results.append(
            {
                "warmup_ms": [step_ms[k] for k in mine_steps if steps[k][1] == "warmup"],
                "samples_ms": [step_ms[k] for k in mine_steps if steps[k][1] == "sample"],
                "sample_rounds": [steps[k][4] for k in mine_steps if steps[k][1] == "sample"],
                "losses": [step_loss[k] for k in mine_steps],
                "applied": applied,
            }
        )
    return results


def run_rank(config: dict[str, Any], output: Path) -> None:
    rank, world_size, device = _join(config)
    allocator: AllocatorPeak | None = None
    if config.get("memory_profile") and device.type == "cpu":
        # The allocator's reports from before the model is built through the first steps.
        allocator = AllocatorPeak()
        with allocator.watch():
            launch = _Launch(config, rank, world_size, device)
            for trainer in launch.trainers:
                for _ in range(MEMORY_STEPS):
                    trainer.step()
                trainer.drain()
    else:
        launch = _Launch(config, rank, world_size, device)
    if rank == config.get("test_crash_rank", -1):
        print(f"rank {rank}: crashing on purpose (test)", file=sys.stderr, flush=True)
        sys.exit(3)
    if rank == config.get("test_hang_rank", -1):
        time.sleep(3600)
    # Python's cyclic collector runs between turns, not inside a timed step.
    collector_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    per_turn = launch.warm_up()
    rounds, stopped_by, probes = launch.measure(per_turn)
    if collector_was_enabled:
        gc.enable()
    # One more step, profiled on rank 0, for the run's trace (kept out of the samples).
    trace = (
        traced_step(launch.trainers[0], device, record=rank == 0) if config.get("trace") else None
    )
    for trainer in launch.trainers:
        trainer.finish()
    step_ms, step_loss, gathered = _gather(launch, allocator)
    if rank == 0:
        result = {
            "variants": _variant_results(launch, step_ms, step_loss, gathered),
            "peak_memory_bytes": [int(g["peak_memory_bytes"]) for g in gathered],
            "peak_memory_source": "resident_set" if allocator is None else "allocator",
            "trace": trace,
            "rounds": rounds,
            "stopped_by": stopped_by,
            "probe_ms": probes,
            "rank_cores": {str(r): g["cores"] for r, g in enumerate(gathered)},
        }
        tmp = output.with_suffix(".tmp")
        tmp.write_text(json.dumps(result), encoding="utf-8")
        tmp.replace(output)
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--output", required=True, type=Path)
    # Test-only: a rank that exits with code 3, or stops answering, before its first step.
    parser.add_argument("--test-crash-rank", type=int, default=-1)
    parser.add_argument("--test-hang-rank", type=int, default=-1)
    args = parser.parse_args(argv)
    die_with_parent()
    config = json.loads(args.config.read_text(encoding="utf-8"))
    config["test_crash_rank"] = args.test_crash_rank
    config["test_hang_rank"] = args.test_hang_rank
    try:
        run_rank(config, args.output)
    except DdlsimError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr, flush=True)
        sys.exit(2)
    # Skip interpreter finalization: gloo's worker threads can still hold finished work whose
    # tensors reach back into Python, and tearing those down while the interpreter shuts down
    # aborts the process now and then ("terminate called without an active exception") after
    # all its work is done. Everything is written and the process group destroyed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
