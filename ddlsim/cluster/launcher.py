"""Where ranks run, chosen once from the request: one :class:`Launcher` interface, three ways.

- ``local`` (:class:`LocalLauncher`): this machine's emulated cluster (a namespace a rank,
  shaped links); the job starts its own ranks. The default, and what the tests use.
- ``env`` (:class:`EnvLauncher`): this process is one rank of a process group that torchrun,
  srun or a PyTorchJob made (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
  ``MASTER_PORT``); rank 0 leads, the others follow what it launches.
- ``slurm`` (:class:`SlurmLauncher`): a Slurm job submitit submits and waits for, whose tasks
  run as ``env`` ranks; rank 0's result comes back to the submitting process.

A :class:`Job` is what runs (a training run, runs side by side, a collectives benchmark): it
knows how to run on the emulated cluster and as one rank of a joined group, and the launcher
decides which. The command line, the worker and the REST service pick a launcher with
:func:`launcher_for` and hand it jobs; nothing else asks which launcher it is.
"""

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, TypeVar

from ddlsim.cluster.external import ExternalRank, agree, launch_store
from ddlsim.cluster.namespaces import remove_stale_namespaces
from ddlsim.cluster.slurm import SlurmSettings, export_slurm_environment, submit_slurm
from ddlsim.data.errors import InvalidOptionError

LAUNCHERS: tuple[str, ...] = ("local", "env", "slurm")
T_co = TypeVar("T_co", covariant=True)
Say = Callable[[str], None]


class Job(Protocol[T_co]):
    """Work for every rank of one launch.

    Jobs are plain values (frozen dataclasses of specs): a Slurm job pickles them to its tasks.
    ``here`` starts the ranks on this machine's emulated cluster and waits; ``as_rank`` runs this
    process as one rank of a group made outside (``launcher`` names it in what is stored) and
    returns rank 0's result, ``None`` on the other ranks.
    """

    @property
    def name(self) -> str:
        """The Slurm job's name (``ddlsim-run-gpt2-tiny``)."""
        ...

    @property
    def use_gpus(self) -> bool:
        """Whether each rank needs a GPU (the Slurm job asks for them)."""
        ...

    def here(self, progress: Say | None) -> T_co: ...

    def as_rank(self, launcher: str, progress: Say | None) -> T_co | None: ...


class Launcher(abc.ABC):
    """Starts jobs somewhere; one a request, chosen by :func:`launcher_for`.

    Contract: :meth:`ranks` answers how many ranks a launch has (and refuses a request that
    asks otherwise) before anything starts; :meth:`launch` runs a job and returns rank 0's
    result (``None`` on the ranks that follow); a leader that may launch nothing calls
    :meth:`release` when done, so that its followers end. Not thread-safe.
    """

    name: ClassVar[str]
    emulated: ClassVar[bool] = False
    """Whether the ranks run on this machine's emulated cluster (links shaped here)."""

    @abc.abstractmethod
    def ranks(self, asked: int | None, *, default: int | None = None) -> int:
        """The launch's world size: the launcher's own, which ``asked`` must match when given
        (``None``: not given); on the emulated cluster ``asked``, else ``default``.

        Raises:
            InvalidOptionError: no world size where the launcher has none, or one that
                differs from the launcher's.
        """

    @property
    def follows(self) -> bool:
        """Whether this process only follows what another rank launches (it reports nothing)."""
        return False

    @abc.abstractmethod
    def launch(
        self,
        job: Job[Any],
        *,
        progress: Say | None = None,
        on_submit: Callable[[str], None] | None = None,
    ) -> Any:
        """Run ``job`` on every rank; rank 0's result, ``None`` on the following ranks.
        ``on_submit`` hears a queued job's id (Slurm).

        Raises:
            ClusterRunError: a rank failed or hung, or the job failed.
        """

    def for_ranks(self, world_size: int) -> "Launcher":
        """This launcher for a launch of ``world_size`` ranks (a worker's task's size).

        Raises:
            InvalidOptionError: a size this launcher cannot give.
        """
        self.ranks(world_size)
        return self

    def release(self) -> None:  # noqa: B027 - only a launcher with followers has to act
        """Tell the following ranks that nothing (more) runs (a leader that launched nothing)."""

    def check_link(self, bandwidth: str | None) -> None:
        """Refuse a link rate where the launcher cannot shape one.

        Raises:
            InvalidOptionError: ``bandwidth`` given and the ranks run on a real network.
        """
        if bandwidth is not None and not self.emulated:
            raise InvalidOptionError(
                f"--bandwidth shapes this machine's emulated cluster; under --launcher "
                f"{self.name} the ranks run on the real network"
            )


class LocalLauncher(Launcher):
    """This machine's emulated cluster: the job starts one process a rank."""

    name = "local"
    emulated = True

    def ranks(self, asked: int | None, *, default: int | None = None) -> int:
        ranks = default if asked is None else asked
        if ranks is None:
            raise InvalidOptionError("--world-size is needed with --launcher local")
        return ranks

    def launch(
        self,
        job: Job[Any],
        *,
        progress: Say | None = None,
        on_submit: Callable[[str], None] | None = None,
    ) -> Any:
        remove_stale_namespaces()  # left by runs whose process was killed outright
        return job.here(progress)


class EnvLauncher(Launcher):
    """This process is one rank of a group an external launcher made; rank 0 leads.

    Raises:
        InvalidOptionError: on construction, when the launcher's variables are missing.
    """

    name = "env"

    def __init__(self) -> None:
        self.place = ExternalRank.from_environ()
        self._launched = False

    def ranks(self, asked: int | None, *, default: int | None = None) -> int:
        if asked not in (None, self.place.world_size):
            raise InvalidOptionError(
                f"--world-size {asked} differs from the launcher's "
                f"WORLD_SIZE({self.place.world_size}); leave it out under --launcher env"
            )
        return self.place.world_size

    @property
    def follows(self) -> bool:
        return self.place.rank != 0

    def launch(
        self,
        job: Job[Any],
        *,
        progress: Say | None = None,
        on_submit: Callable[[str], None] | None = None,
    ) -> Any:
        self._launched = True
        return job.as_rank(self.name, progress)

    def release(self) -> None:
        if not self._launched and not self.follows:
            agree(launch_store(self.place), self.place, None)
        self._launched = True


class SlurmLauncher(Launcher):
    """A Slurm job of ``settings``' ranks, submitted with submitit; waits for rank 0's result."""

    name = "slurm"

    def __init__(self, settings: SlurmSettings) -> None:
        self.settings = settings

    def ranks(self, asked: int | None, *, default: int | None = None) -> int:
        if asked not in (None, self.settings.world_size):
            raise InvalidOptionError(
                f"--world-size {asked} differs from the Slurm job's nodes({self.settings.nodes})"
                f" x gpus-per-node({self.settings.gpus_per_node}); leave it out"
            )
        return self.settings.world_size

    def for_ranks(self, world_size: int) -> "Launcher":
        nodes = self.settings.nodes
        if world_size % nodes:
            raise InvalidOptionError(
                f"world_size({world_size}) does not split over the Slurm job's nodes({nodes})"
            )
        return SlurmLauncher(dataclasses.replace(self.settings, gpus_per_node=world_size // nodes))

    def launch(
        self,
        job: Job[Any],
        *,
        progress: Say | None = None,
        on_submit: Callable[[str], None] | None = None,
    ) -> Any:
        return submit_slurm(
            self.settings,
            _slurm_task,
            job,
            name=job.name,
            use_gpus=job.use_gpus,
            progress=progress,
            on_submit=on_submit,
        )


def _slurm_task(job: Job[Any]) -> Any:
    """One task of a Slurm job: its place exported as torchrun would, then one rank of it."""
    export_slurm_environment()
    return job.as_rank("slurm", None)


def launcher_for(name: str, *, slurm: SlurmSettings | None = None) -> Launcher:
    """The launcher ``name`` (one of ``LAUNCHERS``); ``slurm`` configures a Slurm job (the
    other launchers do not read it).

    Raises:
        InvalidOptionError: an unknown name, or ``env`` outside a launched group.
    """
    makers: dict[str, Callable[[], Launcher]] = {
        "local": LocalLauncher,
        "env": EnvLauncher,
        "slurm": lambda: SlurmLauncher(slurm or SlurmSettings()),
    }
    if name not in makers:
        raise InvalidOptionError(f"launcher {name!r} is unknown; allowed: {', '.join(LAUNCHERS)}")
    return makers[name]()
