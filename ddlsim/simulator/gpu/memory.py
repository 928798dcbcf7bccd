"""How much GPU memory a layout needs: weights, gradients and optimizer states, activations.

Weights and optimizer: mixed-precision Adam keeps per parameter a 16-bit copy (2 bytes), an
fp32 gradient (4, Megatron-LM's ``main_grad``), an fp32 master copy and two fp32 moments (12):
18 bytes; sharded (FSDP/ZeRO-3) the fp32 master, gradient and moments are split over the
data-parallel group (16 bytes / dp) and the 16-bit weights of about two blocks exist at once.
Activations follow Korthikanti et al. (MLSys 2023, "Reducing Activation Recomputation in Large
Transformer Models"), per block and micro-batch of ``s`` tokens, ``b`` sequences, hidden ``h``,
``a`` heads, tensor-parallel ``t``, in bytes of 16-bit activations:

    no recomputation, tp without sequence parallelism:  s b h (10 + 24/t + 5 a s / (h t))
    with sequence parallelism:                          s b h / t (34 + 5 a s / h)
    selective recomputation (or fused attention, which keeps no scores): the 5 a s / h term goes
    full recomputation: the block's input only, 2 s b h (/ t with sequence parallelism)

Of the 10 s b h kept whole, 2 are the dropout masks of the attention's and the MLP's outputs
(one byte an element), kept only by a model that drops out (GPT-2's configs do; Llama's and
Nemotron's have no dropout); of the 24 split, 4 are the keys and values (2 s b h each), which
grouped-query attention shrinks to the key-value heads' share ``g``: ``24 - 4 (1 - g)``.

Transformer Engine's fp8 layers keep the fp8 copies of their GEMMs' inputs for the backward
instead of the 16-bit ones: the QKV and first MLP projections' inputs (2 s b h each, kept
whole without sequence parallelism) and the second MLP projection's (8 s b h) take half, so
10 + 24 / t becomes 8 + 20 / t, and 34 becomes 28 with sequence parallelism.

The first stage of a 1F1B schedule holds ``min(p, m)`` micro-batches in flight, interleaved
``p (1 + (p - 1) / (p v))`` worth of its layers; GPipe holds all ``m``. Context parallelism
divides the tokens ``s`` a rank holds by ``cp``.

Sharding over the ``d`` ranks that hold the same weights (data- and context-parallel): ZeRO-1
and Megatron-Core's distributed optimizer keep the 16-bit weights and their 16-bit gradient
buffer whole (Megatron-Core reduces gradients in bf16 unless told otherwise, DeepSpeed in the
training dtype) and shard the fp32 master weights and Adam's moments (4 + 12 / d bytes a
parameter), ZeRO-2 also the gradients (2 + 14 / d); FSDP
(ZeRO-3) shards everything (16 / d) and holds two blocks' 16-bit weights at a time, or, under
pipelining, the stage's whole 16-bit weights and fp32 gradients between micro-batches.
"""

import dataclasses
from typing import TYPE_CHECKING

from ddlsim.simulator.gpu.experts import experts_activation_bytes

if TYPE_CHECKING:
    from ddlsim.data.specs.scale_plan import ScalePlan
    from ddlsim.simulator.gpu.shard_costs import ShardCosts

# Of the formulas' tensors split by tensor parallelism (24 sbh, 20 with fp8 inputs), the dense
# MLP's two wide ones: its up-projection's output and its activation's (4h each, 16-bit; the
# activation's kept in fp8 with fp8 inputs).
MLP_SPLIT = 16.0
MLP_SPLIT_FP8 = 12.0
GIB = 1024**3
# What a CUDA context, NCCL's buffers and the allocator's fragmentation take before the job.
RESERVED_GIB = 5.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """Peak bytes on the busiest GPU, by part."""

    weights_and_optimizer: float
    activations: float
    logits: float
    reserved: float

    @property
    def total(self) -> float:
        return self.weights_and_optimizer + self.activations + self.logits + self.reserved

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    def to_json(self) -> dict[str, float]:
        return {
            "total_gib": round(self.total_gib, 2),
            "weights_and_optimizer_gib": round(self.weights_and_optimizer / GIB, 2),
            "activations_gib": round(self.activations / GIB, 2),
            "logits_gib": round(self.logits / GIB, 2),
            "reserved_gib": self.reserved / GIB,
        }


def block_activation_bytes(
    *,
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    tp: int,
    sequence_parallel: bool,
    recompute: str,
    fused_attention: bool,
    fp8_inputs: bool = False,
    dropout: bool = True,
    kv_share: float = 1.0,
) -> float:
    """Bytes one block keeps for its backward per micro-batch (the formulas above);
    ``fp8_inputs``: the GEMMs' inputs are kept in fp8 (Transformer Engine's fp8 layers);
    ``dropout``: the model drops out (masks kept); ``kv_share``: key-value heads over heads."""
    sbh = seq * batch * hidden
    if recompute == "full":
        return 2 * sbh / (tp if sequence_parallel else 1)
    scores = 0.0 if (recompute == "selective" or fused_attention) else 5 * heads * seq / hidden
    whole, split = (8.0, 20.0) if fp8_inputs else (10.0, 24.0)
    whole -= 0.0 if dropout else 2.0
    split -= 4.0 * (1.0 - kv_share)
    if sequence_parallel:
        return sbh / tp * (whole + split + scores)
    return sbh * (whole + split / tp + scores / tp)


def in_flight(schedule: str, *, stages: int, chunks: int, micro_batches: int) -> float:
    """Micro-batches' worth of its layers' activations the first stage holds at its peak."""
    if schedule == "gpipe":
        return float(micro_batches)
    if chunks > 1:
        return min(stages * (1 + (stages - 1) / (stages * chunks)), float(micro_batches))
    return float(min(stages, micro_batches))


def layer_parts(layers: int, parts: int) -> list[int]:
    """``layers`` split into ``parts`` model chunks, the first ones a layer longer."""
    base, extra = divmod(layers, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def weight_bytes(
    plan: "ScalePlan", params: float, block_params: float, *, shards: int | None = None
) -> float:
    """Weights, gradients and optimizer states of ``params`` parameters on one GPU, their
    sharded states split over ``shards`` ranks (the data- and context-parallel ones by default;
    the expert-data-parallel ones for routed experts)."""
    shards = shards or plan.dp * plan.cp
    if plan.fsdp and plan.pp > 1:
        # Pipelined, FSDP keeps the stage's weights gathered (16-bit) and its gradients whole
        # (fp32, reduced once after the last micro-batch) through the iteration.
        return 16 * params / shards + 6 * params
    if plan.fsdp:
        # The fp32 shard (16 bytes) plus two blocks' gathered 16-bit weights.
        return 16 * params / shards + 2 * 2 * block_params
    if plan.distributed_optimizer or plan.zero == 1:
        return (4.0 + 12.0 / shards) * params
    if plan.zero == 2:
        return (2.0 + 14.0 / shards) * params
    return 18.0 * params


def estimate_memory(
    costs: "ShardCosts",
    plan: "ScalePlan",
    *,
    layers: int,
    hidden: int,
    heads: int,
    vocab: int,
    fused_attention: bool,
    mbs: int,
    seq_len: int,
    stage_params: list[int],
    dropout: bool = True,
    kv_share: float = 1.0,
    expert_params: list[float] | None = None,
) -> MemoryEstimate:
    """The busiest GPU's memory: the first stage's, or the last's where the logits outweigh
    it; ``seq_len`` is the whole sequence (a context-parallel rank holds ``1 / cp`` of it);
    ``expert_params``: each stage's routed-expert parameters on one GPU, their states sharded
    over the expert-data-parallel ranks."""
    p, v = plan.pp, plan.virtual_stages
    tokens = seq_len // plan.cp
    weights = [weight_bytes(plan, n, costs.block.params) for n in stage_params]
    for stage, held in enumerate(expert_params or []):
        weights[stage] += weight_bytes(plan, held, held, shards=plan.edp)
    shape = {
        "seq": tokens,
        "batch": mbs,
        "hidden": hidden,
        "heads": heads,
        "tp": plan.tp,
        "sequence_parallel": plan.sequence_parallel,
        "fused_attention": fused_attention,
        "fp8_inputs": plan.kernels == "transformer_engine" and plan.precision == "fp8",
        "dropout": dropout,
        "kv_share": kv_share,
    }
    per_block = (
        costs.op_policy_saved_bytes
        if plan.recompute == "selective_op"
        else block_activation_bytes(**shape, recompute=plan.recompute)  # type: ignore[arg-type]
    )
    if costs.experts is not None and plan.recompute != "full":
        # The routed experts replace the dense MLP the formulas count (its two wide tensors).
        dense_mlp = (MLP_SPLIT_FP8 if shape["fp8_inputs"] else MLP_SPLIT) / plan.tp
        per_block += experts_activation_bytes(costs.experts, plan) - dense_mlp * (
            tokens * mbs * hidden
        )
    layers_first = sum(layer_parts(layers, p * v)[0::p])
    held = in_flight(plan.schedule_kind, stages=p, chunks=v, micro_batches=plan.micro_batches)
    activations = per_block * layers_first * held
    if plan.recompute == "full":
        # One block's activations live while it is recomputed and differentiated.
        activations += block_activation_bytes(**shape, recompute="none")  # type: ignore[arg-type]
    # The loss on the last stage, one micro-batch at a time: 16-bit logits, their fp32 copy
    # and log-softmax, and then the fp32 gradient: 12 bytes a logit at the peak.
    logits = 12.0 * mbs * tokens * vocab / plan.tp
    first = weights[0] + activations + (logits if p == 1 else 0.0)
    last = weights[-1] + (activations / max(held, 1) if p > 1 else activations) + logits
    if first >= last:
        return MemoryEstimate(
            weights_and_optimizer=weights[0],
            activations=activations,
            logits=logits if p == 1 else 0.0,
            reserved=RESERVED_GIB * GIB,
        )
    return MemoryEstimate(
        weights_and_optimizer=weights[-1],
        activations=last - weights[-1] - logits,
        logits=logits,
        reserved=RESERVED_GIB * GIB,
    )
