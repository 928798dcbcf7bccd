"""``ddlsim search``: the fastest tensor-fusion strategy for a model on a cluster, found with the
simulator, and (``--verify``) checked against the executor.

The space searched so far is data-parallel tensor fusion: bucket partitions of the gradients in
the order they become ready, with DeAR on or off (``backtrack``, ``random``), or DDP-style
bucket caps with DeAR on or off (Optuna's ``tpe`` and ``cmaes``, whose study can live in a
database that several searches share). The rank's micro-batch is kernel-profiled
unless the store has a profile; collectives are priced from the store's fits of the link (the
link's nominal rate where none is stored).
"""

import argparse
from typing import Any

from data.errors import InvalidOptionError
from data.specs.cluster import parse_bandwidth_gbps
from data.specs.strategy import Strategy
from data.store import Store
from data.zoo import resolve_model
from executor.run import RunOptions, run_training
from profiler.cluster import remove_stale_namespaces
from search.backtrack import BacktrackOptions, SearchResult, backtrack_fusion
from search.evaluator import FusionEvaluator
from search.optuna_search import StudyOptions, optuna_fusion
from search.random_search import random_fusion
from service.cmd_predict import (
    cost_model_for,
    kernel_profile_for,
    machine_scale,
    normalized_bandwidth,
)
from service.output import emit_json, positive_int, progress
from simulator.costs import comm_models, rank_spec, scaled

ALGORITHMS = ("backtrack", "tpe", "cmaes", "random")


def cmd_search(args: argparse.Namespace) -> int:
    if args.world_size < 2:
        raise InvalidOptionError(
            f"world_size({args.world_size}) must be >= 2: tensor fusion buckets gradients "
            "between data-parallel ranks"
        )
    if not args.time_limit > 0:
        raise InvalidOptionError(f"time_limit({args.time_limit}) must be > 0 seconds")
    spec = resolve_model(args.model).with_inputs(
        batch_size=args.batch_size, seq_len=args.seq_len, image_size=args.image_size
    )
    bandwidth = normalized_bandwidth(args.bandwidth)
    rank = rank_spec(spec, Strategy(), args.world_size)
    options = BacktrackOptions(budget=args.budget, time_limit_s=args.time_limit, top=args.top)
    with Store.open(args.db) as store:
        graph, profile, _ = kernel_profile_for(
            store, rank, optimizer="adamw", iters=args.profile_iters
        )
        fits = store.collective_profiles(backend="gloo")
    links = {
        ring: comm_models(
            fits,
            world_size=args.world_size,
            bandwidth=bandwidth,
            bandwidth_gbps=parse_bandwidth_gbps(bandwidth),
            ring=ring,
        ).models
        for ring in (False, True)
    }
    scale = machine_scale(args.world_size)
    evaluator = FusionEvaluator(
        graph,
        scaled(profile.node_ms, scale),
        links[False],
        ring_comm=links[True],
        dp=args.world_size,
        cost_model=cost_model_for(args.simulator),
        compute_scale=scale,
    )
    progress(f"searching {spec.label} ({args.algo}, up to {args.budget} evaluations)")
    nbytes = {p.name: p.nbytes for p in graph.params}
    order = list(graph.grad_ready_order)
    sizes = [nbytes[n] for n in order]
    if args.algo == "backtrack":
        result = backtrack_fusion(evaluator, order, sizes, options)
    elif args.algo in ("tpe", "cmaes"):
        study = StudyOptions(
            storage=args.storage,
            study_name=args.study_name or f"{spec.label}-{args.world_size}-{bandwidth}",
            workers=args.workers,
            seed=args.seed,
        )
        result = optuna_fusion(evaluator, order, sizes, args.algo, options=options, study=study)
    else:
        result = random_fusion(evaluator, order, options, seed=args.seed)
    payload = _payload(args, spec.label, bandwidth, evaluator.predictor, result)
    if args.verify:
        payload.update(_verify(args, spec, bandwidth, result))
    if args.json:
        emit_json(payload)
    else:
        _print(payload)
    return 0


def _payload(
    args: argparse.Namespace, model: str, bandwidth: str, predictor: str, result: SearchResult
) -> dict[str, Any]:
    return {
        "model": model,
        "world_size": args.world_size,
        "bandwidth": bandwidth,
        "algo": args.algo,
        "predictor": predictor,
        "best": {"strategy": result.best.to_dict(), "predicted_ms": result.best_ms},
        "baseline": {"strategy": result.baseline.to_dict(), "predicted_ms": result.baseline_ms},
        "top": [{"strategy": s.to_dict(), "predicted_ms": ms} for s, ms in result.top],
        "evaluations": result.evaluations,
        "elapsed_s": result.elapsed_s,
        "convergence": list(result.curve),
    }


def _verify(
    args: argparse.Namespace, spec: Any, bandwidth: str, result: SearchResult
) -> dict[str, Any]:
    """Run the best strategy and the baseline through the executor, side by side."""
    remove_stale_namespaces()
    options = RunOptions(
        world_size=args.world_size,
        bandwidth=bandwidth,
        iters=args.iters,
        warmup=args.warmup,
    )
    measured = {}
    for name, strategy in (("baseline", result.baseline), ("best", result.best)):
        progress(f"running the {name} for real")
        measured[name] = run_training(spec, strategy, options).median_ms
    return {
        "measured_best_ms": measured["best"],
        "measured_baseline_ms": measured["baseline"],
        "speedup": measured["baseline"] / measured["best"],
    }


def _print(payload: dict[str, Any]) -> None:
    best, baseline = payload["best"], payload["baseline"]
    print(
        f"{payload['model']} on {payload['world_size']} ranks, {payload['bandwidth']}: "
        f"{payload['evaluations']} strategies priced in {payload['elapsed_s']:.1f} s "
        f"({payload['algo']}, predictor {payload['predictor']})\n"
        f"  baseline (DDP defaults)  {baseline['predicted_ms']:.1f} ms predicted\n"
        f"  best                     {best['predicted_ms']:.1f} ms predicted: "
        f"{_describe(best['strategy'])}"
    )
    if "speedup" in payload:
        print(
            f"  measured                 best {payload['measured_best_ms']:.1f} ms, baseline "
            f"{payload['measured_baseline_ms']:.1f} ms: {payload['speedup']:.2f}x"
        )


def _describe(strategy: dict[str, Any]) -> str:
    fusion = strategy["tensor_fusion"]
    buckets = fusion.get("buckets")
    what = f"{len(buckets)} buckets" if buckets else "DDP's buckets"
    return what + (", DeAR" if fusion.get("dear") else "")


def register(sub: Any) -> None:
    cmd = sub.add_parser(
        "search", help="find the fastest tensor-fusion strategy with the simulator"
    )
    cmd.add_argument("model", metavar="MODEL", help="zoo name, spec file or inline JSON")
    cmd.add_argument("--world-size", type=positive_int, required=True)
    cmd.add_argument("--bandwidth", help="link rate per host (1gbit, 100mbit, none)")
    cmd.add_argument("--algo", choices=ALGORITHMS, default="backtrack")
    cmd.add_argument("--budget", type=positive_int, default=2000, help="strategies to price")
    cmd.add_argument("--time-limit", type=float, default=60.0, help="seconds")
    cmd.add_argument("--top", type=positive_int, default=5)
    cmd.add_argument("--seed", type=int, default=0, help="the samplers' seed")
    cmd.add_argument(
        "--storage",
        help="tpe/cmaes: an RDB URL (sqlite:///PATH, postgresql+psycopg://...) holding the "
        "study, so that several searches share it",
    )
    cmd.add_argument("--study-name", help="tpe/cmaes: the study (default: model-ranks-link)")
    cmd.add_argument(
        "--workers", type=positive_int, default=1, help="tpe/cmaes: trials run at once"
    )
    cmd.add_argument("--batch-size", type=positive_int, help="global batch size")
    cmd.add_argument("--seq-len", type=positive_int)
    cmd.add_argument("--image-size", type=positive_int)
    cmd.add_argument(
        "--profile-iters", type=positive_int, default=10, help="when a kernel profile is taken"
    )
    cmd.add_argument(
        "--simulator", help="replay, or a cost-model checkpoint (default: the trained/shipped)"
    )
    cmd.add_argument("--verify", action="store_true", help="run the best and the baseline")
    cmd.add_argument("--iters", type=positive_int, default=6, help="--verify's iterations")
    cmd.add_argument("--warmup", type=positive_int, default=2, help="--verify's warm-up")
    cmd.add_argument("--db", help="store URL (default: $DDLSIM_DB or the user data dir)")
    cmd.add_argument("--json", action="store_true", help="print JSON")
    cmd.set_defaults(handler=cmd_search)
