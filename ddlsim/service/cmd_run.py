"""``ddlsim run MODEL --strategy S --world-size N``: train for real, measure, store
(:mod:`ddlsim.workflows.execute`); with ``--strategy`` given more than once, the strategies run
side by side in one launch."""

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from ddlsim.cluster import ClusterRunError
from ddlsim.data.errors import one_line
from ddlsim.data.store import mask_url
from ddlsim.executor.run import RunOptions, RunResult
from ddlsim.service import output
from ddlsim.workflows.execute import Executed
from ddlsim.workflows.launched import execute_launched, execute_side_by_side
from ddlsim.workflows.requests import ExecuteRequest, MeasureSettings, defaults

EXIT_RUN_FAILED = 1
DEFAULTS = defaults(RunOptions)


def cmd_run(args: argparse.Namespace) -> int:
    launcher = output.launcher_from(args)
    launcher.check_link(args.bandwidth)
    asked = None if args.world_size == DEFAULTS["world_size"] else args.world_size
    options = output.request_from(
        args,
        RunOptions,
        renames={"timeout_s": "timeout", "budget_s": "measure_budget_s"},
        collective_timeout_s=min(args.timeout, args.collective_timeout),
        world_size=launcher.ranks(asked, default=DEFAULTS["world_size"]),
    )
    strategies = output.strategy_arguments(args)
    request = output.request_from(args, ExecuteRequest, strategy=strategies[0], options=options)
    for strategy in strategies[1:]:
        ExecuteRequest(model=request.model, strategy=strategy, options=options)  # checks it
    extra: dict[str, Any] = {}
    try:
        if len(strategies) > 1:
            done = execute_side_by_side(
                request,
                strategies,
                rounds=args.rounds,
                launcher=launcher,
                db=args.db,
                progress=output.stderr_progress,
                on_submit=output.slurm_job_printer(extra),
            )
        else:
            launched = execute_launched(
                request,
                launcher=launcher,
                db=args.db,
                progress=output.stderr_progress,
                on_submit=output.slurm_job_printer(extra),
            )
            done = None if launched is None else [launched]
    except ClusterRunError as exc:
        print(f"ddlsim: error: run failed: {one_line(exc, limit=2000)}", file=sys.stderr)
        return EXIT_RUN_FAILED
    if done is None:
        return 0  # a rank that follows: rank 0 reports and stores
    if args.json:
        payloads = [_payload(executed, launcher.name, extra) for executed in done]
        output.emit_json(payloads if len(strategies) > 1 else payloads[0])
        return 0
    fastest = min(executed.result.median_ms for executed in done)
    for executed in done:
        _print_summary(executed.result, executed.measurement_id, mask_url(executed.store_url))
        if len(done) > 1:
            print(
                f"  side by side {executed.result.median_ms / fastest:.3f}x the fastest's median"
            )
    return 0


def _payload(executed: Executed, launcher: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        **executed.result.to_json(),
        "id": executed.measurement_id,
        "db": mask_url(executed.store_url),
        "launcher": launcher,
        **extra,
    }


def _print_summary(result: RunResult, measurement_id: int, url: str) -> None:
    times = result.to_json()["iteration_time_ms"]
    applied = result.applied
    print(
        f"{result.model} on {result.options.world_size} rank(s) "
        f"({applied.get('device', result.options.device)}), "
        f"{result.options.bandwidth or 'loopback'} ({result.network})\n"
        f"  iteration   {times['median']:.1f} ms median, 95 % interval "
        f"{output.format_interval(times['ci95_ms'])} "
        f"(p10 {times['p10']:.1f}, p90 {times['p90']:.1f}) "
        f"over {len(result.samples_ms)} iterations, stopped by {result.stopped_by}\n"
        f"  placement   {_placement_line(result.rank_cores)}\n"
        f"  losses      {', '.join(f'{x:.4f}' for x in result.losses)}\n"
        f"  memory      peak {output.human_bytes(max(result.peak_memory_bytes))} per rank\n"
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
    output.add_input_arguments(run)
    output.add_launch_arguments(
        run,
        DEFAULTS,
        "run on an emulated cluster with this link rate per host (1gbit, 100mbit, 10gbit, none); "
        "without it the ranks share loopback",
        side_by_side=True,
    )
    run.add_argument(
        "--rounds",
        type=output.positive_int,
        default=3,
        help="with several --strategy: each takes a turn of --iters steps at least this many "
        "times, in an order shuffled every round (default 3)",
    )
    run.add_argument(
        "--device",
        default=DEFAULTS["device"],
        help="cpu, or cuda: rank r on GPU r of this machine (default: cpu)",
    )
    run.add_argument(
        "--backend",
        default=DEFAULTS["backend"],
        help="process-group backend: gloo or nccl (default: nccl on cuda, gloo on cpu)",
    )
    output.add_protocol_arguments(
        run,
        defaults=MeasureSettings(
            iters=DEFAULTS["iters"],
            warmup=DEFAULTS["warmup"],
            ci_target=DEFAULTS["ci_target"],
            budget_s=DEFAULTS["budget_s"],
        ),
    )
    output.add_launcher_arguments(run, what="the run")
    run.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    run.add_argument("--optimizer", default=DEFAULTS["optimizer"], help="adamw or sgd")
    run.add_argument(
        "--dropout",
        action="store_true",
        help="keep the model's dropout (off by default, so losses compare across plans)",
    )
    run.add_argument(
        "--timeout", type=float, default=DEFAULTS["timeout_s"], help="whole run, seconds"
    )
    run.add_argument(
        "--collective-timeout",
        type=float,
        default=DEFAULTS["collective_timeout_s"],
        help="a collective waiting longer fails its rank (a hung rank), seconds",
    )
    output.add_store_arguments(run)
    run.set_defaults(handler=cmd_run)
