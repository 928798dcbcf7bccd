"""Peak memory of one rank under a strategy, from the graph of its micro-batch.

The search prunes plans that do not fit a device (``predicted peak <= capacity``), so the
estimate errs on the high side: it adds up what a rank holds at the end of its first backward,
when activations, gradients, communication buffers and the optimizer state can all be alive at
once.

- **Weights**: every parameter under data parallelism; a pipeline rank holds its stage's share
  of the block stack plus, at worst, all parameters outside it (embeddings, head); tensor
  parallelism shards the parameters of the layers its plan splits, taken as ``1 / tp`` of the
  block stack; FSDP keeps ``1 / dp`` of each group plus two groups unsharded (the one computing
  and the one FSDP2 prefetches), and the root's parameters outside any group unsharded.
- **Gradients**: as many bytes as the weights a rank updates (FSDP: its shard, plus one group's
  unsharded gradients before the reduce-scatter).
- **Optimizer state**: AdamW's two moments per parameter a rank updates; SGD's momentum.
- **Buffers**: the flat gradient buckets of DDP and of the executor's hooks (a copy of every
  gradient); none for FSDP, which reduce-scatters into its shards.
- **Activations**: the outputs the forward pass keeps for backward, estimated as every
  forward output that is not a view, times the micro-batches a schedule keeps in flight
  (one under data and tensor parallelism and gradient accumulation; all of them under GPipe; up
  to ``pp`` under 1F1B; the warm-up chunks of interleaved 1F1B on the first rank), with the
  stack's share per stage; tensor parallelism shards the activations inside attention and MLP,
  taken as half of them. A grid plan (``parallel.grid``) holds ``1 / tp`` of the block stack's
  weights as shards plus each layer's block gathered over depth (``1 / (rows * cols)``, kept
  from forward to backward), and ``1 / depth`` of the activations (its samples), those inside
  attention and MLP on ``1 / cols``.
- **Transients**: the largest forward output once more (its gradient is born in backward while
  it is still held: the logits of a language-model head) and a weights-sized temporary of the
  optimizer's step (torch's multi-tensor AdamW works on whole lists at once).

``benchmarks/memory_model.py`` compares the estimate with peaks measured by the profiler.
"""

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.models import build_model
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.stages import stage_count

if TYPE_CHECKING:
    from ddlsim.data.specs.parallel import ParallelPlan

GIB = 1024**3
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd": 1}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class MemoryEstimate:
    """What one rank holds at its peak, in bytes."""

    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    buffers_bytes: int
    activations_bytes: int
    transient_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return (
            self.weights_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.buffers_bytes
            + self.activations_bytes
            + self.transient_bytes
        )

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    def to_json(self) -> dict[str, float]:
        return {
            "peak_gib": self.total_gib,
            **{
                f.name.removesuffix("_bytes") + "_gib": getattr(self, f.name) / GIB
                for f in dataclasses.fields(self)
            },
        }


def peak_memory(
    graph: IterationGraph,
    strategy: Strategy,
    *,
    world_size: int,
    blocks: Sequence[str] = (),
    fsdp_groups: Sequence[Sequence[str]] = (),
    optimizer: str = "adamw",
    saved: Mapping[str, int] | None = None,
    split: Callable[[str], bool] | None = None,
) -> MemoryEstimate:
    """The peak memory of a rank running ``strategy`` on ``world_size`` ranks.

    Args:
        graph: the model's graph at the rank's micro-batch (any strategy).
        blocks: module paths of the model's stack of repeated blocks (pipeline stages and
            tensor-parallel layers are cut from it); empty when it has none.
        fsdp_groups: the FSDP groups (module paths) when ``strategy`` shards with FSDP.
        saved: the bytes the rank's micro-batch keeps for backward by module path
            (:func:`ddlsim.profiler.saved.saved_bytes`); with it the estimate follows the
            step's timeline (:func:`timeline_peak`), without it every forward output counts.
        split: whether a module path's saved tensors are split by tensor parallelism (the
            tensors inside the attention and MLP between their split projections).

    Raises:
        InvalidStrategyError: ``dp * tp * pp != world_size``.
    """
    if saved is not None:
        return timeline_peak(
            graph,
            strategy,
            world_size=world_size,
            blocks=blocks,
            fsdp_groups=fsdp_groups,
            optimizer=optimizer,
            saved=saved,
            split=split or (lambda path: False),
        )
    plan = strategy.parallel
    dp = plan.resolve_dp(world_size)
    sizes = {p.name: p.nbytes for p in graph.params}
    total = sum(sizes.values())
    in_blocks = sum(n for name, n in sizes.items() if _under(name, blocks))
    outside = total - in_blocks
    states = OPTIMIZER_STATES.get(optimizer, 2)
    outputs = [
        out.nbytes
        for node in graph.nodes
        if node.phase == "forward" and node.kind == "compute" and not node.is_view
        for out in node.outputs
    ]
    activations = sum(outputs)
    largest = max(outputs, default=0)
    if plan.pp > 1:
        stages = stage_count(plan)
        weights = outside + in_blocks // plan.pp
        chunks = _chunks_in_flight(plan.pp_schedule, plan.pp, plan.micro_batches, plan.chunks)
        held = activations * chunks // stages
        return _unsharded(weights, states, held, largest // stages + weights)
    if plan.fsdp:
        grouped = [sum(n for name, n in sizes.items() if _under(name, g)) for g in fsdp_groups]
        root = total - sum(grouped)
        largest = max(grouped, default=0)
        shard = total // dp
        return MemoryEstimate(
            weights_bytes=shard + root + 2 * largest,
            grads_bytes=shard + largest,
            optimizer_bytes=states * shard,
            buffers_bytes=0,
            activations_bytes=activations,
            transient_bytes=largest + shard,
        )
    if plan.grid:
        axes = plan.grid_axes
        shards = outside + in_blocks // plan.tp
        gathered = in_blocks // (axes["rows"] * axes["cols"])
        samples = activations // axes["depth"]
        held = (samples + samples // axes["cols"]) // 2
        estimate = _unsharded(shards, states, held, largest // axes["depth"] + shards)
        return dataclasses.replace(estimate, weights_bytes=shards + gathered)
    if plan.layers and len(plan.layers) == len(blocks):
        # Per-layer placements: only the tp blocks are split; batch and replicate blocks whole.
        per_block = [sum(n for name, n in sizes.items() if _under(name, [b])) for b in blocks]
        in_blocks = sum(
            n // plan.tp if layout == "tp" else n
            for n, layout in zip(per_block, plan.layers, strict=True)
        )
        weights = outside + in_blocks
    else:
        weights = outside + in_blocks // plan.tp
    held = activations if plan.tp == 1 else (activations + activations // plan.tp) // 2
    return _unsharded(weights, states, held, largest + weights)


def _unsharded(
    weights_bytes: int, states: int, activations_bytes: int, transient_bytes: int
) -> MemoryEstimate:
    """A rank that holds its ``weights_bytes`` of parameters whole (not sharded by FSDP): as
    many bytes of gradients and of communication buffers, ``states`` optimizer states each."""
    return MemoryEstimate(
        weights_bytes=weights_bytes,
        grads_bytes=weights_bytes,
        optimizer_bytes=states * weights_bytes,
        buffers_bytes=weights_bytes,
        activations_bytes=activations_bytes,
        transient_bytes=transient_bytes,
    )


def _chunks_in_flight(schedule: str, pp: int, micro_batches: int, virtual: int) -> int:
    """Forward chunks (a micro-batch through one stage) whose activations the first rank holds
    at once."""
    if schedule == "gpipe":
        return micro_batches
    if schedule == "1f1b":
        return min(pp, micro_batches)
    if schedule == "eager_1f1b":
        return min(2 * pp - 1, micro_batches)
    # torch's interleaved 1F1B: rank 0 warms up with (V - 1) * pp + 2 * (pp - 1) forwards,
    # then runs one more before its first backward.
    chunks = (virtual - 1) * pp + 2 * (pp - 1) + 1
    return min(chunks, micro_batches * virtual)


def _under(name: str, paths: Sequence[str]) -> bool:
    return any(name == p or name.startswith(f"{p}.") for p in paths)


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
    alive under gradient accumulation.

    Activations are what autograd saved (``saved``), by block: a pipeline rank keeps its
    stages' blocks times the micro-batches its schedule holds in flight; tensor parallelism
    splits the part inside the split layers (``split``) over ``tp`` and, with the vocabulary
    split, the embedding's and head's weights too.
    """
    plan = strategy.parallel
    dp = plan.resolve_dp(world_size)
    states = OPTIMIZER_STATES.get(optimizer, 2)
    sizes = {p.name: p.nbytes for p in graph.params}
    total = sum(sizes.values())
    largest_param = max(sizes.values(), default=0)
    outputs = [
        out.nbytes
        for node in graph.nodes
        if node.phase == "forward" and node.kind == "compute" and not node.is_view
        for out in node.outputs
    ]
    logits = max(outputs, default=0)
    per_block = [sum(n for path, n in saved.items() if _under(path, [b])) for b in blocks]
    split_block = [
        sum(n for path, n in saved.items() if _under(path, [b]) and split(path)) for b in blocks
    ]
    outside_saved = sum(saved.values()) - sum(per_block)
    params_in = [sum(n for name, n in sizes.items() if _under(name, [b])) for b in blocks]
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
            activations_bytes=sum(saved.values()),
            transient_bytes=2 * logits,
        )
    tp = plan.tp
    if tp > 1 or plan.grid or plan.layers:
        layouts = list(plan.layers) if len(plan.layers) == len(blocks) else ["tp"] * len(blocks)
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
        if plan.fsdp:
            # Sharded beside the pipeline (ZeRO-2 style): the stage's weights stay gathered
            # through the step beside their shards, its gradients unsharded until the one
            # reduce-scatter after the last backward; the optimizer holds a shard's state.
            estimate = MemoryEstimate(
                weights_bytes=weights + weights // dp,
                grads_bytes=updated if plan.micro_batches > 1 else min(largest_param, updated),
                optimizer_bytes=states * updated // dp,
                buffers_bytes=0,
                activations_bytes=blocks_saved * in_flight + (outside_saved if last else 0),
                transient_bytes=2 * logits if last else 0,
            )
            if best is None or estimate.total_bytes > best.total_bytes:
                best = estimate
            continue
        estimate = MemoryEstimate(
            weights_bytes=weights,
            grads_bytes=updated if plan.micro_batches > 1 else min(largest_param, updated),
            optimizer_bytes=states * updated,
            buffers_bytes=updated if dp > 1 else 0,
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
    if tied_output_embedding(graph.model):
        outputs_side += max((n for name, n in sizes.items() if owners[name] in before), default=0)
    return inputs_side, outputs_side


@functools.cache
def _tied(spec_json: str) -> bool:
    with torch.device("meta"):
        model = build_model(ModelSpec.from_dict(json.loads(spec_json)))
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    if get_in is None or get_out is None:
        return False
    inputs, outputs = get_in(), get_out()
    return inputs is not None and outputs is not None and outputs.weight is inputs.weight


def tied_output_embedding(spec: ModelSpec) -> bool:
    """Whether ``spec``'s output layer uses its input embedding's weight."""
    return _tied(json.dumps(spec.to_dict(), sort_keys=True))


def _in_flight_on(plan: "ParallelPlan", rank: int) -> int:
    """Micro-batches (chunks, interleaved) whose activations pipeline rank ``rank`` holds at
    its peak: the warm-up forwards before its first backward, and the one with it."""
    m, pp = plan.micro_batches, plan.pp
    if plan.pp_schedule == "gpipe":
        return m
    if plan.pp_schedule == "1f1b":
        return min(pp - rank, m)
    if plan.pp_schedule == "eager_1f1b":
        return min(2 * (pp - rank) - 1, m)
    return min((plan.chunks - 1) * pp + 2 * (pp - rank - 1) + 1, m * plan.chunks)
