"""The cost model on a synthetic dataset whose measured times differ from the replay in a
known way: it must learn the difference, keep the order of strategies, and survive a
checkpoint round trip."""

import math
from pathlib import Path

import pytest
import torch

from data.errors import InvalidOptionError
from data.graph.format import IterationGraph
from data.specs.model import ModelSpec
from data.specs.strategy import Strategy
from data.zoo import ZOO
from profiler.capture import capture_graph
from simulator.dataset import Dataset, KernelEntry, LinkFit, RunEntry
from simulator.features import BUCKET_FEATURES, GLOBAL_FEATURES, NODE_FEATURES
from simulator.gnn import CostModelConfig
from simulator.train import (
    TrainOptions,
    build_training_set,
    duration_error,
    load_checkpoint,
    predict_samples,
    save_checkpoint,
    train_cost_model,
)

STRATEGIES = [
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


def _dataset(specs: list[ModelSpec]) -> Dataset:
    kernels = {}
    runs = []
    links = tuple(
        LinkFit(
            collective=c, world_size=2, bandwidth=bw, alpha_us=200.0, busbw_gbps=rate, r2=1.0
        )
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


def _with_truth(dataset: Dataset) -> Dataset:
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


@pytest.fixture(scope="module")
def synthetic() -> Dataset:
    return _with_truth(_dataset([ZOO["mlp"], ZOO["gpt2-tiny"]]))


def test_training_set_shapes(synthetic: Dataset) -> None:
    data = build_training_set(synthetic)
    assert len(data.samples) == len(synthetic.runs) and not data.skipped
    assert len(data.graphs) == 2
    for graph in data.graphs.values():
        assert graph.data.x.shape[1] == len(NODE_FEATURES)
        assert graph.data.edge_index.shape[0] == 2
        assert bool(graph.data.timed.any())
    for sample in data.samples:
        assert sample.buckets.shape[1] == len(BUCKET_FEATURES)
        assert sample.globals.shape == (len(GLOBAL_FEATURES),)
        assert len(sample.bucket_rows) == sample.buckets.shape[0]


def test_the_model_learns_what_the_replay_misses(synthetic: Dataset, tmp_path: Path) -> None:
    data = build_training_set(synthetic)
    model = train_cost_model(
        data, config=CostModelConfig(hidden=32, layers=2), options=TrainOptions(epochs=200)
    )
    measured = [float(s.measured_ms or 0) for s in data.samples]
    replayed = predict_samples(model, data.graphs, data.samples, "replay")
    learned = predict_samples(model, data.graphs, data.samples, "gnn")

    def mape(predicted: list[float]) -> float:
        return sum(abs(p - m) / m for p, m in zip(predicted, measured, strict=True)) / len(
            measured
        )

    assert mape(replayed) > 0.1  # DeAR's third of the runs are 50 % off
    assert mape(learned) < 0.05
    assert math.isfinite(duration_error(model, data.graphs))
    # the checkpoint gives the same predictions
    path = tmp_path / "model.pt"
    save_checkpoint(model, path, {"predictor": "gnn"})
    loaded, meta = load_checkpoint(path)
    assert meta == {"predictor": "gnn"}
    again = predict_samples(loaded, data.graphs, data.samples, "gnn")
    assert again == pytest.approx(learned, rel=1e-5)


def test_bad_checkpoints_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.pt"
    torch.save({"format": 7}, path)
    with pytest.raises(InvalidOptionError, match="format 7"):
        load_checkpoint(path)
    with pytest.raises(InvalidOptionError, match="cannot be read"):
        load_checkpoint(tmp_path / "missing.pt")


def test_train_options_are_checked() -> None:
    with pytest.raises(InvalidOptionError, match=r"epochs\(0\)"):
        TrainOptions(epochs=0)
    with pytest.raises(InvalidOptionError, match=r"hidden\(2\)"):
        CostModelConfig(hidden=2)
