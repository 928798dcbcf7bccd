"""A synthetic dataset for the cost model's tests: real graphs, durations that follow the
ops' work, and measured times that differ from the replay in a known way (DeAR 50 % slower and
FSDP 30 % slower, which the replay does not model)."""

import dataclasses
from typing import Any

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.models import repeated_blocks
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.profiler.capture import capture_graph
from ddlsim.simulator.dataset import Dataset, FusionEntry, KernelEntry, LinkFit, RunEntry
from ddlsim.simulator.train import build_training_set

STRATEGIES: list[dict[str, Any]] = [
    {},
    {"tensor_fusion": {"bucket_cap_mb": 0.25}},
    {"tensor_fusion": {"bucket_cap_mb": 1, "implementation": "hooks"}},
    {"tensor_fusion": {"bucket_caps_mb": [65536]}},
    {"tensor_fusion": {"bucket_cap_mb": 0.5, "dear": True}},
    {"tensor_fusion": {"bucket_caps_mb": [65536], "dear": True}},
]
# Parallel plans, for models with blocks to shard, split and pipeline (all at the rank batch
# of two-way data parallelism, the one kernel profile the dataset has).
PLAN_STRATEGIES: list[dict[str, Any]] = [
    {"parallel": {"fsdp": True}},
    {"parallel": {"tp": 2, "micro_batches": 2}},
    {"parallel": {"pp": 2, "micro_batches": 2, "pp_schedule": "gpipe"}},
    {"parallel": {"pp": 2, "micro_batches": 2, "pp_schedule": "1f1b"}},
]


def _durations(graph: IterationGraph) -> dict[int, float]:
    # a smooth function of the op's work: something the duration head can learn
    return {
        n.id: 0.002 + n.flops / 2e9 + (n.bytes_read + n.bytes_written) / 4e9
        for n in graph.nodes
        if n.kind in ("compute", "optimizer")
    }


# Compiled over eager time of every repeated block, by model: what the fused-block head learns.
FUSED_RATIO = {"mlp": 0.8, "gpt2-tiny": 0.5}


def synthetic_dataset(specs: list[ModelSpec], *, plans: tuple[str, ...] = ()) -> Dataset:
    """Runs of every spec under ``STRATEGIES``, and of the specs labelled in ``plans`` under
    ``PLAN_STRATEGIES`` too; a fusion profile of each spec's repeated blocks (``FUSED_RATIO``)."""
    kernels = {}
    fusion = {}
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
        ratio = FUSED_RATIO.get(spec.label, 1.0)
        fusion[(rank.label, rank.inputs.batch_size)] = FusionEntry(
            model=rank.label,
            batch_size=rank.inputs.batch_size,
            blocks=tuple(
                {"block": b, "eager_ms": 2.0, "compiled_ms": 2.0 * ratio, "compile_s": 1.0}
                for b in repeated_blocks(spec)
            ),
        )
        for bandwidth in ("1gbit", "none"):
            for raw in STRATEGIES + (PLAN_STRATEGIES if spec.label in plans else []):
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
    return Dataset(runs=tuple(runs), kernels=kernels, links=links, meta={}, fusion=fusion)


def two_model_dataset() -> Dataset:
    """The dataset the cost model's tests train and price: the mlp's and gpt2-tiny's runs,
    gpt2-tiny's parallel plans among them."""
    return synthetic_dataset([ZOO["mlp"], ZOO["gpt2-tiny"]], plans=("gpt2-tiny",))


def with_truth(dataset: Dataset) -> Dataset:
    """Measured = replay, slowed by 50 % under DeAR and 30 % under FSDP (what the replay
    misses on this CPU)."""
    data = build_training_set(dataset)
    runs = []
    for run, sample in zip(dataset.runs, data.samples, strict=True):
        slowdown = 1.5 if run.strategy.tensor_fusion.dear else 1.0
        slowdown *= 1.3 if run.strategy.parallel.fsdp else 1.0
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
    return dataclasses.replace(dataset, runs=tuple(runs))
