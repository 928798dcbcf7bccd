"""What the GPU-cluster simulator says of a layout (:class:`ScalePrediction`) and what it needs
to know of the model beyond one shard's graph (:class:`ModelDims`)."""

import dataclasses
from typing import Any

from ddlsim.simulator.gpu.memory import MemoryEstimate

BREAKDOWN_KEYS: tuple[str, ...] = (
    "compute",
    "recompute",
    "exposed_comm_node",
    "exposed_comm_network",
    "pipeline_bubble",
    "optimizer",
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ModelDims:
    """What the memory model and the collectives need to know of the model."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    fused_attention: bool
    kv_heads: int = 0
    dropout: bool = True
    label: str = "the model"
    stack: str = "its stack"

    @property
    def kv_hidden(self) -> int:
        """Keys' (or values') width: the key-value heads times the head size."""
        return (self.kv_heads or self.heads) * self.hidden // self.heads


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ScalePrediction:
    """One iteration: its time, throughput, FLOP rate and memory, and where the time goes."""

    iteration_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    memory: MemoryEstimate
    fits: bool
    breakdown_ms: dict[str, float]
    micro_batch_size: int
    model_tflops_per_gpu: float = 0.0
    mfu: float = 0.0
    # Set where a learned cost model corrected the replay: the replay's own time, and the
    # predictor that corrected it (:mod:`ddlsim.simulator.gpu.cost`).
    replay_s: float | None = None
    predictor: str = "replay"

    def corrected(self, iteration_s: float, predictor: str) -> "ScalePrediction":
        """This prediction at ``iteration_s`` (a cost model's correction of the replay): the
        rates scale with the time; memory and the replay's breakdown stay."""
        ratio = self.iteration_s / iteration_s
        return dataclasses.replace(
            self,
            iteration_s=iteration_s,
            tokens_per_s_per_gpu=self.tokens_per_s_per_gpu * ratio,
            tflops_per_gpu=self.tflops_per_gpu * ratio,
            model_tflops_per_gpu=self.model_tflops_per_gpu * ratio,
            mfu=self.mfu * ratio,
            replay_s=self.iteration_s,
            predictor=predictor,
        )

    def to_json(self) -> dict[str, Any]:
        """``tflops_per_gpu`` counts recomputed FLOPs (as Megatron-LM's papers do);
        ``model_tflops_per_gpu`` and ``mfu`` (against the GPU's dense 16-bit peak) do not.
        A corrected prediction also names its ``predictor`` and the ``replay_s`` it corrected
        (``breakdown_ms`` is the replay's)."""
        corrected = (
            {"predictor": self.predictor, "replay_s": self.replay_s}
            if self.replay_s is not None
            else {}
        )
        return {
            **corrected,
            "iteration_s": self.iteration_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "tflops_per_gpu": self.tflops_per_gpu,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "memory": self.memory.to_json(),
            "fits": self.fits,
            "micro_batch_size": self.micro_batch_size,
            "breakdown_ms": {key: round(value, 3) for key, value in self.breakdown_ms.items()},
        }
