"""The replay's error on grid runs against the share of the step that every grid rank repeats.

A grid keeps the ops outside its split linear layers (embeddings, LM head, norms, loss) whole on
each rank of a depth slice (``simulator/grid.py``: divisor ``depth``). For every grid run of the
given dataset files, this replays the run from its session's kernel profile at the shared-core
scale (no speed probe) and prints the share of the replayed step those whole ops take beside the
replay's signed error against the measured median, then the correlation and slope of the two
over all runs.

    .venv/bin/python benchmarks/grid_whole_share.py \\
        benchmarks/results/grid-session-2026-11-26.json.gz \\
        benchmarks/results/grid-session-2-2026-11-26.json.gz
"""

import argparse
import statistics
from pathlib import Path

from ddlsim.data.graph.annotate import with_strategy
from ddlsim.data.specs.cluster import parse_bandwidth_gbps
from ddlsim.simulator.costs import comm_models, compute_scale, rank_spec, scaled
from ddlsim.simulator.dataset import load_dataset
from ddlsim.simulator.plans import _PlanReplay, replay_parallel_plan
from ddlsim.simulator.replay import transfer_durations
from ddlsim.simulator.runtime import RuntimeCosts
from ddlsim.simulator.train import _cores


def rows_of(path: Path) -> list[tuple[str, str, bool, float, float]]:
    """(model, grid, overlap, whole share, signed error) for each grid run of ``path``."""
    dataset = load_dataset(path)
    out = []
    for run in dataset.runs:
        plan = run.strategy.parallel
        if not plan.grid:
            continue
        entry = dataset.kernel_for(rank_spec(run.model, run.strategy, run.world_size))
        if entry is None:
            continue
        scale = compute_scale(run.world_size, _cores(run))
        models = comm_models(
            list(dataset.links),
            world_size=plan.resolve_dp(run.world_size),
            bandwidth=run.bandwidth,
            bandwidth_gbps=parse_bandwidth_gbps(run.bandwidth),
            ring=False,
        ).models
        graph = with_strategy(entry.graph, run.strategy)
        durations = transfer_durations(entry.graph, scaled(entry.node_ms, scale), graph)
        result = replay_parallel_plan(
            graph,
            durations,
            list(dataset.links),
            models,
            world_size=run.world_size,
            bandwidth=run.bandwidth,
            compute_scale=scale,
        )
        costs, _ = _PlanReplay(
            graph, durations, list(dataset.links), models, run.world_size, run.bandwidth,
            RuntimeCosts(),
        ).grid_inputs()  # fmt: skip
        depth = plan.grid_axes["depth"]
        whole = sum(
            float(durations.get(n.id, 0.0)) / depth
            for n in graph.nodes
            if n.kind == "compute" and costs.divisor.get(n.id, 1) == depth
        )
        out.append(
            (
                run.model.label,
                "x".join(map(str, plan.grid)),
                plan.grid_overlap,
                whole / result.iteration_time_ms,
                result.iteration_time_ms / run.measured_ms - 1,
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("datasets", nargs="+", type=Path)
    args = parser.parse_args()
    rows = [row for path in args.datasets for row in rows_of(path)]
    print("| model | grid | overlap | whole share | replay error |")
    print("|---|---|---|---|---|")
    for model, grid, overlap, share, error in rows:
        print(f"| {model} | {grid} | {'on' if overlap else 'off'} | {share:.2f} | {error:+.2f} |")
    if len(rows) > 2:
        shares, errors = [r[3] for r in rows], [r[4] for r in rows]
        correlation = statistics.correlation(shares, errors)
        slope = statistics.linear_regression(shares, errors).slope
        print(f"\n{len(rows)} runs: correlation {correlation:.2f}, slope {slope:.2f}")


if __name__ == "__main__":
    main()
