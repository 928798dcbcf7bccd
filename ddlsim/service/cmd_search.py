"""``ddlsim search``: the fastest strategy for a model on a cluster, found with the simulator,
and (``--verify``) checked against the executor.

``--space all`` (the default) searches parallel plans (data, tensor and pipeline parallelism,
FSDP, micro-batches), tensor fusion (bucket partitions or caps, DeAR) and op fusion (compiled
blocks); ``--space fusion`` keeps DDP's plan and searches fusion only. Plans whose predicted peak
memory exceeds ``--memory-gb`` per device are pruned. ``backtrack`` is the DisCo-style search;
``tpe``, ``cmaes``, ``nsga2`` (time and memory together) and ``random`` are Optuna samplers whose
study can live in a database or a journal file (``--storage``) that several worker processes
(``--workers``), on this machine or others, share; ``autotune`` is the Horovod-style baseline
that tunes DDP's bucket cap by Bayesian optimisation over live executor runs, without the
simulator.

The rank's micro-batch is kernel-profiled unless the store has a profile; collectives are priced
from the store's fits of the link (the link's nominal rate where none is stored).
"""

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import resolve_model
from ddlsim.executor.plan import model_supports
from ddlsim.executor.protocol import speedup as measured_speedup
from ddlsim.executor.run import (
    MAX_SIDE_BY_SIDE,
    RunOptions,
    RunResult,
    compare_training,
    run_training,
)
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.profiler.cluster import remove_stale_namespaces
from ddlsim.search.autotune import autotune_fusion
from ddlsim.search.backtrack import BacktrackOptions, SearchResult, backtrack_fusion, begin
from ddlsim.search.joint import backtrack_all
from ddlsim.search.optuna_search import (
    JOURNAL,
    Space,
    StudyOptions,
    finished_trials,
    open_study,
    optimize,
    pruned_reasons,
    result_from_study,
)
from ddlsim.search.random_search import random_fusion
from ddlsim.search.space import Cluster, Profiles, StrategyEvaluator, candidate_plans
from ddlsim.service.cmd_predict import (
    cost_model_for,
    kernel_profile_for,
    machine_scale,
    normalized_bandwidth,
)
from ddlsim.service.cmd_run import add_result
from ddlsim.service.output import (
    add_protocol_arguments,
    describe,
    emit_json,
    format_interval,
    positive_int,
    progress,
    protocol_options,
    verification_lines,
)
from ddlsim.simulator.calibration import (
    DEFAULT_CONFIDENCE,
    Calibration,
    check_confidence,
)
from ddlsim.simulator.memory import GIB

ALGORITHMS = ("backtrack", "tpe", "cmaes", "nsga2", "random", "autotune")
SAMPLERS = ("tpe", "cmaes", "nsga2", "random")
SPACES = ("all", "fusion")


def cmd_search(args: argparse.Namespace) -> int:
    payload = run_search(args)
    if args.json:
        emit_json(payload)
    else:
        _print(payload)
    return 0


Report = Callable[[float, str], None]


def run_search(args: argparse.Namespace, report: Report | None = None) -> dict[str, Any]:
    """The search ``args`` describe (``ddlsim search``'s arguments), as its JSON payload.

    ``report(fraction, message)`` hears of progress: the strategies priced against the
    budget, then the verifying runs. It may raise to stop the search.

    Raises:
        DdlsimError: bad arguments, a model or plan the tools cannot handle.
    """
    _check(args)
    spec = _spec(args)
    with Store.open(args.db) as store:
        evaluator = build_evaluator(args, spec, store)
        graph, _ = evaluator.profiles(_rank(spec, args.world_size))
        nbytes = {p.name: p.nbytes for p in graph.params}
        order = list(graph.grad_ready_order)
        sizes = [nbytes[n] for n in order]
        space = _space(args, spec, evaluator, sum(sizes) / 2**20)
        progress(f"searching {spec.label} ({args.algo}, {args.space} space)")
        pareto: list[dict[str, Any]] = []
        pruned: dict[str, int] = {}
        with _bar(args) as bar:
            evaluator.on_priced = advance = _progress(bar, int(bar.total or 1), report)
            options = BacktrackOptions(
                budget=args.budget, time_limit_s=args.time_limit, top=args.top
            )
            if args.algo == "backtrack" and args.space == "fusion":
                result = backtrack_fusion(evaluator, order, sizes, options)
            elif args.algo == "backtrack":
                joint = backtrack_all(evaluator, space.plans, order, sizes, options)
                result = joint.result
                for _, reason in joint.pruned:
                    pruned[reason] = pruned.get(reason, 0) + 1
            elif args.algo == "random" and args.space == "fusion":
                result = random_fusion(evaluator, order, options, seed=args.seed)
            elif args.algo == "autotune":
                result = _autotune(args, spec, sum(sizes) / 2**20, advance)
            else:
                result, pareto, pruned = _sample(args, spec, evaluator, space, order)
        payload = _payload(args, spec.label, evaluator, result)
        if args.algo == "nsga2":
            payload["pareto"] = [_rescored(evaluator, row) for row in pareto]
        payload["pruned"] = pruned
    if args.verify:
        if report is not None:
            report(1.0, "running the pick and the baseline for real")
        payload.update(_verify(args, spec, payload))
    return payload


def _check(args: argparse.Namespace) -> None:
    if args.world_size < 2:
        raise InvalidOptionError(
            f"world_size({args.world_size}) must be >= 2: a search splits work between ranks"
        )
    if not args.time_limit > 0:
        raise InvalidOptionError(f"time_limit({args.time_limit}) must be > 0 seconds")
    if args.confidence is not None:
        check_confidence(args.confidence)
    if args.memory_gb is not None and not args.memory_gb > 0:
        raise InvalidOptionError(f"memory_gb({args.memory_gb}) must be > 0")
    if args.verify_top > 1 and not args.verify:
        raise InvalidOptionError(f"verify_top({args.verify_top}) > 1 needs --verify")
    if args.verify_top > min(args.top, MAX_SIDE_BY_SIDE - 1):
        raise InvalidOptionError(
            f"verify_top({args.verify_top}) must be <= top({args.top}) and <= "
            f"{MAX_SIDE_BY_SIDE - 1} (the candidates and DDP's defaults run in one launch)"
        )
    if args.workers > 1 and args.algo not in SAMPLERS:
        raise InvalidOptionError(
            f"workers({args.workers}) > 1 needs an Optuna sampler (--algo "
            f"{'|'.join(SAMPLERS)}); {args.algo} runs in one process"
        )


def _spec(args: argparse.Namespace) -> ModelSpec:
    return resolve_model(args.model).with_inputs(
        batch_size=args.batch_size, seq_len=args.seq_len, image_size=args.image_size
    )


def _rank(spec: ModelSpec, world_size: int) -> ModelSpec:
    from ddlsim.simulator.costs import rank_spec

    return rank_spec(spec, Strategy(), world_size)


def default_capacity_gb(world_size: int) -> float:
    """Each rank's share of this machine's memory: every rank of the emulated cluster runs
    here."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total / GIB / world_size


def build_evaluator(args: argparse.Namespace, spec: ModelSpec, store: Store) -> StrategyEvaluator:
    """The evaluator of ``args``'s cluster, its profiles read from (or taken into) ``store``."""
    bandwidth = normalized_bandwidth(args.bandwidth)
    capacity_gb = args.memory_gb if args.memory_gb else default_capacity_gb(args.world_size)

    def profiles(rank: ModelSpec) -> tuple[IterationGraph, Mapping[int, float]]:
        graph, profile, _ = kernel_profile_for(
            store, rank, optimizer="adamw", iters=args.profile_iters
        )
        return graph, profile.node_ms

    cost_model = cost_model_for(args.simulator)
    return StrategyEvaluator(
        spec,
        Cluster(
            world_size=args.world_size,
            bandwidth=bandwidth,
            fits=store.collective_profiles(backend="gloo"),
            capacity_bytes=int(capacity_gb * GIB),
            compute_scale=machine_scale(args.world_size),
        ),
        _cached(profiles),
        capture_plan,
        cost_model=cost_model,
        calibration=calibration_of(cost_model, args.confidence),
        confidence=args.confidence or DEFAULT_CONFIDENCE,
    )


def calibration_of(
    cost_model: tuple[Any, Mapping[str, Any]] | None, confidence: float | None
) -> Calibration | None:
    """The checkpoint's calibration of its own predictor, unless ``confidence`` is ``None``
    (``--confidence off``) or the checkpoint has none (trained without cross-validation)."""
    if cost_model is None or confidence is None:
        return None
    _, meta = cost_model
    raw = (meta.get("calibration") or {}).get(str(meta.get("predictor", "")))
    return Calibration.from_json(raw) if raw else None


def confidence_arg(text: str) -> float | None:
    """``--confidence``: a number (checked against [0.5, 0.99] with the other options), or
    ``off``."""
    if text.strip().lower() == "off":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"confidence {text!r} is not a number in [0.5, 0.99] or 'off'"
        ) from None


def capture_plan(rank: ModelSpec, strategy: Strategy) -> IterationGraph:
    """The graph of a rank's micro-batch under ``strategy`` (AdamW, as profiles are taken)."""
    return capture_graph(rank, CaptureOptions(strategy=strategy))


def _cached(profiles: Profiles) -> Profiles:
    memo: dict[str, tuple[IterationGraph, Mapping[int, float]]] = {}

    def cached(rank: ModelSpec) -> tuple[IterationGraph, Mapping[int, float]]:
        key = rank.label + str(rank.inputs.batch_size)
        if key not in memo:
            memo[key] = profiles(rank)
        return memo[key]

    return cached


def _space(
    args: argparse.Namespace, spec: ModelSpec, evaluator: StrategyEvaluator, grad_mb: float
) -> Space:
    plans = (
        candidate_plans(spec, args.world_size, model_supports)
        if args.space == "all"
        else [ParallelPlan()]
    )
    blocks = evaluator.blocks if args.space == "all" else ()
    return Space(plans=tuple(plans), total_grad_mb=grad_mb, blocks=blocks)


@contextmanager
def _bar(args: argparse.Namespace) -> Iterator[tqdm]:
    """Evaluations against the budget on a terminal (nothing in pipes or --json output)."""
    unit = "run" if args.algo == "autotune" else "strategy"
    total = args.budget if args.algo != "autotune" else min(args.budget, AUTOTUNE_RUNS)
    bar = tqdm(total=total, unit=unit, file=sys.stderr, disable=None, leave=False)
    try:
        yield bar
    finally:
        bar.close()


AUTOTUNE_RUNS = 10


def _progress(bar: tqdm, total: int, report: Report | None) -> Callable[[int], None]:
    """Counts priced strategies onto the bar (on a terminal) and to ``report``."""
    priced = 0

    def advance(count: int) -> None:
        nonlocal priced
        priced += count
        bar.update(count)
        if report is not None:
            report(min(1.0, priced / total), f"{priced} of {total} evaluations")

    return advance


def _sample(
    args: argparse.Namespace,
    spec: ModelSpec,
    evaluator: StrategyEvaluator,
    space: Space,
    order: list[str],
) -> tuple[SearchResult, list[dict[str, Any]], dict[str, int]]:
    """An Optuna search, with ``args.workers - 1`` more worker processes on the same study (a
    temporary journal file when no ``--storage`` is given)."""
    options = BacktrackOptions(budget=args.budget, time_limit_s=args.time_limit, top=args.top)
    start, baseline, baseline_ms = begin(evaluator, order)
    with tempfile.TemporaryDirectory(prefix="ddlsim-study-") as scratch:
        storage = args.storage
        if storage is None and args.workers > 1:
            storage = f"{JOURNAL}{Path(scratch) / 'study.log'}"
        study = StudyOptions(
            storage=storage,
            study_name=args.study_name
            or f"{spec.label}-{args.world_size}-{normalized_bandwidth(args.bandwidth)}-"
            f"{args.algo}-{args.space}",
            seed=args.seed,
        )
        trials = open_study(args.algo, study)
        # The budget is this search's: trials already in a shared study do not count.
        target = finished_trials(trials) + args.budget
        deadline = start + args.time_limit
        workers = _start_workers(args, study, target, deadline - time.perf_counter())
        try:
            optimize(trials, evaluator, space, budget=target, deadline=deadline)
            for worker in workers:
                worker.join()
        finally:
            for worker in workers:  # interrupted: end them by their id
                if worker.is_alive():
                    worker.terminate()
                    worker.join()
        failed = [w.exitcode for w in workers if w.exitcode not in (0, None)]
        if failed:
            raise InvalidOptionError(f"{len(failed)} search worker(s) failed (exit {failed})")
        result, pareto = result_from_study(
            trials,
            space,
            baseline=baseline,
            baseline_ms=baseline_ms,
            start=start,
            options=options,
            baseline_fits=evaluator.feasible(baseline),
        )
        return result, pareto, pruned_reasons(trials)


def _start_workers(
    args: argparse.Namespace, study: StudyOptions, target: int, seconds: float
) -> list[multiprocessing.process.BaseProcess]:
    context = multiprocessing.get_context("spawn")
    workers: list[multiprocessing.process.BaseProcess] = []
    for index in range(1, args.workers):
        worker = context.Process(
            target=_worker,
            args=(vars(args).copy(), study, index, target, seconds),
            name=f"ddlsim-search-worker-{index}",
            daemon=True,
        )
        worker.start()
        workers.append(worker)
    return workers


def _worker(
    raw: dict[str, Any], study: StudyOptions, index: int, target: int, seconds: float
) -> None:
    """One more worker on the study: its own evaluator (profiles from the store), its own
    sampler seed."""
    deadline = time.perf_counter() + seconds
    args = argparse.Namespace(**raw)
    spec = _spec(args)
    with Store.open(args.db) as store:
        evaluator = build_evaluator(args, spec, store)
        graph, _ = evaluator.profiles(_rank(spec, args.world_size))
        grad_mb = sum(p.nbytes for p in graph.params) / 2**20
        space = _space(args, spec, evaluator, grad_mb)
        trials = open_study(args.algo, study, worker=index)
        optimize(trials, evaluator, space, budget=target, deadline=deadline)


def _autotune(
    args: argparse.Namespace, spec: ModelSpec, grad_mb: float, advance: Callable[[int], None]
) -> SearchResult:
    remove_stale_namespaces()
    options = RunOptions(
        world_size=args.world_size,
        bandwidth=normalized_bandwidth(args.bandwidth),
        **protocol_options(args),
    )

    def measure(strategy: Strategy) -> float:
        return run_training(spec, strategy, options).median_ms

    return autotune_fusion(
        measure,
        total_grad_mb=grad_mb,
        budget=min(args.budget, AUTOTUNE_RUNS),
        time_limit_s=args.time_limit,
        seed=args.seed,
        top=args.top,
        on_sample=lambda strategy, ms: advance(1),
    )


def _payload(
    args: argparse.Namespace, model: str, evaluator: StrategyEvaluator, result: SearchResult
) -> dict[str, Any]:
    measured = args.algo == "autotune"

    def entry(strategy: Strategy, ms: float) -> dict[str, Any]:
        row: dict[str, Any] = {"strategy": strategy.to_dict()}
        if measured:
            row["measured_ms"] = ms
        (row["predicted_ms"],) = evaluator.predicted([strategy])
        (row["scored_ms"],) = evaluator.price([strategy])
        row["peak_memory_gib"] = evaluator.memory(strategy).total_gib
        row["fits"] = evaluator.feasible(strategy)
        return row

    capacity = evaluator.cluster.capacity_bytes
    return {
        "model": model,
        "world_size": args.world_size,
        "bandwidth": evaluator.cluster.bandwidth,
        "algo": args.algo,
        "space": args.space,
        "predictor": evaluator.predictor,
        "calibration": _calibration_json(evaluator),
        "memory_capacity_gib": capacity / GIB if capacity else None,
        "best": entry(result.best, result.best_ms),
        "baseline": entry(result.baseline, result.baseline_ms),
        "top": [entry(s, ms) for s, ms in result.top],
        "evaluations": result.evaluations,
        "elapsed_s": result.elapsed_s,
        "convergence": list(result.curve),
    }


def _rescored(evaluator: StrategyEvaluator, row: dict[str, Any]) -> dict[str, Any]:
    """A Pareto row (its time the search's score) with the prediction and the score apart."""
    strategy = Strategy.from_dict(row["strategy"])
    (predicted,) = evaluator.predicted([strategy])
    return {**row, "predicted_ms": predicted, "scored_ms": row["predicted_ms"]}


def _calibration_json(evaluator: StrategyEvaluator) -> dict[str, Any] | None:
    """How the search scored strategies: the confidence and each kind's factor on its
    predicted time; ``None`` when it ranked by the prediction alone."""
    calibration = evaluator.calibration
    if calibration is None:
        return None
    summary = calibration.summary(evaluator.confidence)
    return {
        "predictor": calibration.predictor,
        "confidence": evaluator.confidence,
        "factors": {kind: row["factor"] for kind, row in summary.items()},
        "runs": {kind: row["runs"] for kind, row in summary.items()},
    }


def _verify(args: argparse.Namespace, spec: ModelSpec, payload: dict[str, Any]) -> dict[str, Any]:
    """Run the pick, the next ``--verify-top`` - 1 candidates and the baseline through the
    executor, side by side.

    All run in one launch (``compare_training``), taking turns of ``--iters`` steps over
    ``--verify-rounds`` rounds, so that a slow spell of the machine slows them all and the
    speed-up is a ratio from one run. With ``--verify-top`` 1 the pick stays the search's; with
    more, the measured fastest of the candidates and DDP's defaults becomes ``best``
    (``picked_by`` ``"measurement"``, the search's own pick kept as ``scored_best``): the
    simulator narrows thousands of strategies to a few, the executor settles the few. A strategy
    whose predicted peak memory is over the capacity is not run (it would exhaust this machine's
    memory, every rank being here): its measured time is ``None`` and ``not_run`` says why. A
    strategy listed twice (the pick is DDP's defaults: ``kept_baseline``) runs once.
    """
    remove_stale_namespaces()
    options = RunOptions(
        world_size=args.world_size,
        bandwidth=normalized_bandwidth(args.bandwidth),
        **protocol_options(args),
    )
    named = _verified_candidates(payload, args.verify_top)
    keys = {name: _key(entry["strategy"]) for name, entry in named.items()}
    not_run: dict[str, str] = {}
    to_run: dict[str, Strategy] = {}  # by strategy key, each once
    for name, entry in named.items():
        if not entry["fits"]:
            not_run[name] = (
                f"predicted peak {entry['peak_memory_gib']:.2f} GiB a rank is over the "
                f"capacity of {payload['memory_capacity_gib']:.2f} GiB"
            )
        else:
            to_run.setdefault(keys[name], Strategy.from_dict(entry["strategy"]))
    runs: dict[str, RunResult] = {}
    if to_run:
        progress(f"running {len(to_run)} strateg{'y' if len(to_run) == 1 else 'ies'} for real")
        launched = compare_training(
            spec, list(to_run.values()), options, rounds=args.verify_rounds
        )
        runs = dict(zip(to_run, launched, strict=True))
        # Stored as any run is, marked side by side in their env: the dashboard shows them.
        with Store.open(args.db) as store, store.transaction() as session:
            for run in launched:
                add_result(session, run)

    def median(name: str) -> float | None:
        got = runs.get(keys[name])
        return got.median_ms if got else None

    out: dict[str, Any] = {"picked_by": "score"}
    best = "best"
    if args.verify_top > 1:
        ran = [name for name in named if median(name) is not None]
        if ran:
            best = min(ran, key=lambda name: (median(name), name != "best"))
            out["picked_by"] = "measurement"
            if best != "best":
                out["scored_best"] = named["best"]
                out["best"] = named[best]
    best_run, baseline_run = runs.get(keys[best]), runs.get(keys["baseline"])
    kept = keys[best] == keys["baseline"]
    for name, measured in (("best", best_run), ("baseline", baseline_run)):
        out[f"measured_{name}_ms"] = measured.median_ms if measured else None
        out[f"measured_{name}_ci95_ms"] = list(measured.ci95_ms) if measured else None
    if best_run is None or baseline_run is None:
        out.update(speedup=None, speedup_interval=None, significant=None, verdict=None)
    elif kept:  # one run, read twice: the ratio is 1 exactly
        out.update(
            speedup=1.0,
            speedup_interval=[1.0, 1.0],
            significant=False,
            verdict="the pick is DDP's defaults",
            kept_baseline=True,
        )
    else:
        gain = measured_speedup(
            baseline_run.samples_ms,
            best_run.samples_ms,
            baseline_rounds=baseline_run.sample_rounds,
            candidate_rounds=best_run.sample_rounds,
        )
        out.update(
            speedup=gain.ratio,
            speedup_interval=list(gain.interval),
            significant=gain.significant,
            verdict=gain.verdict,
        )
    rows = []
    for key, run in runs.items():
        names = [name for name in named if keys[name] == key and name not in not_run]
        rows.append(
            {
                **named[names[0]],
                "measured_ms": run.median_ms,
                "ci95_ms": list(run.ci95_ms),
                "samples": len(run.samples_ms),
                "verified_as": names,
            }
        )
    out["verified"] = sorted(rows, key=lambda row: row["measured_ms"])
    if runs:
        first = next(iter(runs.values()))
        out["measurement"] = {
            "side_by_side": first.side_by_side,
            "rounds": first.rounds,
            "stopped_by": first.stopped_by,
            "rank_cores": {str(k): v for k, v in first.rank_cores.items()},
        }
    if not_run:
        out["not_run"] = not_run
    return out


def _verified_candidates(payload: dict[str, Any], count: int) -> dict[str, dict[str, Any]]:
    """The baseline and the search's first ``count`` distinct candidates (its pick, then the
    next of ``top``), by name: ``baseline``, ``best``, ``top 2``, ``top 3``..."""
    named = {"baseline": payload["baseline"], "best": payload["best"]}
    seen = {_key(payload["best"]["strategy"])}
    for entry in payload["top"]:
        if len(seen) >= count:
            break
        if _key(entry["strategy"]) not in seen:
            seen.add(_key(entry["strategy"]))
            named[f"top {len(seen)}"] = entry
    return named


def _key(strategy: dict[str, Any]) -> str:
    return Strategy.from_dict(strategy).to_json()


def _print(payload: dict[str, Any]) -> None:
    best, baseline = payload["best"], payload["baseline"]
    kind = "measured" if payload["algo"] == "autotune" else "predicted"
    key = "measured_ms" if kind == "measured" else "predicted_ms"
    print(
        f"{payload['model']} on {payload['world_size']} ranks, {payload['bandwidth']}: "
        f"{payload['evaluations']} strategies priced in {payload['elapsed_s']:.1f} s "
        f"({payload['algo']}, {payload['space']} space, predictor {payload['predictor']})\n"
        f"  baseline (DDP defaults)  {baseline[key]:.1f} ms {kind}, "
        f"{baseline['peak_memory_gib']:.2f} GiB\n"
        f"  best                     {best[key]:.1f} ms {kind}, "
        f"{best['peak_memory_gib']:.2f} GiB: {describe(best['strategy'])}"
    )
    calibration = payload.get("calibration")
    if calibration is not None and kind == "predicted":
        print(
            f"  scored at the {calibration['confidence']:g} quantile of each kind's held-out "
            f"speed-up errors: best {best['scored_ms']:.1f} ms against "
            f"{baseline['scored_ms']:.1f} ms"
        )
    for reason, count in payload.get("pruned", {}).items():
        print(f"  pruned                   {count} x {reason}")
    for row in payload.get("pareto", []):
        print(
            f"  pareto                   {row['predicted_ms']:.1f} ms, "
            f"{row['peak_memory_gib']:.2f} GiB: {describe(row['strategy'])}"
        )
    if "speedup" in payload:
        for line in verification_lines(payload):
            print(f"  measured                 {line}")
    if payload.get("picked_by") == "measurement":
        for row in payload["verified"]:
            print(
                f"  verified                 {row['measured_ms']:.1f} ms measured "
                f"({format_interval(row['ci95_ms'])}), "
                f"{row['predicted_ms']:.1f} ms predicted: {describe(row['strategy'])}"
            )
        if "scored_best" in payload:
            print(
                "  the measured fastest replaced the search's pick: "
                f"{describe(payload['scored_best']['strategy'])}"
            )
    for name, reason in payload.get("not_run", {}).items():
        print(f"  not run                  the {name}: {reason}")


def register(sub: Any) -> None:
    cmd = sub.add_parser("search", help="find the fastest strategy with the simulator")
    cmd.add_argument("model", metavar="MODEL", help="zoo name, spec file or inline JSON")
    cmd.add_argument("--world-size", type=positive_int, required=True)
    cmd.add_argument("--bandwidth", help="link rate per host (1gbit, 100mbit, none)")
    cmd.add_argument("--algo", choices=ALGORITHMS, default="backtrack")
    cmd.add_argument(
        "--space",
        choices=SPACES,
        default="all",
        help="all: parallel plans, tensor and op fusion; fusion: DDP's plan, tensor fusion only",
    )
    cmd.add_argument(
        "--budget",
        type=positive_int,
        default=2000,
        help=f"strategies to price (autotune: live runs, at most {AUTOTUNE_RUNS})",
    )
    cmd.add_argument("--time-limit", type=float, default=60.0, help="seconds")
    cmd.add_argument(
        "--memory-gb",
        type=float,
        help="memory per device (GiB); plans predicted to need more are pruned "
        "(default: this machine's memory over the ranks)",
    )
    cmd.add_argument("--top", type=positive_int, default=5)
    cmd.add_argument(
        "--confidence",
        type=confidence_arg,
        default=DEFAULT_CONFIDENCE,
        help="score each strategy at this quantile of its kind's held-out speed-up errors, so "
        "that a pick must beat DDP's defaults by more than its kind usually loses (default "
        f"{DEFAULT_CONFIDENCE}); off: rank by the predicted time alone",
    )
    cmd.add_argument("--seed", type=int, default=0, help="the samplers' seed")
    cmd.add_argument(
        "--storage",
        help="Optuna samplers: where the study lives, so that several searches share it: an "
        "RDB URL (sqlite:///PATH, postgresql+psycopg://...) or journal:///PATH (Optuna's "
        "journal file: faster, for processes sharing a file system)",
    )
    cmd.add_argument("--study-name", help="the study (default: model-ranks-link-algo-space)")
    cmd.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="Optuna samplers: worker processes on the study (a temporary journal file when "
        "--storage is not given)",
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
    add_protocol_arguments(cmd, iters=6, what="--verify and autotune")
    cmd.add_argument(
        "--verify-rounds",
        type=positive_int,
        default=3,
        help="--verify: the strategies run side by side, taking turns of --iters steps this "
        "many times each",
    )
    cmd.add_argument(
        "--verify-top",
        type=positive_int,
        default=1,
        help="--verify: also run the next candidates of --top, up to this many in all, and "
        "keep the measured fastest of them and DDP's defaults (default 1: verify the pick only)",
    )
    cmd.add_argument("--db", help="store URL (default: $DDLSIM_DB or the user data dir)")
    cmd.add_argument("--json", action="store_true", help="print JSON")
    cmd.set_defaults(handler=cmd_search)
