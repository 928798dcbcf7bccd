"""Training precision on a rank: autocast for bf16 and fp16 (weights stay fp32, matmuls run in
the 16-bit type), a gradient scaler for fp16, fp8 linears through torchao on GPUs that have
fp8, and FSDP2's ``MixedPrecisionPolicy`` in place of autocast when parameters are sharded.

What a device cannot do is refused before any rank starts (:func:`device_target`, for
:func:`ddlsim.plans.feasibility.check`; :func:`check_fp8_library`).
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.plans.feasibility import Target

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    # fp8 runs its linears in fp8 (torchao) and the rest of the model under bf16 autocast.
    "fp8": torch.bfloat16,
}
# fp8 tensor cores: compute capability 8.9 (Ada) and 9.0 (Hopper) and later.
FP8_CAPABILITY = (8, 9)


def device_target(world_size: int, device: str) -> Target:
    """Where this executor's ranks run on this machine, for :func:`ddlsim.plans.feasibility.check`:
    ``cpu``, or ``cuda`` on this machine's GPU (with fp8 where its compute capability has it)."""
    if device != "cuda":
        return Target(world_size=world_size, where="cpu", device=device)
    if not torch.cuda.is_available():
        return Target(world_size=world_size, where="cuda", device="cuda (torch sees no GPU)")
    return Target(
        world_size=world_size,
        where="cuda",
        device=torch.cuda.get_device_name(),
        fp8=torch.cuda.get_device_capability() >= FP8_CAPABILITY,
    )


def check_fp8_library(strategy: Strategy) -> None:
    """Raises:
    InvalidStrategyError: fp8 without torchao, which runs its linears.
    """
    if strategy.precision != "fp8":
        return
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
