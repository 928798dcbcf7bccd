"""The search registry's algorithms on GPU clusters' layouts, against the GPU path's own
bound-and-replay search (issue 52).

For each published row named (a model, its cluster, its global batch and sequence length, its
precision), the bound-and-replay search prices every layout in closed form and replays the
promising ones; each registry algorithm (``backtrack``, ``tpe``, ``cmaes``, ``random``) searches
the same space within a budget of replayed layouts. Reported: the space's size, each search's
pick (its predicted iteration time over the bound search's pick: 1.0 is as fast, above is
slower), the layouts it priced and its wall time on this machine. Prices are predictions on
paper, the same for every search; only the algorithms differ.

    .venv/bin/python benchmarks/layout_algorithms.py --budget 100 --json
"""

import argparse
import json
import sys
import time
from typing import Any

from ddlsim.search import SearchBudget
from ddlsim.workflows.layout_search import LayoutJob, layout_problem, search_layouts_with
from ddlsim.workflows.published import parse_row, rows_file, rows_of
from ddlsim.workflows.scale import search_at_scale

# (file, a part of the row's name): clusters of 8 to 64 GPUs, dense models of 1.7B to 70B.
ROWS: tuple[tuple[str, str], ...] = (
    ("nemo_h100.json", "Llama 2 7B on 8"),
    ("megatron_lm_h100.json", "GPT 1.7B on 48"),
    ("torchtitan_a100.json", "Llama 3 8B on 64"),
    ("megatron_bridge_h100.json", "Llama 3 70B on 64"),
)
ALGORITHMS = ("backtrack", "tpe", "cmaes", "random")


def _row(name: str, part: str) -> dict[str, Any]:
    raw = json.loads(rows_file(f"data/published/{name}").read_text(encoding="utf-8"))
    for row in rows_of(raw, name):
        if part in row["name"]:
            return dict(row)
    raise SystemExit(f"no row of {name} names {part!r}")


def compare(name: str, part: str, budget: int) -> dict[str, Any]:
    """One row's cluster searched by the bound search and by each registry algorithm."""
    title, request, _, _ = parse_row(_row(name, part))
    precision = request.plan.precision
    started = time.perf_counter()
    bound = search_at_scale(
        request.model,
        request.cluster,
        global_batch=request.global_batch,
        seq_len=request.seq_len,
        precision=precision,
    )
    bound_s = time.perf_counter() - started
    if bound.best is None:
        return {"row": title, "error": "no layout fits"}
    job = LayoutJob(
        model=request.model,
        cluster=request.cluster,
        global_batch=request.global_batch,
        seq_len=request.seq_len,
        precision=precision,
    )
    problem, _, _ = layout_problem(job)
    out: dict[str, Any] = {
        "row": title,
        "gpus": request.cluster.world_size,
        "layouts": len(problem.space.plans),
        "bound": {
            "layout": bound.best.plan.label(),
            "iteration_s": bound.best.iteration_s,
            "priced": bound.evaluated,
            "wall_s": round(bound_s, 1),
        },
    }
    for algo in ALGORITHMS:
        started = time.perf_counter()
        found = search_layouts_with(
            algo, job, SearchBudget(evaluations=budget, time_limit_s=3600, top=1, seed=0)
        )
        best = found["best"]
        out[algo] = {
            "layout": best["layout"] if best else None,
            "over_bound": round(best["iteration_s"] / bound.best.iteration_s, 4) if best else None,
            "priced": found["evaluated"],
            "wall_s": round(time.perf_counter() - started, 1),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=100, help="layouts each algorithm prices")
    parser.add_argument("--json", action="store_true", help="print the JSON result only")
    args = parser.parse_args(argv)
    results = []
    for name, part in ROWS:
        result = compare(name, part, args.budget)
        results.append(result)
        if not args.json:
            print(json.dumps(result), file=sys.stderr, flush=True)
    print(json.dumps({"budget": args.budget, "rows": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
