"""What the dataset holds: kernel and fusion profiles, link fits and executor runs.

A :class:`Dataset` is self-contained: the graphs the kernel profiles timed, their per-node
times, the fusion profiles, the collective fits, and every run (model, strategy, world size,
link, iteration samples), all that replaying and featurizing the runs needs.
"""

import dataclasses
import json
import statistics
from collections.abc import Iterable
from typing import Any

from ddlsim.data.comm_model import LinkFit
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy

# the steps a run's speed ratio is rounded to: runs within a step replay one graph (below the
# probe's own repeatability, about 2 %)
SPEED_STEP = 0.02


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class KernelEntry:
    """A kernel profile: the graph it timed (default strategy, the rank's micro-batch) and the
    median time of each node (ms)."""

    graph: IterationGraph
    node_ms: dict[int, float]
    iteration_time_ms: float
    # the machine's speed probe as it was profiled (cluster.speed; None before it existed)
    probe_ms: float | None = None

    @property
    def precision(self) -> str:
        """The precision the profile ran in: its graph's autocast (``fp32`` without one)."""
        return str(self.graph.env.get("autocast", "fp32"))


def kernel_key(label: str, batch_size: int, precision: str = "fp32") -> tuple[str, int]:
    """Where a dataset keeps the kernel profile of a model at a batch size in a precision:
    ``(label, batch)`` for fp32 (every CPU profile), ``(label:precision, batch)`` otherwise."""
    return (label if precision == "fp32" else f"{label}:{precision}", batch_size)


def key_of(entry: KernelEntry) -> tuple[str, int]:
    """The key of ``entry`` among a dataset's kernel profiles (:func:`kernel_key`)."""
    model = entry.graph.model
    return kernel_key(model.label, model.inputs.batch_size, entry.precision)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FusionEntry:
    """A fusion profile: blocks of a model at one batch size, each timed alone (forward and
    backward) eager and compiled, median ms."""

    model: str
    batch_size: int
    blocks: tuple[dict[str, Any], ...]

    def ratios(self) -> dict[str, float]:
        """Compiled over eager time of each block."""
        return {
            str(b["block"]): float(b["compiled_ms"]) / float(b["eager_ms"])
            for b in self.blocks
            if float(b["eager_ms"]) > 0 and float(b["compiled_ms"]) > 0
        }


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RunEntry:
    """One executor run: each iteration's time (slowest rank) after warm-up."""

    model: ModelSpec
    strategy: Strategy
    world_size: int
    bandwidth: str
    samples_ms: tuple[float, ...]
    seed: int
    created_at: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def measured_ms(self) -> float:
        """The median of the run's iteration times."""
        return statistics.median(self.samples_ms)

    @property
    def family(self) -> str:
        """The model's family (its label when it has none): what holdout splits keep apart."""
        return self.model.family or self.model.label

    def speed_ratio(self, kernel: KernelEntry) -> float:
        """How much slower the machine computed during this run than while ``kernel`` was
        profiled: the run's speed probe over the profile's (``cluster.speed``), to the nearest
        ``SPEED_STEP``; 1 where either has none (runs and profiles before the probe)."""
        probe = self.extra.get("probe_ms")
        if kernel.probe_ms is None or not isinstance(probe, int | float) or probe <= 0:
            return 1.0
        return max(SPEED_STEP, round(float(probe) / kernel.probe_ms / SPEED_STEP) * SPEED_STEP)

    @property
    def ci_half_width(self) -> float | None:
        """Half the median's recorded 95 % interval over the median (0.01: ±1 %), or ``None``
        for a run measured before the protocol recorded one (cpu-v2)."""
        interval = self.extra.get("ci95_ms")
        if not interval or self.measured_ms <= 0:
            return None
        low, high = (float(x) for x in interval)
        return (high - low) / 2 / self.measured_ms

    @property
    def speedup(self) -> float | None:
        """DDP's defaults measured in the same launch over this run's median (above 1: this
        strategy was faster), or ``None`` without such a reference."""
        reference = self.extra.get("reference_ms")
        return float(reference) / self.measured_ms if reference else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Dataset:
    """Runs and everything needed to replay and featurize them.

    ``sessions`` are later collections kept apart: each a dataset of its own profiles, fits
    and meta (runtime costs) with no runs, whose runs are among ``runs``, marked
    ``extra["session"]``. A session measured on another day may have run at another speed
    (this VM's compute varied by 1.3-1.7x between sessions of one day), so its runs replay
    only from its own profiles (:meth:`source_of`, :func:`.export.add_session`).
    """

    runs: tuple[RunEntry, ...]
    kernels: dict[tuple[str, int], KernelEntry]  # kernel_key: (model label, rank batch size)
    links: tuple[LinkFit, ...]
    meta: dict[str, Any]
    fusion: dict[tuple[str, int], FusionEntry] = dataclasses.field(default_factory=dict)
    sessions: dict[str, "Dataset"] = dataclasses.field(default_factory=dict)

    def source_of(self, run: RunEntry) -> "Dataset":
        """Where ``run``'s kernel and fusion profiles, link fits and runtime costs are: its
        session's, else this dataset's.

        Raises:
            InvalidOptionError: the run names a session the dataset does not hold.
        """
        name = run.extra.get("session")
        if not name:
            return self
        if name not in self.sessions:
            raise InvalidOptionError(
                f"run of {run.model.label} names session {name!r}; the dataset holds: "
                f"{', '.join(sorted(self.sessions)) or 'none'}"
            )
        return self.sessions[name]

    @property
    def families(self) -> list[str]:
        """The families of the runs, sorted."""
        return sorted({r.family for r in self.runs})

    def kernel_for(self, spec: ModelSpec, precision: str = "fp32") -> KernelEntry | None:
        """The kernel profile of ``spec`` at its batch size (a rank's micro-batch) in
        ``precision``, if any."""
        return self.kernels.get(kernel_key(spec.label, spec.inputs.batch_size, precision))

    def select(
        self, *, families: Iterable[str] | None = None, exclude: Iterable[str] = ()
    ) -> "Dataset":
        """This dataset with the runs of ``families`` only (all when ``None``), less those of
        ``exclude``; profiles and fits are kept whole."""
        keep = set(families) if families is not None else None
        drop = set(exclude)
        runs = tuple(
            r for r in self.runs if (keep is None or r.family in keep) and r.family not in drop
        )
        return dataclasses.replace(self, runs=runs)


def spec_key(spec: ModelSpec) -> str:
    """A model spec's identity in the dataset: its canonical JSON (sorted keys)."""
    return json.dumps(spec.to_dict(), sort_keys=True)
