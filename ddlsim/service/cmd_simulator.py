"""``ddlsim simulator validate``: predict strategies, run them for real, compare.

For any model spec: the links are profiled (gloo collectives on the emulated cluster) and the
rank's micro-batch kernel-profiled unless the store has both; then K diverse strategies (DDP's
defaults first) run through the executor and through the simulator, and the first one runs a
second time to show the measurement noise the errors should be read against.
"""

import argparse
import statistics
from typing import Any

from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store, add_collective_profile, add_graph, add_prediction
from ddlsim.data.zoo import resolve_model
from ddlsim.executor.plan import model_supports
from ddlsim.executor.run import RunOptions, run_training
from ddlsim.profiler.batch import collective_records
from ddlsim.profiler.cluster import ClusterRunError, remove_stale_namespaces
from ddlsim.profiler.collectives import profile_collectives
from ddlsim.service import cmd_dataset, cmd_train
from ddlsim.service.cmd_predict import cost_model_for, normalized_bandwidth, predict_on_store
from ddlsim.service.cmd_run import add_result
from ddlsim.service.output import (
    add_protocol_arguments,
    emit_json,
    positive_int,
    progress,
    protocol_options,
)
from ddlsim.simulator.evaluate import accuracy

# Diverse on purpose: DDP's own buckets, the executor's hooks at several granularities, DeAR,
# gradient accumulation, FSDP, tensor parallelism, pipelines. ``validate --strategies K`` takes
# the first K that the model, the world size and the batch allow.
CANDIDATES: tuple[dict[str, Any], ...] = (
    {},
    {"tensor_fusion": {"bucket_caps_mb": [65536], "implementation": "hooks"}},
    {"parallel": {"fsdp": True}},
    {"tensor_fusion": {"bucket_cap_mb": 1, "implementation": "hooks"}},
    {"tensor_fusion": {"bucket_cap_mb": 4, "dear": True}},
    {"parallel": {"tp": 2}},
    {"parallel": {"pp": 2, "micro_batches": 2, "pp_schedule": "gpipe"}},
    {"tensor_fusion": {"bucket_cap_mb": 4, "implementation": "hooks"}},
    {"parallel": {"micro_batches": 2}},
    {"parallel": {"pp": 2, "micro_batches": 4, "pp_schedule": "1f1b"}},
    {"tensor_fusion": {"bucket_cap_mb": 1, "dear": True}},
    {"tensor_fusion": {"bucket_cap_mb": 0.25, "implementation": "hooks"}},
    {"tensor_fusion": {"bucket_caps_mb": [1, 4]}},
    {"tensor_fusion": {"bucket_caps_mb": [65536], "dear": True}},
)
# Collective sizes for the link profile: 4 KiB to 64 MiB in powers of 4.
LINK_SIZES = [4096 * 4**i for i in range(9)]
LINK_COLLECTIVES = ("all_reduce", "sendrecv")
# FSDP and tensor parallelism also gather and reduce-scatter.
PLAN_COLLECTIVES = ("all_gather", "reduce_scatter")


def strategies_for(spec: ModelSpec, world_size: int, count: int) -> list[Strategy]:
    """The first ``count`` candidates the model supports whose plan fits the world size and
    whose micro-batches divide the global batch."""
    chosen = []
    for raw in CANDIDATES:
        strategy = Strategy.from_dict(raw)
        plan = strategy.parallel
        try:
            parts = plan.resolve_dp(world_size) * plan.micro_batches
        except InvalidStrategyError:
            continue
        if spec.inputs.batch_size % parts or not model_supports(spec, strategy):
            continue
        chosen.append(strategy)
        if len(chosen) == count:
            break
    return chosen


def _link_profiles(
    store: Store, world_size: int, bandwidth: str, strategies: list[Strategy]
) -> None:
    """Profile the link's collectives unless the store has fits of those the strategies use."""
    have = {
        p.collective
        for p in store.collective_profiles(
            backend="gloo", world_size=world_size, bandwidth=bandwidth
        )
    }
    needed = set(LINK_COLLECTIVES)
    if any(s.parallel.fsdp or s.parallel.tp > 1 for s in strategies):
        needed |= set(PLAN_COLLECTIVES)
    if needed <= have:
        return
    progress(f"no collective profile of {world_size} ranks at {bandwidth} yet: profiling it")
    profile = profile_collectives(
        world_size=world_size,
        bandwidth=bandwidth,
        sizes=LINK_SIZES,
        collectives=sorted(needed),
        progress=progress,
    )
    with store.transaction() as session:
        for record in collective_records(profile):
            add_collective_profile(session, profile=record)


def cmd_validate(args: argparse.Namespace) -> int:
    spec = resolve_model(args.model).with_inputs(
        batch_size=args.batch_size, seq_len=args.seq_len, image_size=args.image_size
    )
    bandwidth = normalized_bandwidth(args.bandwidth)
    strategies = strategies_for(spec, args.world_size, args.strategies)
    if not strategies:
        raise InvalidOptionError(
            f"batch_size({spec.inputs.batch_size}) does not split evenly over "
            f"world_size({args.world_size}) ranks; no strategy can run"
        )
    if len(strategies) < args.strategies:
        progress(f"only {len(strategies)} candidate strategies fit batch {spec.inputs.batch_size}")
    remove_stale_namespaces()
    rows: list[dict[str, Any]] = []
    options = RunOptions(world_size=args.world_size, bandwidth=bandwidth, **protocol_options(args))
    with Store.open(args.db) as store:
        if args.world_size > 1:
            _link_profiles(store, args.world_size, bandwidth, strategies)
        cost_model = cost_model_for(args.simulator)
        first_ms: float | None = None
        repeat_ms: float | None = None
        for index, strategy in enumerate([*strategies, strategies[0]]):
            predicted, _, _ = predict_on_store(
                store,
                spec,
                strategy,
                world_size=args.world_size,
                bandwidth=bandwidth,
                cost_model=cost_model,
                profile_iters=args.profile_iters,
            )
            label = strategy.to_json()
            progress(f"running {index + 1}/{len(strategies) + 1}: {label}")
            try:
                measured = run_training(spec, strategy, options)
            except ClusterRunError as exc:
                progress(f"run failed, left out: {exc}")
                continue
            with store.transaction() as session:
                add_result(session, measured)
                add_graph(session, graph=predicted.graph)
                add_prediction(session, prediction=predicted.record())
            if index == 0:
                first_ms = measured.median_ms
            if index == len(strategies):
                repeat_ms = measured.median_ms
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
        "world_size": args.world_size,
        "bandwidth": bandwidth,
        "simulator_version": predicted.simulator_version,
        "rows": rows,
    }
    if len(rows) >= 2:
        payload.update(
            accuracy([r["predicted_ms"] for r in rows], [r["measured_ms"] for r in rows]).to_json()
        )
    payload["noise_mape"] = (
        abs(repeat_ms - first_ms) / statistics.fmean([repeat_ms, first_ms])
        if repeat_ms is not None and first_ms is not None
        else None
    )
    if args.json:
        emit_json(payload)
    else:
        _print_table(payload)
    return 0


def _print_table(payload: dict[str, Any]) -> None:
    print(
        f"{payload['model']}, {payload['world_size']} ranks, {payload['bandwidth']} "
        f"({payload['simulator_version']})"
    )
    for row in payload["rows"]:
        error = row["predicted_ms"] / row["measured_ms"] - 1
        print(
            f"  {row['predicted_ms']:9.1f} ms predicted {row['measured_ms']:9.1f} ms measured "
            f"{error:+7.1%}  {Strategy.from_dict(row['strategy']).to_json()}"
        )
    for key in ("mape", "p90_ape", "kendall_tau", "pair_accuracy", "noise_mape"):
        value = payload.get(key)
        print(f"  {key:<14}{'-' if value is None else f'{value:.3f}'}")


def register(sub: Any) -> None:
    simulator = sub.add_parser(
        "simulator", help="train, evaluate and check the simulator against real runs"
    )
    commands = simulator.add_subparsers(dest="simulator_command", required=True)
    validate = commands.add_parser(
        "validate", help="predict and run K strategies of a model, and compare"
    )
    validate.add_argument("model", metavar="MODEL", help="zoo name, spec file or inline JSON")
    validate.add_argument("--world-size", type=positive_int, default=2)
    validate.add_argument("--bandwidth", default="1gbit", help="link rate per host, or none")
    validate.add_argument("--strategies", type=positive_int, default=6)
    add_protocol_arguments(validate, iters=6)
    validate.add_argument("--profile-iters", type=positive_int, default=10)
    validate.add_argument("--batch-size", type=positive_int, help="global batch size")
    validate.add_argument("--seq-len", type=positive_int)
    validate.add_argument("--image-size", type=positive_int)
    validate.add_argument(
        "--simulator",
        metavar="replay|CKPT",
        help="as for ddlsim predict (default: yours, else the shipped cost model)",
    )
    validate.add_argument("--db", help="store URL (default: $DDLSIM_DB or the user data dir)")
    validate.add_argument("--json", action="store_true", help="print JSON")
    validate.set_defaults(handler=cmd_validate)
    cmd_dataset.register(commands)
    cmd_train.register(commands)
