"""The search space of one model on one cluster: which parallel plans, tensor-fusion choices and
compiled blocks a search may pick from.

Backtracking walks it through bucket partitions of the gradients (:mod:`search.backtrack`);
the Optuna samplers draw a point of it as trial parameters (:meth:`Space.sample`) and read the
strategy those stand for (:meth:`Space.strategy`): a parallel plan by its name, under a
data-parallel plan a DDP-style bucket cap (log-uniform from 10 KB to all gradients in one
bucket), the first bucket's cap as a share of it and DeAR on or off, and how many blocks of the
model's stack are compiled (the first ``k``).
"""

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import optuna

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import (
    LAYER_LAYOUTS,
    OpFusionPlan,
    ParallelPlan,
    Strategy,
    TensorFusionPlan,
)
from ddlsim.simulator.plans import is_data_parallel

MIN_CAP_MB = 0.01
"""The smallest bucket cap a sampler draws (MB)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Space:
    """What a search chooses from: ``plans`` (the first is DDP's), the bucket caps up to all
    ``total_grad_mb`` of gradients in one bucket, DeAR (when ``dear``), the ``blocks`` whose
    first ``k`` may be compiled (none: op fusion is not searched), and under tensor-parallel
    plans a layout for each of the ``layer_blocks`` blocks (per-layer placements; 0: not
    searched; ``layer_stacks``: each block's stack where a stack's blocks must share a
    layout) at the global ``batch_size`` on ``world_size`` ranks.

    Raises:
        InvalidOptionError: no plan.
    """

    plans: tuple[ParallelPlan, ...]
    total_grad_mb: float
    blocks: tuple[str, ...] = ()
    dear: bool = True
    layer_blocks: int = 0
    # Each block's stack where a stack's blocks must share one layout (empty: none must).
    layer_stacks: tuple[int, ...] = ()
    batch_size: int = 0
    world_size: int = 0
    # Whether data-parallel plans take tensor-fusion choices (bucket caps, DeAR): not on GPU
    # clusters, whose frameworks bucket as they do (Megatron-Core's buckets, FSDP's groups).
    tensor_fusion: bool = True

    def layer_layouts(self, plan: ParallelPlan) -> tuple[str, ...]:
        """The per-layer layouts a tensor-parallel ``plan`` may give its ``layer_blocks``
        blocks: ``batch`` only where ``tp`` divides the rank's micro-batch; none without
        blocks or tensor parallelism, and none for a grid (which splits every block alike)."""
        if plan.tp == 1 or plan.grid or not self.layer_blocks:
            return ()
        rank_batch = plan.rank_batch_size(self.batch_size, self.world_size)
        return tuple(
            layout for layout in LAYER_LAYOUTS if layout != "batch" or rank_batch % plan.tp == 0
        )

    def __post_init__(self) -> None:
        if not self.plans:
            raise InvalidOptionError("the space has no parallel plan the model supports")

    @property
    def labels(self) -> dict[str, ParallelPlan]:
        """The plans by :attr:`ParallelPlan.label`."""
        return {p.label: p for p in self.plans}

    def sample(self, trial: optuna.Trial) -> dict[str, Any]:
        """Draw a trial's parameters (conditional on the plan)."""
        params: dict[str, Any] = {}
        labels = list(self.labels)
        params["plan"] = (
            trial.suggest_categorical("plan", labels) if len(labels) > 1 else labels[0]
        )
        if self.tensor_fusion and is_data_parallel(self.labels[params["plan"]]):
            top = max(self.total_grad_mb, MIN_CAP_MB * 2)
            params["log_cap_mb"] = trial.suggest_float(
                "log_cap_mb", math.log(MIN_CAP_MB), math.log(top)
            )
            params["first_share"] = trial.suggest_float("first_share", 0.05, 1.0)
            if self.dear:
                params["dear"] = trial.suggest_categorical("dear", [False, True])
        if self.blocks:
            params["compiled_blocks"] = trial.suggest_int("compiled_blocks", 0, len(self.blocks))
        return params

    def strategy(self, params: Mapping[str, Any]) -> Strategy:
        """The strategy a trial's parameters stand for."""
        plan = self.labels[str(params.get("plan", self.plans[0].label))]
        fusion = TensorFusionPlan()
        if "log_cap_mb" in params:
            cap = math.exp(float(params["log_cap_mb"]))
            fusion = TensorFusionPlan(
                bucket_cap_mb=cap,
                first_bucket_cap_mb=cap * float(params["first_share"]),
                dear=bool(params.get("dear", False)),
            )
        compiled = self.blocks[: int(params.get("compiled_blocks", 0))]
        return Strategy(
            parallel=plan, tensor_fusion=fusion, op_fusion=OpFusionPlan(compiled=compiled)
        )
