"""What a prediction stands on, read from the store: the kernel profile of a rank's
micro-batch (taken now when missing), the link's fits (the shipped dataset's where the store
has none), the link's name and the machine's scale.
"""

import os
import platform
from collections.abc import Callable, Sequence

from ddlsim.data.errors import DdlsimError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.cluster import parse_bandwidth_gbps
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.store import (
    KernelProfileRecord,
    Store,
    add_collective_profile,
    add_graph,
    add_kernel_profile,
)
from ddlsim.profiler.batch_jobs import collective_records, kernel_record
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.profiler.collectives import profile_collectives
from ddlsim.profiler.kernels import profile_kernels
from ddlsim.simulator.costs import BackendFit, compute_scale
from ddlsim.simulator.default import shipped_link_fits
from ddlsim.workflows.requests import Progress, no_progress

Capture = Callable[[ModelSpec, CaptureOptions], IterationGraph]

# What every data-parallel plan sends: the all-reduce, and pipelines' sends.
LINK_COLLECTIVES = ("all_reduce", "sendrecv")
# FSDP and tensor parallelism also gather and reduce-scatter.
PLAN_COLLECTIVES = ("all_gather", "reduce_scatter")
# DeAR on gloo runs the executor's ring.
RING_COLLECTIVES = ("ring_reduce_scatter", "ring_all_gather")
# The compute each collective takes from its rank, which the replay charges (3 repeats a size).
CPU_REPEATS = 3
# A search's link profile: 4 KiB to 16 MiB in powers of 4 (sizes below the shaped link's burst
# fix the latency, the larger ones its rate).
SEARCH_LINK_SIZES = [4096 * 4**i for i in range(7)]


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


def link_fits(store: Store) -> list[BackendFit]:
    """The store's gloo collective fits, and the shipped dataset's fits of every (ranks, link)
    the store has none of: a link this machine has not profiled yet is priced as this emulated
    cluster's link measured when the dataset was collected, not at its nominal rate with no
    latency (the quickstart's search once picked 24 buckets priced so, measured 0.72x of DDP's
    defaults). A fit the store has of a link, even of one collective, replaces all of the
    shipped ones of it: one day's measurements are not mixed with another's."""
    stored = store.collective_profiles(backend="gloo")
    have = {(p.world_size, p.bandwidth) for p in stored}
    shipped = [f for f in shipped_link_fits() if (f.world_size, f.bandwidth) not in have]
    return [*shipped, *stored]


def profile_link(
    store: Store,
    *,
    world_size: int,
    bandwidth: str,
    collectives: Sequence[str],
    sizes: Sequence[int] = SEARCH_LINK_SIZES,
    repeats: int = 5,
    progress: Progress = no_progress,
) -> bool:
    """Profile ``collectives`` on ``world_size`` ranks over links of ``bandwidth`` (this
    machine's emulated cluster) and store their fits, unless the store has a fit of each; whether
    it profiled now. ``repeats``: timed runs of each collective and size (more steady the
    latency of small messages where ranks share cores).

    Raises:
        ClusterRunError: a rank failed or the profile ran out of time.
    """
    have = {
        p.collective
        for p in store.collective_profiles(
            backend="gloo", world_size=world_size, bandwidth=bandwidth
        )
    }
    missing = sorted(set(collectives) - have)
    if not missing:
        return False
    progress(
        None,
        f"no fit of {', '.join(missing)} on {world_size} ranks at {bandwidth} yet: profiling "
        "the link",
    )
    profile = profile_collectives(
        world_size=world_size,
        bandwidth=bandwidth,
        sizes=list(sizes),
        collectives=missing,
        repeats=repeats,
        cpu_repeats=CPU_REPEATS,
        progress=lambda message: progress(None, message),
    )
    with store.transaction() as session:
        for record in collective_records(profile):
            add_collective_profile(session, profile=record)
    return True


def machine_scale(world_size: int) -> float:
    """Ranks of an emulated cluster all run on this machine: with more ranks than cores, each
    computes slower than its one-rank profile (one intra-op thread a rank)."""
    return compute_scale(world_size, len(os.sched_getaffinity(0)))


def normalized_bandwidth(text: str | None) -> str:
    """The link as the store names it: a lower-case rate, or ``none`` for an unshaped one."""
    if text is None:
        return "none"
    return "none" if parse_bandwidth_gbps(text) is None else text.strip().lower()
