"""Helpers shared by the commands: number formatting, JSON output, progress lines."""

import argparse
import json
import sys
from typing import Any


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
