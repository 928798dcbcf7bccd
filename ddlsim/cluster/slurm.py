"""Slurm jobs through submitit: a job of ``nodes`` x ``gpus_per_node`` tasks, each one rank of
the process group (its place exported as torchrun would), rank 0's result back to the process
that submitted it. submitit's ``local`` executor runs the same job on this machine."""

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddlsim.cluster.emulated import ClusterRunError
from ddlsim.data.errors import InvalidOptionError

SUBMITIT_CLUSTERS: tuple[str, ...] = ("slurm", "local")
MAX_SLURM_NODES = 4096
MAX_SLURM_MINUTES = 60 * 24 * 14


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
    ``on_submit`` gets the job's id as soon as it is queued.

    Raises:
        ClusterRunError: the job failed, or no task returned a result.
    """
    import submitit

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
