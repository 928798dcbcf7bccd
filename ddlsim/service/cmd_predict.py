"""``ddlsim predict MODEL --strategy S --world-size N``: the simulator's iteration time, stored."""

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddlsim.data.errors import DdlsimError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.cluster import parse_bandwidth_gbps
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import (
    KernelProfileRecord,
    Store,
    add_graph,
    add_kernel_profile,
    add_prediction,
    add_strategy,
)
from ddlsim.data.zoo import resolve_model
from ddlsim.profiler.batch import kernel_record
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.profiler.kernels import profile_kernels
from ddlsim.service.output import emit_json, positive_int, progress
from ddlsim.simulator.costs import compute_scale, rank_spec
from ddlsim.simulator.default import load_default
from ddlsim.simulator.gnn import IterationCostModel
from ddlsim.simulator.predict import Prediction, predict


class MissingProfileError(DdlsimError, LookupError):
    """The store has no kernel profile of a model at a micro-batch, and none may be taken now."""


def kernel_profile_for(
    store: Store,
    spec: ModelSpec,
    *,
    optimizer: str,
    iters: int,
    profile_missing: bool = True,
    capture: Callable[[ModelSpec, CaptureOptions], IterationGraph] = capture_graph,
) -> tuple[IterationGraph, KernelProfileRecord, bool]:
    """The graph of ``spec`` (default strategy) and its newest CPU kernel profile; profiles it
    (one rank, one thread) and stores the profile when there is none. The flag says whether it
    was profiled now.

    Raises:
        MissingProfileError: there is none and ``profile_missing`` is false.
    """
    graph = capture(spec, CaptureOptions(optimizer="sgd" if optimizer == "sgd" else "adamw"))
    stored = [p for p in store.kernel_profiles(graph_hash=graph.graph_hash) if p.device == "cpu"]
    if stored:
        return graph, stored[-1], False
    if not profile_missing:
        raise MissingProfileError(
            f"no kernel profile of {spec.label} at batch {spec.inputs.batch_size} "
            f"(a rank's micro-batch) in the store; profile it first (a profiling run with a "
            f"'kernels' job for this model and batch_size {spec.inputs.batch_size})"
        )
    progress(
        f"no kernel profile of {spec.label} at batch {spec.inputs.batch_size} yet: "
        f"profiling it on one rank ({iters} iterations)"
    )
    _, profile = profile_kernels(spec, iters=iters, graph=graph, progress=progress)
    record = kernel_record(profile)
    with store.transaction() as session:
        add_graph(session, graph=graph)
        profile_id = add_kernel_profile(session, profile=record)
    stored = [p for p in store.kernel_profiles(graph_hash=graph.graph_hash) if p.id == profile_id]
    return graph, stored[0], True


def predict_on_store(
    store: Store,
    spec: ModelSpec,
    strategy: Strategy,
    *,
    world_size: int,
    bandwidth: str,
    cost_model: tuple[IterationCostModel, dict[str, Any]] | None,
    optimizer: str = "adamw",
    profile_iters: int = 10,
    profile_missing: bool = True,
    capture: Callable[[ModelSpec, CaptureOptions], IterationGraph] = capture_graph,
) -> tuple[Prediction, KernelProfileRecord, bool]:
    """Predict ``strategy`` for ``spec`` with the store's kernel profile of the rank's
    micro-batch (taken now if there is none: the flag says so) and its gloo collective fits;
    compute is scaled for ranks sharing this machine's cores."""
    rank = rank_spec(spec, strategy, world_size)
    profiled, profile, profiled_now = kernel_profile_for(
        store,
        rank,
        optimizer=optimizer,
        iters=profile_iters,
        profile_missing=profile_missing,
        capture=capture,
    )
    options = CaptureOptions(strategy=strategy, optimizer="sgd" if optimizer == "sgd" else "adamw")
    prediction = predict(
        capture(rank, options),
        profiled=profiled,
        node_ms=profile.node_ms,
        collective_profiles=store.collective_profiles(backend="gloo"),
        world_size=world_size,
        bandwidth=bandwidth,
        cost_model=cost_model,
        compute_scale=machine_scale(world_size),
    )
    return prediction, profile, profiled_now


def cost_model_for(
    choice: str | None,
) -> tuple[IterationCostModel, dict[str, Any]] | None:
    """``--simulator``: ``replay`` for the replay alone, a checkpoint path, or (unset) the
    user's trained cost model, else the shipped one."""
    if choice == "replay":
        return None
    return load_default(Path(choice) if choice else None)


def machine_scale(world_size: int) -> float:
    """Ranks of an emulated cluster all run on this machine: with more ranks than cores, each
    computes slower than its one-rank profile (one intra-op thread a rank)."""
    return compute_scale(world_size, len(os.sched_getaffinity(0)))


def normalized_bandwidth(text: str | None) -> str:
    """The link as the store names it: a lower-case rate, or ``none`` for an unshaped one."""
    if text is None:
        return "none"
    return "none" if parse_bandwidth_gbps(text) is None else text.strip().lower()


def cmd_predict(args: argparse.Namespace) -> int:
    spec = resolve_model(args.model).with_inputs(
        batch_size=args.batch_size, seq_len=args.seq_len, image_size=args.image_size
    )
    strategy = Strategy.parse(args.strategy) if args.strategy else Strategy()
    bandwidth = normalized_bandwidth(args.bandwidth)
    with Store.open(args.db) as store:
        prediction, profile, profiled_now = predict_on_store(
            store,
            spec,
            strategy,
            world_size=args.world_size,
            bandwidth=bandwidth,
            cost_model=cost_model_for(args.simulator),
            optimizer=args.optimizer,
            profile_iters=args.profile_iters,
        )
        graph = prediction.graph
        with store.transaction() as session:
            add_graph(session, graph=graph)
            add_strategy(session, strategy=strategy)
            prediction_id = add_prediction(session, prediction=prediction.record())
    if args.trace:
        Path(args.trace).write_text(json.dumps(prediction.result.chrome_trace()), "utf-8")
    payload = {
        **prediction.to_json(),
        "model": spec.label,
        "rank_batch_size": graph.model.inputs.batch_size,
        "kernel_profile": {"id": profile.id, "profiled_now": profiled_now},
        "id": prediction_id,
        "db": store.url,
    }
    if args.json:
        emit_json(payload)
    else:
        _print_summary(prediction, payload)
    return 0


def _print_summary(prediction: Prediction, payload: dict[str, Any]) -> None:
    parts = prediction.breakdown()
    print(
        f"{payload['model']} on {prediction.world_size} rank(s), {prediction.bandwidth}: "
        f"{prediction.iteration_time_ms:.1f} ms per iteration ({prediction.simulator_version})\n"
        f"  replay        {prediction.replay_ms:.1f} ms (predictor: {prediction.predictor})\n"
        f"  compute       {parts['compute_ms']:.1f} ms\n"
        f"  exposed comm  {parts['exposed_comm_ms']:.1f} ms "
        f"(of {parts['comm_ms']:.1f} ms communicating)\n"
        f"  collectives   "
        + "; ".join(f"{op}: {src}" for op, src in payload["collective_models"].items())
        + "".join(
            f"\n  compiled      {block}: {eager:.2f} ms eager, {compiled:.2f} ms fused (predicted)"
            for block, eager, compiled in prediction.fused_blocks
        )
        + f"\n  stored        prediction {payload['id']} in {payload['db']}",
        file=sys.stdout,
    )


def register(sub: Any) -> None:
    cmd = sub.add_parser("predict", help="predict a strategy's iteration time with the simulator")
    cmd.add_argument("model", metavar="MODEL", help="zoo name, spec file or inline JSON")
    cmd.add_argument("--strategy", help="strategy JSON or file (default: PyTorch DDP's defaults)")
    cmd.add_argument("--world-size", type=positive_int, default=1)
    cmd.add_argument(
        "--bandwidth",
        help="link rate per host (1gbit, 100mbit, none); collective fits of this link are used",
    )
    cmd.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd"))
    cmd.add_argument("--batch-size", type=positive_int, help="global batch size")
    cmd.add_argument("--seq-len", type=positive_int)
    cmd.add_argument("--image-size", type=positive_int)
    cmd.add_argument(
        "--profile-iters",
        type=positive_int,
        default=10,
        help="iterations of the kernel profile taken when none is stored",
    )
    cmd.add_argument("--trace", help="write the replayed timeline here (Chrome trace JSON)")
    cmd.add_argument(
        "--simulator",
        metavar="replay|CKPT",
        help="'replay' alone, or a cost-model checkpoint (default: yours if trained, else the "
        "shipped one)",
    )
    cmd.add_argument("--db", help="store URL (default: $DDLSIM_DB or the user data dir)")
    cmd.add_argument("--json", action="store_true", help="print JSON")
    cmd.set_defaults(handler=cmd_predict)
