"""Capture the ``IterationGraph`` of one training iteration of a real model.

How: the model is built and run forward and backward under ``FakeTensorMode`` (shapes only, no
memory, no arithmetic: a 100M-parameter model takes seconds), with a ``TorchDispatchMode``
recording every ATen op as it is dispatched, and ``register_post_accumulate_grad_hook`` on
every parameter marking when its gradient is ready.

Why this rather than an aot_autograd joint graph or ``torch.export``: the recorder sees exactly
the ops eager training dispatches (no functionalization, no decomposition of its own), which
are the ops ``torch.profiler`` will time and attribute to nodes; the gradient-ready order is the
real autograd engine's, read from the same hook DDP and the executor use; backward ops are tied
to their forward op and module through the autograd node that runs them
(``torch._C._current_autograd_node`` and its sequence number); and tied weights, which make the
joint-graph exporters fail, need no special case. ``FlopCounterMode`` is a dispatch mode too and
uses the same formula registry, so the totals agree with it op for op.
"""

import contextlib
import dataclasses
import difflib
import logging
import platform
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry
from torch.utils.weak import WeakTensorKeyDictionary

from ddlsim.data.errors import (
    InvalidModelSpecError,
    InvalidOptionError,
    InvalidStrategyError,
    one_line,
)
from ddlsim.data.graph.annotate import (
    OPTIMIZERS,
    Optimizer,
    PendingNode,
    assemble,
    pending,
)
from ddlsim.data.graph.format import IterationGraph, ParamInfo, Phase, TensorMeta
from ddlsim.data.models import check_model_spec, import_transformers, training_loss
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.profiler.fake import fake_model
from ddlsim.profiler.flops import register_missing_flop_formulas


@dataclasses.dataclass(kw_only=True, slots=True)
class CaptureOptions:
    """What to capture besides the model: the strategy whose gradient collectives are placed,
    the optimizer whose step nodes close the iteration, and the seed of weights and inputs."""

    strategy: Strategy = dataclasses.field(default_factory=Strategy)
    optimizer: Optimizer = "adamw"
    seed: int = 0
    # The forward under autocast to this type (weights stay fp32), as a kernel profile of that
    # precision runs it: the graph then holds autocast's casts and its 16-bit matmuls.
    autocast: str = "fp32"

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise InvalidOptionError(
                f"optimizer {self.optimizer!r} is not supported; allowed: {', '.join(OPTIMIZERS)}"
            )
        if self.autocast not in AUTOCAST:
            raise InvalidOptionError(
                f"precision {self.autocast!r} is not supported in a capture; allowed: "
                f"{', '.join(AUTOCAST)}"
            )


# Precisions a kernel profile runs, and the type autocast runs the forward's matmuls in.
AUTOCAST: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}


def autocast(device: str, precision: str) -> contextlib.AbstractContextManager[Any]:
    """The forward's autocast for ``precision`` on ``device`` (none for fp32)."""
    dtype = AUTOCAST[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=dtype)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(shape=tuple(int(d) for d in t.shape), dtype=_dtype_name(t.dtype))


def _nbytes(t: torch.Tensor) -> int:
    logical = t.numel() * t.element_size()
    try:
        return min(logical, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return logical


def _unique_tensors(values: Sequence[Any]) -> list[torch.Tensor]:
    seen: set[int] = set()
    out = []
    for value in values:
        if isinstance(value, torch.Tensor) and id(value) not in seen:
            seen.add(id(value))
            out.append(value)
    return out


class OpMode(TorchDispatchMode):
    """A dispatch mode handed every ATen op in dispatch order: :meth:`on_op` runs it and
    returns its result. The capture records the ops through one and the kernel profiler
    (:mod:`.kernels`) marks them through another, so both see the same ops in the same order.
    """

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return self.on_op(func, args, kwargs or {})

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``func(*args, **kwargs)`` and return its result, doing what the mode is for."""
        raise NotImplementedError


class _Recorder(OpMode):
    """Records each dispatched ATen op with its dependencies, module and cost."""

    def __init__(self, module_of_param: dict[int, str]) -> None:
        super().__init__()
        self.nodes: list[PendingNode] = []
        self.phase: Phase = "forward"
        self.module_stack: list[str] = [""]
        self._producer: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self._node_of_seq: dict[int, int] = {}
        self._module_of_param = module_of_param

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = func(*args, **kwargs)
        schema = func._schema
        written = [
            value
            for arg, value in zip(schema.arguments, args, strict=False)
            if arg.alias_info is not None
            and arg.alias_info.is_write
            and isinstance(value, torch.Tensor)
        ]
        # An in-place op returns the tensor it writes: count it once, as an output.
        flat_out = _unique_tensors([*tree_flatten(out)[0], *written])
        if not flat_out and not written:
            return out  # metadata queries (prim.device, sym sizes) touch no tensor data
        flat_in = _unique_tensors(tree_flatten((args, kwargs))[0])
        deps = sorted({d for t in flat_in if (d := self._producer.get(t)) is not None})
        index = len(self.nodes)
        module, forward_ref = self._attribute(index)
        is_view = any(
            ret.alias_info is not None and not ret.alias_info.is_write for ret in schema.returns
        )
        packet = func.overloadpacket
        flops = (
            int(flop_registry[packet](*args, **kwargs, out_val=out))
            if (packet in flop_registry)
            else 0
        )
        self.nodes.append(
            pending(
                deps,
                forward_ref,
                kind="compute",
                phase=self.phase,
                op=str(func),
                module=module,
                inputs=tuple(_meta(t) for t in flat_in),
                outputs=tuple(_meta(t) for t in flat_out),
                flops=flops,
                bytes_read=0 if is_view else sum(_nbytes(t) for t in flat_in),
                bytes_written=0 if is_view else sum(_nbytes(t) for t in flat_out),
                is_view=is_view,
            )
        )
        for t in flat_out:
            self._producer[t] = index
        return out

    def _attribute(self, index: int) -> tuple[str, int | None]:
        """Module path of the op being recorded, and for backward ops their forward op."""
        if self.phase == "forward":
            # An op that records autograd history took the latest sequence number before it was
            # dispatched; ops that do not leave it alone, so the first claimant is the owner.
            self._node_of_seq.setdefault(torch.autograd._get_sequence_nr() - 1, index)
            return self.module_stack[-1], None
        node = torch._C._current_autograd_node()
        if node is None:
            return "", None  # the engine seeding the loss gradient
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):  # AccumulateGrad of a parameter
            return self._module_of_param.get(id(variable), ""), None
        forward_ref = self._node_of_seq.get(node._sequence_nr())
        if forward_ref is None:
            return "", None
        return self.nodes[forward_ref].node.module, forward_ref

    def record_grad_ready(self, name: str, module: str, param: torch.Tensor) -> int:
        """A node marking ``param``'s gradient ready, after the op that produced it."""
        producer = self._producer.get(param.grad) if param.grad is not None else None
        nbytes = param.numel() * param.element_size()
        self.nodes.append(
            pending(
                [producer if producer is not None else len(self.nodes) - 1],
                kind="grad_ready",
                phase="backward",
                op="grad_ready",
                module=module,
                param=name,
                params=(name,),
                param_bytes=nbytes,
                grad_bytes=nbytes,
            )
        )
        return len(self.nodes) - 1


@contextlib.contextmanager
def _quiet_fake_tensor_log() -> Iterator[None]:
    """FakeTensorMode logs a traceback before re-raising a shape error; the caller reports it."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _check_module_paths(model: nn.Module, strategy: Strategy) -> None:
    """Blocks named by the strategy (compiled, FSDP groups) must be modules of the model."""
    modules = {name for name, _ in model.named_modules() if name}
    named = [
        (f"op_fusion.compiled[{i}]", path) for i, path in enumerate(strategy.op_fusion.compiled)
    ]
    for g, group in enumerate(strategy.parallel.fsdp_groups or ()):
        named += [(f"parallel.fsdp_groups[{g}][{i}]", path) for i, path in enumerate(group)]
    for where, path in named:
        if path not in modules:
            close = difflib.get_close_matches(path, sorted(modules), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise InvalidStrategyError(
                f"{where} names {path!r}, which is not a module of {type(model).__name__}{hint}"
            )


def _module_hooks(model: nn.Module, recorder: _Recorder) -> list[Any]:
    handles = []

    def enter(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            recorder.module_stack.append(name)

        return hook

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        recorder.module_stack.pop()

    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(enter(name)))
        handles.append(module.register_forward_hook(leave, always_call=True))
    return handles


def _param_infos(model: nn.Module) -> tuple[list[ParamInfo], dict[int, str], dict[int, str]]:
    infos = []
    name_of: dict[int, str] = {}
    module_of: dict[int, str] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        module = name.rpartition(".")[0]
        infos.append(
            ParamInfo(
                name=name,
                module=module,
                shape=tuple(int(d) for d in param.shape),
                dtype=_dtype_name(param.dtype),
                numel=param.numel(),
                nbytes=param.numel() * param.element_size(),
            )
        )
        name_of[id(param)] = name
        module_of[id(param)] = module
    return infos, name_of, module_of


def capture_graph(
    spec: ModelSpec,
    options: CaptureOptions | None = None,
    *,
    prepare: Callable[[nn.Module], None] | None = None,
) -> IterationGraph:
    """Capture one training iteration of ``spec``: forward, backward, gradient readiness,
    the strategy's gradient collectives and the optimizer step.

    ``prepare`` changes the fake model before the iteration runs, inside its fake mode (a
    tensor-parallel shard's local weights, a dtype: :mod:`.shard`).

    Raises:
        InvalidModelSpecError: when the spec is invalid or the model cannot run on its inputs.
        InvalidStrategyError: when the strategy's buckets do not partition the gradients.
    """
    options = options or CaptureOptions()
    check_model_spec(spec)
    register_missing_flop_formulas()
    fake = fake_model(spec, seed=options.seed)
    model, batch = fake.model, fake.batch
    _check_module_paths(model, options.strategy)
    with fake.mode:
        if prepare is not None:
            prepare(model)
        params, name_of, module_of = _param_infos(model)
        recorder = _Recorder(module_of)
        handles = _module_hooks(model, recorder)
        ready: list[tuple[str, int]] = []

        def grad_ready(param: torch.Tensor) -> None:
            name = name_of[id(param)]
            ready.append((name, recorder.record_grad_ready(name, module_of[id(param)], param)))

        for param in model.parameters():
            if param.requires_grad:
                handles.append(param.register_post_accumulate_grad_hook(grad_ready))
        try:
            with recorder, _quiet_fake_tensor_log():
                with autocast("cpu", options.autocast):
                    loss = training_loss(model, batch)
                recorder.phase = "backward"
                loss.backward()
        except (RuntimeError, ValueError, IndexError, TypeError, AssertionError) as exc:
            raise InvalidModelSpecError(
                f"{spec.label} ({spec.cls}) failed on inputs {spec.inputs.to_dict()}: "
                f"{type(exc).__name__}: {one_line(exc)}"
            ) from None
        finally:
            for handle in handles:
                handle.remove()
    env = {"torch": torch.__version__, "python": platform.python_version()}
    if options.autocast != "fp32":
        env["autocast"] = options.autocast
    if spec.source == "transformers":
        env["transformers"] = import_transformers().__version__
    return assemble(
        model=spec,
        strategy=options.strategy,
        optimizer=options.optimizer,
        params=params,
        recorded=recorder.nodes,
        ready=dict(ready),
        env=env,
    )


__all__ = ["AUTOCAST", "OPTIMIZERS", "CaptureOptions", "Optimizer", "autocast", "capture_graph"]
