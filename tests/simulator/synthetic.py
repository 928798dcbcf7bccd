"""A synthetic dataset for the cost model's tests: real graphs, durations that follow the
ops' work, and measured times that differ from the replay in a known way (DeAR 50 % slower,
which the replay does not model)."""

from typing import Any

from data.graph.format import IterationGraph
from data.specs.model import ModelSpec
from data.specs.strategy import Strategy
from profiler.capture import capture_graph
from simulator.dataset import Dataset, KernelEntry, LinkFit, RunEntry
from simulator.train import build_training_set

STRATEGIES: list[dict[str, Any]] = [
    {},
    {"tensor_fusion": {"bucket_cap_mb": 0.25}},
    {"tensor_fusion": {"bucket_cap_mb": 1, "implementation": "hooks"}},
    {"tensor_fusion": {"bucket_caps_mb": [65536]}},
    {"tensor_fusion": {"bucket_cap_mb": 0.5, "dear": True}},
    {"tensor_fusion": {"bucket_caps_mb": [65536], "dear": True}},
]


def _durations(graph: IterationGraph) -> dict[int, float]:
    # a smooth function of the op's work: something the duration head can learn
    return {
        n.id: 0.002 + n.flops / 2e9 + (n.bytes_read + n.bytes_written) / 4e9
        for n in graph.nodes
        if n.kind in ("compute", "optimizer")
    }


def synthetic_dataset(specs: list[ModelSpec]) -> Dataset:
    kernels = {}
    runs = []
    links = tuple(
        LinkFit(collective=c, world_size=2, bandwidth=bw, alpha_us=200.0, busbw_gbps=rate, r2=1.0)
        for c in ("all_reduce", "sendrecv")
        for bw, rate in (("1gbit", 0.9), ("none", 8.0))
    )
    for spec in specs:
        rank = spec.with_inputs(batch_size=spec.inputs.batch_size // 2)
        graph = capture_graph(rank)
        kernels[(rank.label, rank.inputs.batch_size)] = KernelEntry(
            graph=graph, node_ms=_durations(graph), iteration_time_ms=1.0
        )
        for bandwidth in ("1gbit", "none"):
            for raw in STRATEGIES:
                runs.append(
                    RunEntry(
                        model=spec,
                        strategy=Strategy.from_dict(raw),
                        world_size=2,
                        bandwidth=bandwidth,
                        samples_ms=(1.0,),  # replaced below by the synthetic truth
                        seed=0,
                        created_at="",
                    )
                )
    return Dataset(runs=tuple(runs), kernels=kernels, links=links, meta={})


def with_truth(dataset: Dataset) -> Dataset:
    """Measured = replay, slowed by 50 % under DeAR (what the replay misses on this CPU)."""
    data = build_training_set(dataset)
    runs = []
    for run, sample in zip(dataset.runs, data.samples, strict=True):
        slowdown = 1.5 if run.strategy.tensor_fusion.dear else 1.0
        runs.append(
            RunEntry(
                model=run.model,
                strategy=run.strategy,
                world_size=run.world_size,
                bandwidth=run.bandwidth,
                samples_ms=(sample.replay_ms * slowdown,),
                seed=0,
                created_at="",
            )
        )
    return Dataset(runs=tuple(runs), kernels=dataset.kernels, links=dataset.links, meta={})
