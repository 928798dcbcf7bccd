"""What one rank holds at its peak, by part: the estimate both peak-memory models give."""

import dataclasses
from collections.abc import Sequence

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


def under(name: str, paths: Sequence[str]) -> bool:
    """Whether module or parameter ``name`` is one of ``paths`` or inside one."""
    return any(name == p or name.startswith(f"{p}.") for p in paths)
