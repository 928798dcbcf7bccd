"""The GPU path's fitted numbers (:mod:`ddlsim.simulator.gpu.calibration`) fitted on a set of
published rows, and every shipped file predicted held out: with the numbers fitted on the
other files only, beside the same file predicted in sample (fitted on every file).

A power-capped part's clock is fitted so that the median signed error of the rows run on it is
zero (the clock scales their compute; bisected in log space); with no such row the clock is
its prior (:data:`~ddlsim.simulator.gpu.calibration.PRIOR`).
"""

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from ddlsim.simulator.gpu.calibration import CAPPED_GPUS, PRIOR, Calibration
from ddlsim.workflows.scale import ScaleRequest, predict_at_scale

# A parsed published row: its name, request, published metric and value (parse_row's answer).
Row = tuple[str, ScaleRequest, str, float]
_CLOCK_RANGE_MHZ = (600.0, 2000.0)
_BISECTIONS = 14  # 1,400 MHz / 2^14: under 0.1 MHz


def predicted_value(row: Row, calibration: Calibration) -> float:
    """The row's published metric as predicted with ``calibration``'s numbers."""
    _, request, metric, _ = row
    request = dataclasses.replace(request, cluster=calibration.apply(request.cluster))
    return float(getattr(predict_at_scale(request), metric))


def _log_error(row: Row, calibration: Calibration) -> float:
    """log(predicted / published), iteration times turned into rates (higher is faster)."""
    _, _, metric, published = row
    ratio = predicted_value(row, calibration) / published
    return -math.log(ratio) if metric == "iteration_s" else math.log(ratio)


def _fit_clock(gpu: str, rows: Sequence[Row]) -> float:
    """The clock at which ``rows``' median signed error is zero (faster with the clock)."""
    low, high = _CLOCK_RANGE_MHZ
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2
        trial = Calibration(clocks_mhz={gpu: middle})
        if statistics.median(_log_error(row, trial) for row in rows) > 0:
            high = middle
        else:
            low = middle
    return (low + high) / 2


def fit_calibration(rows: Sequence[Row]) -> Calibration:
    """The fitted numbers that ``rows`` constrain, each at its prior where none does."""
    clocks = dict(PRIOR.clocks_mhz)
    for gpu in CAPPED_GPUS:
        on_gpu = [row for row in rows if row[1].cluster.gpu.name == gpu]
        if on_gpu:
            clocks[gpu] = _fit_clock(gpu, on_gpu)
    return Calibration(clocks_mhz=clocks)


def _constraining(rows: Sequence[Row]) -> tuple[str, ...]:
    """The names of the rows a fit depends on (rows on a capped part), to reuse fits."""
    return tuple(sorted(row[0] for row in rows if row[1].cluster.gpu.name in CAPPED_GPUS))


def hold_out_by_file(
    files: dict[str, list[Row]],
    *,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every file's rows predicted in sample (numbers fitted on every file) and held out
    (fitted on the other files only): per row and per file the absolute percentage errors,
    per file and pooled over all rows the mean of them (MAPE), and each fit's numbers."""
    fits: dict[tuple[str, ...], Calibration] = {}

    def fitted(rows: list[Row]) -> Calibration:
        key = _constraining(rows)
        if key not in fits:
            if progress:
                progress(f"fitting on {len(rows)} rows ({len(key)} constrain a number)")
            fits[key] = fit_calibration(rows)
        return fits[key]

    every = [row for rows in files.values() for row in rows]
    in_sample = fitted(every)
    report: dict[str, Any] = {"in_sample_calibration": in_sample.to_json(), "files": []}
    pooled: dict[str, list[float]] = {"held_out": [], "in_sample": []}
    for name, rows in files.items():
        others = [row for other, rest in files.items() if other != name for row in rest]
        held_out = fitted(others)
        if progress:
            progress(f"predicting {name} ({len(rows)} rows)")
        entries = []
        for row in rows:
            _, _, metric, published = row
            values = {"held_out": predicted_value(row, held_out)}
            values["in_sample"] = (
                values["held_out"] if held_out == in_sample else predicted_value(row, in_sample)
            )
            entry: dict[str, Any] = {"name": row[0], "metric": metric, "published": published}
            for kind, value in values.items():
                ape = abs(value - published) / published
                entry[kind] = round(value, 4)
                entry[f"{kind}_ape"] = round(ape, 4)
                pooled[kind].append(ape)
            entries.append(entry)
        report["files"].append(
            {
                "name": name,
                "rows": entries,
                "held_out_calibration": held_out.to_json(),
                "held_out_mape": _mean(e["held_out_ape"] for e in entries),
                "in_sample_mape": _mean(e["in_sample_ape"] for e in entries),
            }
        )
    report["held_out_mape"] = _mean(pooled["held_out"])
    report["in_sample_mape"] = _mean(pooled["in_sample"])
    report["worst_file_held_out"] = max((f["held_out_mape"], f["name"]) for f in report["files"])[
        1
    ]
    return report


def _mean(values: Any) -> float:
    values = list(values)
    return round(sum(values) / len(values), 4)
