"""Peak memory of one rank along its step's timeline, from what autograd saves for backward.

:func:`timeline_peak` is what :func:`ddlsim.simulator.memory.peak_memory` answers when it is
given the bytes the rank's micro-batch saves by module (:func:`ddlsim.profiler.saved.saved_bytes`):
the peak as the backward starts, per plan kind (data parallel, FSDP, tensor-parallel layers and
grids, pipelines with or without FSDP beside them). Activations are what autograd saved, by
block: a pipeline rank keeps its stages' blocks times the micro-batches its schedule holds in
flight; tensor parallelism splits the part inside the split layers over ``tp`` and, with the
vocabulary split, the embedding's and head's weights too. ``benchmarks/memory_model.py`` sets
it against each rank's allocator.
"""

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.models import build_model
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.plans.stages import stage_count, tied_parameters, warmup_forwards
from ddlsim.simulator.memory_estimate import OPTIMIZER_STATES, MemoryEstimate
from ddlsim.simulator.memory_estimate import under as _under

if TYPE_CHECKING:
    from ddlsim.data.specs.parallel import ParallelPlan


def timeline_peak(
    graph: IterationGraph,
    strategy: Strategy,
    *,
    world_size: int,
    blocks: Sequence[str],
    fsdp_groups: Sequence[Sequence[str]],
    optimizer: str,
    saved: Mapping[str, int],
    split: Callable[[str], bool],
) -> MemoryEstimate:
    """The peak of the busiest rank where it happens: as its backward starts, when the
    optimizer's state, the weights (gathered where sharded), the communication buffers and
    every activation kept for backward are alive, the loss's logits-sized gradients are born
    (two tensors the size of the largest forward output) and the first gradient arrives (the
    output layer's: taken as the largest parameter's); gradients of earlier micro-batches are
    alive under gradient accumulation. ``saved``: the bytes autograd saves by module;
    ``split``: whether a module's are split by tensor parallelism.
    """
    plan = strategy.parallel
    dp = plan.resolve_dp(world_size)
    states = OPTIMIZER_STATES.get(optimizer, 2)
    sizes = {p.name: p.nbytes for p in graph.params}
    total = sum(sizes.values())
    largest_param = max(sizes.values(), default=0)
    logits = _largest_output(graph)
    per_block, split_block, params_in = _by_block(saved, sizes, blocks, split)
    outside_saved = sum(saved.values()) - sum(per_block)
    outside_params = total - sum(params_in)
    accumulated = plan.micro_batches > 1

    if plan.pp > 1:
        inputs_side, outputs_side = _outside_sides(graph, blocks, sizes)
        return _pipeline_peak(
            plan,
            states=states,
            per_block=per_block,
            params_in=params_in,
            outside_params=outside_params,
            used_outside=(inputs_side, outputs_side),
            outside_saved=outside_saved,
            logits=logits,
            largest_param=largest_param,
            dp=dp,
        )
    if plan.fsdp:
        return _fsdp_peak(
            sizes,
            fsdp_groups,
            dp=dp,
            states=states,
            accumulated=accumulated,
            saved_bytes=sum(saved.values()),
            logits=logits,
        )
    if plan.tp > 1 or plan.grid or plan.layers:
        return _split_peak(
            plan,
            params_in=params_in,
            per_block=per_block,
            split_block=split_block,
            outside=(outside_params, outside_saved),
            states=states,
            accumulated=accumulated,
            largest_param=largest_param,
            logits=logits,
            dp=dp,
        )
    return MemoryEstimate(
        weights_bytes=total,
        grads_bytes=total if accumulated else largest_param,
        optimizer_bytes=states * total,
        buffers_bytes=total if dp > 1 else 0,
        activations_bytes=sum(saved.values()),
        transient_bytes=2 * logits,
    )


def _pipeline_peak(
    plan: "ParallelPlan",
    *,
    states: int,
    per_block: list[int],
    params_in: list[int],
    outside_params: int,
    used_outside: tuple[int, int],
    outside_saved: int,
    logits: int,
    largest_param: int,
    dp: int,
) -> MemoryEstimate:
    """The busiest pipeline rank: every rank keeps the parameters outside the blocks (the
    executor's stages run the model's own forward) but gradients and optimizer state only of
    those its stages use (the first stage's embeddings, the last's head: ``used_outside``) and
    of its blocks, and its blocks' activations for the micro-batches in flight on it; the last
    stage also the activations outside the blocks (the head's and the loss's) and the loss's
    two logits-sized gradients."""
    stages = stage_count(plan)
    bounds = [round(i * len(per_block) / stages) for i in range(stages + 1)]
    best: MemoryEstimate | None = None
    for rank in range(plan.pp):
        mine = [s for s in range(stages) if s % plan.pp == rank]
        blocks_params = sum(sum(params_in[bounds[s] : bounds[s + 1]]) for s in mine)
        blocks_saved = sum(sum(per_block[bounds[s] : bounds[s + 1]]) for s in mine) // len(mine)
        in_flight = _in_flight_on(plan, rank)
        last = (stages - 1) in mine
        weights = outside_params + blocks_params
        updated = blocks_params + (used_outside[0] if 0 in mine else 0)
        updated += used_outside[1] if last else 0
        # Sharded beside the pipeline (ZeRO-2 style), the stage's weights stay gathered through
        # the step beside their shards, its gradients unsharded until the one reduce-scatter
        # after the last backward, and the optimizer holds a shard's state.
        shards = dp if plan.fsdp else 1
        estimate = MemoryEstimate(
            weights_bytes=weights + (weights // dp if plan.fsdp else 0),
            grads_bytes=updated if plan.micro_batches > 1 else min(largest_param, updated),
            optimizer_bytes=states * updated // shards,
            buffers_bytes=updated if dp > 1 and not plan.fsdp else 0,
            activations_bytes=blocks_saved * in_flight + (outside_saved if last else 0),
            transient_bytes=2 * logits if last else 0,
        )
        if best is None or estimate.total_bytes > best.total_bytes:
            best = estimate
    assert best is not None
    return best


def _outside_sides(
    graph: IterationGraph, blocks: Sequence[str], sizes: Mapping[str, int]
) -> tuple[int, int]:
    """Bytes of the parameters outside the blocks that the forward uses before the first block
    (embeddings) and after the last (the head), by the modules that use them; a weight tied
    from the input embedding to the output layer counts on both sides."""
    order = [n.module for n in graph.nodes if n.phase == "forward" and n.kind == "compute"]
    in_blocks = [i for i, module in enumerate(order) if _under(module, blocks)]
    if not in_blocks:
        return 0, 0
    first, last = in_blocks[0], in_blocks[-1]
    before = {module for module in order[:first]}
    after = {module for module in order[last + 1 :]}
    owners = {p.name: p.module for p in graph.params}
    inputs_side = sum(
        n for name, n in sizes.items() if not _under(name, blocks) and owners[name] in before
    )
    outputs_side = sum(
        n for name, n in sizes.items() if not _under(name, blocks) and owners[name] in after
    )
    # An input-side parameter the head holds too (an embedding tied to it) counts on both.
    for name, holders in _tied(json.dumps(graph.model.to_dict(), sort_keys=True)).items():
        if name in sizes and owners[name] in before and any(h in after for h in holders):
            outputs_side += sizes[name]
    return inputs_side, outputs_side


@functools.cache
def _tied(spec_json: str) -> dict[str, tuple[str, ...]]:
    with torch.device("meta"):
        return tied_parameters(build_model(ModelSpec.from_dict(json.loads(spec_json))))


def _in_flight_on(plan: "ParallelPlan", rank: int) -> int:
    """Micro-batches (chunks, interleaved) whose activations pipeline rank ``rank`` holds at
    its peak: the warm-up forwards before its first backward, and the one with it."""
    m, pp = plan.micro_batches, plan.pp
    if plan.chunks == 1:
        return warmup_forwards(plan.pp_schedule, rank, pp, m)
    return min((plan.chunks - 1) * pp + 2 * (pp - rank - 1) + 1, m * plan.chunks)


def _largest_output(graph: IterationGraph) -> int:
    """The largest tensor the forward writes (a language model's logits)."""
    return max(
        (
            out.nbytes
            for node in graph.nodes
            if node.phase == "forward" and node.kind == "compute" and not node.is_view
            for out in node.outputs
        ),
        default=0,
    )


def _by_block(
    saved: Mapping[str, int],
    sizes: Mapping[str, int],
    blocks: Sequence[str],
    split: Callable[[str], bool],
) -> tuple[list[int], list[int], list[int]]:
    """Each block's saved bytes, the part of them tensor parallelism splits, and its
    parameters' bytes."""
    per_block = [sum(n for path, n in saved.items() if _under(path, [b])) for b in blocks]
    split_block = [
        sum(n for path, n in saved.items() if _under(path, [b]) and split(path)) for b in blocks
    ]
    params_in = [sum(n for name, n in sizes.items() if _under(name, [b])) for b in blocks]
    return per_block, split_block, params_in


def _fsdp_peak(
    sizes: Mapping[str, int],
    fsdp_groups: Sequence[Sequence[str]],
    *,
    dp: int,
    states: int,
    accumulated: bool,
    saved_bytes: int,
    logits: int,
) -> MemoryEstimate:
    """FSDP: a shard of everything, the root's parameters and two groups gathered."""
    total = sum(sizes.values())
    largest_param = max(sizes.values(), default=0)
    grouped = [sum(n for name, n in sizes.items() if _under(name, g)) for g in fsdp_groups]
    root = total - sum(grouped)
    shard = total // dp
    # The sharded gradients are born as the backward reduce-scatters, while activations
    # are freed: at the backward's start only the first unsharded gradient is alive.
    return MemoryEstimate(
        weights_bytes=shard + root + 2 * max(grouped, default=0),
        grads_bytes=(total if accumulated else largest_param),
        optimizer_bytes=states * shard,
        buffers_bytes=0,
        activations_bytes=saved_bytes,
        transient_bytes=2 * logits,
    )


def _split_peak(
    plan: "ParallelPlan",
    *,
    params_in: list[int],
    per_block: list[int],
    split_block: list[int],
    outside: tuple[int, int],
    states: int,
    accumulated: bool,
    largest_param: int,
    logits: int,
    dp: int,
) -> MemoryEstimate:
    """Tensor-parallel layers (every block, or per-layer placements) and grids: the split
    blocks' weights and the part of their saved tensors inside attention and the MLP over the
    ranks that split them; ``outside``: the parameters and saved bytes outside the blocks."""
    outside_params, outside_saved = outside
    tp = plan.tp
    layouts = list(plan.layers) if len(plan.layers) == len(params_in) else ["tp"] * len(params_in)
    split_saved, samples = tp, 1
    vocab_split = plan.vocab == "split"
    weights = outside_params // tp if vocab_split else outside_params
    if plan.grid:
        # A grid keeps the embedding and the head whole; its blocks' weights are split over
        # rows x cols, the heads over cols, the samples over depth.
        axes = plan.grid_axes
        tp, split_saved, samples = axes["rows"] * axes["cols"], axes["cols"], axes["depth"]
        weights, vocab_split = outside_params, False
    activations = outside_saved
    for layout, params, kept, inside in zip(
        layouts, params_in, per_block, split_block, strict=True
    ):
        if layout == "tp":
            weights += params // tp
            activations += kept - inside + inside // split_saved
        elif layout == "batch":
            weights += params
            activations += kept // tp
        else:
            weights += params
            activations += kept
    return MemoryEstimate(
        weights_bytes=weights,
        grads_bytes=weights if accumulated else largest_param // (tp if vocab_split else 1),
        optimizer_bytes=states * weights,
        buffers_bytes=weights if dp > 1 else 0,
        activations_bytes=activations // samples,
        transient_bytes=2 * logits // samples,
    )
