"""Training precision on a rank: autocast for bf16 and fp16 (weights stay fp32, matmuls run in
the 16-bit type), a gradient scaler for fp16, fp8 linears through torchao on GPUs that have
fp8, and FSDP2's ``MixedPrecisionPolicy`` in place of autocast when parameters are sharded.

What a device cannot do is refused before any rank starts (:func:`check_precision`).
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.strategy import Strategy

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    # fp8 runs its linears in fp8 (torchao) and the rest of the model under bf16 autocast.
    "fp8": torch.bfloat16,
}
# fp8 tensor cores: compute capability 8.9 (Ada) and 9.0 (Hopper) and later.
FP8_CAPABILITY = (8, 9)


def check_precision(strategy: Strategy, device: str) -> None:
    """Refuse a precision the plan or the device cannot run, naming both.

    Raises:
        InvalidStrategyError: fp8 without a GPU that has fp8 (or without torchao); fp16 with a
            plan whose steps the gradient scaler does not drive (FSDP, the distributed
            optimizer, pipelines, grids, DeAR).
    """
    precision = strategy.precision
    plan = strategy.parallel
    if precision == "fp16":
        unscaled = {
            "parallel.fsdp": plan.fsdp,
            "parallel.distributed_optimizer": plan.distributed_optimizer,
            "parallel.pp > 1": plan.pp > 1,
            "parallel.tp > 1": plan.tp > 1,
            "parallel.grid": bool(plan.grid),
            "tensor_fusion.dear": strategy.tensor_fusion.dear,
        }
        named = [key for key, used in unscaled.items() if used]
        if named:
            raise InvalidStrategyError(
                f"precision 'fp16' needs a gradient scaler, which this executor applies to "
                f"DDP and bucket plans only; {', '.join(named)} runs bf16 or fp32"
            )
    if precision != "fp8":
        return
    if device != "cuda" or not torch.cuda.is_available():
        raise InvalidStrategyError(
            f"precision 'fp8' needs a GPU with fp8 (compute capability 8.9 or later: L40S, "
            f"H100, H200, B200); this run's device is {device!r}"
            + ("" if device != "cuda" else " and torch sees no CUDA device")
        )
    capability = torch.cuda.get_device_capability()
    if capability < FP8_CAPABILITY:
        name = torch.cuda.get_device_name()
        raise InvalidStrategyError(
            f"precision 'fp8' needs compute capability 8.9 or later; {name} has "
            f"{capability[0]}.{capability[1]}"
        )
    try:
        import torchao.float8  # noqa: F401
    except ImportError as exc:
        raise InvalidStrategyError(
            "precision 'fp8' runs its linears through torchao, which is not installed "
            "(pip install 'ddlsim[fp8]')"
        ) from exc


def to_fp8(model: nn.Module) -> None:
    """Swap the model's linears for torchao's fp8 training linears, in place (dimensions that
    are not multiples of 16, which fp8 GEMMs need, stay in bf16)."""
    from torchao.float8 import convert_to_float8_training

    def eligible(module: nn.Module, path: str) -> bool:
        return (
            isinstance(module, nn.Linear)
            and module.in_features % 16 == 0
            and module.out_features % 16 == 0
        )

    convert_to_float8_training(model, module_filter_fn=eligible)


class Precision:
    """One rank's precision: what wraps the forward, the backward and the optimizer step.

    ``sharded`` plans (FSDP) cast through ``MixedPrecisionPolicy`` (:meth:`fsdp_policy`) and get
    no autocast.
    """

    def __init__(self, precision: str, device: torch.device, *, sharded: bool = False) -> None:
        self.precision = precision
        self.device = device
        self.dtype = DTYPES.get(precision)
        self._autocast = self.dtype is not None and not sharded
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if not self._autocast:
            yield
            return
        with torch.autocast(self.device.type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer step; with fp16, unscaled, skipped on inf/NaN, the scale updated."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def fsdp_policy(self) -> Any:
        """FSDP2's policy: compute in the 16-bit type, reduce gradients in fp32."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.dtype is None:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)
