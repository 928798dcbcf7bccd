"""Helpers shared by the commands: number formatting, JSON output, progress lines."""

import argparse
import json
import sys
from typing import Any

from ddlsim.data.specs.strategy import Strategy


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def emit_json(payload: Any) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True))


def human(value: float, unit: str) -> str:
    """Decimal prefixes (FLOPs, counts): ``1.23 GFLOP``."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def human_bytes(value: float) -> str:
    """Binary prefixes, as bucket caps are given (MiB)."""
    for scale, prefix in ((2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}B"
    return f"{value:.0f} B"


def progress(message: str) -> None:
    """A status line on a terminal (never in pipes or --json output)."""
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


def nonnegative_float(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 1), e.g. 0.01")
    return value


def add_protocol_arguments(
    parser: argparse.ArgumentParser, *, iters: int = 10, what: str = ""
) -> None:
    """The measurement protocol's options (``executor.protocol``), the same on every command
    that measures training; ``what`` names the part of the command they apply to."""
    prefix = f"{what}: " if what else ""
    parser.add_argument(
        "--iters",
        type=positive_int,
        default=iters,
        help=f"{prefix}at least this many measured steps (a turn, side by side), more until "
        f"--ci or --measure-budget",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=2,
        help=f"{prefix}at least this many warm-up steps, more until the step time is stable",
    )
    parser.add_argument(
        "--ci",
        dest="ci_target",
        type=fraction,
        default=0.01,
        help=f"{prefix}measure until the median's 95 %% interval is within +- this fraction "
        "of it (default 0.01)",
    )
    parser.add_argument(
        "--measure-budget",
        dest="measure_budget_s",
        type=nonnegative_float,
        default=30.0,
        help=f"{prefix}seconds a strategy may measure beyond the minimums (default 30; "
        "0: exactly --iters and --warmup)",
    )


def protocol_options(args: argparse.Namespace) -> dict[str, Any]:
    """``RunOptions`` keywords from ``add_protocol_arguments``'s options."""
    return {
        "iters": args.iters,
        "warmup": args.warmup,
        "ci_target": args.ci_target,
        "budget_s": args.measure_budget_s,
    }


def format_interval(interval: Any, unit: str = " ms") -> str:
    """``[low, high]`` as ``low-high`` with the unit (``-`` for none)."""
    if not interval:
        return "-"
    low, high = interval
    return f"{low:.1f}-{high:.1f}{unit}"


def verification_lines(verified: Any) -> list[str]:
    """A person's reading of a search's ``--verify`` fields: each measured median with its
    interval, and the speed-up, or plainly that the pick is DDP's defaults (one measurement)
    or that the two differ by no measurable amount."""

    def timed(name: str) -> str:
        ms = verified.get(f"measured_{name}_ms")
        if ms is None:
            return "not run"
        ci = format_interval(verified.get(f"measured_{name}_ci95_ms"))
        return f"{ms:.1f} ms (95 % interval {ci})"

    if verified.get("kept_baseline"):
        return [f"the pick is DDP's defaults: one measurement, {timed('best')}"]
    lines = [f"pick {timed('best')}, DDP's defaults {timed('baseline')}"]
    ratio = verified.get("speedup")
    if ratio is not None:
        low, high = verified["speedup_interval"]
        span = f"95 % interval {low:.3f}-{high:.3f}"
        if verified.get("significant"):
            lines.append(f"the pick is {ratio:.3f}x {verified['verdict']} ({span}, side by side)")
        else:
            lines.append(f"no measurable difference ({ratio:.3f}x, {span}, side by side)")
    return lines


def describe(strategy: dict[str, Any]) -> str:
    """One line of a strategy's JSON: its plan, buckets, DeAR and compiled blocks."""
    if Strategy.from_dict(strategy) == Strategy():
        return "DDP's defaults"
    parallel, fusion = strategy["parallel"], strategy["tensor_fusion"]
    parts = [f"{key}{parallel[key]}" for key in ("tp", "pp") if parallel[key] > 1]
    if parallel["pp"] > 1:
        parts.append(parallel["pp_schedule"])
    if parallel["fsdp"]:
        parts.append("FSDP")
    if parallel["micro_batches"] > 1:
        parts.append(f"{parallel['micro_batches']} micro-batches")
    if parallel["pp"] == 1 and parallel["tp"] == 1 and not parallel["fsdp"]:
        buckets = fusion.get("buckets")
        parts.append(
            f"{len(buckets)} buckets"
            if buckets
            else f"bucket cap {fusion['bucket_cap_mb']:.3g} MB"
        )
        if fusion.get("dear"):
            parts.append("DeAR")
    compiled = strategy["op_fusion"]["compiled"]
    if compiled:
        parts.append(f"{len(compiled)} blocks compiled")
    return ", ".join(parts)
