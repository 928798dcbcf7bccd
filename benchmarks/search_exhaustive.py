"""The search's pick on a space small enough to measure every point: is it the fastest?

For each model, a space of tensor-fusion strategies (DDP's defaults, DDP with a 4 MB and a
one-bucket cap, the executor's buckets of 2, 4 and 8 equal-byte runs, and DeAR over 2 and 4
such buckets) is priced by the simulator, and every strategy is measured by the executor on the
emulated cluster side by side (``executor.run.compare_training``): one launch holds all eight,
which take turns of ``--iters`` steps in ``--rounds`` rounds, each round in a new order, and
``--launches`` such launches are made. A point's time is the median of all its steps. On this
machine one step differs from the next by 10-20 % and separate launches of one strategy by
several per cent: launched apart, two points compare one slow spell with another. Side by side,
with 120 steps a point, the 90 % bootstrap interval of a ratio is a few per cent wide (printed
with the pick's); the table's launch spread shows how far one point's launches are apart.

The pick is the strategy the search would take: the lowest score (the predicted time times its
kind's calibration factor, see ``ddlsim/simulator/calibration.py``; ``--confidence off``: the
predicted time alone); the table gives its measured time as a ratio to the best measured one
(1.00: the search found the fastest; the target is within 3 %), the same for the lowest
predicted time alone, and the rank correlation of predicted and measured times.

The settled pick is what ``ddlsim search --verify --verify-top K`` keeps: the K best-scored
points and DDP's defaults run side by side in one more launch (``--verify-rounds`` rounds of
``--iters`` steps), and the measured fastest of them is taken. That launch only chooses; the
chosen point is judged by the exhaustive launches, so a lucky turn in the settling launch cannot
flatter its own ratio.

    .venv/bin/python benchmarks/search_exhaustive.py --db sqlite:///bench.db \
        --models gpt2-tiny bert-tiny vgg-mini mlp --world-size 2 --bandwidth 1gbit
"""

import argparse
import dataclasses
import json
import platform
import statistics
from typing import Any

import torch

from ddlsim.cluster import remove_stale_namespaces
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import resolve_model
from ddlsim.executor.protocol import ratio_interval
from ddlsim.executor.run import RunOptions, compare_training
from ddlsim.search.partitions import even_cuts, strategy_of
from ddlsim.simulator.calibration import Calibration
from ddlsim.workflows.requests import SearchRequest
from ddlsim.workflows.search import build_evaluator


def space(order: list[str], sizes: list[int]) -> dict[str, Strategy]:
    """The small space: DDP caps, equal-byte hook buckets, and DeAR."""
    out = {
        "DDP defaults": Strategy(),
        "DDP cap 4 MB": Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": 4}}),
        "DDP one bucket": Strategy.from_dict(
            {"tensor_fusion": {"bucket_cap_mb": 65536, "first_bucket_cap_mb": 65536}}
        ),
    }
    for k in (2, 4, 8):
        out[f"{k} buckets"] = strategy_of(order, even_cuts(sizes, k), False)
    for k in (2, 4):
        out[f"{k} buckets, DeAR"] = strategy_of(order, even_cuts(sizes, k), True)
    return out


def kendall_tau(a: list[float], b: list[float]) -> float:
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    score = sum(
        1 if (a[i] - a[j]) * (b[i] - b[j]) > 0 else -1
        for i, j in pairs
        if a[i] != a[j] and b[i] != b[j]
    )
    return score / len(pairs) if pairs else 0.0


CONFIDENCES = ("off", "0.5", "0.65", "0.8", "0.9")


def picks_by_confidence(
    points: dict[str, Strategy],
    predicted: dict[str, float],
    measured: dict[str, float],
    calibration: Calibration | None,
) -> dict[str, dict[str, Any]]:
    """The pick at each of :data:`CONFIDENCES` (lowest predicted time x factor) and its measured
    time over the fastest one, from one set of measurements."""
    fastest = min(measured.values())
    out: dict[str, dict[str, Any]] = {}
    for confidence in CONFIDENCES:
        if confidence == "off":
            scores = dict(predicted)
        elif calibration is None:
            continue
        else:
            scores = {
                name: ms * calibration.factor(points[name], float(confidence))
                for name, ms in predicted.items()
            }
        pick = min(scores, key=scores.__getitem__)
        out[confidence] = {"pick": pick, "ratio": measured[pick] / fastest}
    return out


def settle(
    args: argparse.Namespace,
    spec: ModelSpec,
    points: dict[str, Strategy],
    scored: dict[str, float],
    options: RunOptions,
) -> dict[str, Any]:
    """``ddlsim search --verify --verify-top K`` on this space: the K best-scored points and
    DDP's defaults side by side in a launch of their own (``--verify-rounds`` rounds), the
    measured fastest of them kept. Its ratio is then read from the exhaustive launches, which
    did not choose it."""
    ranked = sorted(points, key=lambda name: scored[name])
    names = ranked[: args.verify_top]
    if "DDP defaults" not in names:
        names.append("DDP defaults")
    remove_stale_namespaces()
    results = compare_training(
        spec,
        [points[name] for name in names],
        dataclasses.replace(options, seed=args.launches),
        rounds=args.verify_rounds,
    )
    measured = {name: r.median_ms for name, r in zip(names, results, strict=True)}
    pick = min(names, key=lambda name: (measured[name], ranked.index(name)))
    print(
        f"#   {spec.label} settling: "
        + ", ".join(f"{name} {measured[name]:.1f}" for name in names)
        + f" -> {pick}",
        flush=True,
    )
    return {"candidates": names, "measured": measured, "pick": pick}


def measure_model(args: argparse.Namespace, model: str) -> dict[str, Any]:
    spec = resolve_model(model)
    settings = SearchRequest(
        model=spec,
        bandwidth=args.bandwidth,
        world_size=args.world_size,
        simulator=args.simulator,
        confidence=None if args.confidence == "off" else float(args.confidence),
    )
    with Store.open(args.db) as store:
        evaluator = build_evaluator(settings, store)
        graph = evaluator.fusion(Strategy().parallel).replay.graph
        nbytes = {p.name: p.nbytes for p in graph.params}
        order = list(graph.grad_ready_order)
        points = space(order, [nbytes[n] for n in order])
        predicted = dict(zip(points, evaluator.predicted(list(points.values())), strict=True))
        scored = dict(zip(points, evaluator.price(list(points.values())), strict=True))
    options = RunOptions(
        world_size=args.world_size, bandwidth=args.bandwidth, iters=args.iters, warmup=args.warmup
    )
    names = list(points)
    samples: dict[str, list[float]] = {name: [] for name in names}
    runs: dict[str, list[float]] = {name: [] for name in names}
    for launch in range(args.launches):
        remove_stale_namespaces()
        results = compare_training(
            spec,
            [points[name] for name in names],
            dataclasses.replace(options, seed=launch),
            rounds=args.rounds,
        )
        for name, result in zip(names, results, strict=True):
            samples[name].extend(result.samples_ms)
            runs[name].append(result.median_ms)
        print(
            f"#   {model} launch {launch + 1}: "
            + ", ".join(f"{name} {runs[name][-1]:.1f}" for name in names),
            flush=True,
        )
    measured = {name: statistics.median(times) for name, times in samples.items()}
    pick = min(scored, key=scored.__getitem__)
    settled = settle(args, spec, points, scored, options)
    unscored = min(predicted, key=predicted.__getitem__)
    fastest = min(measured, key=measured.__getitem__)
    keys = list(points)
    return {
        "model": model,
        "predictor": evaluator.predictor,
        "calibrated": evaluator.calibration is not None,
        "pick": pick,
        "pick_unscored": unscored,
        "fastest": fastest,
        "ratio": measured[pick] / measured[fastest],
        "ratio_interval": ratio_interval(samples[pick], samples[fastest]),
        "ratio_unscored": measured[unscored] / measured[fastest],
        "settled": settled,
        "ratio_settled": measured[settled["pick"]] / measured[fastest],
        "tau": kendall_tau([predicted[k] for k in keys], [measured[k] for k in keys]),
        "tau_scored": kendall_tau([scored[k] for k in keys], [measured[k] for k in keys]),
        "ddp_over_fastest": measured["DDP defaults"] / measured[fastest],
        "predicted": predicted,
        "scored": scored,
        "measured": measured,
        "runs": runs,
        "by_confidence": picks_by_confidence(points, predicted, measured, evaluator.calibration),
        "samples": samples,
        # How far apart one point's launches are (largest over smallest), the median over points.
        "spread": statistics.median(max(times) / min(times) for times in runs.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True)
    parser.add_argument(
        "--models", nargs="*", default=["gpt2-tiny", "bert-tiny", "vgg-mini", "mlp"]
    )
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--iters", type=int, default=4, help="kept steps of a turn")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10, help="turns of every point a launch")
    parser.add_argument("--launches", type=int, default=3, help="launches of the whole space")
    parser.add_argument(
        "--verify-top",
        type=int,
        default=3,
        help="the search's --verify-top: best-scored points settled by a launch of their own",
    )
    parser.add_argument(
        "--verify-rounds", type=int, default=10, help="that launch's rounds (of --iters steps)"
    )
    parser.add_argument("--simulator")
    parser.add_argument("--confidence", default="0.8", help="as ddlsim search's, or off")
    parser.add_argument("--out", help="also write the rows here (JSON)")
    args = parser.parse_args()
    for name in ("iters", "rounds", "launches", "verify_top", "verify_rounds"):
        if getattr(args, name) < 1:
            parser.error(
                f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}"
            )
    rows = [measure_model(args, model) for model in args.models]
    print(
        f"# {args.world_size} ranks, {args.bandwidth}; torch {torch.__version__}; "
        f"{platform.machine()}; side by side, {args.launches} launches x {args.rounds} "
        f"rounds x {args.iters} steps a point, the median of all"
    )
    print(
        "| model | pick | fastest measured | pick / fastest (90 % interval) | lowest prediction | "
        "its / fastest | settled by measurement | its / fastest | DDP / fastest | tau | "
        "tau of scores | launch spread |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['model']} | {row['pick']} | {row['fastest']} | {row['ratio']:.3f} "
            f"({row['ratio_interval'][0]:.3f}-{row['ratio_interval'][1]:.3f}) | "
            f"{row['pick_unscored']} | {row['ratio_unscored']:.3f} | "
            f"{row['settled']['pick']} | {row['ratio_settled']:.3f} | "
            f"{row['ddp_over_fastest']:.3f} | {row['tau']:.2f} | {row['tau_scored']:.2f} | "
            f"{row['spread']:.3f} |"
        )
    print(f"median pick / fastest: {statistics.median(r['ratio'] for r in rows):.3f}")
    print(
        f"median settled pick / fastest (top {args.verify_top} and DDP's defaults, "
        f"{args.verify_rounds} rounds in a launch of their own): "
        f"{statistics.median(r['ratio_settled'] for r in rows):.3f}"
    )
    print("pick / fastest by confidence (the same measurements):")
    for confidence in CONFIDENCES:
        ratios = {
            r["model"]: r["by_confidence"][confidence]["ratio"]
            for r in rows
            if confidence in r["by_confidence"]
        }
        if ratios:
            cells = ", ".join(f"{model} {ratio:.3f}" for model, ratio in ratios.items())
            print(f"  {confidence}: {cells}; median {statistics.median(ratios.values()):.3f}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
