"""Every cost model keeps the :class:`CostModel` contract on the same graphs and strategies:
finite positive times, the replay's own time for ``replay``, ``blend`` between the replay and
``gnn`` (their geometric mean); and ``--simulator`` loads the model it names, once."""

import math
from pathlib import Path

import pytest
import torch

from ddlsim.data.errors import InvalidOptionError
from ddlsim.simulator.calibration import MIN_ERRORS, RISK_KINDS, Calibration
from ddlsim.simulator.cost_model import (
    COST_MODEL_VERSION,
    PREDICTORS,
    SIMULATOR_VERSION,
    BlendCostModel,
    CostModel,
    GnnCostModel,
    ReplayCostModel,
    cost_model,
    load_cost_model,
)
from ddlsim.simulator.dataset import Dataset
from ddlsim.simulator.gnn import CostModelConfig, IterationCostModel
from ddlsim.simulator.train import TrainingSet, build_training_set, save_checkpoint


@pytest.fixture(scope="module")
def data(two_models: Dataset) -> TrainingSet:
    """Two models' graphs, their data-parallel strategies, one's parallel plans, and blocks."""
    return build_training_set(two_models)


@pytest.fixture(scope="module")
def network() -> IterationCostModel:
    """An untrained network: the contract holds whatever the weights."""
    torch.manual_seed(0)
    return IterationCostModel(CostModelConfig(hidden=8, layers=1)).eval()


def _models(network: IterationCostModel) -> dict[str, CostModel]:
    return {name: cost_model(name, network=network) for name in PREDICTORS}


@pytest.mark.parametrize("name", PREDICTORS)
def test_every_cost_model_predicts_finite_positive_times(
    name: str, data: TrainingSet, network: IterationCostModel
) -> None:
    model = cost_model(name, network=network)
    assert model.name == name
    encoded = model.encode(data.graphs)
    times = model.predict(encoded, data.samples)
    assert len(times) == len(data.samples)
    assert all(math.isfinite(ms) and ms > 0 for ms in times)
    assert model.predict(encoded, []) == []
    # encoding only the graphs the samples use gives the same times
    assert model.predict_samples(data.graphs, data.samples) == pytest.approx(times, rel=1e-6)
    fused = model.predict_fused(encoded, data.blocks)
    assert len(fused) == len(data.blocks) > 0
    assert all(math.isfinite(ms) and ms > 0 for ms in fused)
    assert model.version == (
        f"{COST_MODEL_VERSION}+{SIMULATOR_VERSION}" if model.learned else SIMULATOR_VERSION
    )


def test_replay_is_the_replay_and_blend_lies_between_it_and_the_gnn(
    data: TrainingSet, network: IterationCostModel
) -> None:
    models = _models(network)
    times = {name: m.predict(m.encode(data.graphs), data.samples) for name, m in models.items()}
    assert times["replay"] == [s.replay_ms for s in data.samples]
    assert not models["replay"].learned and models["gnn"].learned and models["blend"].learned
    assert times["gnn"] != times["replay"]
    for replayed, gnn, blend in zip(times["replay"], times["gnn"], times["blend"], strict=True):
        assert min(replayed, gnn) <= blend <= max(replayed, gnn)
        assert blend == pytest.approx(math.sqrt(replayed * gnn), rel=1e-9)
    # the replay has no model of compiled blocks: their eager time
    replay = models["replay"]
    fused = replay.predict_fused(replay.encode(data.graphs), data.blocks)
    assert fused == [b.eager_ms for b in data.blocks]


def test_simulator_choices_load_the_model_they_name(
    tmp_path: Path, network: IterationCostModel
) -> None:
    replay = load_cost_model("replay")
    assert isinstance(replay, ReplayCostModel) and replay.meta is None
    assert replay.network is None and replay.calibration is None
    assert isinstance(load_cost_model(str(tmp_path / "missing.pt")), ReplayCostModel)
    calibration = Calibration(
        predictor="blend", errors={kind: (0.01,) * MIN_ERRORS for kind in RISK_KINDS}
    )
    path = tmp_path / "blend.pt"
    meta = {"predictor": "blend", "calibration": {"blend": calibration.to_json()}}
    save_checkpoint(network, path, meta)
    blend = load_cost_model(str(path))
    assert isinstance(blend, BlendCostModel) and blend.meta == meta
    assert blend.calibration == calibration
    chose_replay = tmp_path / "replay.pt"
    save_checkpoint(network, chose_replay, {"predictor": "replay"})
    kept = load_cost_model(str(chose_replay))
    assert isinstance(kept, ReplayCostModel) and kept.network is not None
    assert kept.meta == {"predictor": "replay"} and kept.calibration is None
    # unset: the user's checkpoint (none in the test's data directory), else the shipped one
    shipped = load_cost_model(None)
    assert shipped.learned and shipped.meta is not None
    assert shipped.name == shipped.meta["predictor"]


def test_unknown_or_untrained_cost_models_are_refused() -> None:
    with pytest.raises(InvalidOptionError, match="'oracle'") as refused:
        cost_model("oracle")
    assert all(name in str(refused.value) for name in PREDICTORS)
    with pytest.raises(InvalidOptionError, match="trained network"):
        GnnCostModel()
