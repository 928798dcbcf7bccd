"""A model and its batch on fake tensors: shapes, dtypes and kernel choices, no data."""

import dataclasses

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ddlsim.data.models import batch_fields, build_model
from ddlsim.data.specs.model import ModelSpec


@dataclasses.dataclass(kw_only=True, slots=True)
class FakeModel:
    """``model`` and ``batch`` live in ``mode``: run them inside ``with mode:``."""

    model: nn.Module
    batch: dict[str, torch.Tensor]
    mode: FakeTensorMode


def fake_model(spec: ModelSpec, *, seed: int = 0) -> FakeModel:
    """Build ``spec`` on the meta device (no memory, initializers skipped), then give it fake
    CPU storage: values never matter, only shapes, dtypes and the device that picks kernels.
    The batch is fake too: no memory, whatever its size.

    Raises:
        InvalidModelSpecError: when the spec is invalid or its inputs do not fit the model.
    """
    with torch.device("meta"):
        model = build_model(spec, seed=seed)
    fields = batch_fields(spec, model)
    mode = FakeTensorMode()
    with mode:
        _materialize(model)
        batch = {
            name: torch.empty(field.shape, dtype=field.dtype, device="cpu")
            for name, field in fields.items()
        }
    return FakeModel(model=model, batch=batch, mode=mode)


def _materialize(model: nn.Module) -> None:
    """Give every meta parameter and buffer fake CPU storage, keeping tied weights tied
    (``Module.to_empty`` would give each alias its own tensor)."""
    new: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for key, param in module._parameters.items():
            if param is not None:
                if id(param) not in new:
                    empty = torch.empty(param.shape, dtype=param.dtype, device="cpu")
                    new[id(param)] = nn.Parameter(empty, requires_grad=param.requires_grad)
                module._parameters[key] = new[id(param)]  # type: ignore[assignment]
        for key, buffer in module._buffers.items():
            if buffer is not None:
                if id(buffer) not in new:
                    new[id(buffer)] = torch.empty(buffer.shape, dtype=buffer.dtype, device="cpu")
                module._buffers[key] = new[id(buffer)]
