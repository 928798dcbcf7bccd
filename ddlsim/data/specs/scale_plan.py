"""``ScalePlan``: a ``Strategy`` resolved for a GPU cluster (every degree explicit), the view
the GPU-cluster simulator and its search price.

It is not a second vocabulary: a plan is read from a strategy (:meth:`ScalePlan.from_strategy`,
also what :meth:`from_dict` and :meth:`parse` do) and written back as one
(:meth:`to_strategy`), so that what ``ddlsim search --cluster`` picks is a strategy that
``ddlsim run`` accepts as it is.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs._serde import expect_choice, expect_int, load_json_or_file
from ddlsim.data.specs.experts import expert_data_parallel, expert_features
from ddlsim.data.specs.strategy import RECOMPUTE, ParallelPlan, Strategy

# The schedules the GPU path replays, in the strategy's names.
PP_SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved_1f1b", "gpipe")
# The precisions GPUs are priced in (fp32 GEMMs are not in the roofline).
PRECISIONS: tuple[str, ...] = ("fp16", "bf16", "fp8")


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class ScalePlan:
    """``dp * tp * pp`` GPUs; each data-parallel replica runs ``micro_batches`` micro-batches
    per iteration through ``pp`` stages (``virtual_stages`` model chunks per GPU with the
    interleaved schedule). ``fsdp`` shards parameters, gradients and optimizer states over
    ``dp`` (ZeRO-3, as FSDP2); ``distributed_optimizer`` shards optimizer states and fp32 master
    weights (Megatron-LM's); without either, gradients are all-reduced.

    Raises:
        InvalidStrategyError: naming the bad value and what is allowed.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batches: int = 1
    pp_schedule: str = "1f1b"
    virtual_stages: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    fsdp: bool = False
    distributed_optimizer: bool = False
    async_tp: bool = False
    cp: int = 1
    cp_comm: str = "ring"
    zero: int = 0
    precision: str = "bf16"
    compile: bool = False
    kernels: str = "pytorch"
    ep: int = 1
    etp: int = 1
    dispatcher: str = "all_to_all"
    capacity_factor: float | None = None
    ep_overlap: bool = False

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "micro_batches", "virtual_stages"):
            expect_int(getattr(self, name), f"parallel.{name}", InvalidStrategyError)
        expect_choice(self.pp_schedule, PP_SCHEDULES, "parallel.pp_schedule", InvalidStrategyError)
        expect_choice(self.recompute, RECOMPUTE, "parallel.recompute", InvalidStrategyError)
        if self.precision == "fp32":
            raise InvalidStrategyError(
                "precision 'fp32' is not priced on GPU clusters (their GEMMs run in 16 or 8 "
                f"bits); allowed: {', '.join(PRECISIONS)}"
            )
        expect_choice(self.precision, PRECISIONS, "precision", InvalidStrategyError)
        if self.pp_schedule == "interleaved_1f1b" and self.pp > 1 and self.micro_batches % self.pp:
            raise InvalidStrategyError(
                f"the interleaved schedule needs micro_batches({self.micro_batches}) to be a "
                f"multiple of pp({self.pp})"
            )
        # The rest (flags, their combinations) is the strategy's to check.
        self.to_strategy()
        expert_data_parallel(self, self.dp)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def fused_kernels(self) -> bool:
        """Whether the blocks' memory-bound ops run fused (compiled, or Transformer Engine's)."""
        return self.compile or self.kernels == "transformer_engine"

    @property
    def schedule_kind(self) -> str:
        """The schedule as the GPU replay names it (``1f1b``, ``interleaved``, ``gpipe``)."""
        return "interleaved" if self.pp_schedule == "interleaved_1f1b" else self.pp_schedule

    @classmethod
    def from_strategy(cls, strategy: Strategy, world_size: int | None = None) -> "ScalePlan":
        """The plan of ``strategy``; ``dp`` from ``world_size`` when the strategy leaves it
        out.

        Raises:
            InvalidStrategyError: a strategy the GPU path cannot price: its precision, a
                schedule or setting of the CPU loop only (per-layer placements, grids, stages,
                explicit buckets, DeAR, compiled block lists), or no ``dp`` and no world size.
        """
        plan = strategy.parallel
        if plan.dp is None and world_size is None:
            raise InvalidStrategyError(
                "parallel.dp must be given to price a strategy on a GPU cluster (or the "
                "cluster's size is needed to derive it)"
            )
        dp = plan.dp if plan.dp is not None else plan.resolve_dp(world_size or 1)
        cpu_only = {
            "parallel.layers": bool(plan.layers),
            "parallel.vocab": plan.vocab != "split",
            "parallel.stages": bool(plan.stages),
            "parallel.grid": bool(plan.grid),
            "parallel.fsdp_groups": plan.fsdp_groups is not None,
            "tensor_fusion.buckets": strategy.tensor_fusion.buckets is not None,
            "tensor_fusion.dear": strategy.tensor_fusion.dear,
            "op_fusion.compiled": bool(strategy.op_fusion.compiled),
        }
        named = [key for key, used in cpu_only.items() if used]
        if named:
            raise InvalidStrategyError(
                f"{', '.join(named)} {'is' if len(named) == 1 else 'are'} not priced on GPU "
                "clusters; the GPU path prices Megatron's and torchtitan's dp x tp x pp x cp "
                "layouts "
                "(use compile for compiled blocks)"
            )
        if plan.pp_schedule not in PP_SCHEDULES:
            raise InvalidStrategyError(
                f"parallel.pp_schedule {plan.pp_schedule!r} is not priced on GPU clusters; "
                f"allowed: {', '.join(PP_SCHEDULES)}"
            )
        return cls(
            dp=dp,
            tp=plan.tp,
            pp=plan.pp,
            micro_batches=plan.micro_batches,
            pp_schedule=plan.pp_schedule,
            virtual_stages=plan.chunks,
            recompute=plan.recompute,
            sequence_parallel=plan.sequence_parallel,
            fsdp=plan.fsdp,
            distributed_optimizer=plan.distributed_optimizer,
            async_tp=plan.async_tp,
            cp=plan.cp,
            cp_comm=plan.cp_comm,
            zero=plan.zero,
            precision=strategy.precision,
            compile=strategy.compile,
            kernels=strategy.kernels,
            ep=plan.ep,
            etp=plan.etp,
            dispatcher=plan.dispatcher,
            capacity_factor=plan.capacity_factor,
            ep_overlap=plan.ep_overlap,
        )

    @property
    def edp(self) -> int:
        """How many ranks hold each expert shard (Megatron-Core's expert data parallelism)."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    def to_strategy(self) -> Strategy:
        """The strategy this plan is: what ``ddlsim run`` takes."""
        interleaved = self.pp_schedule == "interleaved_1f1b"
        if self.virtual_stages > 1 and not interleaved:
            raise InvalidStrategyError(
                f"parallel.virtual_stages({self.virtual_stages}) > 1 needs pp_schedule "
                f"'interleaved_1f1b', got {self.pp_schedule!r}"
            )
        return Strategy(
            parallel=ParallelPlan(
                dp=self.dp,
                tp=self.tp,
                pp=self.pp,
                micro_batches=self.micro_batches,
                pp_schedule=self.pp_schedule,  # type: ignore[arg-type]
                virtual_stages=self.virtual_stages if interleaved else None,
                recompute=self.recompute,
                sequence_parallel=self.sequence_parallel,
                fsdp=self.fsdp,
                distributed_optimizer=self.distributed_optimizer,
                async_tp=self.async_tp,
                cp=self.cp,
                cp_comm=self.cp_comm,
                zero=self.zero,
                ep=self.ep,
                etp=self.etp,
                dispatcher=self.dispatcher,
                capacity_factor=self.capacity_factor,
                ep_overlap=self.ep_overlap,
            ),
            precision=self.precision,
            compile=self.compile,
            kernels=self.kernels,
        )

    def to_dict(self) -> dict[str, Any]:
        """The plan as a strategy's JSON (dp, tp, pp and micro-batches always written)."""
        out = self.to_strategy().to_dict()
        parallel = out["parallel"]
        for key in ("dp", "tp", "pp", "micro_batches", "pp_schedule"):
            parallel[key] = getattr(self, key)
        out["precision"] = self.precision
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], world_size: int | None = None) -> "ScalePlan":
        """A plan from a strategy's JSON (a published row's ``strategy``); precision bf16 when
        the JSON gives none, ``dp`` from ``world_size`` when it gives none."""
        if isinstance(raw, Mapping) and "precision" not in raw:
            raw = {**raw, "precision": "bf16"}
        return cls.from_strategy(Strategy.from_dict(raw), world_size)

    @classmethod
    def parse(cls, text: str, world_size: int | None = None) -> "ScalePlan":
        """A plan from inline JSON or a JSON/YAML file."""
        return cls.from_dict(load_json_or_file(text, "plan", InvalidStrategyError), world_size)

    def label(self) -> str:
        parts = [f"dp{self.dp}", f"tp{self.tp}", f"pp{self.pp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}" + ("" if self.cp_comm == "ring" else "-ag"))
        parts.append(f"mb{self.micro_batches}")
        if self.virtual_stages > 1:
            parts.append(f"v{self.virtual_stages}")
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.fsdp:
            parts.append("fsdp")
        if self.distributed_optimizer:
            parts.append("dist-opt")
        if self.zero:
            parts.append(f"zero{self.zero}")
        if self.async_tp:
            parts.append("async-tp")
        parts += expert_features(self)
        if self.compile:
            parts.append("compiled")
        if self.kernels == "transformer_engine":
            parts.append("te")
        return " ".join(parts) + f" {self.precision}"
