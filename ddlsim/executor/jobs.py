"""The executor's jobs for a :class:`ddlsim.cluster.launcher.Launcher`: one training run
(:class:`RunJob`) and strategies side by side (:class:`CompareJob`), each on this machine's
emulated cluster (:func:`executor.run.run_training`, :func:`compare_training`) or as this
process's rank of a group made outside (:mod:`.joined`).

In a group made outside, rank 0 says what runs side by side (it may have searched first): it
posts the strategies to the launch's store and the other ranks wait for them
(:func:`ddlsim.cluster.external.agree`) before the process group is joined; a leader with
nothing to run posts nothing and its followers end (:meth:`Launcher.release`).
"""

import dataclasses
import json
from collections.abc import Callable

from ddlsim.cluster import groups
from ddlsim.cluster.external import ExternalRank, agree, launch_store
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.executor.joined import compare_joined, run_joined
from ddlsim.executor.run import RunOptions, RunResult, compare_training, run_training

Say = Callable[[str], None]


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
            f"WORLD_SIZE({place.world_size}); leave --world-size out"
        )
    return place, dataclasses.replace(options, world_size=place.world_size, pin=False)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RunJob:
    """Train ``spec`` with ``strategy`` and measure it; rank 0's :class:`RunResult`."""

    spec: ModelSpec
    strategy: Strategy
    options: RunOptions

    @property
    def name(self) -> str:
        return f"ddlsim-run-{self.spec.label}"

    @property
    def use_gpus(self) -> bool:
        return self.options.device == "cuda"

    def here(self, progress: Say | None) -> RunResult:
        return run_training(self.spec, self.strategy, self.options, progress=progress)

    def as_rank(self, launcher: str, progress: Say | None) -> RunResult | None:
        place, options = _in_group(self.options)
        return run_joined(
            self.spec,
            self.strategy,
            options,
            network=place.network(launcher, options.resolved_backend),
            progress=progress,
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CompareJob:
    """``strategies`` side by side (:func:`compare_training`'s protocol: ``rounds`` turns each
    or more, ``settle`` discarded steps a turn); rank 0's results, one a strategy in order.

    In a group made outside only rank 0's ``strategies`` count (a following rank may give
    ``None``); an empty list runs nothing.
    """

    spec: ModelSpec
    strategies: tuple[Strategy, ...] | None
    options: RunOptions
    rounds: int
    settle: int = 1

    @property
    def name(self) -> str:
        return f"ddlsim-verify-{self.spec.label}"

    @property
    def use_gpus(self) -> bool:
        return self.options.device == "cuda"

    def here(self, progress: Say | None) -> list[RunResult]:
        if not self.strategies:
            return []
        return compare_training(
            self.spec,
            list(self.strategies),
            self.options,
            rounds=self.rounds,
            settle=self.settle,
            progress=progress,
        )

    def as_rank(self, launcher: str, progress: Say | None) -> list[RunResult] | None:

        place, options = _in_group(self.options)
        store = launch_store(place)
        offer = json.dumps([s.to_dict() for s in self.strategies or []])
        agreed = [
            Strategy.from_dict(raw) for raw in json.loads(agree(store, place, offer) or "[]")
        ]
        if not agreed:
            return [] if place.rank == 0 else None
        groups.join(
            options.resolved_backend,
            options.collective_timeout_s,
            store=store,
            rank=place.rank,
            world_size=place.world_size,
        )
        return compare_joined(
            self.spec,
            agreed,
            options,
            rounds=self.rounds,
            settle=self.settle,
            network=place.network(launcher, options.resolved_backend),
            progress=progress,
        )
