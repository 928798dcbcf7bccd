"""``ddlsim predict|search MODEL --cluster dgx-h100:32``: large jobs on GPU clusters on paper
(:mod:`ddlsim.workflows.scale`); nothing is stored, nothing runs on a GPU."""

import argparse
import sys
from typing import Any

from ddlsim.data.errors import InvalidClusterError, InvalidStrategyError
from ddlsim.data.specs._serde import load_json_or_file
from ddlsim.data.specs.cluster import EmulatedClusterSpec
from ddlsim.data.specs.gpu_cluster import PRESETS, GpuClusterSpec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.scale_plan import PRECISIONS, ScalePlan
from ddlsim.data.specs.strategy import KERNELS
from ddlsim.plans.feasibility import check_priceable
from ddlsim.search import SearchBudget
from ddlsim.search.scale_plans import SpaceLimits
from ddlsim.service import output
from ddlsim.workflows.clusters import resolve_cluster
from ddlsim.workflows.layout_search import LayoutJob, search_layouts_with
from ddlsim.workflows.scale import ScaleRequest, layout_cost, predict_at_scale, search_at_scale
from ddlsim.workflows.scale_jobs import scale_request_checked

CLUSTER_HELP = (
    f"the cluster: a GPU cluster on paper, PRESET:NODES ({', '.join(PRESETS)}), the name of a "
    "cluster profile measured with 'ddlsim profile collectives --launcher env --name NAME' "
    "(NAME[:NODES]), inline JSON or a file, priced instead of measuring this machine; or an "
    "emulated cluster of this machine (JSON naming world_size, one rank a node, and its "
    "inter_node link), the same as --world-size and --bandwidth"
)


def gpu_cluster(args: argparse.Namespace) -> GpuClusterSpec | None:
    """The GPU cluster ``--cluster`` names, or ``None``: no ``--cluster``, or an emulated
    cluster, whose ranks and link then stand in ``args.world_size`` and ``args.bandwidth``
    (the CPU path reads them there).

    Raises:
        InvalidClusterError: an emulated cluster of several ranks a node (this machine emulates
            one a node), or one that contradicts ``--world-size``/``--bandwidth`` given too.
    """
    if not args.cluster:
        return None
    # Resolved once a command (a stored profile's name opens the store).
    cluster = getattr(args, "resolved_cluster", None) or resolve_cluster(
        args.cluster, getattr(args, "db", None)
    )
    args.resolved_cluster = cluster
    if isinstance(cluster, GpuClusterSpec):
        return cluster
    if not isinstance(cluster, EmulatedClusterSpec) or cluster.node_size != 1:
        raise InvalidClusterError(
            f"emulated cluster {cluster.to_json()} has {cluster.node_size} ranks a node; this "
            "machine emulates one rank a node (devices_per_node 1)"
        )
    for name, value in (("world_size", cluster.world_size), ("bandwidth", cluster.link)):
        given = getattr(args, name, None)
        if given is not None and given != value and not _is_default(args, name, given):
            raise InvalidClusterError(
                f"--{name.replace('_', '-')} {given} contradicts --cluster's {name} {value}; "
                "give one of them"
            )
        setattr(args, name, value)
    return None


def _is_default(args: argparse.Namespace, name: str, value: object) -> bool:
    defaults = getattr(args, "cluster_defaults", {})
    return bool(name in defaults and defaults[name] == value)


def add_cluster_arguments(parser: argparse.ArgumentParser, *, with_plan: bool) -> None:
    parser.add_argument("--cluster", help=CLUSTER_HELP)
    parser.set_defaults(
        cluster_defaults={
            name: parser.get_default(name)
            for name in ("world_size", "bandwidth")
            if parser.get_default(name) is not None
        }
    )
    if with_plan:
        parser.add_argument(
            "--plan",
            help="with --cluster: the layout (--strategy says the same), a strategy as --strategy "
            "takes it (JSON or a "
            'file): {"parallel": {"dp", "tp", "pp", "micro_batches", "pp_schedule", '
            '"virtual_stages", "recompute", "sequence_parallel", "fsdp", '
            '"distributed_optimizer", "zero", "cp", "cp_comm", "async_tp"}, "precision", '
            '"compile", "kernels"}; dp defaults to what the cluster leaves, precision to bf16',
        )
    else:
        parser.add_argument(
            "--precision", choices=PRECISIONS, default="bf16", help="with --cluster"
        )
        parser.add_argument(
            "--compile", action="store_true", help="with --cluster: blocks compiled"
        )
        parser.add_argument(
            "--kernels",
            choices=KERNELS,
            default="pytorch",
            help="with --cluster: the layers' kernel library (transformer_engine: "
            "Megatron-Core's, whose tensor-parallel overlap the search then uses)",
        )
        parser.add_argument(
            "--search-space",
            help="with --cluster: what the job's framework offers, where less than everything "
            '(JSON or a file): {"recompute": [...], "sharding": ["none", '
            '"distributed_optimizer", "fsdp"], "cp": [1, 2, ...], "sequence_parallel": bool, '
            '"interleaved": bool}',
        )
        parser.add_argument(
            "--memory-margin-gib",
            type=float,
            default=0.0,
            help="with --cluster: GiB a layout must leave free on each GPU to be offered "
            "(predicted peak + margin <= the GPU's memory; default 0)",
        )
        parser.add_argument(
            "--target",
            choices=("paper", "cuda"),
            default="paper",
            help="with --cluster: paper prices every layout the GPU path models (default); "
            "cuda offers only what ddlsim run executes on those GPUs (a search for a run)",
        )


def _request_parts(args: argparse.Namespace) -> tuple[ModelSpec, GpuClusterSpec, int, int]:
    model = output.model_argument(args)
    check_priceable(model)
    cluster = gpu_cluster(args)
    if cluster is None:
        raise InvalidClusterError(f"--cluster {args.cluster!r} is not a GPU cluster")
    seq_len = args.seq_len or model.inputs.seq_len
    if seq_len is None:
        raise InvalidStrategyError("--cluster needs --seq-len (the model's spec has none)")
    return model, cluster, model.inputs.batch_size, seq_len


def predict_on_cluster(args: argparse.Namespace) -> int:
    """``ddlsim predict MODEL --cluster C --plan P --batch-size B --seq-len S``.

    Raises:
        InvalidStrategyError: for a bad plan, or one that does not fit the GPUs' memory (the
            estimate in the message).
    """
    layout = args.plan or getattr(args, "strategy", None)
    if args.plan and getattr(args, "strategy", None):
        raise InvalidStrategyError("--plan and --strategy name the same layout: give one")
    if not layout:
        raise InvalidStrategyError("--cluster needs --strategy (or --plan: the layout to price)")
    model, cluster, batch, seq_len = _request_parts(args)
    plan = ScalePlan.parse(layout, cluster.world_size)
    request = ScaleRequest(
        model=model, cluster=cluster, plan=plan, global_batch=batch, seq_len=seq_len
    )
    cost = layout_cost(args.simulator, cluster)
    prediction = predict_at_scale(scale_request_checked(request), cost=cost)
    memory = prediction.memory
    if not prediction.fits:
        parts = ", ".join(f"{k.removesuffix('_gib')} {v} GiB" for k, v in memory.to_json().items())
        raise InvalidStrategyError(
            f"{plan.label()} does not fit {cluster.gpu.name}'s {cluster.gpu.memory_gib:g} GiB: "
            f"the busiest GPU needs about {memory.total_gib:.1f} GiB ({parts}); shard more "
            "(tp, pp, fsdp) or recompute"
        )
    payload = {
        "model": model.label,
        "cluster": cluster.to_dict(),
        "strategy": plan.to_dict(),
        "global_batch": batch,
        "seq_len": seq_len,
        **prediction.to_json(),
    }
    if args.json:
        output.emit_json(payload)
        return 0
    print(
        f"{model.label} on {cluster.world_size} x {cluster.gpu.name} ({cluster.name}, "
        f"{cluster.nodes} nodes), {plan.label()}:\n"
        f"  iteration     {prediction.iteration_s:.3f} s\n"
        f"  throughput    {prediction.tokens_per_s_per_gpu:.0f} tokens/s per GPU, "
        f"{prediction.tflops_per_gpu:.0f} TFLOP/s per GPU\n"
        f"  memory        {memory.total_gib:.1f} GiB of {cluster.gpu.memory_gib:g} "
        "on the busiest GPU"
    )
    return 0


def search_on_cluster(args: argparse.Namespace) -> int:
    """``ddlsim search MODEL --cluster C --batch-size B --seq-len S``: the fastest layout, by
    the GPU path's bound-and-replay search, or with ``--algo`` by the search registry's
    algorithm (:mod:`ddlsim.workflows.layout_search`)."""
    model, cluster, batch, seq_len = _request_parts(args)
    cost = layout_cost(args.simulator, cluster)
    limits = (
        SpaceLimits.from_dict(
            load_json_or_file(args.search_space, "search space", InvalidStrategyError)
        )
        if args.search_space
        else None
    )
    if args.algo is not None:
        job = LayoutJob(
            model=model,
            cluster=cluster,
            global_batch=batch,
            seq_len=seq_len,
            precision=args.precision,
            compile=args.compile,
            kernels=args.kernels,
            limits=limits,
            memory_margin_gib=args.memory_margin_gib,
            target=args.target,
        )
        budget = SearchBudget(
            evaluations=args.budget, time_limit_s=args.time_limit, top=args.top, seed=args.seed
        )
        found = search_layouts_with(
            args.algo, job, budget, storage=args.storage, study_name=args.study_name, cost=cost
        )
        return _show_layouts(args, model, cluster, found)
    result = search_at_scale(
        model,
        cluster,
        global_batch=batch,
        seq_len=seq_len,
        precision=args.precision,
        compile=args.compile,
        kernels=args.kernels,
        allow_async_tp=args.kernels == "transformer_engine",
        limits=limits,
        memory_margin_gib=args.memory_margin_gib,
        target=args.target,
        cost=cost,
    )
    top = [
        {
            "strategy": ranked.plan.to_dict(),
            "layout": ranked.plan.label(),
            "iteration_s": ranked.iteration_s,
            "tokens_per_s_per_gpu": batch * seq_len / ranked.iteration_s / cluster.world_size,
            "memory_gib": round(ranked.memory_gib, 2),
            "replayed": ranked.replayed,
        }
        for ranked in result.ranked[:10]
    ]
    payload = {
        "model": model.label,
        "cluster": cluster.to_dict(),
        "global_batch": batch,
        "seq_len": seq_len,
        "evaluated": result.evaluated,
        "refused_memory": result.refused_memory,
        "failed": result.failed,
        "seconds": round(result.seconds, 2),
        "best": top[0] if top else None,
        "top": top,
    }
    if args.target != "paper":
        payload.update(target=args.target, not_runnable=result.not_runnable)
    if not args.json:
        print(
            f"{model.label} on {cluster.world_size} x {cluster.gpu.name}: {result.evaluated} "
            f"layouts priced in {result.seconds:.1f} s, {result.refused_memory} do not fit"
        )
    return _show_layouts(args, model, cluster, payload)


def _show_layouts(
    args: argparse.Namespace, model: ModelSpec, cluster: GpuClusterSpec, payload: dict[str, Any]
) -> int:
    """A cluster search's answer: JSON, or the ranked layouts (exit 1 when none fits)."""
    top = payload["top"]
    if args.json:
        output.emit_json(payload)
        return 0 if top else 1
    if "algo" in payload:
        print(
            f"{model.label} on {cluster.world_size} x {cluster.gpu.name}: "
            f"{payload['evaluated']} of {payload['layouts']} layouts priced by {payload['algo']} "
            f"in {payload['seconds']:.1f} s"
        )
    if not top:
        print("  no layout fits the GPUs' memory", file=sys.stderr)
        return 1
    for rank, row in enumerate(top, 1):
        print(
            f"  {rank:2d}. {row['layout']:45s} {row['iteration_s']:8.3f} s  "
            f"{row['tokens_per_s_per_gpu']:8.0f} tok/s/GPU  {row['memory_gib']:6.1f} GiB"
        )
    return 0
