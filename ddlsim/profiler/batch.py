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

import dataclasses
import hashlib
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ddlsim.data.errors import DdlsimError, InvalidOptionError, one_line
from ddlsim.data.specs._serde import check_keys, load_json_or_file
from ddlsim.profiler.kernels import DEVICES

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
    listed = as_list(raw.get("jobs", []), "jobs")
    if len(listed) > MAX_JOBS:
        raise InvalidBatchError(f"jobs holds {len(listed)}; a batch holds at most {MAX_JOBS}")
    for index, entry in enumerate(listed):
        if not isinstance(entry, Mapping):
            raise InvalidBatchError(f"jobs[{index}] must be a mapping, got {entry!r}")
        jobs.append(_job(entry, f"jobs[{index}]"))
    for index, entry in enumerate(as_list(raw.get("product", []), "product")):
        where = f"product[{index}]"
        if not isinstance(entry, Mapping):
            raise InvalidBatchError(f"{where} must be a mapping of lists, got {entry!r}")
        keys = sorted(entry)
        axes = [as_list(entry[key], f"{where}.{key}") for key in keys]
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


def as_list(value: Any, where: str) -> list[Any]:
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
