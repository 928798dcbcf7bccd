"""A search's pick checked against the executor: the pick, the next candidates and DDP's
defaults run side by side in one launch under the measurement protocol."""

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from ddlsim.cluster.launcher import Launcher
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.executor.jobs import CompareJob
from ddlsim.executor.protocol import speedup as measured_speedup
from ddlsim.executor.run import RunOptions, RunResult
from ddlsim.simulator.predict import Prediction
from ddlsim.workflows.execute import add_result
from ddlsim.workflows.predict import add_predicted, predict_request
from ddlsim.workflows.profiles import normalized_bandwidth
from ddlsim.workflows.requests import PredictRequest, Progress, SearchRequest, no_progress


def verify_options(request: SearchRequest, launcher: Launcher) -> RunOptions:
    """The options the verifying runs take (the same on every rank of a launched group; a
    link rate only where ``launcher`` shapes one)."""
    return RunOptions(
        world_size=request.world_size,
        bandwidth=normalized_bandwidth(request.bandwidth) if launcher.emulated else None,
        **request.measure.run_options(),
    )


def verify_job(
    request: SearchRequest, launcher: Launcher, strategies: list[Strategy] | None
) -> CompareJob:
    """The verifying runs as one job: ``strategies`` side by side (``None`` on a rank that
    follows: rank 0 says which)."""
    return CompareJob(
        spec=request.model,
        strategies=None if strategies is None else tuple(strategies),
        options=verify_options(request, launcher),
        rounds=request.verify_rounds,
    )


def verify(
    request: SearchRequest,
    payload: dict[str, Any],
    progress: Progress = no_progress,
    *,
    launcher: Launcher,
    on_submit: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], list[RunResult]]:
    """Run the pick, the next ``verify_top`` - 1 candidates of ``top`` and the baseline (DDP's
    defaults) through the executor, side by side: what was measured (for the payload) and the
    runs, for the caller to store (:func:`ddlsim.workflows.execute.add_result`) with whatever
    else must land with them.

    All run in one launch through ``launcher`` (:class:`CompareJob`), taking turns of
    ``measure.iters`` steps over ``verify_rounds`` rounds, so that a slow spell of the machine
    slows them all and each speed-up is a ratio from one run. The measurement settles the answer
    (``picked_by`` ``"measurement"``, :func:`_settle`): the measured fastest candidate if it beat
    the baseline beyond the noise, else the baseline (``kept_baseline``); ``answer`` says which in
    plain words, ``fastest_candidate`` by how much; each row of ``verified`` carries its measured
    speed-up over the baseline and that speed-up's 95 % interval. The simulator narrows thousands
    of strategies to a few, the executor settles the few, and a pick measured slower is never the
    answer. A strategy whose predicted peak memory is over the capacity is not run (it would
    exhaust this machine's memory, every rank being here): ``not_run`` says why. A strategy listed
    twice runs once.

    Long: settling by measurement in the order it happens (candidates, one launch, the
    intervals, the rule).
    """
    named = _verified_candidates(payload, min(request.verify_top, request.top))
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
    if to_run:
        progress(
            None, f"running {len(to_run)} strateg{'y' if len(to_run) == 1 else 'ies'} for real"
        )
    launched: list[RunResult] = []
    if to_run:
        launched = launcher.launch(
            verify_job(request, launcher, list(to_run.values())),
            progress=lambda message: progress(None, message),
            on_submit=on_submit,
        )
    runs: dict[str, RunResult] = dict(zip(to_run, launched, strict=True))
    out: dict[str, Any] = {"picked_by": "measurement", **_settle(named, keys, runs)}
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
    baseline_run = runs.get(keys["baseline"])
    for row, run in zip(rows, runs.values(), strict=True):
        if baseline_run is not None and run is not baseline_run:
            gain = measured_speedup(
                baseline_run.samples_ms,
                run.samples_ms,
                baseline_rounds=baseline_run.sample_rounds,
                candidate_rounds=run.sample_rounds,
            )
            row.update(speedup=gain.ratio, speedup_interval=list(gain.interval))
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
    return out, list(runs.values())


def _settle(
    named: dict[str, dict[str, Any]], keys: dict[str, str], runs: dict[str, RunResult]
) -> dict[str, Any]:
    """The answer of the measured runs: of the candidates that beat DDP's defaults beyond the
    noise (their speed-up's 95 % interval above 1), the measured fastest; DDP's defaults when
    none did. (The measured fastest alone is not the test: a candidate a hair faster with a
    wider interval would hide one that is measurably faster.)

    The search's own pick, when the answer differs from it, is kept as ``scored_best``; the
    measured fastest candidate's speed-up is reported either way (``fastest_candidate``), so
    the payload says what was measured even when it keeps the baseline."""
    baseline_run = runs.get(keys["baseline"])
    ran = [
        name
        for name in named
        if name != "baseline" and keys[name] != keys["baseline"] and keys[name] in runs
    ]
    out: dict[str, Any] = {}

    def order(name: str) -> tuple[float, bool]:
        return runs[keys[name]].median_ms, name != "best"

    fastest = min(ran, key=order, default=None)
    gains = {}
    if baseline_run is not None:
        for name in ran:
            run = runs[keys[name]]
            gains[name] = measured_speedup(
                baseline_run.samples_ms,
                run.samples_ms,
                baseline_rounds=baseline_run.sample_rounds,
                candidate_rounds=run.sample_rounds,
            )
    if fastest is not None and fastest in gains:
        quickest = gains[fastest]
        out["fastest_candidate"] = {
            **named[fastest],
            "name": fastest,
            "measured_ms": runs[keys[fastest]].median_ms,
            "speedup": quickest.ratio,
            "speedup_interval": list(quickest.interval),
            "verdict": quickest.verdict,
        }
    winners = [name for name, g in gains.items() if g.significant and g.ratio > 1]
    answer = min(winners, key=order) if winners else "baseline"
    gain = gains.get(answer)
    if baseline_run is None:  # DDP's defaults did not fit: the fastest that ran, if any
        answer = fastest or "best"
    if keys[answer] != keys["best"]:
        out["scored_best"] = named["best"]
        out["best"] = named[answer]
    answer_run, kept = runs.get(keys[answer]), keys[answer] == keys["baseline"]
    for name, measured in (("best", answer_run), ("baseline", baseline_run)):
        out[f"measured_{name}_ms"] = measured.median_ms if measured else None
        out[f"measured_{name}_ci95_ms"] = list(measured.ci95_ms) if measured else None
    if answer_run is None or baseline_run is None:
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
        assert gain is not None
        out.update(
            speedup=gain.ratio,
            speedup_interval=list(gain.interval),
            significant=gain.significant,
            verdict=gain.verdict,
        )
    out["answer"] = _answer_words(named, answer, out, runs, keys)
    return out


def _answer_words(
    named: dict[str, dict[str, Any]],
    answer: str,
    out: dict[str, Any],
    runs: dict[str, RunResult],
    keys: dict[str, str],
) -> str:
    """What the measured runs decided, in plain words."""
    candidates = sum(1 for name in named if name != "baseline" and keys[name] in runs)
    fastest = out.get("fastest_candidate")
    if answer != "baseline" and out.get("speedup_interval") is not None:
        low, high = out["speedup_interval"]
        which = (
            "the fastest"
            if fastest is not None and fastest["name"] == answer
            else "the fastest measurably faster"
        )
        return (
            f"picked {Strategy.from_dict(named[answer]['strategy']).describe()}: measured "
            f"{out['speedup']:.3f}x faster than DDP's defaults (95 % interval "
            f"{low:.3f}-{high:.3f}), {which} of {candidates} candidate"
            f"{'s' if candidates != 1 else ''} run side by side"
        )
    if fastest is None:
        if keys["best"] == keys["baseline"]:
            return "kept DDP's defaults: the search found nothing predicted faster"
        return "nothing was measured: the search's pick stands unverified"
    low, high = fastest["speedup_interval"]
    return (
        f"kept DDP's defaults: the fastest of {candidates} candidate"
        f"{'s' if candidates != 1 else ''}, {Strategy.from_dict(fastest['strategy']).describe()}"
        f", measured {fastest['speedup']:.3f}x (95 % interval {low:.3f}-{high:.3f}), not faster "
        "beyond the noise"
    )


def predict_verified(request: SearchRequest, store: Store, strategy: Strategy) -> Prediction:
    """The prediction of a verified strategy on the verifying runs' cluster, with the search's
    cost model and the store's profiles (as ``ddlsim predict`` makes it)."""
    asked = PredictRequest(
        model=request.model,
        strategy=strategy,
        world_size=request.world_size,
        bandwidth=request.bandwidth,
        profile_iters=request.profile_iters,
        simulator=request.simulator,
    )
    return predict_request(asked, store)[0]


def store_verified(
    session: Session,
    payload: dict[str, Any],
    runs: list[RunResult],
    predictions: list[Prediction],
) -> None:
    """Add each verifying run and the prediction of its strategy to ``session``, and name both
    on the payload's ``verified`` row of that strategy (``measurement_id``, ``prediction_id``):
    the dashboard pairs them."""
    rows = {_key(row["strategy"]): row for row in payload.get("verified", [])}
    for run, prediction in zip(runs, predictions, strict=True):
        row = rows.get(run.strategy.to_json(), {})
        row["measurement_id"] = add_result(session, run)
        row["prediction_id"] = add_predicted(session, prediction, run.strategy)


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
