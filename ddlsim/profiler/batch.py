"""Batch runs: many kernel and collective profiles and executor runs from one YAML file,
resumable.

The file lists jobs, a cross product of jobs, or both::

    jobs:
      - {kind: kernels, model: bert-tiny, iters: 5}
      - {kind: fusion, model: bert-tiny, blocks: [bert.encoder.layer.0]}
      - {kind: collectives, world_size: 2, bandwidth: 1gbit, sizes: [1MiB, 16MiB]}
      - {kind: run, model: gpt2-tiny, world_size: 2, bandwidth: 1gbit,
         strategy: {tensor_fusion: {dear: true}}}
      - {kind: compare, model: gpt2-tiny, world_size: 2, bandwidth: 1gbit,
         strategies: [{tensor_fusion: {bucket_cap_mb: 4}}, {parallel: {fsdp: true}}]}
    product:
      - kind: [kernels]
        model: [mlp, gpt2-tiny]
        batch_size: [8, 16]

A ``compare`` job runs DDP's defaults and its ``strategies`` side by side in one launch
(``executor.run.compare_training``): every measurement it stores has a reference taken in the
same launch (the same ``launch_id``), so that speed-ups as well as times can be read off it.

Every job has a key (a hash of its normalized settings). A job whose key is stored as done is
skipped; a job interrupted mid-way (killed, Ctrl-C) is still "running" and is redone; a job that
fails is recorded with its error and the run goes on. Each job's results are written in one
transaction together with its "done" mark.
"""

import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import platform
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ddlsim.data.comm_model import COLLECTIVES
from ddlsim.data.errors import DdlsimError, InvalidOptionError, one_line
from ddlsim.data.limits import SpecLimits
from ddlsim.data.specs._serde import check_keys, load_json_or_file
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

MAX_JOBS = 10_000
# What an executor job (one strategy, or several side by side) may set besides its strategies.
_EXECUTOR_KEYS = frozenset(
    {
        "kind",
        "model",
        "world_size",
        "bandwidth",
        "batch_size",
        "seq_len",
        "image_size",
        "iters",
        "warmup",
        "ci_target",
        "measure_budget_s",
        "seed",
        "optimizer",
        "device",
        "backend",
    }
)
KINDS: dict[str, frozenset[str]] = {
    "kernels": frozenset(
        {
            "kind",
            "model",
            "batch_size",
            "seq_len",
            "image_size",
            "iters",
            "warmup",
            "device",
            "optimizer",
            "precision",
            "threads",
        }
    ),
    # Blocks timed alone, eager and compiled (profiler.fusion).
    "fusion": frozenset(
        {
            "kind",
            "model",
            "batch_size",
            "seq_len",
            "image_size",
            "blocks",
            "iters",
            "warmup",
            "threads",
        }
    ),
    "collectives": frozenset(
        {
            "kind",
            "world_size",
            "backend",
            "bandwidth",
            "sizes",
            "collectives",
            "warmup",
            "repeats",
            "cpu_repeats",
        }
    ),
    # Executor runs: the runners come from the executor's side (``service.cmd_run``).
    "run": _EXECUTOR_KEYS | {"strategy"},
    # DDP's defaults and several strategies side by side in one launch.
    "compare": _EXECUTOR_KEYS | {"strategies", "rounds"},
}


class InvalidBatchError(InvalidOptionError):
    """A batch file is malformed: unknown kind or key, a product over a non-list."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """One unit of a batch: its kind, its settings and the key that identifies it."""

    kind: str
    settings: Mapping[str, Any]

    @property
    def key(self) -> str:
        """What identifies the job in the store: a hash of its kind and settings."""
        canonical = json.dumps({"kind": self.kind, **self.settings}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:24]

    @property
    def label(self) -> str:
        """The job as people read it: ``kind(setting=value, ...)``, a model given as a spec
        by its name or class."""
        shown = ", ".join(f"{k}={_shown(v)}" for k, v in sorted(self.settings.items()))
        return f"{self.kind}({shown})"


def _shown(value: Any) -> Any:
    if isinstance(value, Mapping) and "class" in value:
        return value.get("name") or value["class"]
    return value


def gpus_needed(job: Job) -> int:
    """CUDA GPUs the job needs on its host: one a rank on ``device: cuda`` or ``backend:
    nccl``, else none."""
    if job.settings.get("device") != "cuda" and job.settings.get("backend") != "nccl":
        return 0
    size = job.settings.get("world_size", 1)
    return size if isinstance(size, int) and size > 0 else 1


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BatchOutcome:
    """What a run did: job keys done now, skipped as already done, failed (with errors)."""

    done: tuple[str, ...]
    skipped: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the three lists."""
        return {
            "done": list(self.done),
            "skipped": list(self.skipped),
            "failed": [{"key": key, "error": error} for key, error in self.failed],
        }


def _job(raw: Mapping[str, Any], where: str) -> Job:
    kind = raw.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise InvalidBatchError(
            f"{where}.kind {kind!r} is not a job kind; allowed: {', '.join(KINDS)}"
        )
    check_keys(raw, set(KINDS[kind]), where, InvalidBatchError)
    if kind in ("kernels", "fusion", "run", "compare") and "model" not in raw:
        raise InvalidBatchError(f"{where} ({kind}) needs 'model'")
    if kind == "compare" and not (
        isinstance(raw.get("strategies"), list) and raw.get("strategies")
    ):
        raise InvalidBatchError(
            f"{where} (compare) needs 'strategies', a non-empty list of strategies "
            f"(got {raw.get('strategies')!r})"
        )
    if kind == "collectives" and "world_size" not in raw:
        raise InvalidBatchError(f"{where} (collectives) needs 'world_size'")
    settings = {k: v for k, v in raw.items() if k != "kind"}
    return Job(kind=kind, settings=settings)


# The kinds of job that run a model on a device (fusion profiles time blocks on the CPU).
ON_DEVICE = ("kernels", "run", "compare")


def on_device(jobs: Sequence[Job], device: str) -> list[Job]:
    """``jobs`` with every kernels, run and compare job set to run on ``device`` (``profile
    batch --device``: one batch file for the CPU's dry run and the GPU's collection; the jobs'
    keys change with the device, so the two are stored apart). Duplicates the setting makes
    are kept once.

    Raises:
        InvalidOptionError: an unknown device, naming the allowed ones.
    """
    if device not in DEVICES:
        raise InvalidOptionError(
            f"device {device!r} is not supported; allowed: {', '.join(DEVICES)}"
        )
    unique: dict[str, Job] = {}
    for job in jobs:
        moved = job
        if job.kind in ON_DEVICE:
            moved = Job(kind=job.kind, settings={**job.settings, "device": device})
        unique.setdefault(moved.key, moved)
    return list(unique.values())


def parse_batch(text: str) -> list[Job]:
    """Jobs from a batch file (YAML/JSON path) or inline JSON, in file order, duplicates once.

    Raises:
        InvalidBatchError: naming the bad entry, key or kind.
    """
    return parse_batch_data(load_json_or_file(text, "batch file", InvalidBatchError))


def parse_batch_data(raw: Mapping[str, Any]) -> list[Job]:
    """Jobs from a batch file's content (see :func:`parse_batch`).

    Raises:
        InvalidBatchError: naming the bad entry, key or kind.
    """
    if not isinstance(raw, Mapping):
        raise InvalidBatchError(f"a batch must be a mapping with 'jobs' or 'product', got {raw!r}")
    check_keys(raw, {"jobs", "product"}, "batch file", InvalidBatchError)
    jobs: list[Job] = []
    listed = _list(raw.get("jobs", []), "jobs")
    if len(listed) > MAX_JOBS:
        raise InvalidBatchError(f"jobs holds {len(listed)}; a batch holds at most {MAX_JOBS}")
    for index, entry in enumerate(listed):
        if not isinstance(entry, Mapping):
            raise InvalidBatchError(f"jobs[{index}] must be a mapping, got {entry!r}")
        jobs.append(_job(entry, f"jobs[{index}]"))
    for index, entry in enumerate(_list(raw.get("product", []), "product")):
        where = f"product[{index}]"
        if not isinstance(entry, Mapping):
            raise InvalidBatchError(f"{where} must be a mapping of lists, got {entry!r}")
        keys = sorted(entry)
        axes = [_list(entry[key], f"{where}.{key}") for key in keys]
        size = math.prod(len(axis) for axis in axes)
        if len(jobs) + size > MAX_JOBS:
            raise InvalidBatchError(
                f"{where} makes {size} jobs; a batch holds at most {MAX_JOBS} in all"
            )
        for values in itertools.product(*axes):
            jobs.append(_job(dict(zip(keys, values, strict=True)), where))
    if not jobs:
        raise InvalidBatchError("batch file holds no jobs (give 'jobs' and/or 'product')")
    unique: dict[str, Job] = {}
    for job in jobs:
        unique.setdefault(job.key, job)
    return list(unique.values())


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidBatchError(f"{where} must be a list, got {value!r}")
    return value


JobRunner = Callable[[Job], Callable[[Any], None]]


def run_batch(
    jobs: Sequence[Job],
    *,
    store: Any,
    runners: Mapping[str, JobRunner],
    progress: Callable[[int, int, str], None] | None = None,
) -> BatchOutcome:
    """Run ``jobs`` against ``store``; ``runners[kind](job)`` does the work and returns the
    callback that writes its results inside the store's job transaction.

    A job that raises is marked failed with its error and the run goes on; ``KeyboardInterrupt``
    stops the run and leaves the job unfinished, to be redone next time.
    """
    done: list[str] = []
    skipped: list[str] = []
    failed: list[tuple[str, str]] = []
    for position, job in enumerate(jobs):
        if progress is not None:
            progress(position, len(jobs), job.label)
        if store.job_status(key=job.key) == "done":
            skipped.append(job.key)
            continue
        store.start_job(key=job.key, kind=job.kind, spec={"kind": job.kind, **job.settings})
        try:
            write_results = runners[job.kind](job)
        except DdlsimError as exc:
            store.fail_job(key=job.key, error=one_line(exc, limit=2000))
            failed.append((job.key, one_line(exc, limit=2000)))
            continue
        except Exception as exc:  # a crashed job must not stop the batch
            message = f"{type(exc).__name__}: {one_line(exc, limit=2000)}"
            store.fail_job(key=job.key, error=message)
            failed.append((job.key, message))
            continue
        store.finish_job(key=job.key, results=write_results)
        done.append(job.key)
    if progress is not None:
        progress(len(jobs), len(jobs), "finished")
    return BatchOutcome(done=tuple(done), skipped=tuple(skipped), failed=tuple(failed))


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
        None if blocks is None else [str(b) for b in _list(blocks, "blocks")],
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
