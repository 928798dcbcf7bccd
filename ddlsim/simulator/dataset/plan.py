"""The batch file that measures the dataset: its jobs, in the order they run, and resuming it.

Generation is an ordinary batch (``ddlsim profile batch``), so it resumes where it stopped and
runs on any machine: :func:`plan_jobs` lists the link profiles (gloo collectives of every world
size and link rate), the kernel profiles (one rank, every micro-batch a rank will run) and the
fusion profiles (the blocks that compiled strategies compile, timed alone eager and compiled)
and the executor runs (every model under several strategies on every cluster setting, DDP's
defaults in each group, and a repeat of it in half of them to measure the noise). Runs come
last and round-robin over models and settings, so a batch cut short still covers every model
evenly. :func:`drop_done` leaves out of a plan what a dataset file already holds.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.simulator.dataset.entries import Dataset, spec_key
from ddlsim.simulator.dataset.pools import plan_kind

# (world size, link) of every run group: cpu-v2 ran both world sizes at 1 Gbit/s and unshaped;
# cpu-v3 at 1 and 4 Gbit/s (raw TCP on this machine follows a shaped link up to ~6 Gb/s).
SETTINGS: tuple[tuple[int, str], ...] = ((2, "1gbit"), (2, "none"), (4, "1gbit"), (4, "none"))
SETTINGS_V3: tuple[tuple[int, str], ...] = (
    (2, "1gbit"),
    (4, "1gbit"),
    (2, "4gbit"),
    (4, "4gbit"),
)
LINK_SIZES: tuple[int, ...] = tuple(4096 * 4**i for i in range(8))  # 4 KiB .. 64 MiB
# DeAR's strategies run the executor's ring on gloo, measured as it runs.
LINK_COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "sendrecv",
    "ring_reduce_scatter",
    "ring_all_gather",
)
# FSDP and tensor parallelism also gather and reduce-scatter.
PARALLEL_COLLECTIVES: tuple[str, ...] = (*LINK_COLLECTIVES, "all_gather", "reduce_scatter")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PlanOptions:
    """How much to measure: strategies per (model, setting) group besides DDP's defaults, and
    the executor's iterations per run.

    With ``side_by_side`` (cpu-v3) a group is one launch (a ``compare`` job): DDP's defaults
    and the group's strategies take turns of ``iters`` steps, at least ``rounds`` rounds, then
    more until every median's 95 % interval is within ``±ci_target`` or ``measure_budget_s`` a
    strategy is spent (the measurement protocol); no repeat runs (each run carries its
    interval). Without it (cpu-v2) every strategy is a launch of its own, ``iters`` steps.
    """

    per_group: int = 4
    iters: int = 5
    warmup: int = 2
    kernel_iters: int = 15
    fusion_iters: int = 10
    collectives: tuple[str, ...] = LINK_COLLECTIVES
    side_by_side: bool = False
    rounds: int = 3
    ci_target: float = 0.01
    measure_budget_s: float = 10.0

    def __post_init__(self) -> None:
        counts = (
            self.per_group,
            self.iters,
            self.warmup,
            self.kernel_iters,
            self.fusion_iters,
            self.rounds,
        )
        if min(counts) < 1:
            raise InvalidOptionError(
                f"per_group({self.per_group}), iters({self.iters}), warmup({self.warmup}), "
                f"kernel_iters({self.kernel_iters}), fusion_iters({self.fusion_iters}) and "
                f"rounds({self.rounds}) must all be >= 1"
            )
        if not 0 < self.ci_target < 1 or not self.measure_budget_s >= 0:
            raise InvalidOptionError(
                f"ci_target({self.ci_target}) must be in (0, 1) and "
                f"measure_budget_s({self.measure_budget_s}) >= 0"
            )


def plan_jobs(
    models: Sequence[ModelSpec],
    pools: Mapping[str, Sequence[Strategy]],
    settings: Sequence[tuple[int, str]] = SETTINGS,
    options: PlanOptions | None = None,
) -> list[dict[str, Any]]:
    """The batch jobs that measure the dataset (a ``jobs:`` list for ``ddlsim profile batch``).

    Group ``(model, setting)`` runs DDP's defaults and ``per_group`` strategies of the model's
    pool, taken in turn so that a model's groups together use as much of its pool as they can;
    odd groups run DDP's defaults once more with another seed (the repeat measures noise).

    Long: groups take the pools' strategies in turn against counters every group updates
    (positions in the pools, the kinds each setting lacks).
    """
    options = options or PlanOptions()
    jobs: list[dict[str, Any]] = []
    for world_size, bandwidth in dict.fromkeys(settings):
        jobs.append(
            {
                "kind": "collectives",
                "world_size": world_size,
                "bandwidth": bandwidth,
                "sizes": list(LINK_SIZES),
                "collectives": list(options.collectives),
            }
        )
    groups: list[tuple[ModelSpec, int, str, list[Strategy]]] = []
    for model_index, spec in enumerate(models):
        pool = list(pools[spec.label])
        for setting_index, (world_size, bandwidth) in enumerate(settings):
            start = (setting_index + model_index) * options.per_group
            chosen = [pool[(start + k) % len(pool)] for k in range(options.per_group)]
            fitting = [
                s for s in [Strategy(), *chosen] if _rank_batch(spec, s, world_size) is not None
            ]
            groups.append((spec, world_size, bandwidth, fitting))
    if options.side_by_side:
        _cover_every_kind(groups, pools)
    rank_batches: dict[str, set[int]] = {}
    for spec, world_size, _, strategies in groups:
        for strategy in strategies:
            rank_batches.setdefault(spec.label, set()).add(
                int(_rank_batch(spec, strategy, world_size) or 0)
            )
    by_label = {spec.label: spec for spec in models}
    for label, batches in rank_batches.items():
        for batch in sorted(batches, reverse=True):
            jobs.append(
                {
                    "kind": "kernels",
                    "model": by_label[label].to_dict(),
                    "batch_size": batch,
                    "iters": options.kernel_iters,
                }
            )
    # Fusion profiles of every block the model's pool compiles, at the micro-batches of the
    # compiled runs and of the first setting's data parallelism, the largest first for every
    # model, so a batch cut short still covers each model.
    fused: dict[str, dict[int, list[str]]] = {}
    for spec, world_size, _, strategies in groups:
        pooled = sorted({b for s in pools[spec.label] for b in s.op_fusion.compiled})
        if not pooled:
            continue
        at_batch = fused.setdefault(spec.label, {})
        if not at_batch:
            at_batch[int(_rank_batch(spec, Strategy(), settings[0][0]) or 0)] = pooled
        for strategy in strategies:
            if strategy.op_fusion.compiled:
                at_batch[int(_rank_batch(spec, strategy, world_size) or 0)] = pooled
    fusion_jobs = [
        (order, label, batch, compiled)
        for label, at_batch in fused.items()
        for order, (batch, compiled) in enumerate(sorted(at_batch.items(), reverse=True))
    ]
    for _, label, batch, compiled in sorted(fusion_jobs, key=lambda job: job[0]):
        jobs.append(
            {
                "kind": "fusion",
                "model": by_label[label].to_dict(),
                "batch_size": batch,
                "blocks": compiled,
                "iters": options.fusion_iters,
            }
        )
    if options.side_by_side:
        jobs.extend(_compare_jobs(groups, len(settings), options))
        return jobs
    run = {"iters": options.iters, "warmup": options.warmup}
    depth = max(len(g[3]) for g in groups)
    for slot in range(depth):
        for spec, world_size, bandwidth, strategies in groups:
            if slot < len(strategies):
                jobs.append(_run_job(spec, strategies[slot], world_size, bandwidth, run, seed=0))
    for index, (spec, world_size, bandwidth, _) in enumerate(groups):
        if index % 2:
            jobs.append(_run_job(spec, Strategy(), world_size, bandwidth, run, seed=1))
    return jobs


def _cover_every_kind(
    groups: list[tuple[ModelSpec, int, str, list[Strategy]]],
    pools: Mapping[str, Sequence[Strategy]],
) -> None:
    """Add to ``groups`` (in place) a strategy of every kind (``plan_kind``) that some model's
    pool has and that fits a setting where the picks in turn left it out: in the group of the
    first model it fits, among the groups of that setting holding the fewest strategies."""
    kinds = {plan_kind(s) for pool in pools.values() for s in pool}
    for setting in dict.fromkeys((g[1], g[2]) for g in groups):
        here = [g for g in groups if (g[1], g[2]) == setting]
        for kind in sorted(kinds - {plan_kind(s) for g in here for s in g[3]}):
            for spec, world_size, _, strategies in sorted(here, key=lambda g: len(g[3])):
                extra = next(
                    (
                        s
                        for s in pools[spec.label]
                        if plan_kind(s) == kind and _rank_batch(spec, s, world_size) is not None
                    ),
                    None,
                )
                if extra is not None:
                    strategies.append(extra)
                    break


def _compare_jobs(
    groups: Sequence[tuple[ModelSpec, int, str, list[Strategy]]],
    settings_count: int,
    options: PlanOptions,
) -> list[dict[str, Any]]:
    """One launch a group, DDP's defaults beside the group's strategies; in rounds that take
    every model once, each round on other settings, so that a batch cut short still covers
    every model and every setting evenly."""
    protocol = {
        "iters": options.iters,
        "warmup": options.warmup,
        "rounds": options.rounds,
        "ci_target": options.ci_target,
        "measure_budget_s": options.measure_budget_s,
        "seed": 0,
    }
    by_model: dict[str, list[tuple[ModelSpec, int, str, list[Strategy]]]] = {}
    for group in groups:
        by_model.setdefault(group[0].label, []).append(group)
    jobs = []
    for turn in range(settings_count):
        for model_index, model_groups in enumerate(by_model.values()):
            if turn >= len(model_groups):
                continue
            spec, world_size, bandwidth, strategies = model_groups[
                (model_index + turn) % len(model_groups)
            ]
            others = [s.to_dict() for s in strategies if s != Strategy()]
            where = {"model": spec.to_dict(), "world_size": world_size, "bandwidth": bandwidth}
            if not others:  # nothing else fits this setting: DDP's defaults alone
                jobs.append({"kind": "run", **where, "strategy": {}, **_single(protocol)})
                continue
            jobs.append({"kind": "compare", **where, "strategies": others, **protocol})
    return jobs


def _single(protocol: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in protocol.items() if k != "rounds"}


def _rank_batch(spec: ModelSpec, strategy: Strategy, world_size: int) -> int | None:
    try:
        parts = strategy.parallel.resolve_dp(world_size) * strategy.parallel.micro_batches
    except InvalidStrategyError:  # the plan needs more (or other) ranks than the setting has
        return None
    batch = spec.inputs.batch_size
    if batch % parts:
        return None
    plan = strategy.parallel
    if "batch" in plan.layers and (batch // parts) % plan.tp:
        return None  # batch blocks split each micro-batch tp ways
    if "tp" in plan.stages and world_size // (plan.pp * plan.tp) < 2:
        return None  # a tensor-parallel stage splits over its data-parallel ranks
    return batch // parts


def _run_job(
    spec: ModelSpec,
    strategy: Strategy,
    world_size: int,
    bandwidth: str,
    run: Mapping[str, int],
    *,
    seed: int,
) -> dict[str, Any]:
    return {
        "kind": "run",
        "model": spec.to_dict(),
        "strategy": strategy.to_dict(),
        "world_size": world_size,
        "bandwidth": bandwidth,
        "seed": seed,
        **run,
    }


def drop_done(jobs: Sequence[Mapping[str, Any]], done: Dataset) -> list[dict[str, Any]]:
    """``jobs`` (a plan) less those whose results ``done`` already holds: link fits of every
    collective asked for, kernel and fusion profiles at the batch size, every strategy of a run
    or side-by-side launch (DDP's defaults included) on the model, world size and link. A
    collection resumes from its file this way when the store it wrote to is gone."""
    measured = {
        (spec_key(r.model), r.world_size, r.bandwidth, r.strategy.to_json()) for r in done.runs
    }
    fitted = {(f.collective, f.world_size, f.bandwidth) for f in done.links}
    out = []
    for job in jobs:
        kind = job["kind"]
        if kind == "collectives":
            finished = all(
                (c, job["world_size"], job["bandwidth"]) in fitted for c in job["collectives"]
            )
        elif kind in ("kernels", "fusion"):
            label = ModelSpec.from_dict(job["model"]).label
            held = done.kernels if kind == "kernels" else done.fusion
            finished = (label, int(job["batch_size"])) in held
        else:
            spec = spec_key(ModelSpec.from_dict(job["model"]))
            raw = job["strategies"] if kind == "compare" else [job["strategy"]]
            strategies = [Strategy(), *map(Strategy.from_dict, raw)]
            if kind == "run":
                strategies = strategies[1:]
            finished = all(
                (spec, job["world_size"], job["bandwidth"], s.to_json()) in measured
                for s in strategies
            )
        if not finished:
            out.append(dict(job))
    return out
