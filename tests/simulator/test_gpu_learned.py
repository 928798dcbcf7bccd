"""The GPU path's learned cost: iterations priced by the roofline and corrected by the GNN,
held out by family."""

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.gpu_cluster import H100_SXM, H200_SXM
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.simulator.dataset import Dataset, RunEntry
from ddlsim.simulator.gpu.cost import roofline_node_ms
from ddlsim.simulator.gpu.learned import (
    evaluate_holdout,
    gpu_of,
    gpu_training_set,
)
from ddlsim.simulator.gpu.roofline import GpuOpCosts
from ddlsim.simulator.train import TrainOptions
from tests.simulator.gpu_runs import graph_of, kernel_entry, synthetic_dataset

_graph = graph_of
_kernel = kernel_entry


def _launch(spec: ModelSpec, raw: dict, ms: float) -> RunEntry:
    return RunEntry(
        model=spec,
        strategy=Strategy.from_dict(raw),
        world_size=1,
        bandwidth="none",
        samples_ms=(ms,),
        seed=0,
        created_at="",
        extra={"launch_id": "L1"},
    )


def test_the_gpu_is_read_from_its_name() -> None:
    assert gpu_of("NVIDIA H100 80GB HBM3") is H100_SXM
    assert gpu_of("NVIDIA H200") is H200_SXM
    with pytest.raises(InvalidOptionError, match="GPU 'Tesla T4' has no measured per-op times"):
        gpu_of("Tesla T4")


def test_roofline_prices_compute_and_optimizer_nodes_and_bf16_runs_faster() -> None:
    costs = GpuOpCosts(H100_SXM)
    # gpt2-small: matmuls large enough to leave the kernel floor
    fp32 = roofline_node_ms(_graph("gpt2-small"), costs)
    bf16 = roofline_node_ms(_graph("gpt2-small", "bf16"), costs)
    kinds = {_graph("gpt2-small").nodes[i].kind for i in fp32}
    assert kinds == {"compute", "optimizer"} and all(ms >= 0 for ms in fp32.values())

    def matmuls(graph, node_ms) -> float:  # type: ignore[no-untyped-def]
        return sum(ms for i, ms in node_ms.items() if graph.nodes[i].op == "aten.mm.default")

    # bf16 tensor cores against fp32's: several times faster
    assert matmuls(_graph("gpt2-small", "bf16"), bf16) < 0.5 * matmuls(_graph("gpt2-small"), fp32)


def test_launches_pair_with_the_profile_of_their_precision() -> None:
    spec = ZOO["gpt2-tiny"]
    kernels = {
        ("gpt2-tiny", 4): _kernel("gpt2-tiny"),
        ("gpt2-tiny:bf16", 4): _kernel("gpt2-tiny", "bf16"),
    }
    runs = (
        _launch(spec, {}, 10.0),
        _launch(spec, {"precision": "bf16"}, 8.0),
        _launch(spec, {"precision": "bf16", "compile": True}, 6.0),
        _launch(ZOO["bert-tiny"], {}, 5.0),  # no profile of it: skipped, named
    )
    dataset = Dataset(runs=runs, kernels=kernels, links=(), meta={})
    data, samples = gpu_training_set(dataset, H100_SXM)
    launches = [s for s in samples if s.source == "launch"]
    assert [s.sample.model_key for s in launches] == [
        "gpt2-tiny@4:fp32",
        "gpt2-tiny@4:bf16",
        "gpt2-tiny@4:bf16",
    ]
    assert [s.sample.reference for s in launches] == [True, False, False]
    assert len({s.sample.group for s in launches}) == 1  # one launch: speed-up pairs
    assert not launches[1].sample.compiled_rows and launches[2].sample.compiled_rows
    assert data.skipped == ["bert-tiny@8 " + Strategy().describe()]
    # the profiles' own iterations are samples too, each alone in its group
    assert sum(1 for s in samples if s.source == "kernels") == 2


def test_held_out_families_learn_what_the_roofline_misses() -> None:
    dataset = synthetic_dataset()
    report = evaluate_holdout(dataset, H100_SXM, options=TrainOptions(epochs=150))
    assert report["families"] == 4 and report["iterations"] == 8
    # the roofline alone misses by a third or more; trained on three families, the
    # correction carries to the fourth
    assert report["mape"]["roofline"] > 0.3
    assert report["mape"]["learned"] < 0.5 * report["mape"]["roofline"], report["mape"]


def test_one_family_cannot_be_held_out() -> None:
    dataset = Dataset(runs=(), kernels={("gpt2-tiny", 4): _kernel("gpt2-tiny")}, links=(), meta={})
    with pytest.raises(InvalidOptionError, match="two families or more; the dataset has 1"):
        evaluate_holdout(dataset, H100_SXM)
