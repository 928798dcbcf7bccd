"""Where ranks run: this machine's emulated cluster (``local``, :func:`executor.run.run_training`),
a process group an external launcher made (``env``: torchrun, srun, a PyTorchJob), or a Slurm
job that submitit submits and waits for (``slurm``).

Under ``env`` every process is one rank: it reads its place from the environment
(:class:`ExternalRank`), captures the graph and checks the strategy itself, joins the process
group (NCCL on ``cuda:LOCAL_RANK``, gloo on the CPU) and trains; rank 0 reports. Under ``slurm``
the submitting process waits for the job, whose tasks are ``env`` ranks
(:class:`SlurmSettings`); rank 0's result comes back to it through submitit.
"""

import dataclasses
import json
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.executor.joined import compare_joined, run_joined
from ddlsim.executor.run import RunOptions, RunResult
from ddlsim.profiler.cluster.external import ENV_KEYS, ExternalRank

LAUNCHERS: tuple[str, ...] = ("local", "env", "slurm")
__all__ = [
    "ENV_KEYS",
    "LAUNCHERS",
    "ExternalRank",
    "SlurmSettings",
    "compare_env",
    "compare_slurm",
    "export_slurm_environment",
    "run_env",
    "run_slurm",
    "submit_slurm",
]
SUBMITIT_CLUSTERS: tuple[str, ...] = ("slurm", "local")
MAX_SLURM_NODES = 4096
MAX_SLURM_MINUTES = 60 * 24 * 14


def _in_group(options: RunOptions) -> tuple[ExternalRank, RunOptions]:
    """This process's place, and ``options`` for its group (its world size; no pinning: the
    launcher places the ranks).

    Raises:
        InvalidOptionError: no launcher environment, or a world size other than the group's.
    """
    place = ExternalRank.from_environ()
    if options.world_size not in (1, place.world_size):
        raise InvalidOptionError(
            f"world_size({options.world_size}) differs from the launcher's "
            f"WORLD_SIZE({place.world_size}); leave --world-size out under --launcher env"
        )
    return place, dataclasses.replace(options, world_size=place.world_size, pin=False)


def run_env(
    spec: ModelSpec,
    strategy: Strategy,
    options: RunOptions,
    *,
    launcher: str = "env",
    progress: Callable[[str], None] | None = None,
) -> RunResult | None:
    """Run this process as its rank of an externally launched group; rank 0's result, ``None``
    elsewhere. ``options.world_size`` must be 1 (take the group's) or the group's size.

    Raises:
        InvalidOptionError: no launcher's environment, or a world size that differs from it.
        InvalidStrategyError: the strategy does not fit the model or the group.
    """
    place, options = _in_group(options)
    return run_joined(
        spec,
        strategy,
        options,
        network=place.network(launcher, options.resolved_backend),
        progress=progress,
    )


def compare_env(
    spec: ModelSpec,
    strategies: list[Strategy] | None,
    options: RunOptions,
    *,
    rounds: int,
    settle: int = 1,
    launcher: str = "env",
    progress: Callable[[str], None] | None = None,
) -> list[RunResult] | None:
    """Strategies side by side (:func:`executor.run.compare_training`'s protocol) on an
    externally launched group: rank 0 gives ``strategies`` (the others ``None``), which it
    posts to the launch's store and the others wait for (up to ``AGREE_TIMEOUT_S``: rank 0 may
    search first), before the group is joined with the run's collective timeout; an empty list
    runs nothing (rank 0 had nothing to verify, or failed: the others must not wait for it).
    Rank 0's results, ``None`` elsewhere.

    Raises:
        InvalidOptionError: no launcher environment, or a world size other than the group's.
    """
    import torch.distributed as dist

    place, options = _in_group(options)
    store = _launch_store(place)
    if place.rank == 0:
        store.set("strategies", json.dumps([s.to_dict() for s in strategies or []]))
    else:
        # Rank 0 may search for a long time first: wait on the store, not in a collective.
        store.wait(["strategies"])
    agreed = [Strategy.from_dict(raw) for raw in json.loads(store.get("strategies"))]
    if not agreed:
        return [] if place.rank == 0 else None
    dist.init_process_group(
        options.resolved_backend,
        store=store,
        rank=place.rank,
        world_size=place.world_size,
        timeout=timedelta(seconds=options.collective_timeout_s),
    )
    return compare_joined(
        spec,
        agreed,
        options,
        rounds=rounds,
        settle=settle,
        network=place.network(launcher, options.resolved_backend),
        progress=progress,
    )


# How long the group's other ranks wait for rank 0 to agree on what to run (its search).
AGREE_TIMEOUT_S = 24 * 3600.0


def _launch_store(place: ExternalRank) -> Any:
    """The launch's key-value store at ``MASTER_ADDR:MASTER_PORT``, under a prefix of ours:
    torchrun's agent hosts it (``TORCHELASTIC_USE_AGENT_STORE``), else rank 0 does, as
    ``init_process_group`` would."""
    import torch.distributed as dist

    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        place.master_addr,
        place.master_port,
        place.world_size,
        is_master=place.rank == 0 and not agent,
        timeout=timedelta(seconds=AGREE_TIMEOUT_S),
        wait_for_workers=False,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"ddlsim/compare/{attempt}/", store)


def _slurm_compare_task(
    spec: dict[str, Any],
    strategies: list[dict[str, Any]],
    options: dict[str, Any],
    rounds: int,
) -> list[RunResult] | None:
    export_slurm_environment()
    return compare_env(
        ModelSpec.from_dict(spec),
        [Strategy.from_dict(raw) for raw in strategies],
        RunOptions(**options),
        rounds=rounds,
        launcher="slurm",
    )


def compare_slurm(
    spec: ModelSpec,
    strategies: list[Strategy],
    options: RunOptions,
    settings: "SlurmSettings",
    *,
    rounds: int,
    progress: Callable[[str], None] | None = None,
    on_submit: Callable[[str], None] | None = None,
) -> list[RunResult]:
    """Strategies side by side in one Slurm job (``settings``); rank 0's results."""
    results: list[RunResult] = submit_slurm(
        settings,
        _slurm_compare_task,
        spec.to_dict(),
        [strategy.to_dict() for strategy in strategies],
        _task_options(options, settings),
        rounds,
        name=f"ddlsim-verify-{spec.label}",
        use_gpus=options.device == "cuda",
        progress=progress,
        on_submit=on_submit,
    )
    return results


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SlurmSettings:
    """A Slurm job of ``nodes`` x ``gpus_per_node`` ranks (one task a GPU; on the CPU, tasks
    without GPUs), submitted with submitit; ``cluster`` ``local`` runs the same job on this
    machine with submitit's local executor (one node). ``folder`` holds submitit's files."""

    nodes: int = 1
    gpus_per_node: int = 1
    partition: str | None = None
    time_min: int = 60
    folder: str | None = None
    cluster: str = "slurm"

    def __post_init__(self) -> None:
        for name, high in (
            ("nodes", MAX_SLURM_NODES),
            ("gpus_per_node", 64),
            ("time_min", MAX_SLURM_MINUTES),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise InvalidOptionError(f"{name}({value!r}) must be an integer in 1..{high}")
        if self.cluster not in SUBMITIT_CLUSTERS:
            raise InvalidOptionError(
                f"submitit cluster {self.cluster!r} is not supported; allowed: "
                f"{', '.join(SUBMITIT_CLUSTERS)}"
            )
        if self.cluster == "local" and self.nodes != 1:
            raise InvalidOptionError(
                f"submitit's local executor runs one node; got nodes({self.nodes})"
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def _task_options(options: RunOptions, settings: SlurmSettings) -> dict[str, Any]:
    """``options`` as the job's tasks rebuild them (plain values), at the job's world size."""
    fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(RunOptions)}
    return {**fields, "world_size": settings.world_size}


def _slurm_task(
    spec: dict[str, Any], strategy: dict[str, Any], options: dict[str, Any]
) -> RunResult | None:
    """One task of the Slurm job: export the task's place as torchrun would, run as a rank."""
    export_slurm_environment()
    return run_env(
        ModelSpec.from_dict(spec),
        Strategy.from_dict(strategy),
        RunOptions(**options),
        launcher="slurm",
    )


def submit_slurm(
    settings: SlurmSettings,
    task: Callable[..., Any],
    *args: Any,
    name: str,
    use_gpus: bool,
    progress: Callable[[str], None] | None = None,
    on_submit: Callable[[str], None] | None = None,
) -> Any:
    """Submit ``task(*args)`` as a Slurm job of ``settings.world_size`` tasks (GPUs requested
    when ``use_gpus``), wait, and return the first task result that is not ``None`` (rank 0's).

    Raises:
        ClusterRunError: the job failed, or no task returned a result.
    """
    import submitit

    from ddlsim.profiler.cluster import ClusterRunError

    say = progress or (lambda message: None)
    folder = Path(settings.folder or Path.cwd() / "ddlsim-slurm") / "%j"
    executor = submitit.AutoExecutor(folder=folder, cluster=settings.cluster)
    parameters: dict[str, Any] = {
        "nodes": settings.nodes,
        "tasks_per_node": settings.gpus_per_node,
        "timeout_min": settings.time_min,
        "name": name,
    }
    if use_gpus:
        parameters["gpus_per_node"] = settings.gpus_per_node
    if settings.partition is not None:
        parameters["slurm_partition"] = settings.partition
    executor.update_parameters(**parameters)
    job = executor.submit(task, *args)
    say(f"submitted Slurm job {job.job_id} ({settings.nodes} node(s) x "
        f"{settings.gpus_per_node} rank(s))")  # fmt: skip
    if on_submit is not None:
        on_submit(str(job.job_id))
    try:
        results = job.results()
    except Exception as exc:  # submitit raises its own FailedJobError and UncompletedJobError
        raise ClusterRunError(f"Slurm job {job.job_id} failed: {exc}") from exc
    first = next((r for r in results if r is not None), None)
    if first is None:
        raise ClusterRunError(f"Slurm job {job.job_id} ended without rank 0's result")
    return first


def export_slurm_environment() -> None:
    """In a task of a Slurm job (or submitit's local executor): set what torchrun would
    (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``)."""
    import submitit

    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def run_slurm(
    spec: ModelSpec,
    strategy: Strategy,
    options: RunOptions,
    settings: SlurmSettings,
    *,
    progress: Callable[[str], None] | None = None,
    on_submit: Callable[[str], None] | None = None,
) -> RunResult:
    """Submit the run as a Slurm job (``settings``) and wait; rank 0's result.

    ``on_submit`` gets the job's id as soon as it is queued.

    Raises:
        InvalidOptionError: bad settings, or a world size other than the job's.
        ClusterRunError: the job failed (its stderr's end in the message).
    """
    if options.world_size not in (1, settings.world_size):
        raise InvalidOptionError(
            f"world_size({options.world_size}) differs from nodes({settings.nodes}) x "
            f"gpus_per_node({settings.gpus_per_node}); leave --world-size out"
        )
    result: RunResult = submit_slurm(
        settings,
        _slurm_task,
        spec.to_dict(),
        strategy.to_dict(),
        _task_options(options, settings),
        name=f"ddlsim-run-{spec.label}",
        use_gpus=options.device == "cuda",
        progress=progress,
        on_submit=on_submit,
    )
    return result
