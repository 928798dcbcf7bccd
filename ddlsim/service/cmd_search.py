"""``ddlsim search``: the fastest strategy for a model on a cluster, found with the simulator,
and (``--verify``) checked against the executor (:mod:`ddlsim.workflows.search`)."""

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm

from ddlsim.data.errors import InvalidOptionError
from ddlsim.service import cmd_scale, output
from ddlsim.simulator.calibration import DEFAULT_CONFIDENCE
from ddlsim.workflows.launched import search_launched
from ddlsim.workflows.requests import (
    SEARCH_ALGORITHMS,
    SEARCH_PRIORS,
    SEARCH_SPACES,
    Progress,
    SearchRequest,
    defaults,
)
from ddlsim.workflows.search import AUTOTUNE_RUNS

DEFAULTS = defaults(SearchRequest)


def cmd_search(args: argparse.Namespace) -> int:
    if cmd_scale.gpu_cluster(args) is not None:
        return cmd_scale.search_on_cluster(args)
    args.algo = args.algo or DEFAULTS["algo"]
    if args.world_size is None:
        raise InvalidOptionError(
            "ddlsim search needs --world-size, or --cluster for a GPU cluster"
        )
    request = output.request_from(
        args,
        SearchRequest,
        renames={"time_limit_s": "time_limit"},
        measure=output.measure_settings(args),
    )
    extra: dict[str, Any] = {}
    with _bar(request) as progress:
        payload = search_launched(
            request,
            launcher=output.launcher_from(args),
            db=args.db,
            progress=progress,
            on_submit=output.slurm_job_printer(extra),
        )
    if payload is None:
        return 0  # a rank that follows: it ran the verifying runs rank 0 chose
    payload.update(extra)
    if args.json:
        output.emit_json(payload)
    else:
        _print(payload)
    return 0


@contextmanager
def _bar(request: SearchRequest) -> Iterator[Progress]:
    """Evaluations against the budget as a bar on a terminal (nothing in pipes or --json
    output); other messages as status lines."""
    unit = "run" if request.algo == "autotune" else "strategy"
    total = min(request.budget, AUTOTUNE_RUNS) if request.algo == "autotune" else request.budget
    bar = tqdm(total=total, unit=unit, file=sys.stderr, disable=None, leave=False)

    def show(fraction: float | None, message: str) -> None:
        if fraction is None:
            output.stderr_progress(fraction, message)
        else:
            bar.update(round(fraction * total) - bar.n)

    try:
        yield show
    finally:
        bar.close()


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
        f"{best['peak_memory_gib']:.2f} GiB: {output.describe(best['strategy'])}"
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
            f"{row['peak_memory_gib']:.2f} GiB: {output.describe(row['strategy'])}"
        )
    if "speedup" in payload:
        for line in output.verification_lines(payload):
            print(f"  measured                 {line}")
    if payload.get("picked_by") == "measurement":
        for row in payload["verified"]:
            print(
                f"  verified                 {row['measured_ms']:.1f} ms measured "
                f"({output.format_interval(row['ci95_ms'])}), "
                f"{row['predicted_ms']:.1f} ms predicted: {output.describe(row['strategy'])}"
            )
        if "scored_best" in payload:
            print(
                "  the measured fastest replaced the search's pick: "
                f"{output.describe(payload['scored_best']['strategy'])}"
            )
    for name, reason in payload.get("not_run", {}).items():
        print(f"  not run                  the {name}: {reason}")


def register(sub: Any) -> None:
    cmd = sub.add_parser("search", help="find the fastest strategy with the simulator")
    output.add_input_arguments(cmd)

    def count(flag: str, asks: str | None = None) -> None:
        """An option that counts something (an integer >= 1), its default the request's field
        of the same name."""
        field = flag.removeprefix("--").replace("-", "_")
        cmd.add_argument(flag, type=output.positive_int, default=DEFAULTS[field], help=asks)

    cmd.add_argument(
        "--world-size", type=output.positive_int, help="ranks (required without --cluster)"
    )
    cmd_scale.add_cluster_arguments(cmd, with_plan=False)
    cmd.add_argument("--bandwidth", help="link rate per host (1gbit, 100mbit, none)")
    cmd.add_argument(
        "--algo",
        choices=SEARCH_ALGORITHMS,
        help=f"the search algorithm (default {DEFAULTS['algo']}; with --cluster, the GPU "
        "path's bound-and-replay search over every layout unless given)",
    )
    cmd.add_argument(
        "--space",
        choices=SEARCH_SPACES,
        default=DEFAULTS["space"],
        help="all: parallel plans, tensor and op fusion; fusion: DDP's plan, tensor fusion only",
    )
    cmd.add_argument(
        "--prior",
        choices=SEARCH_PRIORS,
        default=DEFAULTS["prior"],
        help="analytic: order the grid plans by the analytical model and drop those it finds "
        "far slower before any is scored; none: score them all",
    )
    count("--budget", f"strategies to price (autotune: live runs, at most {AUTOTUNE_RUNS})")
    cmd.add_argument("--time-limit", type=float, default=DEFAULTS["time_limit_s"], help="seconds")
    cmd.add_argument(
        "--memory-gb",
        type=float,
        help="memory per device (GiB); plans predicted to need more are pruned "
        "(default: this machine's memory over the ranks)",
    )
    count("--top")
    cmd.add_argument(
        "--confidence",
        type=confidence_arg,
        default=DEFAULTS["confidence"],
        help="score each strategy at this quantile of its kind's held-out speed-up errors, so "
        "that a pick must beat DDP's defaults by more than its kind usually loses (default "
        f"{DEFAULT_CONFIDENCE}); off: rank by the predicted time alone",
    )
    cmd.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="the samplers' seed")
    cmd.add_argument(
        "--storage",
        help="Optuna samplers: where the study lives, so that several searches share it: an "
        "RDB URL (sqlite:///PATH, postgresql+psycopg://...) or journal:///PATH (Optuna's "
        "journal file: faster, for processes sharing a file system)",
    )
    cmd.add_argument("--study-name", help="the study (default: model-ranks-link-algo-space)")
    count(
        "--workers",
        "Optuna samplers: worker processes on the study (a temporary journal file when "
        "--storage is not given)",
    )
    output.add_prediction_arguments(cmd, profile_iters=DEFAULTS["profile_iters"])
    _add_verify_arguments(cmd, count)
    output.add_store_arguments(cmd)
    cmd.set_defaults(handler=cmd_search)


def _add_verify_arguments(cmd: argparse.ArgumentParser, count: Any) -> None:
    """``--verify``, where its runs go (``--launcher``), their protocol and how many run."""
    cmd.add_argument(
        "--verify",
        action="store_true",
        help="run the first --verify-top candidates beside DDP's defaults, side by side, and "
        "answer with the measured fastest if it beat DDP's defaults beyond the noise (else "
        "keep DDP's defaults)",
    )
    output.add_launcher_arguments(cmd, what="--verify")
    output.add_protocol_arguments(cmd, defaults=DEFAULTS["measure"], what="--verify and autotune")
    count(
        "--verify-rounds",
        "--verify: the strategies run side by side, taking turns of --iters steps this many "
        "times each",
    )
    count(
        "--verify-top",
        "--verify: how many of --top's candidates run beside DDP's defaults (default 3)",
    )
