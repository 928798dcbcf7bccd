"""Check the simulator against real runs of any model: predict strategies, run them, compare.

The links are profiled (gloo collectives on the emulated cluster) and the rank's micro-batch
kernel-profiled unless the store has both; then K diverse strategies (DDP's defaults first) are
predicted and run side by side through the executor, with the first a second time to show the
measurement noise the errors should be read against.
"""

import statistics
from typing import Any

from ddlsim.cluster import ClusterRunError
from ddlsim.cluster.launcher import LocalLauncher
from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.data.store import Store, add_graph, add_prediction
from ddlsim.executor.jobs import CompareJob, RunJob
from ddlsim.executor.run import RunOptions, RunResult
from ddlsim.plans.feasibility import model_supports
from ddlsim.plans.tp_plans import check_layouts
from ddlsim.simulator.cost_model import load_cost_model
from ddlsim.simulator.costs import uses_ring
from ddlsim.simulator.evaluate import accuracy
from ddlsim.workflows.execute import add_result
from ddlsim.workflows.predict import predict_on_store
from ddlsim.workflows.profiles import (
    LINK_COLLECTIVES,
    PLAN_COLLECTIVES,
    RING_COLLECTIVES,
    normalized_bandwidth,
    profile_link,
)
from ddlsim.workflows.requests import Progress, ValidateRequest, no_progress

# Diverse on purpose: DDP's own buckets, the executor's hooks at several granularities, DeAR,
# gradient accumulation, FSDP, tensor parallelism, pipelines. A validation of K strategies
# takes the first K that the model, the world size and the batch allow.
# A placeholder in ``CANDIDATES``: per-layer placements made for each model's blocks.
MIXED_LAYERS = "tp, then batch"
CANDIDATES: tuple[dict[str, Any], ...] = (
    {},
    {"tensor_fusion": {"bucket_caps_mb": [65536], "implementation": "hooks"}},
    {"parallel": {"fsdp": True}},
    {"tensor_fusion": {"bucket_cap_mb": 1, "implementation": "hooks"}},
    {"tensor_fusion": {"bucket_cap_mb": 4, "dear": True}},
    {"parallel": {"tp": 2}},
    {"parallel": {"tp": 2, "layers": MIXED_LAYERS, "vocab": "replicate"}},
    {"parallel": {"pp": 2, "micro_batches": 2, "pp_schedule": "gpipe"}},
    {"tensor_fusion": {"bucket_cap_mb": 4, "implementation": "hooks"}},
    {"parallel": {"micro_batches": 2}},
    {"parallel": {"pp": 2, "micro_batches": 4, "pp_schedule": "1f1b"}},
    {"tensor_fusion": {"bucket_cap_mb": 1, "dear": True}},
    {"tensor_fusion": {"bucket_cap_mb": 0.25, "implementation": "hooks"}},
    {"tensor_fusion": {"bucket_caps_mb": [1, 4]}},
    {"tensor_fusion": {"bucket_caps_mb": [65536], "dear": True}},
)
# Collective sizes for the link profile: 4 KiB to 256 MiB in powers of 4.
LINK_SIZES = [4096 * 4**i for i in range(9)]


def validate(
    request: ValidateRequest, store: Store, progress: Progress = no_progress
) -> dict[str, Any]:
    """Every strategy's prediction beside its measured median and interval (``rows``), the
    aggregate errors (MAPE, p90, Kendall's tau, pair accuracy) over two rows or more, the
    error of each predicted speed-up over DDP's defaults (``speedup_error``: median, p90 and
    count of ``|predicted / measured - 1|``, what a search acts on) and the first strategy's
    repeat difference (``noise_mape``). Runs and predictions are stored.

    The strategies and a repeat of the first run side by side in one launch under the
    measurement protocol (``compare_training``), so that the speed-ups are ratios of one launch
    and the repeat shows the noise they carry; where a strategy fails that launch, each runs in
    a launch of its own (``side_by_side`` false) and the failing ones are left out.

    Raises:
        InvalidOptionError: no candidate strategy fits the batch and the world size.

    Long: the workflow's steps in the order they run (profiles, predictions, the side-by-side
    launch, the errors).
    """
    spec = request.model
    bandwidth = normalized_bandwidth(request.bandwidth)
    strategies = strategies_for(spec, request.world_size, request.strategies)
    if not strategies:
        raise InvalidOptionError(
            f"batch_size({spec.inputs.batch_size}) does not split evenly over "
            f"world_size({request.world_size}) ranks; no strategy can run"
        )
    if len(strategies) < request.strategies:
        progress(
            None, f"only {len(strategies)} candidate strategies fit batch {spec.inputs.batch_size}"
        )
    options = RunOptions(
        world_size=request.world_size, bandwidth=bandwidth, **request.measure.run_options()
    )
    if request.world_size > 1:
        _link_profiles(store, request.world_size, bandwidth, strategies, progress)
    cost_model = load_cost_model(request.simulator)
    predictions = []
    for strategy in strategies:
        predicted, _, _ = predict_on_store(
            store,
            spec,
            strategy,
            world_size=request.world_size,
            bandwidth=bandwidth,
            cost_model=cost_model,
            profile_iters=request.profile_iters,
            progress=progress,
        )
        predictions.append(predicted)
    runs, side_by_side = _measure(spec, [*strategies, strategies[0]], options, progress)
    with store.transaction() as session:
        for index, run in enumerate(runs):
            if run is None:
                continue
            add_result(session, run)
            if index < len(strategies):
                add_graph(session, graph=predictions[index].graph)
                add_prediction(session, prediction=predictions[index].record())
    rows: list[dict[str, Any]] = []
    for strategy, predicted, measured in zip(strategies, predictions, runs, strict=False):
        if measured is None:
            continue
        rows.append(
            {
                "strategy": strategy.to_dict(),
                "predicted_ms": predicted.iteration_time_ms,
                "measured_ms": measured.median_ms,
                "measured_ci95_ms": list(measured.ci95_ms),
                "replay_ms": predicted.replay_ms,
                "breakdown": predicted.breakdown(),
            }
        )
    payload: dict[str, Any] = {
        "model": spec.label,
        "world_size": request.world_size,
        "bandwidth": bandwidth,
        "simulator_version": predictions[0].simulator_version,
        "side_by_side": side_by_side,
        "rows": rows,
    }
    if len(rows) >= 2:
        payload.update(
            accuracy([r["predicted_ms"] for r in rows], [r["measured_ms"] for r in rows]).to_json()
        )
    payload["speedup_error"] = _speedup_error(rows, strategies[0])
    first, repeat = runs[0], runs[-1]
    payload["noise_mape"] = (
        abs(repeat.median_ms - first.median_ms)
        / statistics.fmean([repeat.median_ms, first.median_ms])
        if repeat is not None and first is not None
        else None
    )
    return payload


def _measure(
    spec: ModelSpec, strategies: list[Strategy], options: RunOptions, progress: Progress
) -> tuple[list[RunResult | None], bool]:
    """The strategies' runs, side by side in one launch (``True``), else one launch each with
    the failing ones ``None`` (``False``)."""
    progress(0.1, f"running {len(strategies)} strategies side by side")
    launcher = LocalLauncher()
    job = CompareJob(spec=spec, strategies=tuple(strategies), options=options, rounds=3)
    try:
        return list(launcher.launch(job)), True
    except ClusterRunError as exc:
        progress(None, f"the side-by-side launch failed ({exc}); running each alone")
    runs: list[RunResult | None] = []
    for index, strategy in enumerate(strategies):
        progress(index / len(strategies), f"running {index + 1}/{len(strategies)} alone")
        try:
            runs.append(launcher.launch(RunJob(spec=spec, strategy=strategy, options=options)))
        except ClusterRunError as exc:
            progress(None, f"run failed, left out: {exc}")
            runs.append(None)
    return runs, False


def _speedup_error(rows: list[dict[str, Any]], baseline: Strategy) -> dict[str, Any]:
    """The median and 90th percentile of ``|predicted / measured - 1|`` of each row's speed-up
    over the baseline's row, and how many rows there are (none without the baseline)."""
    base = next((r for r in rows if r["strategy"] == baseline.to_dict()), None)
    errors = sorted(
        abs(
            (base["predicted_ms"] / row["predicted_ms"])
            / (base["measured_ms"] / row["measured_ms"])
            - 1
        )
        for row in rows
        if base is not None and row is not base
    )
    if not errors:
        return {"median": None, "p90": None, "runs": 0}
    return {
        "median": statistics.median(errors),
        "p90": errors[min(len(errors) - 1, round(0.9 * (len(errors) - 1)))],
        "runs": len(errors),
    }


def _mixed_layers(spec: ModelSpec, raw: dict[str, Any]) -> dict[str, Any] | None:
    """``raw`` with its ``MIXED_LAYERS`` made concrete for ``spec``: the first half of the
    blocks ``tp``, the rest ``batch``; ``None`` for a model without a tensor-parallel plan or
    with fewer than two blocks."""
    parallel = raw["parallel"]
    try:
        blocks = check_layouts(spec, ParallelPlan(tp=parallel["tp"]), rank_batch=None)
    except InvalidStrategyError:
        return None
    if len(blocks) < 2:
        return None
    half = len(blocks) // 2
    layers = ["tp"] * half + ["batch"] * (len(blocks) - half)
    return {**raw, "parallel": {**parallel, "layers": layers}}


def strategies_for(spec: ModelSpec, world_size: int, count: int) -> list[Strategy]:
    """The first ``count`` candidates the model supports whose plan fits the world size and
    whose micro-batches divide the global batch."""
    chosen = []
    for candidate in CANDIDATES:
        mixed = candidate.get("parallel", {}).get("layers") == MIXED_LAYERS
        raw = _mixed_layers(spec, candidate) if mixed else candidate
        if raw is None:
            continue
        strategy = Strategy.from_dict(raw)
        if not strategy.parallel.fits(spec.inputs.batch_size, world_size):
            continue
        if not model_supports(spec, strategy):
            continue
        plan = strategy.parallel
        if plan.per_layer:
            rank_batch = plan.rank_batch_size(spec.inputs.batch_size, world_size)
            try:
                check_layouts(spec, plan, rank_batch=rank_batch)
            except InvalidStrategyError:  # batch blocks tp cannot split here
                continue
        chosen.append(strategy)
        if len(chosen) == count:
            break
    return chosen


def _link_profiles(
    store: Store,
    world_size: int,
    bandwidth: str,
    strategies: list[Strategy],
    progress: Progress,
) -> None:
    """Profile the link's collectives unless the store has fits of those the strategies use."""
    needed = set(LINK_COLLECTIVES)
    if any(s.parallel.fsdp or s.parallel.tp > 1 for s in strategies):
        needed |= set(PLAN_COLLECTIVES)
    if any(uses_ring(s, "gloo") for s in strategies):
        needed |= set(RING_COLLECTIVES)
    profile_link(
        store,
        world_size=world_size,
        bandwidth=bandwidth,
        collectives=sorted(needed),
        sizes=LINK_SIZES,
        progress=progress,
    )
