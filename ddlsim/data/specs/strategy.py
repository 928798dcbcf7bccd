"""``Strategy``: how a training job is parallelized, how gradients are bucketed, what is compiled,
in what precision. One vocabulary for the CPU loop and GPU clusters: what ``ddlsim search
--cluster`` prints, ``ddlsim run`` accepts.

Defaults equal PyTorch DDP's: pure data parallelism in fp32, gradient buckets capped at 25 MiB
with a 1 MiB first bucket (caps in MiB, as ``DistributedDataParallel(bucket_cap_mb=...)`` reads
them), plain all-reduce, nothing compiled, nothing recomputed.
"""

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs._serde import (
    check_keys,
    expect_choice,
    expect_number,
    load_json_or_file,
)
from ddlsim.data.specs.experts import EXPERT_DEFAULTS
from ddlsim.data.specs.parallel import (
    DEFAULT_VIRTUAL_STAGES,
    GRID_AXES,
    LAYER_LAYOUTS,
    PIPELINE_SCHEDULES,
    PRECISIONS,
    RECOMPUTE,
    STAGE_LAYOUTS,
    VOCAB_LAYOUTS,
    ParallelPlan,
    PipelineSchedule,
    layout_summary,
    string_groups,
)

__all__ = [
    "DEFAULT_BUCKET_CAP_MB",
    "DEFAULT_FIRST_BUCKET_CAP_MB",
    "DEFAULT_VIRTUAL_STAGES",
    "GRID_AXES",
    "KERNELS",
    "LAYER_LAYOUTS",
    "PIPELINE_SCHEDULES",
    "PRECISIONS",
    "RECOMPUTE",
    "STAGE_LAYOUTS",
    "VOCAB_LAYOUTS",
    "Bucket",
    "OpFusionPlan",
    "ParallelPlan",
    "PipelineSchedule",
    "Strategy",
    "TensorFusionPlan",
    "layout_summary",
]
MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25.0
DEFAULT_FIRST_BUCKET_CAP_MB = 1.0
FusionImplementation = Literal["auto", "ddp", "hooks"]
FUSION_IMPLEMENTATIONS: tuple[str, ...] = ("auto", "ddp", "hooks")
KERNELS: tuple[str, ...] = ("pytorch", "transformer_engine")
ReduceScatterImplementation = Literal["auto", "ring", "native"]
REDUCE_SCATTER_IMPLEMENTATIONS: tuple[str, ...] = ("auto", "ring", "native")
MAX_CAP_MB = float(1 << 30)  # a PiB: above any model's gradients, and bytes that fit an int


def _cap(value: Any, where: str) -> float:
    """A bucket cap in MiB: a finite number in (0, MAX_CAP_MB]."""
    cap = expect_number(value, where, InvalidStrategyError)
    if cap > MAX_CAP_MB:
        raise InvalidStrategyError(f"{where} must be at most {MAX_CAP_MB:.0f} MiB, got {value!r}")
    return cap


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class Bucket:
    """One gradient bucket: parameter names in ready order and their total bytes."""

    index: int
    params: tuple[str, ...]
    grad_bytes: int


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class TensorFusionPlan:
    """How gradients are grouped into collectives.

    Either ``buckets`` (an explicit partition of the gradients, by parameter name; any grouping)
    or caps: ``bucket_caps_mb`` (one cap per bucket, the last repeating) or
    ``first_bucket_cap_mb`` then ``bucket_cap_mb``. ``dear`` decouples each bucket's all-reduce
    into a reduce-scatter during backward and an all-gather before the next forward.

    ``implementation`` picks who buckets: ``"ddp"`` is ``DistributedDataParallel`` itself (caps
    only), ``"hooks"`` the executor's own post-accumulate-grad hooks (any partition, DeAR);
    ``"auto"`` takes DDP for caps without DeAR and hooks otherwise. ``reduce_scatter`` picks
    DeAR's reduce-scatter and all-gather: the backend's own or a ring over send/recv; ``"auto"``
    takes the ring on gloo, whose own reduce-scatter is a whole all-reduce.
    """

    buckets: tuple[tuple[str, ...], ...] | None = None
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB
    first_bucket_cap_mb: float = DEFAULT_FIRST_BUCKET_CAP_MB
    bucket_caps_mb: tuple[float, ...] | None = None
    dear: bool = False
    implementation: FusionImplementation = "auto"
    reduce_scatter: ReduceScatterImplementation = "auto"

    def __post_init__(self) -> None:
        expect_choice(
            self.implementation,
            FUSION_IMPLEMENTATIONS,
            "tensor_fusion.implementation",
            InvalidStrategyError,
        )
        expect_choice(
            self.reduce_scatter,
            REDUCE_SCATTER_IMPLEMENTATIONS,
            "tensor_fusion.reduce_scatter",
            InvalidStrategyError,
        )
        if self.implementation == "ddp" and (self.buckets is not None or self.dear):
            raise InvalidStrategyError(
                "tensor_fusion.implementation 'ddp' takes bucket caps only: explicit buckets "
                "and dear need 'hooks' (or 'auto')"
            )
        _cap(self.bucket_cap_mb, "tensor_fusion.bucket_cap_mb")
        _cap(self.first_bucket_cap_mb, "tensor_fusion.first_bucket_cap_mb")
        if not isinstance(self.dear, bool):
            raise InvalidStrategyError(
                f"tensor_fusion.dear must be true or false, got {self.dear!r}"
            )
        if self.buckets is not None:
            if self.bucket_caps_mb is not None:
                raise InvalidStrategyError(
                    "tensor_fusion.buckets and tensor_fusion.bucket_caps_mb are exclusive: "
                    "give one"
                )
            groups = string_groups(self.buckets, "tensor_fusion.buckets")
            if not groups:
                raise InvalidStrategyError("tensor_fusion.buckets must hold at least one bucket")
            seen: set[str] = set()
            for index, group in enumerate(groups):
                if not group:
                    raise InvalidStrategyError(f"tensor_fusion.buckets[{index}] is empty")
                for name in group:
                    if name in seen:
                        raise InvalidStrategyError(
                            f"gradient {name!r} appears in more than one bucket "
                            f"(again in tensor_fusion.buckets[{index}])"
                        )
                    seen.add(name)
            object.__setattr__(self, "buckets", groups)
        if self.bucket_caps_mb is not None:
            if isinstance(self.bucket_caps_mb, str | bytes) or not isinstance(
                self.bucket_caps_mb, Sequence
            ):
                raise InvalidStrategyError(
                    f"tensor_fusion.bucket_caps_mb must be a list of numbers, "
                    f"got {self.bucket_caps_mb!r}"
                )
            caps = tuple(
                _cap(cap, f"tensor_fusion.bucket_caps_mb[{i}]")
                for i, cap in enumerate(self.bucket_caps_mb)
            )
            if not caps:
                raise InvalidStrategyError("tensor_fusion.bucket_caps_mb must not be empty")
            object.__setattr__(self, "bucket_caps_mb", caps)

    @property
    def uses_ddp(self) -> bool:
        """Whether ``DistributedDataParallel`` itself buckets (see ``implementation``)."""
        if self.implementation == "auto":
            return self.buckets is None and not self.dear
        return self.implementation == "ddp"

    def assign(self, grads: Sequence[tuple[str, int]]) -> list[Bucket]:
        """Partition ``grads`` (``(name, bytes)`` in gradient-ready order) into buckets.

        With caps, as DDP does after its first iteration: walk the gradients in ready order and
        close a bucket once it holds at least its cap. With explicit buckets, they are returned
        in launch order (the order in which their last gradient becomes ready).

        Raises:
            InvalidStrategyError: when explicit buckets name an unknown gradient or miss one.
        """
        if self.buckets is None:
            return self._assign_by_caps(grads)
        ready_index = {name: i for i, (name, _) in enumerate(grads)}
        sizes = dict(grads)
        for index, group in enumerate(self.buckets):
            for name in group:
                if name not in ready_index:
                    raise InvalidStrategyError(
                        f"tensor_fusion.buckets[{index}] names {name!r}, which is not a gradient "
                        f"of this model ({len(grads)} gradients, e.g. {grads[0][0]!r})"
                    )
        covered = {name for group in self.buckets for name in group}
        missing = [name for name, _ in grads if name not in covered]
        if missing:
            raise InvalidStrategyError(
                f"tensor_fusion.buckets miss {len(missing)} gradient(s), first {missing[0]!r}; "
                "explicit buckets must partition all gradients"
            )
        ordered = sorted(self.buckets, key=lambda g: max(ready_index[n] for n in g))
        return [
            Bucket(
                index=i,
                params=tuple(sorted(group, key=ready_index.__getitem__)),
                grad_bytes=sum(sizes[n] for n in group),
            )
            for i, group in enumerate(ordered)
        ]

    def _assign_by_caps(self, grads: Sequence[tuple[str, int]]) -> list[Bucket]:
        if self.bucket_caps_mb is not None:
            caps = [int(cap * MIB) for cap in self.bucket_caps_mb]
        else:
            caps = [int(self.first_bucket_cap_mb * MIB), int(self.bucket_cap_mb * MIB)]
        buckets: list[Bucket] = []
        current: list[str] = []
        current_bytes = 0
        for name, size in grads:
            current.append(name)
            current_bytes += size
            if current_bytes >= caps[min(len(buckets), len(caps) - 1)]:
                buckets.append(
                    Bucket(index=len(buckets), params=tuple(current), grad_bytes=current_bytes)
                )
                current, current_bytes = [], 0
        if current:
            buckets.append(
                Bucket(index=len(buckets), params=tuple(current), grad_bytes=current_bytes)
            )
        return buckets


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class OpFusionPlan:
    """Which blocks (module paths) are compiled with ``torch.compile``; the rest run eagerly."""

    compiled: tuple[str, ...] = ()
    backend: Literal["inductor"] = "inductor"

    def __post_init__(self) -> None:
        if isinstance(self.compiled, str) or not isinstance(self.compiled, Sequence):
            raise InvalidStrategyError(
                f"op_fusion.compiled must be a list of module paths, got {self.compiled!r}"
            )
        for index, path in enumerate(self.compiled):
            if not isinstance(path, str):
                raise InvalidStrategyError(
                    f"op_fusion.compiled[{index}] must be a module path string, got {path!r}"
                )
        if len(set(self.compiled)) != len(self.compiled):
            raise InvalidStrategyError(
                f"op_fusion.compiled repeats a block: {list(self.compiled)}"
            )
        object.__setattr__(self, "compiled", tuple(self.compiled))
        if self.backend != "inductor":
            raise InvalidStrategyError(
                f"op_fusion.backend {self.backend!r} is not supported; allowed: inductor"
            )


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class Strategy:
    """A whole training strategy. ``Strategy()`` is PyTorch DDP's defaults.

    Raises:
        InvalidStrategyError: on construction, naming the bad field and the allowed values.
    """

    parallel: ParallelPlan = dataclasses.field(default_factory=ParallelPlan)
    tensor_fusion: TensorFusionPlan = dataclasses.field(default_factory=TensorFusionPlan)
    op_fusion: OpFusionPlan = dataclasses.field(default_factory=OpFusionPlan)
    precision: str = "fp32"
    # Every repeated block compiled (torchtitan's per-block compile), on top of op_fusion's.
    compile: bool = False
    # The kernel library the layers run on: PyTorch's own (eager, or compiled with ``compile``)
    # or NVIDIA Transformer Engine's (Megatron-Core's: fused norm + linear, fused activations,
    # fp8 quantization fused into the kernel before each GEMM, fp8 weights cast once an
    # iteration). The GPU-cluster simulator prices both; the executor runs PyTorch's.
    kernels: str = "pytorch"

    def __post_init__(self) -> None:
        expect_choice(self.precision, PRECISIONS, "precision", InvalidStrategyError)
        if not isinstance(self.compile, bool):
            raise InvalidStrategyError(f"compile must be true or false, got {self.compile!r}")
        expect_choice(self.kernels, KERNELS, "kernels", InvalidStrategyError)

    def validate_for(self, world_size: int) -> None:
        """Check the plan fits ``world_size`` ranks (``dp * tp * pp * cp``)."""
        self.parallel.resolve_dp(world_size)

    @property
    def kind(self) -> str:
        """What the strategy mainly is, for reports by kind: ``pipeline``, ``stages`` (a
        pipeline with tensor-parallel stages), ``tensor`` (parallelism), ``layers`` (tensor
        parallelism with per-layer placements), ``grid`` (tensor parallelism over a 3-D
        grid), ``fsdp``, ``compiled`` (blocks), ``dear``, or else (DDP's or the executor's)
        ``buckets``."""
        plan = self.parallel
        if plan.pp > 1:
            return "stages" if "tp" in plan.stages else "pipeline"
        if plan.grid:
            return "grid"
        if plan.tp > 1:
            return "layers" if plan.per_layer else "tensor"
        if plan.fsdp:
            return "fsdp"
        if self.op_fusion.compiled:
            return "compiled"
        return "dear" if self.tensor_fusion.dear else "buckets"

    def describe(self) -> str:
        """One line for people: the plan, the buckets, DeAR and the compiled blocks."""
        if self == Strategy():
            return "DDP's defaults"
        plan, fusion = self.parallel, self.tensor_fusion
        parts = plan.features(fsdp="FSDP", micro_batches="{} micro-batches")
        if plan.pp == 1 and plan.tp == 1 and not plan.fsdp:
            parts.append(
                f"{len(fusion.buckets)} buckets"
                if fusion.buckets
                else f"bucket cap {fusion.bucket_cap_mb:.3g} MB"
            )
            if fusion.dear:
                parts.append("DeAR")
        if self.op_fusion.compiled:
            parts.append(f"{len(self.op_fusion.compiled)} blocks compiled")
        if self.compile:
            parts.append("every block compiled")
        if self.kernels != "pytorch":
            parts.append(f"{self.kernels} kernels")
        if self.precision != "fp32":
            parts.append(self.precision)
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        out = json.loads(json.dumps(dataclasses.asdict(self)))
        # Per-layer placements are written only when set, so that every strategy stored before
        # they existed keeps its JSON (and the keys and hashes made of it).
        parallel = out["parallel"]
        if not parallel["layers"]:
            del parallel["layers"]
        if parallel["vocab"] == "split":
            del parallel["vocab"]
        if not parallel["stages"]:
            del parallel["stages"]
        if not parallel["grid"]:
            del parallel["grid"]
            del parallel["grid_overlap"]
        # So are the GPU-grade settings, and the precision and compile flag.
        for key, default in _GPU_GRADE_DEFAULTS.items():
            if parallel[key] == default:
                del parallel[key]
        if out["precision"] == "fp32":
            del out["precision"]
        if not out["compile"]:
            del out["compile"]
        if out["kernels"] == "pytorch":
            del out["kernels"]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "Strategy":
        check_keys(
            raw,
            {"parallel", "tensor_fusion", "op_fusion", "precision", "compile", "kernels"},
            "strategy",
            InvalidStrategyError,
        )
        parallel = _section(raw, "parallel", ParallelPlan)
        tensor_fusion = _section(raw, "tensor_fusion", TensorFusionPlan)
        op_fusion = _section(raw, "op_fusion", OpFusionPlan)
        return cls(
            parallel=parallel,
            tensor_fusion=tensor_fusion,
            op_fusion=op_fusion,
            precision=raw.get("precision", "fp32"),
            compile=raw.get("compile", False),
            kernels=raw.get("kernels", "pytorch"),
        )

    @classmethod
    def parse(cls, text: str) -> "Strategy":
        """A strategy from inline JSON or a JSON/YAML file path."""
        return cls.from_dict(load_json_or_file(text, "strategy", InvalidStrategyError))


_GPU_GRADE_DEFAULTS: dict[str, Any] = {
    "recompute": "none",
    "sequence_parallel": False,
    "virtual_stages": None,
    "distributed_optimizer": False,
    "async_tp": False,
    "cp": 1,
    "cp_comm": "ring",
    "zero": 0,
    **EXPERT_DEFAULTS,
}
_SectionT = TypeVar("_SectionT", ParallelPlan, TensorFusionPlan, OpFusionPlan)
_LIST_FIELDS = {
    "fsdp_groups",
    "buckets",
    "bucket_caps_mb",
    "compiled",
    "layers",
    "stages",
    "grid",
}


def _section(raw: Mapping[str, Any], key: str, section_cls: type[_SectionT]) -> _SectionT:
    body = raw.get(key, {})
    fields = {f.name for f in dataclasses.fields(section_cls)}
    check_keys(body, fields, key, InvalidStrategyError)
    kwargs: dict[str, Any] = {
        name: (tuple(value) if name in _LIST_FIELDS and isinstance(value, list) else value)
        for name, value in body.items()
    }
    return section_cls(**kwargs)
