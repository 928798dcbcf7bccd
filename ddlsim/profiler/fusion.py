"""Fusion profiles: how long a block takes compiled (operator fusion) against eager.

The kernel profile times each op of an eager iteration; a block compiled with ``torch.compile``
runs instead as a few fused kernels, whose time no eager trace shows. :func:`profile_fusion`
measures it the way the executor compiles (``torch.compile`` of the block's ``forward``, static
shapes): each chosen block is run alone, forward and backward, on the inputs it receives in a
real forward pass of the model (recorded by a forward pre-hook), first eager and then compiled,
and the medians of both are kept. Their ratio is what the simulator's fused-block model learns;
the eager time of the same block in the kernel profile, times that ratio, prices the block
compiled.

Isolated timing leaves out what a block costs only inside the iteration (the cache state the
previous block leaves, the optimizer), on both sides of the ratio alike.
"""

import dataclasses
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ddlsim.cluster.allocator import use_rank_allocator
from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.models import build_model, make_batch, repeated_blocks, training_loss
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import OpFusionPlan
from ddlsim.profiler.capture import capture_graph


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BlockTiming:
    """One block alone, forward and backward: median ms eager and compiled, and the seconds
    the first compiled call took (compilation)."""

    block: str
    eager_ms: float
    compiled_ms: float
    compile_s: float

    @property
    def speedup(self) -> float:
        """Eager over compiled time (above 1: compiling helps); NaN without a compiled time."""
        return self.eager_ms / self.compiled_ms if self.compiled_ms > 0 else float("nan")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FusionProfile:
    """The blocks of one model at one batch size, timed eager and compiled."""

    model: str
    graph_hash: str
    device: str
    backend: str
    iters: int
    blocks: tuple[BlockTiming, ...]
    env: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the profile and its blocks."""
        out = dataclasses.asdict(self)
        out["blocks"] = [{**dataclasses.asdict(b), "speedup": b.speedup} for b in self.blocks]
        return out


def profile_fusion(
    spec: ModelSpec,
    blocks: Sequence[str] | None = None,
    *,
    iters: int = 10,
    warmup: int = 2,
    threads: int | None = 1,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> tuple[IterationGraph, FusionProfile]:
    """Time ``blocks`` (default: the model's repeated blocks) of ``spec`` eager and compiled;
    also returns the model's graph (default strategy), which the profile refers to.

    ``threads`` intra-op threads, one by default like the kernel profile and the executor's
    ranks (``None``: leave torch's setting).

    Raises:
        InvalidOptionError: ``iters``/``warmup``/``threads`` out of range, or a model without
            blocks to compile.
        InvalidStrategyError: a block that is not a module of the model, or named twice.
    """
    if iters < 1 or warmup < 0 or (threads is not None and threads < 1):
        raise InvalidOptionError(
            f"iters({iters}) must be >= 1, warmup({warmup}) >= 0 and threads({threads}) >= 1"
        )
    chosen = list(blocks) if blocks is not None else repeated_blocks(spec)
    if not chosen:
        raise InvalidOptionError(f"{spec.label} has no repeated blocks to compile; name some")
    backend = OpFusionPlan(compiled=tuple(chosen)).backend  # a strategy's checks, its backend
    say = progress or (lambda message: None)
    use_rank_allocator()  # the ranks' allocator (profiler.allocator)
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        model = build_model(spec, seed=seed)
        model.train()
        modules = _modules(model, spec, chosen)
        say(f"recording the inputs of {len(chosen)} blocks")
        inputs = _block_inputs(model, modules, make_batch(spec, model, seed=seed))
        timings = []
        for path in chosen:
            say(f"timing {path} eager and compiled")
            timings.append(
                _time_block(
                    path,
                    modules[path],
                    inputs[path],
                    iters=iters,
                    warmup=warmup,
                    backend=backend,
                )
            )
    finally:
        torch.set_num_threads(previous)
    graph = capture_graph(spec)
    return graph, FusionProfile(
        model=spec.label,
        graph_hash=graph.graph_hash,
        device="cpu",
        backend=backend,
        iters=iters,
        blocks=tuple(timings),
        env={
            "torch": torch.__version__,
            "machine": platform.machine(),
            "threads": str(torch.get_num_threads() if threads is None else threads),
        },
    )


def _modules(model: nn.Module, spec: ModelSpec, chosen: Sequence[str]) -> dict[str, nn.Module]:
    names = dict(model.named_modules())
    for index, path in enumerate(chosen):
        if not path or path not in names:
            raise InvalidStrategyError(f"blocks[{index}] {path!r} is not a module of {spec.label}")
    return {path: names[path] for path in chosen}


Inputs = tuple[tuple[Any, ...], dict[str, Any]]


def _block_inputs(
    model: nn.Module, modules: dict[str, nn.Module], batch: dict[str, torch.Tensor]
) -> dict[str, Inputs]:
    """What each block receives in one forward pass, detached; floating tensors become leaves
    that need a gradient (as they do inside training)."""
    seen: dict[str, Inputs] = {}

    def leaf(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        copy = value.detach().clone()
        return copy.requires_grad_(True) if copy.is_floating_point() else copy

    def recorder(path: str) -> Callable[..., None]:
        def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if path not in seen:
                seen[path] = pytree.tree_map(leaf, (args, kwargs))

        return hook

    handles = [
        module.register_forward_pre_hook(recorder(path), with_kwargs=True)
        for path, module in modules.items()
    ]
    try:
        training_loss(model, batch)
    finally:
        for handle in handles:
            handle.remove()
    missing = sorted(set(modules) - set(seen))
    if missing:
        raise InvalidOptionError(
            f"block {', '.join(missing)} does not run in a forward pass of the model, so it "
            "cannot be timed"
        )
    return seen


def _time_block(
    path: str, module: nn.Module, inputs: Inputs, *, iters: int, warmup: int, backend: str
) -> BlockTiming:
    args, kwargs = inputs
    leaves = [
        t
        for t in pytree.tree_leaves((args, kwargs))
        if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    params = [p for p in module.parameters() if p.requires_grad]

    def step() -> float:
        for tensor in (*leaves, *params):
            tensor.grad = None
        start = time.perf_counter()
        out = module(*args, **kwargs)
        floats = [
            t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        torch.stack([t.float().sum() for t in floats]).sum().backward()
        return (time.perf_counter() - start) * 1e3

    def median(count: int) -> float:
        for _ in range(warmup):
            step()
        return statistics.median(step() for _ in range(count))

    eager_ms = median(iters)
    original = module.forward
    torch._dynamo.reset()  # a fresh cache: each block is compiled, as in the executor, alone
    module.forward = torch.compile(original, backend=backend, dynamic=False)
    try:
        start = time.perf_counter()
        step()
        compile_s = time.perf_counter() - start
        compiled_ms = median(iters)
    finally:
        module.forward = original
        torch._dynamo.reset()
    return BlockTiming(block=path, eager_ms=eager_ms, compiled_ms=compiled_ms, compile_s=compile_s)
