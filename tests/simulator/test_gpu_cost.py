"""The GPU path's cost through the cost-model interface: the replay alone by default, a
checkpoint trained on GPU iterations where one is given, and no checkpoint of the wrong kind."""

import functools
from pathlib import Path

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.gpu_cluster import A100_80G, H100_HBM2E_500W, H100_SXM
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.simulator.cost_model import (
    GnnCostModel,
    ReplayCostModel,
    load_cost_model,
)
from ddlsim.simulator.default import shipped_checkpoint
from ddlsim.simulator.features import GLOBAL_FEATURES
from ddlsim.simulator.gpu.cost import (
    check_gpu_cost_model,
    layout_globals,
    load_gpu_cost_model,
    user_gpu_checkpoint,
)
from ddlsim.simulator.gpu.learned import train_gpu_cost_model
from ddlsim.simulator.gpu.memory import MemoryEstimate
from ddlsim.simulator.gpu.prediction import ScalePrediction
from ddlsim.simulator.train import TrainOptions, save_checkpoint
from tests.simulator.gpu_runs import synthetic_dataset


@functools.cache
def _trained() -> tuple[object, dict]:
    """Trained once on the synthetic GPU (the roofline a third too fast on every family)."""
    return train_gpu_cost_model(synthetic_dataset(), H100_SXM, options=TrainOptions(epochs=80))


def _checkpoint(tmp_path: Path, **meta: object) -> Path:
    network, trained_meta = _trained()
    path = tmp_path / "gpu.pt"
    save_checkpoint(network, path, {**trained_meta, **meta})  # type: ignore[arg-type]
    return path


def test_held_out_evaluation_chooses_the_correction_and_the_meta_names_its_gpu() -> None:
    _, meta = _trained()
    assert meta["target"] == "gpu" and meta["measured"] == "h100"
    assert meta["iterations"] == 8 and len(meta["families"]) == 4
    held = meta["holdout_mape"]
    # auto: the correction only where it beat the roofline on families it never saw
    assert meta["predictor"] == ("gnn" if held["learned"] < held["roofline"] else "replay")
    assert held["learned"] < held["roofline"]  # this GPU misses the roofline the same way


def test_a_gpu_checkpoint_loads_for_its_gpu_only(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, predictor="gnn")
    loaded = load_gpu_cost_model(str(path), H100_SXM)
    assert isinstance(loaded, GnnCostModel)
    # the 500 W H100 is priced over the same measured op costs
    assert isinstance(load_gpu_cost_model(str(path), H100_HBM2E_500W), GnnCostModel)
    with pytest.raises(InvalidOptionError, match="trained over the 'h100' GPU's op costs"):
        load_gpu_cost_model(str(path), A100_80G)
    # the CPU loop refuses it, the GPU path refuses the CPU loop's
    with pytest.raises(InvalidOptionError, match="corrects the GPU path"):
        load_cost_model(str(path))
    with pytest.raises(InvalidOptionError, match="corrects the CPU loop's replay"):
        load_gpu_cost_model(str(shipped_checkpoint()), H100_SXM)
    with pytest.raises(InvalidOptionError, match="CPU loop's closed form"):
        load_gpu_cost_model("analytic", H100_SXM)
    assert isinstance(load_gpu_cost_model("replay", H100_SXM), ReplayCostModel)


def test_the_default_is_the_users_gpu_checkpoint_where_it_fits(tmp_path: Path) -> None:
    # no checkpoint trained: the replay alone (none ships)
    assert type(load_gpu_cost_model(None, H100_SXM)) is ReplayCostModel
    assert load_gpu_cost_model(None, H100_SXM).meta is None
    target = user_gpu_checkpoint()
    target.parent.mkdir(parents=True, exist_ok=True)
    _checkpoint(tmp_path, predictor="gnn").replace(target)
    assert isinstance(load_gpu_cost_model(None, H100_SXM), GnnCostModel)
    # trained over another GPU's op costs: the replay alone, not an error
    assert type(load_gpu_cost_model(None, A100_80G)) is ReplayCostModel
    check_gpu_cost_model(ReplayCostModel(), A100_80G)  # the replay corrects nothing


def test_a_layouts_globals_are_its_shares_and_sizes() -> None:
    plan = ScalePlan(dp=2, tp=4, pp=2, micro_batches=4, fsdp=False)
    prediction = ScalePrediction(
        iteration_s=0.1,
        tokens_per_s_per_gpu=1.0,
        tflops_per_gpu=1.0,
        memory=MemoryEstimate(weights_and_optimizer=0, activations=0, logits=0, reserved=0),
        fits=True,
        breakdown_ms={
            "compute": 60.0,
            "recompute": 10.0,
            "exposed_comm_node": 5.0,
            "exposed_comm_network": 5.0,
            "pipeline_bubble": 20.0,
            "optimizer": 0.0,
        },
        micro_batch_size=1,
    )
    values = dict(zip(GLOBAL_FEATURES, layout_globals(prediction, plan), strict=True))
    assert values["log_replay_ms"] == pytest.approx(4.60517, rel=1e-5)  # log(100 ms)
    assert values["compute_share"] == pytest.approx(0.7)
    assert values["exposed_comm_share"] == pytest.approx(0.1)
    assert values["bubble_share"] == pytest.approx(0.2)
    assert (values["log2_dp"], values["log2_tp"], values["log2_pp"]) == (1.0, 2.0, 1.0)
    assert values["micro_batches"] == 4.0 and values["schedule_1f1b"] == 1.0
    assert values["log1p_busbw_gbps"] == 0.0  # what the GPU path does not model
    corrected = prediction.corrected(0.2, "gnn")
    assert corrected.replay_s == 0.1 and corrected.tokens_per_s_per_gpu == pytest.approx(0.5)
    assert corrected.to_json()["predictor"] == "gnn"
    assert "predictor" not in prediction.to_json()
