"""Peak memory of one rank under a strategy, from the graph of its micro-batch.

Given what autograd saves for backward by module, :func:`peak_memory` answers with the step's
timeline (:mod:`.memory_timeline`, what the search uses); without it, with the model below.

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
from collections.abc import Callable, Mapping, Sequence

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.strategy import Strategy
from ddlsim.plans.stages import stage_count
from ddlsim.simulator.memory_estimate import GIB, OPTIMIZER_STATES, MemoryEstimate
from ddlsim.simulator.memory_estimate import under as _under
from ddlsim.simulator.memory_timeline import timeline_peak

__all__ = ["GIB", "OPTIMIZER_STATES", "MemoryEstimate", "peak_memory", "timeline_peak"]


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
    return _outputs_peak(
        graph,
        strategy,
        world_size=world_size,
        blocks=blocks,
        fsdp_groups=fsdp_groups,
        optimizer=optimizer,
    )


def _outputs_peak(
    graph: IterationGraph,
    strategy: Strategy,
    *,
    world_size: int,
    blocks: Sequence[str],
    fsdp_groups: Sequence[Sequence[str]],
    optimizer: str,
) -> MemoryEstimate:
    """The estimate without the saved bytes: every non-view forward output kept for backward
    (the module docstring's model)."""
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
