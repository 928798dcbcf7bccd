"""Kernel traces: time every node of an ``IterationGraph`` in real training iterations.

Three passes over the real model (real weights, real data, real optimizer):

1. Timing, profiler off: the median wall time of ``iters`` training iterations. This is the
   number a user would see, and the one the attributed times are checked against.
2. Mapping, one iteration: a dispatch mode wraps every ATen op it sees in a
   ``record_function`` marker carrying the op's position. The ops it sees are exactly the ones
   the graph capture records, so each profiler event inside a marker belongs to that graph node.
3. Measurement, ``iters`` iterations under ``torch.profiler`` without the mapping mode (which
   costs Python time per op). Its event sequence is the mapping pass's without the markers, so
   events are matched by position (aligned by name where a run differs) and inherit their node.

A node's time on the CPU is the time from the end of the previous node to its own end: launch
overhead, the Python between ops and the composite ops that wrap it (``aten::linear`` around
``aten::addmm``) are paid by the node they lead to, and the nodes of an iteration add up to the
iteration. The optimizer step is shared among the optimizer nodes by parameter bytes. On CUDA a
node's time is the device time of its kernels, and the optimizer nodes share the device time of
the kernels launched after the last graph op; the sum of node times is then the busy time of the
device, which falls short of the iteration where the host cannot launch kernels fast enough.
"""

import dataclasses
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile, record_function

from ddlsim.cluster import interrupt
from ddlsim.cluster.allocator import use_rank_allocator
from ddlsim.cluster.speed import probe_ms
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.models import build_model, make_batch, training_loss
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.store.records import KernelTimes
from ddlsim.profiler.attribution import ITERATION, MARK, attribute, graph_node_of_op
from ddlsim.profiler.capture import (
    AUTOCAST,
    CaptureOptions,
    OpMode,
    Optimizer,
    autocast,
    capture_graph,
)

Device = Literal["cpu", "cuda"]
DEVICES: tuple[str, ...] = ("cpu", "cuda")
# What KernelProfile.summary() reports, in its order: the figures, not the per-node times.
_SUMMARY = (
    "model",
    "graph_hash",
    "device",
    "device_name",
    "iters",
    "iteration_time_ms",
    "profiled_iteration_ms",
    "attributed_ms",
    "coverage",
    "num_nodes_timed",
    "matched_fraction",
    "trace_path",
)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class KernelProfile(KernelTimes):
    """Per-node median times of one model on one device, and how well they add up.

    ``coverage`` is ``attributed_ms / iteration_time_ms``: the sum of node medians against the
    median iteration measured with the profiler off. Beyond what the store keeps: the samples of
    that median, the iteration measured with the profiler on, and the share of profiler events
    matched to a graph node.
    """

    iteration_samples_ms: tuple[float, ...]
    profiled_iteration_ms: float
    matched_fraction: float

    @property
    def num_nodes_timed(self) -> int:
        """How many graph nodes got a time."""
        return len(self.node_ms)

    def summary(self) -> dict[str, Any]:
        """The profile's figures, without its per-node times."""
        return {name: getattr(self, name) for name in _SUMMARY}


class _Marker(OpMode):
    """Wraps each dispatched op in a ``record_function`` naming its position."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        index = len(self.ops)
        self.ops.append(str(func))
        with record_function(f"{MARK}{index}"):
            return func(*args, **kwargs)


def _make_optimizer(model: nn.Module, optimizer: Optimizer) -> torch.optim.Optimizer:
    if optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=1e-4)


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def profile_kernels(
    spec: ModelSpec,
    *,
    iters: int = 10,
    warmup: int = 3,
    device: Device = "cpu",
    optimizer: Optimizer = "adamw",
    precision: str = "fp32",
    seed: int = 0,
    threads: int | None = 1,
    graph: IterationGraph | None = None,
    trace_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[IterationGraph, KernelProfile]:
    """Profile ``iters`` training iterations of ``spec`` and time every node of its graph.

    ``precision`` ``bf16`` runs the forward under autocast (weights and optimizer fp32, as a
    bf16 strategy trains) and captures the graph so, casts included.

    ``threads`` intra-op threads (``None``: leave torch's setting). One by default: ranks of the
    emulated cluster run with one thread each, and with a core left to the rest of the machine
    the times repeat (with both cores busy, a preempted thread stalls every op it shares).

    Raises:
        InvalidOptionError: on ``iters``/``warmup`` out of range or an unavailable device.
        InvalidModelSpecError: when the spec is invalid.
    """
    if iters < 1 or warmup < 0:
        raise InvalidOptionError(f"iters({iters}) must be >= 1 and warmup({warmup}) >= 0")
    if device not in DEVICES:
        raise InvalidOptionError(f"device {device!r} is not supported; allowed: cpu, cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise InvalidOptionError("device 'cuda' was asked for but torch sees no CUDA device")
    if threads is not None and threads < 1:
        raise InvalidOptionError(f"threads({threads}) must be >= 1")
    if precision not in AUTOCAST:
        raise InvalidOptionError(
            f"precision {precision!r} is not supported; allowed: {', '.join(AUTOCAST)}"
        )
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _profile(
            spec,
            iters=iters,
            warmup=warmup,
            device=device,
            optimizer=optimizer,
            precision=precision,
            seed=seed,
            graph=graph,
            trace_dir=trace_dir,
            progress=progress,
        )
    finally:
        torch.set_num_threads(previous_threads)


def _profile(
    spec: ModelSpec,
    *,
    iters: int,
    warmup: int,
    device: Device,
    optimizer: Optimizer,
    precision: str,
    seed: int,
    graph: IterationGraph | None,
    trace_dir: Path | None,
    progress: Callable[[str], None] | None,
) -> tuple[IterationGraph, KernelProfile]:
    """Long: the three passes (timing, mapping, measured) share one model, batch and optimizer and
    read in the order they run."""
    say = progress or (lambda message: None)
    # The ranks' allocator: the steps timed here must reuse their large tensors as a rank does.
    use_rank_allocator()
    # Kineto logs every profiler start and stop at its highest level, and a profile starts once an
    # iteration: silence its log unless the user set a level. It is read at the first start.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    if graph is None:
        say(f"capturing the graph of {spec.label}")
        graph = capture_graph(
            spec, CaptureOptions(optimizer=optimizer, seed=seed, autocast=precision)
        )
    model = build_model(spec, seed=seed).to(device)
    batch = make_batch(spec, model, seed=seed, device=device)
    opt = _make_optimizer(model, optimizer)

    def forward_backward() -> None:
        with autocast(device, precision):
            loss = training_loss(model, batch)
        loss.backward()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        forward_backward()
        opt.step()

    say(f"warming up ({warmup} iterations)")
    for _ in range(warmup):
        interrupt.check()
        step()
    _synchronize(device)

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)

    say("mapping profiler events to graph nodes")
    marker = _Marker()
    with profile(activities=activities) as mapping_prof:
        with record_function(ITERATION):
            opt.zero_grad(set_to_none=True)
            with marker:
                forward_backward()
            opt.step()
        _synchronize(device)

    # The machine's speed as the timing begins and ends (cluster.speed): a run replayed from
    # this profile is scaled by its own probe over this one.
    probes = [probe_ms()]
    # Unprofiled and profiled iterations alternate, so that both see the same machine state.
    say(f"timing {iters} iterations, alternately with the profiler off and on")
    samples_ms = []
    profiled_events: list[list[FunctionEvent]] = []
    trace_path = None
    for index in range(iters):
        interrupt.check()
        start = time.perf_counter()
        step()
        _synchronize(device)
        samples_ms.append((time.perf_counter() - start) * 1e3)
        with profile(activities=activities) as prof:
            with record_function(ITERATION):
                step()
            _synchronize(device)
        profiled_events.append(list(prof.events()))
        if trace_dir is not None and index == iters - 1:
            trace_dir.mkdir(parents=True, exist_ok=True)
            trace_path = str(trace_dir / f"{spec.label}-{graph.graph_hash[:12]}.trace.json")
            prof.export_chrome_trace(trace_path)

    probes.append(probe_ms())
    node_of_op = graph_node_of_op(graph, marker.ops)
    per_node, profiled_ms, matched = attribute(
        mapping_prof.events(), profiled_events, node_of_op, graph, device
    )
    node_ms = {node: statistics.median(values) for node, values in sorted(per_node.items())}
    iteration_ms = statistics.median(samples_ms)
    attributed = sum(node_ms.values())
    device_name = torch.cuda.get_device_name() if device == "cuda" else platform.processor()
    return graph, KernelProfile(
        graph_hash=graph.graph_hash,
        model=spec.label,
        device=device,
        device_name=device_name or platform.machine(),
        iters=iters,
        iteration_time_ms=iteration_ms,
        iteration_samples_ms=tuple(samples_ms),
        profiled_iteration_ms=statistics.median(profiled_ms),
        attributed_ms=attributed,
        coverage=attributed / iteration_ms,
        node_ms=node_ms,
        matched_fraction=matched,
        trace_path=trace_path,
        env={
            "torch": torch.__version__,
            "threads": str(torch.get_num_threads()),
            "python": platform.python_version(),
            "probe_ms": f"{statistics.mean(probes):.4f}",
            **({"precision": precision} if precision != "fp32" else {}),
        },
    )
