"""``run_training``: check a strategy, launch its ranks, and return what they measured;
``compare_training``: several strategies side by side in one launch.

The strategy is checked against the model and the world size before any process starts; the
ranks run on an emulated cluster (one network namespace per rank, links shaped to
``bandwidth``) or, without a bandwidth, on loopback. Nothing is stored here: the caller stores
the result once the whole run has succeeded, so a failed run leaves no half-written rows.
"""

import contextlib
import dataclasses
import json
import platform
import statistics
import tempfile
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ddlsim.cluster import (
    EmulatedCluster,
    LoopbackFallbackWarning,
)
from ddlsim.cluster.allocator import ALLOCATOR_ENV
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.executor.options import DEVICES, RunOptions
from ddlsim.executor.precision import check_fp8_library, device_target
from ddlsim.executor.protocol import (
    median_interval,
    ranks_per_core,
    relative_half_width,
)
from ddlsim.plans.feasibility import check
from ddlsim.profiler.capture import CaptureOptions, Optimizer, capture_graph


@dataclasses.dataclass(kw_only=True, slots=True)
class RunResult:
    """What a run measured. Times in ms; ``losses`` per step, warm-up steps first."""

    model: str
    graph: IterationGraph
    strategy: Strategy
    options: RunOptions
    samples_ms: list[float]
    warmup_ms: list[float]
    losses: list[float]
    peak_memory_bytes: list[int]
    applied: dict[str, Any]
    network: str
    rank_cores: dict[int, list[int]]
    wall_s: float
    # With RunOptions.trace: rank 0's profiled step ({name, lane, start_ms, end_ms}).
    trace: list[dict[str, Any]] | None = None
    # compare_training: how many strategies shared the launch, and the rounds of turns.
    side_by_side: int = 1
    rounds: int = 1
    # The round each sample was taken in (side by side: for ratio intervals), and why the
    # launch stopped measuring (executor.protocol.STOP_REASONS, or "minimum").
    sample_rounds: list[int] = dataclasses.field(default_factory=list)
    stopped_by: str = "minimum"
    # Shared by every result of one launch: which measurements were taken side by side.
    launch_id: str = ""
    # Where peak_memory_bytes comes from: each process's resident set, or (RunOptions.
    # memory_profile, CPU) the allocator's peak of live tensors (executor.memory_profile).
    peak_memory_source: str = "resident_set"
    # The machine's speed probe after each round (cluster.speed), rank 0's, in ms.
    probe_ms: list[float] = dataclasses.field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def ci95_ms(self) -> tuple[float, float]:
        """The median's distribution-free 95 % interval (``executor.protocol``)."""
        return median_interval(self.samples_ms)

    @property
    def ci_half_width(self) -> float:
        """Half that interval over the median (0.01: ±1 %; infinity under 6 samples)."""
        return relative_half_width(self.samples_ms)

    @property
    def compile_time_s(self) -> float | None:
        """First warm-up step minus a steady step, when blocks were compiled (else ``None``)."""
        if not self.strategy.op_fusion.compiled or not self.warmup_ms:
            return None
        return max(0.0, (self.warmup_ms[0] - self.median_ms) / 1e3)

    def env(self) -> dict[str, Any]:
        return {
            "torch": torch.__version__,
            "machine": platform.machine(),
            "processor": platform.processor(),
            "threads_per_rank": 1,
            "pinned": self.options.pin,
            "ranks_per_core": {str(k): v for k, v in ranks_per_core(self.rank_cores).items()},
            "allocator": dict(ALLOCATOR_ENV),
            "device": self.applied.get("device", self.options.device),
            "backend": self.applied.get("backend"),
            "rank_cores": {str(k): v for k, v in self.rank_cores.items()},
            "iters": self.options.iters,
            "warmup": self.options.warmup,
            "seed": self.options.seed,
            "optimizer": self.options.optimizer,
            "dropout": self.options.dropout,
            "warmup_ms": self.warmup_ms,
            "compile_time_s": self.compile_time_s,
            "side_by_side": self.side_by_side,
            "launch_id": self.launch_id,
            "rounds": self.rounds,
            "sample_rounds": self.sample_rounds,
            "stopped_by": self.stopped_by,
            "ci95_ms": list(self.ci95_ms),
            "ci_target": self.options.ci_target,
            "budget_s": self.options.budget_s,
            "probe_ms": statistics.median(self.probe_ms) if self.probe_ms else None,
        }

    def to_json(self) -> dict[str, Any]:
        samples = sorted(self.samples_ms)
        return {
            "model": self.model,
            "graph_hash": self.graph.graph_hash,
            "strategy": self.strategy.to_dict(),
            "world_size": self.options.world_size,
            "bandwidth": self.options.bandwidth or "loopback",
            "network": self.network,
            "device": self.options.device,
            "iteration_time_ms": {
                "median": self.median_ms,
                "ci95_ms": list(self.ci95_ms),
                "ci_half_width": _finite(self.ci_half_width),
                "stopped_by": self.stopped_by,
                "p10": _quantile(samples, 0.1),
                "p90": _quantile(samples, 0.9),
                "samples": self.samples_ms,
            },
            "losses": self.losses,
            "peak_memory_bytes": self.peak_memory_bytes,
            **(
                {"peak_memory_source": self.peak_memory_source}
                if self.peak_memory_source != "resident_set"
                else {}
            ),
            "applied": self.applied,
            "compile_time_s": self.compile_time_s,
            "env": self.env(),
        }


def _finite(value: float) -> float | None:
    """JSON has no infinity: an interval too wide to state is ``None``."""
    return value if value != float("inf") else None


def _quantile(ordered: list[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


MAX_SIDE_BY_SIDE = 16
__all__ = [
    "DEVICES",
    "MAX_SIDE_BY_SIDE",
    "RunOptions",
    "RunResult",
    "compare_training",
    "prepare_launch",
    "results_of",
    "run_training",
]


def run_training(
    spec: ModelSpec,
    strategy: Strategy,
    options: RunOptions,
    *,
    progress: Callable[[str], None] | None = None,
    extra_args: tuple[str, ...] = (),
) -> RunResult:
    """Train ``spec`` with ``strategy`` on ``options.world_size`` ranks and measure it.

    Raises:
        InvalidStrategyError: the strategy cannot run on this model and world size (before any
            process starts).
        InvalidOptionError: bad options.
        ClusterRunError: a rank failed or hung; every rank has been stopped.
    """
    return _launch(
        spec, [strategy], options, rounds=1, settle=0, progress=progress, extra_args=extra_args
    )[0]


def compare_training(
    spec: ModelSpec,
    strategies: Sequence[Strategy],
    options: RunOptions,
    *,
    rounds: int = 3,
    settle: int = 1,
    progress: Callable[[str], None] | None = None,
) -> list[RunResult]:
    """Measure ``strategies`` side by side: one launch, each warmed up, then rounds in which
    every strategy takes a turn of ``settle`` discarded and ``options.iters`` kept steps, in an
    order shuffled anew each round: at least ``rounds`` rounds, then more until the protocol's
    stopping rule holds for every strategy (``RunOptions``; ``budget_s`` 0: exactly
    ``rounds``).

    Every strategy sees the same machine at nearly the same moments, so a slow spell (this
    2-core VM has them: one launch's median can differ from the next's by 10 %) slows them all
    and their ratios stay; separate launches compare one spell with another. Each strategy has
    a model and optimizer of its own in every rank's process. Returns one result per strategy,
    in the order given; ``peak_memory_bytes`` is the process's, all strategies together.

    Raises:
        InvalidOptionError: no strategies or more than ``MAX_SIDE_BY_SIDE``, ``rounds`` < 1,
            ``settle`` < 0, or a trace asked for (one strategy's launch only).
        InvalidStrategyError, ClusterRunError: as ``run_training``.
    """
    if not 1 <= len(strategies) <= MAX_SIDE_BY_SIDE:
        raise InvalidOptionError(
            f"{len(strategies)} strategies to compare; allowed: 1 to {MAX_SIDE_BY_SIDE}"
        )
    for name, value, low in (("rounds", rounds, 1), ("settle", settle, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidOptionError(f"{name}({value!r}) must be an integer >= {low}")
    if options.trace:
        raise InvalidOptionError("trace is for one strategy's run; use run_training")
    return _launch(
        spec, list(strategies), options, rounds=rounds, settle=settle, progress=progress
    )


def prepare_launch(
    spec: ModelSpec,
    strategies: list[Strategy],
    options: RunOptions,
    *,
    rounds: int,
    settle: int,
    progress: Callable[[str], None],
    ranks_here: int | None = None,
) -> tuple[IterationGraph, dict[str, Any]]:
    """Check everything and build the ranks' config: the captured graph and the config."""
    options.check_devices(ranks_here=ranks_here)
    target = device_target(options.world_size, options.device)
    for strategy in strategies:  # every refusal before the graph is captured
        check(spec, strategy, target)
        check_fp8_library(strategy)
    progress(f"capturing the graph of {spec.label}")
    graph = capture_graph(spec, CaptureOptions(optimizer=_capture_optimizer(options.optimizer)))
    variants = [
        {
            "strategy": strategy.to_dict(),
            "buckets": [
                {"params": list(b.params), "grad_bytes": b.grad_bytes}
                for b in strategy.tensor_fusion.assign(graph.gradient_sizes)
            ],
        }
        for strategy in strategies
    ]
    config = {
        "spec": spec.to_dict(),
        "variants": variants,
        "frozen": graph.params_without_grad,
        "settle": settle,
        "iters": options.iters,
        "rule": options.rule(rounds=rounds).to_dict(),
        "seed": options.seed,
        "optimizer": options.optimizer,
        "dropout": options.dropout,
        "collective_timeout_s": options.collective_timeout_s,
        "device": options.device,
        "backend": options.resolved_backend,
        "trace": options.trace,
        "memory_profile": options.memory_profile,
    }
    return graph, config


def results_of(
    raw: Mapping[str, Any],
    *,
    spec: ModelSpec,
    graph: IterationGraph,
    strategies: Sequence[Strategy],
    options: RunOptions,
    network: str,
    rank_cores: dict[int, list[int]],
    wall_s: float,
) -> list[RunResult]:
    """The results of one launch from rank 0's result JSON (``rank_main``)."""
    launch_id = uuid.uuid4().hex[:16]
    return [
        RunResult(
            model=spec.label,
            graph=graph,
            strategy=strategy,
            options=options,
            samples_ms=[float(x) for x in mine["samples_ms"]],
            warmup_ms=[float(x) for x in mine["warmup_ms"]],
            losses=[float(x) for x in mine["losses"]],
            peak_memory_bytes=[int(x) for x in raw["peak_memory_bytes"]],
            peak_memory_source=str(raw.get("peak_memory_source", "resident_set")),
            applied=mine["applied"],
            network=network,
            rank_cores=rank_cores,
            wall_s=wall_s,
            trace=raw.get("trace"),
            side_by_side=len(strategies),
            rounds=int(raw["rounds"]),
            sample_rounds=[int(x) for x in mine["sample_rounds"]],
            stopped_by=str(raw["stopped_by"]),
            launch_id=launch_id,
            probe_ms=[float(x) for x in raw.get("probe_ms", [])],
        )
        for strategy, mine in zip(strategies, raw["variants"], strict=True)
    ]


def _launch(
    spec: ModelSpec,
    strategies: list[Strategy],
    options: RunOptions,
    *,
    rounds: int,
    settle: int,
    progress: Callable[[str], None] | None,
    extra_args: tuple[str, ...] = (),
) -> list[RunResult]:
    # Launches here follow the measurement protocol (executor.protocol).
    say = progress or (lambda message: None)
    graph, config = prepare_launch(
        spec, strategies, options, rounds=rounds, settle=settle, progress=say
    )
    with tempfile.TemporaryDirectory(prefix="ddlsim-run-") as tmp:
        config_path = Path(tmp) / "config.json"
        output = Path(tmp) / "result.json"
        config_path.write_text(json.dumps(config), encoding="utf-8")
        with contextlib.ExitStack() as stack:
            if options.bandwidth is None:
                # Loopback was asked for: the cluster's fallback warning does not apply.
                stack.enter_context(warnings.catch_warnings())
                warnings.simplefilter("ignore", LoopbackFallbackWarning)
            cluster = stack.enter_context(
                EmulatedCluster(
                    options.world_size,
                    bandwidth=options.bandwidth,
                    force_loopback=True if options.bandwidth is None else None,
                    pin_cores=options.pin,
                )
            )
            say(f"launching {options.world_size} rank(s) on {cluster.network}")
            launched = cluster.launch(
                "ddlsim.executor.rank_main",
                ["--config", str(config_path), "--output", str(output), *extra_args],
                env=ALLOCATOR_ENV,
                timeout_s=options.timeout_s,
                output_paths=[output],
                stdout_callback=say,
            )
        raw = json.loads(output.read_text(encoding="utf-8"))
    return results_of(
        raw,
        spec=spec,
        graph=graph,
        strategies=strategies,
        options=options,
        network=launched.network,
        rank_cores=launched.rank_cores,
        wall_s=launched.wall_s,
    )


def _capture_optimizer(name: str) -> Optimizer:
    if name == "sgd":
        return "sgd"
    return "adamw"
