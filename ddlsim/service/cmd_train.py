"""``ddlsim simulator train|eval|bench``: fit the cost model, measure it on held-out families,
time batched predictions."""

import argparse
import itertools
import random
import statistics
import sys
import time
from typing import Any

import torch
from torch_geometric.data import Batch
from tqdm import tqdm

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.profiler.capture import capture_graph
from ddlsim.service.output import add_simulator_argument, emit_json, positive_int, progress
from ddlsim.simulator.cost_model import PREDICTORS, load_cost_model
from ddlsim.simulator.costs import comm_models
from ddlsim.simulator.dataset import LinkFit
from ddlsim.simulator.dataset.json_file import read_part
from ddlsim.simulator.default import shipped_dataset
from ddlsim.simulator.dp_replay import DataParallelReplay
from ddlsim.simulator.evaluate import Accuracy
from ddlsim.simulator.features import ModelGraph, model_graph, strategy_sample
from ddlsim.simulator.gnn import CostModelConfig
from ddlsim.simulator.holdout import (
    metrics_by_kind,
)
from ddlsim.simulator.replay import comm_models_for_link
from ddlsim.simulator.runtime import shipped_runtime_costs
from ddlsim.simulator.train import (
    TrainOptions,
    intra_op_threads,
)
from ddlsim.workflows.gpu_simulator import GpuTrainRequest, train_gpu_simulator
from ddlsim.workflows.simulator_jobs import (
    TrainRequest,
    evaluate_simulator,
    train_simulator,
)


def _metrics_json(metrics: dict[str, Accuracy]) -> dict[str, Any]:
    return {name: m.to_json() for name, m in metrics.items()}


def _train_request(args: argparse.Namespace, **extra: Any) -> TrainRequest:
    """The training of :func:`_common`'s options (``extra``: the command's own)."""
    return TrainRequest(
        dataset=args.dataset,
        db=args.db,
        epochs=args.epochs,
        hidden=args.hidden,
        layers=args.layers,
        seed=args.seed,
        **extra,
    )


def cmd_train(args: argparse.Namespace) -> int:
    if args.gpu is not None:
        return _train_gpu(args)
    request = _train_request(args, predictor=args.predictor, workers=args.workers, out=args.out)
    with tqdm(total=request.epochs, desc="training", unit="epoch", file=sys.stderr) as bar:

        def tick(epoch: int, total: int, loss: float) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}")

        def say(fraction: float | None, message: str) -> None:
            if fraction is None:
                progress(message)

        payload = train_simulator(request, say, epoch=tick)
    if args.json:
        emit_json(payload)
    else:
        print(
            f"trained on {payload['runs']} runs of {len(payload['families'])} families in "
            f"{payload['elapsed_s']:.0f} s; predictor {payload['predictor']}; written to "
            f"{payload['out']}"
        )
    return 0


def _train_gpu(args: argparse.Namespace) -> int:
    """``ddlsim simulator train --gpu``: the GPU path's cost model
    (:mod:`ddlsim.workflows.gpu_simulator`)."""
    if args.db:
        raise InvalidOptionError(
            "--gpu trains on a GPU dataset file (--dataset) or the shipped GPU runs, not on a "
            "store's runs: drop --db"
        )
    request = GpuTrainRequest(
        dataset=args.dataset,
        gpu=args.gpu or None,
        epochs=args.epochs,
        seed=args.seed,
        predictor=args.predictor,
        out=args.out,
    )
    payload = train_gpu_simulator(request, progress)
    if args.json:
        emit_json(payload)
        return 0
    held = payload["holdout_mape"]
    errors = (
        f"held out by family: roofline MAPE {held['roofline']:.3f}, corrected "
        f"{held['learned']:.3f}"
        if held
        else "one family: nothing held out"
    )
    print(
        f"trained on {payload['iterations']} iterations of {len(payload['families'])} families "
        f"on {payload['gpu']} in {payload['elapsed_s']:.0f} s; {errors}; predictor "
        f"{payload['predictor']}; written to {payload['out']}"
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    request = _train_request(args)
    report, payload = evaluate_simulator(
        request, args.holdout, lambda fraction, message: progress(message)
    )
    default = payload["default_predictor"]
    if not args.rows:
        payload.pop("rows")
    if args.json:
        emit_json(payload)
        return 0
    print(
        f"held out {', '.join(report.holdout)}: {len(report.rows)} runs; trained on "
        f"{report.train_runs} in {report.train_seconds:.0f} s"
    )
    print(f"  {'':<8}{'mape':>8}{'p90_ape':>9}{'tau':>7}{'pairs':>7}")
    for name in PREDICTORS:
        m = report.metrics[name]
        pairs = "-" if m.pair_accuracy is None else f"{m.pair_accuracy:.3f}"
        mark = "  (default)" if name == default else ""
        print(f"  {name:<8}{m.mape:8.3f}{m.p90_ape:9.3f}{m.kendall_tau:7.3f}{pairs:>7}{mark}")
    for kind, metrics in metrics_by_kind(report.rows).items():
        m = metrics[default]
        print(f"  {kind:<9} mape {m.mape:.3f}, p90_ape {m.p90_ape:.3f} ({default})")
    print(f"  op durations never seen, median APE: {report.duration_mdape:.3f}")
    if report.fused_blocks:
        print(
            f"  compiled blocks ({report.fused_blocks}), median APE: "
            f"{report.fused_mdape:.3f} (eager time taken for compiled: "
            f"{report.fused_mdape_unfused:.3f})"
        )
    return 0


def _bench_graph(kernels: list[dict[str, Any]]) -> tuple[IterationGraph, dict[int, float], str]:
    """gpt2-tiny at a rank's micro-batch (~500 nodes): its profile from the dataset's
    ``kernels`` (their file form; the smallest batch) if there, else a capture with
    FLOP-proportional durations."""
    profiled = [
        (int(raw["graph"]["model"]["inputs"]["batch_size"]), i)
        for i, raw in enumerate(kernels)
        if ModelSpec.from_dict(raw["graph"]["model"]).label == "gpt2-tiny"
    ]
    if profiled:
        batch, index = min(profiled)
        raw = kernels[index]
        node_ms = {int(k): float(v) for k, v in raw["node_ms"].items()}
        return IterationGraph.from_dict(raw["graph"]), node_ms, f"gpt2-tiny@{batch} (profiled)"
    graph = capture_graph(ZOO["gpt2-tiny"].with_inputs(batch_size=4, seq_len=64))
    node_ms = {
        n.id: 0.002 + n.flops / 2e9 for n in graph.nodes if n.kind in ("compute", "optimizer")
    }
    return graph, node_ms, "gpt2-tiny@4 (FLOP-proportional durations)"


def _bench_comm(links: tuple[LinkFit, ...]) -> dict[str, AlphaBeta]:
    """2 ranks at 1 Gbit/s: the dataset's fits (their CPU work included) if it has them, else
    the line rate with 300 us a call."""
    if links:
        fits = comm_models(
            list(links), world_size=2, bandwidth="1gbit", bandwidth_gbps=1.0, ring=False
        )
        if all("line rate" not in source for source in fits.sources.values()):
            return fits.models
    return comm_models_for_link(2, 1.0, alpha_us=300.0)


def _random_partitions(
    order: list[str], count: int, seed: int, *, dear: bool = False
) -> list[Strategy]:
    rng = random.Random(seed)
    seen: set[tuple[int, ...]] = set()
    out: list[Strategy] = []
    while len(out) < count:
        cuts = tuple(sorted(rng.sample(range(1, len(order)), k=rng.randint(0, 12))))
        if cuts in seen:
            continue
        seen.add(cuts)
        bounds = [0, *cuts, len(order)]
        buckets = [order[a:b] for a, b in itertools.pairwise(bounds)]
        out.append(Strategy.from_dict({"tensor_fusion": {"buckets": buckets, "dear": dear}}))
    return out


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        # two parts of the shipped dataset: building all of it takes half a minute
        links = tuple(LinkFit(**raw) for raw in read_part(shipped_dataset(), "links"))
        kernels = read_part(shipped_dataset(), "kernels")
    except InvalidOptionError:
        links, kernels = (), []
    graph, node_ms, what = _bench_graph(kernels)
    strategies = _random_partitions(
        graph.grad_ready_order, args.strategies, seed=0, dear=args.dear
    )
    comm = _bench_comm(links)
    model = load_cost_model(args.simulator).network
    rates: dict[str, list[float]] = {"replay": [], "cost_model": []}
    runtime = shipped_runtime_costs()
    with intra_op_threads(1):
        for _ in range(args.repeats):
            start = time.perf_counter()
            fast = DataParallelReplay(graph, node_ms, runtime)
            for strategy in strategies:
                fast.summary(strategy, comm)
            rates["replay"].append(len(strategies) / (time.perf_counter() - start))
            if model is None:
                continue
            start = time.perf_counter()
            fast = DataParallelReplay(graph, node_ms, runtime)
            encoded = model_graph(graph, node_ms)
            with torch.no_grad():
                h, _ = model.encode(torch_batch := _single_batch(encoded))
                for first in range(0, len(strategies), args.batch):
                    chunk = strategies[first : first + args.batch]
                    samples = [
                        strategy_sample(
                            model_key="g",
                            graph=encoded,
                            strategy=s,
                            summary=fast.summary(s, comm),
                            comm=comm,
                            dp=2,
                        )
                        for s in chunk
                    ]
                    model.corrections(h, torch_batch, {"g": 0}, samples)
            rates["cost_model"].append(len(strategies) / (time.perf_counter() - start))
    payload = {
        "graph": what,
        "num_nodes": len(graph.nodes),
        "strategies": len(strategies),
        "dear": args.dear,
        "repeats": args.repeats,
        "evaluations_per_s": statistics.median(rates["cost_model"] or rates["replay"]),
        "replay_evaluations_per_s": statistics.median(rates["replay"]),
        "cost_model_evaluations_per_s": (
            statistics.median(rates["cost_model"]) if rates["cost_model"] else None
        ),
        "threads": 1,
    }
    if args.json:
        emit_json(payload)
    else:
        print(
            f"{payload['strategies']} distinct bucket partitions "
            f"{'with DeAR ' if args.dear else ''}of {what} "
            f"({payload['num_nodes']} nodes), median of {args.repeats}:\n"
            f"  replay alone    {payload['replay_evaluations_per_s']:.0f} evaluations/s\n"
            f"  with cost model "
            + (
                f"{payload['cost_model_evaluations_per_s']:.0f} evaluations/s"
                if payload["cost_model_evaluations_per_s"]
                else "- (no checkpoint)"
            )
        )
    return 0


def _single_batch(encoded: ModelGraph) -> Batch:
    return Batch.from_data_list([encoded.data])


def _common(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--dataset", help="dataset file (default: the shipped one)")
    cmd.add_argument("--db", help="train on this store's runs and profiles instead")
    cmd.add_argument("--epochs", type=positive_int, default=TrainOptions().epochs)
    cmd.add_argument("--hidden", type=positive_int, default=CostModelConfig().hidden)
    cmd.add_argument("--layers", type=positive_int, default=CostModelConfig().layers)
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--json", action="store_true", help="print JSON")


def register(commands: Any) -> None:
    train = commands.add_parser("train", help="train the cost model on measured runs")
    _common(train)
    train.add_argument(
        "--workers",
        type=positive_int,
        help="processes for the held-out folds of --predictor auto (default: one a core)",
    )
    train.add_argument(
        "--out",
        help="checkpoint to write (default: simulator/cost_model.pt in the user's data "
        "directory, ~/.local/share/ddlsim on Linux, which predict then uses)",
    )
    train.add_argument(
        "--predictor",
        default="auto",
        choices=("auto", *PREDICTORS),
        help="what predict uses; auto: the lowest error with each family held out in turn",
    )
    train.add_argument(
        "--gpu",
        nargs="?",
        const="",
        metavar="NAME",
        help="train the GPU path's cost model (predict|search --cluster) on GPU iterations: "
        "--dataset a GPU dataset, else the shipped H100 zoo runs; NAME the GPU where the "
        "dataset names none; written to simulator/gpu_cost_model.pt in the data directory",
    )
    train.set_defaults(handler=cmd_train)
    evaluate = commands.add_parser(
        "eval", help="train without some model families and measure the error on them"
    )
    _common(evaluate)
    evaluate.add_argument("--holdout", nargs="+", required=True, metavar="FAMILY")
    evaluate.add_argument("--rows", action="store_true", help="include every run in --json")
    evaluate.set_defaults(handler=cmd_eval)
    bench = commands.add_parser("bench", help="time batched predictions of distinct strategies")
    bench.add_argument("--strategies", type=positive_int, default=2000)
    bench.add_argument("--batch", type=positive_int, default=256)
    bench.add_argument("--repeats", type=positive_int, default=3)
    bench.add_argument("--dear", action="store_true", help="every partition with DeAR")
    add_simulator_argument(bench)
    bench.add_argument("--json", action="store_true", help="print JSON")
    bench.set_defaults(handler=cmd_bench)
