"""A search's pick checked against the executor: the pick, the next candidates and DDP's
defaults run side by side in one launch under the measurement protocol."""

from collections.abc import Callable
from typing import Any

from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.executor.protocol import speedup as measured_speedup
from ddlsim.executor.run import RunOptions, RunResult, compare_training
from ddlsim.profiler.cluster import remove_stale_namespaces
from ddlsim.workflows.profiles import normalized_bandwidth
from ddlsim.workflows.requests import Progress, SearchRequest, no_progress

Compare = Callable[[ModelSpec, list[Strategy], RunOptions, int], list[RunResult]]
"""``compare(model, strategies, options, rounds)``: the strategies measured side by side (this
machine's emulated cluster by default; a launched group or a Slurm job otherwise). Called once,
with every strategy to run, possibly none."""


def _compare_here(
    model: ModelSpec, strategies: list[Strategy], options: RunOptions, rounds: int
) -> list[RunResult]:
    if not strategies:
        return []
    remove_stale_namespaces()
    return compare_training(model, strategies, options, rounds=rounds)


def verify_options(request: SearchRequest) -> RunOptions:
    """The options the verifying runs take (the same on every rank of a launched group)."""
    return RunOptions(
        world_size=request.world_size,
        bandwidth=normalized_bandwidth(request.bandwidth),
        **request.measure.run_options(),
    )


def verify(
    request: SearchRequest,
    payload: dict[str, Any],
    progress: Progress = no_progress,
    *,
    compare: Compare | None = None,
) -> tuple[dict[str, Any], list[RunResult]]:
    """Run the pick, the next ``verify_top`` - 1 candidates and the baseline through the
    executor, side by side: what was measured (for the payload) and the runs, for the caller
    to store (:func:`ddlsim.workflows.execute.add_result`) with whatever else must land with
    them.

    All run in one launch (``compare_training``), taking turns of ``measure.iters`` steps over
    ``verify_rounds`` rounds, so that a slow spell of the machine slows them all and the
    speed-up is a ratio from one run. With ``verify_top`` 1 the pick stays the search's; with
    more, the measured fastest of the candidates and DDP's defaults becomes ``best``
    (``picked_by`` ``"measurement"``, the search's own pick kept as ``scored_best``): the
    simulator narrows thousands of strategies to a few, the executor settles the few. A strategy
    whose predicted peak memory is over the capacity is not run (it would exhaust this machine's
    memory, every rank being here): its measured time is ``None`` and ``not_run`` says why. A
    strategy listed twice (the pick is DDP's defaults: ``kept_baseline``) runs once.
    """
    options = verify_options(request)
    named = _verified_candidates(payload, request.verify_top)
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
    launched = (compare or _compare_here)(
        request.model, list(to_run.values()), options, request.verify_rounds
    )
    runs: dict[str, RunResult] = dict(zip(to_run, launched, strict=True))

    def median(name: str) -> float | None:
        got = runs.get(keys[name])
        return got.median_ms if got else None

    out: dict[str, Any] = {"picked_by": "score"}
    best = "best"
    if request.verify_top > 1:
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
    return out, list(runs.values())


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
