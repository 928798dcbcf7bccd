"""Each kind of profiling job a batch holds: its checks before it is queued, its runner, and the
store records of what it measured (kernel, fusion and collective profiles; executor jobs are
:mod:`ddlsim.workflows.profile`'s). The batch file itself, its parsing and its run loop are
:mod:`.batch`'s."""

import contextlib
import dataclasses
import json
import platform
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ddlsim.data.comm_model import COLLECTIVES
from ddlsim.data.errors import DdlsimError, InvalidOptionError, one_line
from ddlsim.data.limits import SpecLimits
from ddlsim.data.specs.cluster import parse_bandwidth_gbps
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.store import (
    CollectiveProfileRecord,
    FusionProfileRecord,
    KernelProfileRecord,
    add_collective_profile,
    add_fusion_profile,
    add_graph,
    add_kernel_profile,
)
from ddlsim.data.store.records import record_of
from ddlsim.data.zoo import resolve_model
from ddlsim.profiler.batch import InvalidBatchError, Job, as_list
from ddlsim.profiler.capture import AUTOCAST, OPTIMIZERS
from ddlsim.profiler.collective_fit import CollectiveProfile
from ddlsim.profiler.collectives import (
    InvalidSizesError,
    check_options,
    default_sizes,
    parse_sizes,
    profile_collectives,
)
from ddlsim.profiler.fusion import FusionProfile, profile_fusion
from ddlsim.profiler.kernels import DEVICES, KernelProfile, profile_kernels


def kernel_record(profile: KernelProfile) -> KernelProfileRecord:
    """The store's record of a kernel profile."""
    return record_of(
        KernelProfileRecord,
        profile,
        node_ms=dict(profile.node_ms),
        env={**profile.env, "matched_fraction": f"{profile.matched_fraction:.4f}"},
        host=platform.node(),
    )


def _job_model(settings: dict[str, Any]) -> ModelSpec:
    """The job's model at its inputs (the keys are taken out of ``settings``)."""
    model = settings.pop("model")
    spec = resolve_model(json.dumps(model) if isinstance(model, Mapping) else str(model))
    return spec.with_inputs(
        batch_size=settings.pop("batch_size", None),
        seq_len=settings.pop("seq_len", None),
        image_size=settings.pop("image_size", None),
    )


def run_kernel_job(job: Job, *, trace_dir: Path | None = None) -> Callable[[Any], None]:
    """Profile one model; the returned callback stores its graph and profile."""
    settings = dict(job.settings)
    spec = _job_model(settings)
    graph, profile = profile_kernels(
        spec,
        iters=int(settings.pop("iters", 20)),
        warmup=int(settings.pop("warmup", 3)),
        device=settings.pop("device", "cpu"),
        optimizer=settings.pop("optimizer", "adamw"),
        precision=settings.pop("precision", "fp32"),
        threads=int(settings.pop("threads", 1)),
        trace_dir=trace_dir,
    )

    def write(session: Any) -> None:
        add_graph(session, graph=graph)
        add_kernel_profile(session, profile=kernel_record(profile))

    return write


def fusion_record(profile: FusionProfile) -> FusionProfileRecord:
    """The store's record of a fusion profile."""
    blocks = [dataclasses.asdict(block) for block in profile.blocks]
    return record_of(FusionProfileRecord, profile, blocks=blocks, env=dict(profile.env))


def run_fusion_job(job: Job) -> Callable[[Any], None]:
    """Time a model's blocks eager and compiled; the callback stores the graph and profile."""
    settings = dict(job.settings)
    spec = _job_model(settings)
    blocks = settings.pop("blocks", None)
    graph, profile = profile_fusion(
        spec,
        None if blocks is None else [str(b) for b in as_list(blocks, "blocks")],
        iters=int(settings.pop("iters", 10)),
        warmup=int(settings.pop("warmup", 2)),
        threads=int(settings.pop("threads", 1)),
    )

    def write(session: Any) -> None:
        add_graph(session, graph=graph)
        add_fusion_profile(session, profile=fusion_record(profile))

    return write


def collective_records(profile: CollectiveProfile) -> list[CollectiveProfileRecord]:
    """The store's records of a collective profile: one per fitted collective, with its raw
    samples."""
    env = {"torch": torch.__version__, "notes": "; ".join(profile.notes)}
    records = []
    for fit in profile.fits:
        samples = [
            {**dataclasses.asdict(sample), "times_us": list(sample.times_us)}
            for sample in profile.samples
            if sample.collective == fit.collective
        ]
        records.append(
            record_of(
                CollectiveProfileRecord,
                fit,
                network=profile.network,
                samples=samples,
                rank_cores=dict(profile.rank_cores),
                env=env,
            )
        )
    return records


def _collective_options(settings: dict[str, Any]) -> dict[str, Any]:
    """A collectives job's arguments of :func:`profile_collectives` (the keys are taken out of
    ``settings``)."""
    sizes = settings.pop("sizes", None)
    if isinstance(sizes, str):
        sizes = parse_sizes(sizes)
    elif isinstance(sizes, list):
        sizes = [s if isinstance(s, int) else parse_sizes(str(s))[0] for s in sizes]
    options: dict[str, Any] = {
        "world_size": int(settings.pop("world_size")),
        "backend": settings.pop("backend", "gloo"),
        "bandwidth": settings.pop("bandwidth", "1gbit"),
        "sizes": sizes,
        "warmup": int(settings.pop("warmup", 2)),
        "repeats": int(settings.pop("repeats", 5)),
        # the compute each collective takes from its rank, which the replay charges
        "cpu_repeats": int(settings.pop("cpu_repeats", 3)),
    }
    if "collectives" in settings:
        options["collectives"] = list(settings.pop("collectives"))
    return options


def run_collective_job(job: Job) -> Callable[[Any], None]:
    """Profile collectives on an emulated cluster; the callback stores one row per fit."""
    profile = profile_collectives(**_collective_options(dict(job.settings)))
    records = collective_records(profile)

    def write(session: Any) -> None:
        for record in records:
            add_collective_profile(session, profile=record)

    return write


# ----- checks before a batch is queued ------------------------------------------------------

# Counts of steps, repeats and rounds, with their least value.
COUNTS: dict[str, int] = {"iters": 1, "warmup": 0, "repeats": 1, "cpu_repeats": 0, "rounds": 1}
MAX_THREADS = 256


def check_job(job: Job, limits: SpecLimits) -> ModelSpec | None:
    """Refuse, without running anything, a kernels, fusion or collectives job its runner would
    refuse, and any job asking for more work than ``limits`` allow (counts over
    ``max_iters``, messages over ``max_message_bytes``); the job's model at its inputs, for
    the caller to hold against the model limits (``None`` for a collectives job). Executor
    jobs' run options are the executor's to check.

    Raises:
        InvalidOptionError: naming the key, the value and what is allowed.
    """
    settings = dict(job.settings)
    for key, least in COUNTS.items():
        if key in settings:
            _check_count(key, settings[key], least, limits.max_iters, "DDLSIM_MAX_ITERS")
    if "threads" in settings:
        _check_count("threads", settings["threads"], 1, MAX_THREADS, None)
    with of_their_types():
        if job.kind == "collectives":
            options = {"collectives": COLLECTIVES, **_collective_options(settings)}
        else:
            spec = _job_model(settings)
    if job.kind == "collectives":
        parse_bandwidth_gbps(options.pop("bandwidth") or "none")
        options["sizes"] = options["sizes"] or default_sizes()
        check_options(timeout_s=600.0, on_this_host=False, **options)
        if max(options["sizes"]) > limits.max_message_bytes:
            raise InvalidSizesError(
                f"sizes: {max(options['sizes'])} bytes is over this service's limit of "
                f"{limits.max_message_bytes} bytes a message (DDLSIM_MAX_MESSAGE_BYTES)"
            )
        return None
    if job.kind == "kernels":
        device = settings.get("device", "cpu")
        if device not in DEVICES:
            raise InvalidOptionError(
                f"device {device!r} is not supported; allowed: {', '.join(DEVICES)}"
            )
        optimizer = settings.get("optimizer", "adamw")
        if optimizer not in OPTIMIZERS:
            raise InvalidOptionError(
                f"optimizer {optimizer!r} is not supported; allowed: {', '.join(OPTIMIZERS)}"
            )
        precision = settings.get("precision", "fp32")
        if precision not in AUTOCAST:
            raise InvalidOptionError(
                f"precision {precision!r} is not supported in a kernel profile; allowed: "
                f"{', '.join(AUTOCAST)}"
            )
    blocks = settings.get("blocks")
    listed = isinstance(blocks, list) and all(isinstance(b, str) for b in blocks)
    if job.kind == "fusion" and blocks is not None and not listed:
        raise InvalidBatchError(f"blocks {blocks!r} must be a list of module names")
    return spec


@contextlib.contextmanager
def of_their_types() -> Iterator[None]:
    """Read a job's settings as its runner does: a setting of the wrong type (``int()`` of a
    word, a list where a number goes) is an :class:`InvalidBatchError` naming it."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        if isinstance(exc, DdlsimError):
            raise
        raise InvalidBatchError(f"a setting is not of its type: {one_line(exc)}") from None


def _check_count(key: str, value: Any, least: int, most: int, variable: str | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        set_by = f" ({variable})" if variable else ""
        raise InvalidOptionError(
            f"{key}({value!r}) is out of range; allowed: an integer from {least} to {most}{set_by}"
        )
