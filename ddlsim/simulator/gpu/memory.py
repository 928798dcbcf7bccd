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

The first stage of a 1F1B schedule holds ``min(p, m)`` micro-batches in flight, interleaved
``p (1 + (p - 1) / (p v))`` worth of its layers; GPipe holds all ``m``.
"""

import dataclasses

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
) -> float:
    """Bytes one block keeps for its backward per micro-batch (the formulas above)."""
    sbh = seq * batch * hidden
    if recompute == "full":
        return 2 * sbh / (tp if sequence_parallel else 1)
    scores = 0.0 if (recompute == "selective" or fused_attention) else 5 * heads * seq / hidden
    if sequence_parallel:
        return sbh / tp * (34 + scores)
    return sbh * (10 + 24 / tp + scores / tp)


def in_flight(schedule: str, *, stages: int, chunks: int, micro_batches: int) -> float:
    """Micro-batches' worth of its layers' activations the first stage holds at its peak."""
    if schedule == "gpipe":
        return float(micro_batches)
    if chunks > 1:
        return min(stages * (1 + (stages - 1) / (stages * chunks)), float(micro_batches))
    return float(min(stages, micro_batches))
