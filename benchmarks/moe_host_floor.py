"""The two numbers of the GPU path's mixture-of-experts pricing that no source states, fitted
on Megatron-MoE-ModelZoo's published Qwen3-235B-A22B runs on 256 H100s
(``ddlsim/data/published/megatron_moe_modelzoo_h100.json``) and checked on Megatron-Bridge's
rows, which they were not fitted on (``megatron_bridge_moe_h100.json``):

- ``EP_OVERLAP_HIDDEN``: the share of the exchanges the combined 1F1B overlap hides, from the
  pair of runs with and without it (19.7 s and 17.6 s a step);
- ``MOE_BLOCK_HOST_MS``: the least an eagerly run MoE block takes a micro-batch (the host's
  pace), from the one run it binds in (TP4 PP8 VPP4 EP8, 29.0 s a step).

Each is found by bisection on its row's step time; the script prints them, each file's rows
with the fitted values, and their MAPE.

    .venv/bin/python benchmarks/moe_host_floor.py
"""

import json
from collections.abc import Callable

from ddlsim.simulator.gpu import experts as gpu_experts
from ddlsim.workflows.published import parse_row, predict_row, rows_file
from ddlsim.workflows.scale import predict_at_scale

FITTED_ON = "data/published/megatron_moe_modelzoo_h100.json"
CHECKED_ON = "data/published/megatron_bridge_moe_h100.json"


def _rows(path: str) -> list[dict]:
    return list(json.loads(rows_file(path).read_text("utf-8"))["rows"])


def _step_s(raw: dict) -> float:
    _, request, _, _ = parse_row(raw)
    return predict_at_scale(request).iteration_s


def _bisect(set_value: Callable[[float], None], raw: dict, low: float, high: float) -> float:
    """The value whose prediction of ``raw`` meets its published step time (the prediction
    grows with the value: a floor; set ``low``/``high`` the other way for a hidden share)."""
    target = float(raw["published"]["iteration_s"])
    for _ in range(40):
        middle = (low + high) / 2
        set_value(middle)
        if _step_s(raw) > target:
            high = middle
        else:
            low = middle
    return (low + high) / 2


def main() -> None:
    fitted = _rows(FITTED_ON)
    _, overlapped, host_bound = fitted

    def overlap(value: float) -> None:
        gpu_experts.EP_OVERLAP_HIDDEN = value

    def host(value: float) -> None:
        gpu_experts.MOE_BLOCK_HOST_MS = value

    host(0.0)
    # More hidden, faster: bisect on the negated share.
    hidden = 1.0 - _bisect(lambda v: overlap(1.0 - v), overlapped, 0.0, 1.0)
    overlap(hidden)
    floor = _bisect(host, host_bound, 0.0, 50.0)
    host(floor)
    print(f"EP_OVERLAP_HIDDEN = {hidden:.3f}  (from {overlapped['name']})")
    print(f"MOE_BLOCK_HOST_MS = {floor:.2f}  (from {host_bound['name']})")
    for path in (FITTED_ON, CHECKED_ON):
        rows = [predict_row(raw, search=False) for raw in _rows(path)]
        for row in rows:
            print(f"  {row['name']}: published {row['published']:g}, predicted "
                  f"{row['predicted']:.4g}, ape {row['ape']:.3f}")  # fmt: skip
        mape = sum(r["ape"] for r in rows) / len(rows)
        print(f"{path}: mape {mape:.4f} over {len(rows)} rows")


if __name__ == "__main__":
    main()
