"""``ddlsim run MODEL --strategy S --world-size N``: train for real, measure, store."""

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from ddlsim.data.errors import one_line
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import (
    MeasurementRecord,
    Store,
    add_graph,
    add_measurement,
    add_strategy,
    strategy_hash,
)
from ddlsim.data.zoo import resolve_model
from ddlsim.executor.run import RunOptions, RunResult, compare_training, run_training
from ddlsim.profiler.batch import Job
from ddlsim.profiler.cluster import ClusterRunError, remove_stale_namespaces
from ddlsim.service.output import (
    add_protocol_arguments,
    emit_json,
    format_interval,
    human_bytes,
    positive_int,
    progress,
    protocol_options,
)

EXIT_RUN_FAILED = 1


def measurement_record(result: RunResult) -> MeasurementRecord:
    return MeasurementRecord(
        model=result.model,
        graph_hash=result.graph.graph_hash,
        strategy_hash=strategy_hash(result.strategy),
        world_size=result.options.world_size,
        bandwidth=result.options.bandwidth or "loopback",
        network=result.network,
        iteration_time_ms=result.samples_ms,
        peak_memory_bytes=result.peak_memory_bytes,
        applied=result.applied,
        env=result.env(),
        losses=result.losses,
    )


def _job_spec_and_options(settings: dict[str, Any]) -> tuple[ModelSpec, RunOptions]:
    """An executor job's model at its inputs and its run options (the keys are taken out of
    ``settings``)."""
    model = settings.pop("model")
    spec = resolve_model(json.dumps(model) if isinstance(model, Mapping) else str(model))
    spec = spec.with_inputs(
        batch_size=settings.pop("batch_size", None),
        seq_len=settings.pop("seq_len", None),
        image_size=settings.pop("image_size", None),
    )
    bandwidth = settings.pop("bandwidth", None)
    options = RunOptions(
        world_size=int(settings.pop("world_size", 1)),
        bandwidth=None if bandwidth is None else str(bandwidth),
        iters=int(settings.pop("iters", 10)),
        warmup=int(settings.pop("warmup", 2)),
        ci_target=float(settings.pop("ci_target", 0.01)),
        budget_s=float(settings.pop("measure_budget_s", 30.0)),
        seed=int(settings.pop("seed", 0)),
        optimizer=str(settings.pop("optimizer", "adamw")),
        device=str(settings.pop("device", "cpu")),
        backend=None if (backend := settings.pop("backend", None)) is None else str(backend),
    )
    return spec, options


def _job_strategy(raw: Any) -> Strategy:
    if isinstance(raw, Mapping):
        return Strategy.from_dict(raw)
    return Strategy.parse(str(raw)) if raw else Strategy()


def run_executor_job(job: Job) -> Callable[[Any], None]:
    """One ``kind: run`` batch job; the callback stores graph, strategy and measurement."""
    settings = dict(job.settings)
    strategy = _job_strategy(settings.pop("strategy", None))
    spec, options = _job_spec_and_options(settings)
    result = run_training(spec, strategy, options)

    def write(session: Any) -> None:
        add_result(session, result)

    return write


def run_compare_job(job: Job) -> Callable[[Any], None]:
    """One ``kind: compare`` batch job: DDP's defaults and the job's strategies side by side in
    one launch (a strategy equal to DDP's defaults is the reference itself, run once); the
    callback stores every measurement, all with the launch's id."""
    settings = dict(job.settings)
    strategies = [Strategy()]
    for raw in settings.pop("strategies"):
        strategy = _job_strategy(raw)
        if strategy not in strategies:
            strategies.append(strategy)
    rounds = int(settings.pop("rounds", 3))
    spec, options = _job_spec_and_options(settings)
    results = compare_training(spec, strategies, options, rounds=rounds)

    def write(session: Any) -> None:
        for result in results:
            add_result(session, result)

    return write


def add_result(session: Any, result: RunResult) -> int:
    add_graph(session, graph=result.graph)
    add_strategy(session, strategy=result.strategy)
    return add_measurement(session, measurement=measurement_record(result))


def cmd_run(args: argparse.Namespace) -> int:
    spec = resolve_model(args.model).with_inputs(
        batch_size=args.batch_size, seq_len=args.seq_len, image_size=args.image_size
    )
    strategy = Strategy.parse(args.strategy) if args.strategy else Strategy()
    options = RunOptions(
        world_size=args.world_size,
        bandwidth=args.bandwidth,
        **protocol_options(args),
        seed=args.seed,
        optimizer=args.optimizer,
        dropout=args.dropout,
        device=args.device,
        backend=args.backend,
        timeout_s=args.timeout,
        collective_timeout_s=min(args.timeout, args.collective_timeout),
    )
    remove_stale_namespaces()  # left by runs whose process was killed outright
    with Store.open(args.db) as store:
        try:
            result = run_training(spec, strategy, options, progress=progress)
        except ClusterRunError as exc:
            print(f"ddlsim: error: run failed: {one_line(exc, limit=2000)}", file=sys.stderr)
            return EXIT_RUN_FAILED
        # One transaction: the graph, the strategy and the measurement land together or not.
        with store.transaction() as session:
            measurement_id = add_result(session, result)
    payload: dict[str, Any] = {**result.to_json(), "id": measurement_id, "db": store.url}
    if args.json:
        emit_json(payload)
    else:
        _print_summary(result, measurement_id, store.url)
    return 0


def _print_summary(result: RunResult, measurement_id: int, url: str) -> None:
    times = result.to_json()["iteration_time_ms"]
    applied = result.applied
    print(
        f"{result.model} on {result.options.world_size} rank(s) "
        f"({applied.get('device', result.options.device)}), "
        f"{result.options.bandwidth or 'loopback'} ({result.network})\n"
        f"  iteration   {times['median']:.1f} ms median, 95 % interval "
        f"{format_interval(times['ci95_ms'])} (p10 {times['p10']:.1f}, p90 {times['p90']:.1f}) "
        f"over {len(result.samples_ms)} iterations, stopped by {result.stopped_by}\n"
        f"  placement   {_placement_line(result.rank_cores)}\n"
        f"  losses      {', '.join(f'{x:.4f}' for x in result.losses)}\n"
        f"  memory      peak {human_bytes(max(result.peak_memory_bytes))} per rank\n"
        f"  applied     plan {_plan_line(applied)}, "
        f"collectives {', '.join(applied.get('collectives', [])) or 'none'}"
    )
    if result.compile_time_s is not None:
        print(f"  compile     {result.compile_time_s:.1f} s (kept out of iteration time)")
    print(f"  stored      measurement {measurement_id} in {url}")


def _placement_line(rank_cores: Mapping[int, list[int]]) -> str:
    return ", ".join(
        f"rank {rank} on core{'s' if len(cores) > 1 else ''} {','.join(map(str, cores))}"
        for rank, cores in sorted(rank_cores.items())
    )


def _plan_line(applied: dict[str, Any]) -> str:
    plan = applied.get("plan")
    if plan == "pipeline":
        return (
            f"pipeline ({len(applied['stages'])} stages, {applied['schedule']}, "
            f"{applied['micro_batches']} micro-batches, dp {applied['dp']})"
        )
    if plan == "tp":
        return f"tp {applied['tp']} x dp {applied['dp']}"
    return f"{plan}, {len(applied.get('buckets', []))} buckets"


def register(sub: Any) -> None:
    run = sub.add_parser(
        "run", help="train a model with a strategy on real torch.distributed ranks, measure it"
    )
    run.add_argument("model", metavar="MODEL", help="zoo name, spec file or inline JSON")
    run.add_argument("--strategy", help="strategy JSON or file (default: PyTorch DDP's defaults)")
    run.add_argument("--world-size", type=positive_int, default=1)
    run.add_argument(
        "--bandwidth",
        help="run on an emulated cluster with this link rate per host (1gbit, 100mbit, 10gbit, "
        "none); without it the ranks share loopback",
    )
    run.add_argument(
        "--device",
        default="cpu",
        help="cpu, or cuda: rank r on GPU r of this machine (default: cpu)",
    )
    run.add_argument(
        "--backend",
        help="process-group backend: gloo or nccl (default: nccl on cuda, gloo on cpu)",
    )
    add_protocol_arguments(run)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--optimizer", default="adamw", help="adamw or sgd")
    run.add_argument(
        "--dropout",
        action="store_true",
        help="keep the model's dropout (off by default, so losses compare across plans)",
    )
    run.add_argument("--batch-size", type=positive_int, help="global batch size")
    run.add_argument("--seq-len", type=positive_int)
    run.add_argument("--image-size", type=positive_int)
    run.add_argument("--timeout", type=float, default=1800.0, help="whole run, seconds")
    run.add_argument(
        "--collective-timeout",
        type=float,
        default=300.0,
        help="a collective waiting longer fails its rank (a hung rank), seconds",
    )
    run.add_argument("--db", help="store URL (default: $DDLSIM_DB or the user data dir)")
    run.add_argument("--json", action="store_true", help="print JSON")
    run.set_defaults(handler=cmd_run)
