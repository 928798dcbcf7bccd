"""What a data-parallel runtime adds to a rank's compute beyond the model's kernels: the copies
of its gradient buckets, and a fixed cost a bucket.

A kernel profile times one rank's model; the runtimes that average the gradients also copy them,
on the rank's compute stream, in passes over the bucket's bytes (a pass reads and writes each
byte once), counted from what each runtime does:

- ``DistributedDataParallel`` copies each gradient into its bucket and divides the bucket by the
  world size before the all-reduce (2 passes at launch), then copies the bucket back into the
  gradients once every bucket has landed (1 pass);
- the executor's own buckets concatenate the gradients into a flat buffer (1 pass at launch) and,
  when it lands, divide it and copy it back into the gradients (2 passes);
- DeAR does the same around its reduce-scatter and all-gather: 1 pass at launch, 2 before the
  bucket's update in the next forward.

A pass costs what one large tensor copy costs on this machine, measured
(:func:`profiler.runtime_costs.measure_copy`) and kept in ``data/simulator/runtime_costs.json``;
the replay charges it where the runtime does the copy, slowed like any compute by the ranks
sharing a core. Each bucket also costs its runtime a fixed time beyond the copies (the hooks'
dispatcher calls and the handoff to the backend's thread, DDP's reducer), charged at launch.
"""

import dataclasses
import functools
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from ddlsim.data.specs.strategy import TensorFusionPlan

# (passes when a bucket is launched, passes when it lands)
_PASSES = {"ddp": (2.0, 1.0), "hooks": (1.0, 2.0), "dear": (1.0, 2.0)}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeCosts:
    """What the plans' runtimes add to a rank's compute (0: not charged), in microseconds.

    ``copy_alpha_us + copy_us_per_byte * bytes`` is one copy pass over a buffer; the FSDP and
    tensor-parallel costs are those :func:`executor.overheads.measure_plan_overheads` measures:
    forward and backward per FSDP group (the root counts as one) and per byte of its
    parameters, per split module, and the
    optimizer's extra time per parameter (every one under FSDP, the split ones under tensor
    parallelism). ``hooks_us_per_bucket`` and ``ddp_us_per_bucket`` are the fixed cost a
    gradient bucket adds beyond its copies under the executor's hooks (and DeAR) and under DDP,
    measured by :func:`executor.bucket_overheads.measure_bucket_overheads`.
    """

    copy_alpha_us: float = 0.0
    copy_us_per_byte: float = 0.0
    fsdp_us_per_group: float = 0.0
    fsdp_us_per_byte: float = 0.0
    fsdp_step_us_per_param: float = 0.0
    tp_us_per_module: float = 0.0
    tp_step_us_per_param: float = 0.0
    hooks_us_per_bucket: float = 0.0
    ddp_us_per_bucket: float = 0.0

    def scaled(self, scale: float) -> "RuntimeCosts":
        """These costs on a rank that computes ``scale`` times slower (shared cores)."""
        return RuntimeCosts(
            **{name: value * scale for name, value in dataclasses.asdict(self).items()}
        )

    def _passes_ms(self, passes: float, nbytes: int) -> float:
        if passes <= 0 or nbytes <= 0:
            return 0.0
        return passes * (self.copy_alpha_us + self.copy_us_per_byte * nbytes) / 1e3

    def launch_ms(self, fusion: TensorFusionPlan, nbytes: int) -> float:
        """The copies a bucket of ``nbytes`` takes on the compute stream before its collective,
        and the runtime's fixed cost a bucket (its hooks or DDP's reducer)."""
        return self._passes_ms(copy_passes(fusion)[0], nbytes) + self.bucket_us(fusion) / 1e3

    def bucket_us(self, fusion: TensorFusionPlan) -> float:
        """The fixed cost a bucket adds under ``fusion``'s runtime (DDP's reducer or the hooks),
        beyond its copies."""
        return self.ddp_us_per_bucket if fusion.uses_ddp else self.hooks_us_per_bucket

    def land_ms(self, fusion: TensorFusionPlan, nbytes: int) -> float:
        """The copies a bucket takes after its (last) collective, before its update."""
        return self._passes_ms(copy_passes(fusion)[1], nbytes)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def copy_passes(fusion: TensorFusionPlan) -> tuple[float, float]:
    """How many copy passes over a bucket ``fusion``'s runtime makes before its collective and
    after it lands."""
    if fusion.dear:
        return _PASSES["dear"]
    return _PASSES["ddp" if fusion.uses_ddp else "hooks"]


def runtime_costs_of(meta: Mapping[str, Any]) -> RuntimeCosts:
    """The copy cost a dataset's ``meta`` records for the machine it was measured on, else the
    shipped one."""
    raw = meta.get("runtime_costs")
    if not isinstance(raw, Mapping):
        return shipped_runtime_costs()
    return _costs(raw)


def _costs(raw: Mapping[str, Any]) -> RuntimeCosts:
    names = {field.name for field in dataclasses.fields(RuntimeCosts)}
    return RuntimeCosts(**{key: float(value) for key, value in raw.items() if key in names})


@functools.cache
def shipped_runtime_costs() -> RuntimeCosts:
    """The copy cost measured on the machine the shipped dataset was measured on."""
    path = resources.files("ddlsim.data") / "simulator" / "runtime_costs.json"
    return _costs(json.loads(path.read_text(encoding="utf-8")))
