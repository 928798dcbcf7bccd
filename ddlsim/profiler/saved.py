"""What a model's forward keeps for its backward, by the module that kept it.

Autograd packs every tensor an op saves for its backward through
``torch.autograd.graph.saved_tensors_hooks``; the model's forward and loss run on fake tensors
(no memory, no arithmetic) with a pack hook that records each saved tensor's storage once, with
the bytes of that storage and the innermost module running when it was packed. Parameters (and
views of them, such as a linear layer's transposed weight) are not activations and are left
out. The peak-memory model (:mod:`ddlsim.simulator.memory`) sums these bytes by module: a
pipeline stage's blocks, a tensor-parallel layer's split part.
"""

import contextlib
import functools
import json
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from ddlsim.data.models import training_loss
from ddlsim.data.specs.model import ModelSpec
from ddlsim.profiler.fake import fake_model


def saved_bytes(spec: ModelSpec) -> Mapping[str, int]:
    """Bytes saved for backward by module path (``""``: the model itself, the loss included)
    over one forward of ``spec``'s batch; cached per spec."""
    return _saved(json.dumps(spec.to_dict(), sort_keys=True))


@functools.lru_cache(maxsize=64)
def _saved(spec_json: str) -> Mapping[str, int]:
    fake = fake_model(ModelSpec.from_dict(json.loads(spec_json)))
    model = fake.model
    # As the executor trains by default (RunOptions.dropout false): no dropout masks.
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    params = {id(p) for p in model.parameters()}
    stack: list[str] = [""]
    seen: set[int] = set()
    by_module: dict[str, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        base = tensor._base if tensor._base is not None else tensor
        if id(tensor) in params or id(base) in params:
            return tensor
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in seen:
            seen.add(key)
            by_module[stack[-1]] = by_module.get(stack[-1], 0) + storage.nbytes()
        return tensor

    with (
        fake.mode,
        _module_stack(model, stack),
        torch.autograd.graph.saved_tensors_hooks(pack, _identity),
    ):
        training_loss(model, fake.batch)
    return dict(by_module)


def _identity(tensor: Any) -> Any:
    return tensor


@contextlib.contextmanager
def _module_stack(model: nn.Module, stack: list[str]) -> Iterator[None]:
    """Keeps ``stack[-1]`` the path of the innermost module whose forward is running."""

    def enter(path: str) -> Any:
        return lambda module, args: stack.append(path)

    def leave(path: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if stack and stack[-1] == path:
                stack.pop()

        return hook

    handles = []
    for path, module in model.named_modules():
        if path:
            handles.append(module.register_forward_pre_hook(enter(path)))
            handles.append(module.register_forward_hook(leave(path)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
