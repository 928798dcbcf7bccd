"""What a prediction stands on, read from the store: the kernel profile of a rank's
micro-batch (taken now when missing), the link's name and the machine's scale.
"""

import os
import platform
from collections.abc import Callable

from ddlsim.data.errors import DdlsimError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.cluster import parse_bandwidth_gbps
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.store import KernelProfileRecord, Store, add_graph, add_kernel_profile
from ddlsim.profiler.batch import kernel_record
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.profiler.kernels import profile_kernels
from ddlsim.simulator.costs import compute_scale
from ddlsim.workflows.requests import Progress, no_progress

Capture = Callable[[ModelSpec, CaptureOptions], IterationGraph]


class MissingProfileError(DdlsimError, LookupError):
    """The store has no kernel profile of a model at a micro-batch, and none may be taken now."""


def kernel_profile_for(
    store: Store,
    spec: ModelSpec,
    *,
    optimizer: str,
    iters: int,
    profile_missing: bool = True,
    capture: Capture = capture_graph,
    progress: Progress = no_progress,
) -> tuple[IterationGraph, KernelProfileRecord, bool]:
    """The graph of ``spec`` (default strategy) and its newest CPU kernel profile; profiles it
    (one rank, one thread) and stores the profile when there is none. The flag says whether it
    was profiled now.

    Raises:
        MissingProfileError: there is none and ``profile_missing`` is false.
    """
    graph = capture(spec, CaptureOptions(optimizer="sgd" if optimizer == "sgd" else "adamw"))
    # This machine's profiles (or those stored before profiles named their host): another
    # host's kernels ran on other cores.
    here = platform.node()
    stored = [
        p
        for p in store.kernel_profiles(graph_hash=graph.graph_hash)
        if p.device == "cpu" and p.host in (here, "")
    ]
    if stored:
        return graph, stored[-1], False
    if not profile_missing:
        raise MissingProfileError(
            f"no kernel profile of {spec.label} at batch {spec.inputs.batch_size} "
            f"(a rank's micro-batch) in the store; profile it first (a profiling run with a "
            f"'kernels' job for this model and batch_size {spec.inputs.batch_size})"
        )
    progress(
        None,
        f"no kernel profile of {spec.label} at batch {spec.inputs.batch_size} yet: "
        f"profiling it on one rank ({iters} iterations)",
    )
    _, profile = profile_kernels(
        spec, iters=iters, graph=graph, progress=lambda message: progress(None, message)
    )
    record = kernel_record(profile)
    with store.transaction() as session:
        add_graph(session, graph=graph)
        profile_id = add_kernel_profile(session, profile=record)
    stored = [p for p in store.kernel_profiles(graph_hash=graph.graph_hash) if p.id == profile_id]
    return graph, stored[0], True


def machine_scale(world_size: int) -> float:
    """Ranks of an emulated cluster all run on this machine: with more ranks than cores, each
    computes slower than its one-rank profile (one intra-op thread a rank)."""
    return compute_scale(world_size, len(os.sched_getaffinity(0)))


def normalized_bandwidth(text: str | None) -> str:
    """The link as the store names it: a lower-case rate, or ``none`` for an unshaped one."""
    if text is None:
        return "none"
    return "none" if parse_bandwidth_gbps(text) is None else text.strip().lower()
