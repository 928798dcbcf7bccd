"""``ScalePlan``: how a large job is split over a GPU cluster, in the terms its users write
(Megatron-LM's and torchtitan's): data x tensor x pipeline parallel, micro-batches and their
schedule, activation recomputation, sequence parallelism, sharded optimizer states, precision.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs._serde import check_keys, expect_choice, expect_int, load_json_or_file

Recompute = Literal["none", "selective", "selective_op", "full"]
# "selective": Megatron-LM's (Korthikanti et al.): the attention core is recomputed;
# "selective_op": torchtitan's op-level policy: matmul and attention outputs are kept, but
# only every other matmul's, and everything else is recomputed.
RECOMPUTE: tuple[str, ...] = ("none", "selective", "selective_op", "full")
PP_SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved", "gpipe")
PRECISIONS: tuple[str, ...] = ("fp16", "bf16", "fp8")
_PARALLEL_KEYS = {
    "dp",
    "tp",
    "pp",
    "micro_batches",
    "pp_schedule",
    "virtual_stages",
    "recompute",
    "sequence_parallel",
    "fsdp",
    "async_tp",
}


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class ScalePlan:
    """``dp * tp * pp`` GPUs; each data-parallel replica runs ``micro_batches`` micro-batches
    per iteration through ``pp`` stages (``virtual_stages`` model chunks per GPU with the
    interleaved schedule). ``fsdp`` shards parameters, gradients and optimizer states over
    ``dp`` (ZeRO-3, as FSDP2); without it they are replicated and gradients all-reduced.

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
    async_tp: bool = False
    precision: str = "bf16"
    compile: bool = False

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "micro_batches", "virtual_stages"):
            expect_int(getattr(self, name), f"parallel.{name}", InvalidStrategyError)
        expect_choice(self.pp_schedule, PP_SCHEDULES, "parallel.pp_schedule", InvalidStrategyError)
        expect_choice(self.recompute, RECOMPUTE, "parallel.recompute", InvalidStrategyError)
        expect_choice(self.precision, PRECISIONS, "precision", InvalidStrategyError)
        for name in ("sequence_parallel", "fsdp", "async_tp", "compile"):
            if not isinstance(getattr(self, name), bool):
                where = name if name == "compile" else f"parallel.{name}"
                raise InvalidStrategyError(
                    f"{where} must be true or false, got {getattr(self, name)!r}"
                )
        if self.virtual_stages > 1 and self.pp_schedule != "interleaved":
            raise InvalidStrategyError(
                f"parallel.virtual_stages({self.virtual_stages}) > 1 needs pp_schedule "
                f"'interleaved', got {self.pp_schedule!r}"
            )
        if self.pp_schedule == "interleaved" and self.pp > 1 and self.micro_batches % self.pp:
            raise InvalidStrategyError(
                f"the interleaved schedule needs micro_batches({self.micro_batches}) to be a "
                f"multiple of pp({self.pp})"
            )
        if self.async_tp and self.tp == 1:
            raise InvalidStrategyError("parallel.async_tp needs tp > 1, got tp 1")
        if self.sequence_parallel and self.tp == 1:
            raise InvalidStrategyError("parallel.sequence_parallel needs tp > 1, got tp 1")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def to_dict(self) -> dict[str, Any]:
        parallel = {name: getattr(self, name) for name in sorted(_PARALLEL_KEYS)}
        return {"parallel": parallel, "precision": self.precision, "compile": self.compile}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "ScalePlan":
        """The ``strategy`` object of a published row: ``{"parallel": {...}, "precision"}``."""
        check_keys(raw, {"parallel", "precision", "compile"}, "strategy", InvalidStrategyError)
        parallel = raw.get("parallel", {})
        check_keys(parallel, _PARALLEL_KEYS, "strategy.parallel", InvalidStrategyError)
        return cls(
            **parallel, precision=raw.get("precision", "bf16"), compile=raw.get("compile", False)
        )

    @classmethod
    def parse(cls, text: str) -> "ScalePlan":
        """A plan from inline JSON or a JSON/YAML file."""
        return cls.from_dict(load_json_or_file(text, "plan", InvalidStrategyError))

    def label(self) -> str:
        parts = [f"dp{self.dp}", f"tp{self.tp}", f"pp{self.pp}", f"mb{self.micro_batches}"]
        if self.virtual_stages > 1:
            parts.append(f"v{self.virtual_stages}")
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.fsdp:
            parts.append("fsdp")
        if self.async_tp:
            parts.append("async-tp")
        if self.compile:
            parts.append("compiled")
        return " ".join(parts) + f" {self.precision}"
