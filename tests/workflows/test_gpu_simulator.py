"""The learned correction plugged into the GPU path: trained on GPU iterations, it corrects a
layout's replayed schedule in predictions and searches, and the CLI trains and loads it."""

import functools
import json
import math

import pytest

from ddlsim.data.specs.gpu_cluster import H100_SXM, GpuClusterSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.data.zoo import ZOO
from ddlsim.search import SearchBudget
from ddlsim.service.cli import main
from ddlsim.simulator.cost_model import checkpoint_cost_model
from ddlsim.simulator.gpu.cost import LayoutCost
from ddlsim.simulator.gpu.learned import train_gpu_cost_model
from ddlsim.simulator.train import TrainOptions
from ddlsim.workflows.layout_search import LayoutJob, search_layouts_with
from ddlsim.workflows.scale import ScaleRequest, predict_at_scale
from tests.simulator.gpu_runs import synthetic_dataset

MODEL = ZOO["llama-tiny"].with_inputs(batch_size=16, seq_len=128)
CLUSTER = GpuClusterSpec.parse("dgx-h100:1")


@functools.cache
def _cost() -> LayoutCost:
    network, meta = train_gpu_cost_model(
        synthetic_dataset(), H100_SXM, options=TrainOptions(epochs=80), predictor="gnn"
    )
    return LayoutCost(checkpoint_cost_model(network, meta))


def _request(layout: str) -> ScaleRequest:
    return ScaleRequest(
        model=MODEL,
        cluster=CLUSTER,
        plan=ScalePlan.parse(layout, CLUSTER.world_size),
        global_batch=16,
        seq_len=128,
    )


def test_a_learned_correction_scales_the_replayed_layout() -> None:
    for layout in ('{"parallel": {"tp": 2}}', '{"parallel": {"pp": 2, "micro_batches": 2}}'):
        replayed = predict_at_scale(_request(layout))
        corrected = predict_at_scale(_request(layout), cost=_cost())
        assert replayed.predictor == "replay" and replayed.replay_s is None
        assert corrected.predictor == "gnn" and corrected.replay_s == replayed.iteration_s
        # the synthetic GPU runs a third slower than the roofline: so does the correction
        assert corrected.iteration_s > replayed.iteration_s
        assert corrected.tokens_per_s_per_gpu * corrected.iteration_s == pytest.approx(
            replayed.tokens_per_s_per_gpu * replayed.iteration_s
        )
        assert corrected.memory == replayed.memory
    # the closed form (what the bound search prunes with) is not corrected
    closed = predict_at_scale(_request('{"parallel": {"tp": 2}}'), replay=False, cost=_cost())
    assert closed.predictor == "replay"


def test_a_registry_search_ranks_by_the_corrected_times() -> None:
    job = LayoutJob(model=MODEL, cluster=CLUSTER, global_batch=16, seq_len=128)
    found = search_layouts_with("random", job, SearchBudget(evaluations=6, top=3), cost=_cost())
    assert found["best"] is not None
    for row in found["top"]:
        again = predict_at_scale(_request(json.dumps(row["strategy"])), cost=_cost())
        assert math.isclose(row["iteration_s"], again.iteration_s, rel_tol=1e-9)


def test_the_cli_trains_on_the_shipped_gpu_runs_and_predicts_with_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulator", "train", "--gpu", "--epochs", "3", "--json"]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert trained["gpu"] == "H100-SXM5-80GB" and trained["iterations"] == 12
    held = trained["holdout_mape"]
    assert trained["predictor"] == ("gnn" if held["learned"] < held["roofline"] else "replay")
    args = ["predict", "llama-tiny", "--cluster", "dgx-h100:1", "--strategy", "{}"]
    args += ["--batch-size", "16", "--seq-len", "128", "--json"]
    assert main([*args, "--simulator", "replay"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert "predictor" not in alone
    assert main(["simulator", "train", "--gpu", "--epochs", "3", "--predictor", "gnn"]) == 0
    assert "predictor gnn" in capsys.readouterr().out
    assert main(args) == 0  # the user's GPU checkpoint, by default
    corrected = json.loads(capsys.readouterr().out)
    assert corrected["predictor"] == "gnn"
    assert corrected["replay_s"] == alone["iteration_s"]
    assert main(["simulator", "train", "--gpu", "--db", "sqlite:///x.db"]) == 2
    assert "drop --db" in capsys.readouterr().err
