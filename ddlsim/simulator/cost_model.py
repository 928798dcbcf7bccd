"""Cost models: what turns the replay of a strategy into its predicted iteration time.

Three predictors, one interface (:class:`CostModel`); held-out evaluation picks the default and
the checkpoint's meta names it:

- ``replay``: the replay's own time (:class:`ReplayCostModel`);
- ``gnn``: the replay corrected by the learned strategy head, ``replay x exp(correction)``;
- ``blend``: half the correction, the geometric mean of the two (:class:`LearnedCostModel`
  applies the weight: 1 for ``gnn``, 0.5 for ``blend``);
- ``analytic``: AxoNN's kind of closed form where there is one (grid plans,
  :func:`simulator.grid.analytic_grid`), the replay elsewhere (:class:`AnalyticCostModel`);
  nothing is trained, so it is never the checkpoint's choice.

Strategies are priced in batches: the graphs their samples refer to are encoded once
(:meth:`CostModel.encode`), then any number of samples are priced against them
(:meth:`CostModel.predict`). :func:`load_cost_model` reads the model ``--simulator`` names,
once; it then travels as one value.
"""

import abc
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, cast

import torch
from torch_geometric.data import Batch

from ddlsim.data.errors import InvalidOptionError
from ddlsim.simulator.calibration import Calibration
from ddlsim.simulator.default import default_checkpoint
from ddlsim.simulator.features import BlockSample, ModelGraph, StrategySample
from ddlsim.simulator.gnn import IterationCostModel
from ddlsim.simulator.train import load_checkpoint

# 2: compute scaled for ranks sharing cores; FSDP, tensor and pipeline plans.
# 3: grid plans.
SIMULATOR_VERSION = "replay-3"
# 2: corrects FSDP, tensor-parallel and pipeline plans too (plan features, trained on them).
# 3: grid plans' features (each axis' size, overlap).
COST_MODEL_VERSION = "gnn-3"

_Item = TypeVar("_Item", StrategySample, BlockSample)

Predictor = Literal["replay", "gnn", "blend", "analytic"]
# The predictors held-out evaluation compares and a checkpoint may name.
PREDICTORS: tuple[Predictor, ...] = ("replay", "gnn", "blend")
ANALYTIC_VERSION = "analytic-1"
GPU_TARGET = "gpu"
"""A checkpoint's ``target`` when it corrects the GPU path's replay
(:mod:`ddlsim.simulator.gpu.cost`); the CPU loop's checkpoints name none, or ``cpu``."""


def target_of(meta: Mapping[str, Any] | None) -> str:
    """Which replay a checkpoint's meta says it corrects: ``cpu`` (the CPU loop's) or ``gpu``."""
    return str((meta or {}).get("target") or "cpu")


@dataclasses.dataclass(frozen=True, eq=False)
class EncodedGraphs:
    """Model graphs by key, batched in key order and (by a learned model) encoded once.

    Shapes:
        embeddings: ``[num_nodes of all graphs, hidden]``, or ``None`` (nothing learned).
    """

    index: Mapping[str, int]
    batch: Batch | None = None
    embeddings: torch.Tensor | None = None


class CostModel(abc.ABC):
    """Predicted iteration times (ms) of strategy samples, from their replay.

    Contract: :meth:`predict` returns one finite positive time per sample, in order, each its
    replay's time (``StrategySample.replay_ms``) times a correction of the model's; it changes
    no state, so one model may serve many evaluators (not from several threads at once: torch
    modules are not made for that). :attr:`learned` says whether anything corrects the replay;
    when not, callers may skip building samples and take the replay's time themselves.

    Args:
        network: the trained network (a checkpoint's), ``None`` for the replay alone.
        meta: the checkpoint's meta (its predictor, calibration, training set), ``None``
            without a checkpoint.

    Raises:
        InvalidOptionError: a learned model without a network.
    """

    name: ClassVar[Predictor]

    def __init__(
        self,
        *,
        network: IterationCostModel | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if network is None and self.learned:
            raise InvalidOptionError(f"the {self.name} cost model needs a trained network")
        self.network = network
        self.meta = dict(meta) if meta is not None else None

    @property
    def learned(self) -> bool:
        """Whether a trained model corrects the replay (``gnn``, ``blend``)."""
        return False

    @property
    def version(self) -> str:
        """The simulator version predictions carry (``replay-3``, ``gnn-3+replay-3``)."""
        return SIMULATOR_VERSION

    @property
    def calibration(self) -> Calibration | None:
        """The checkpoint's held-out errors of this predictor's speed-ups, if it has them
        (trained with cross-validation)."""
        raw = ((self.meta or {}).get("calibration") or {}).get(self.name)
        return Calibration.from_json(raw) if raw else None

    def encode(self, graphs: Mapping[str, ModelGraph]) -> EncodedGraphs:
        """``graphs`` batched in the order of their keys, for :meth:`predict`."""
        return EncodedGraphs(index={key: i for i, key in enumerate(sorted(graphs))})

    @abc.abstractmethod
    def predict(self, graphs: EncodedGraphs, samples: Sequence[StrategySample]) -> list[float]:
        """The predicted iteration time (ms) of each sample, whose model is among ``graphs``."""

    @abc.abstractmethod
    def predict_fused(self, graphs: EncodedGraphs, blocks: Sequence[BlockSample]) -> list[float]:
        """Each block's predicted time compiled (ms), its model among ``graphs``."""

    def predict_samples(
        self, graphs: Mapping[str, ModelGraph], samples: Sequence[StrategySample]
    ) -> list[float]:
        """:meth:`predict` of ``samples``, encoding the graphs they refer to for this call."""
        if not samples:
            return []
        used = {s.model_key for s in samples}
        return self.predict(self.encode({k: graphs[k] for k in sorted(used)}), samples)


class ReplayCostModel(CostModel):
    """The replay alone: a sample's time is its replay's, a compiled block's its eager time.
    It may carry a checkpoint (whose held-out evaluation chose the replay) for its meta."""

    name: ClassVar[Predictor] = "replay"

    def predict(self, graphs: EncodedGraphs, samples: Sequence[StrategySample]) -> list[float]:
        return [s.replay_ms for s in samples]

    def predict_fused(self, graphs: EncodedGraphs, blocks: Sequence[BlockSample]) -> list[float]:
        return [b.eager_ms for b in blocks]


class AnalyticCostModel(ReplayCostModel):
    """The analytical model: the closed-form time of a grid plan (every collective's
    alpha-beta time plus the kernel profile's compute shares, summed; ``simulator.predict``
    applies it), the replay's time for every other plan (a data-parallel sample's replay is
    already the closed form of its schedule)."""

    name = "analytic"

    @property
    def version(self) -> str:
        return f"{ANALYTIC_VERSION}+{SIMULATOR_VERSION}"


class LearnedCostModel(CostModel):
    """The replay corrected by the trained strategy head: ``replay x exp(w x correction)``,
    the correction the predicted ``log(measured / replayed)`` and ``w`` the class's
    :attr:`correction_weight`; compiled blocks priced by the fused-block head.

    Raises:
        InvalidOptionError: no network.
    """

    correction_weight: ClassVar[float]

    @property
    def learned(self) -> bool:
        return True

    @property
    def _network(self) -> IterationCostModel:
        # A learned model is never made without a network (CostModel.__init__).
        return cast(IterationCostModel, self.network)

    @property
    def version(self) -> str:
        return f"{COST_MODEL_VERSION}+{SIMULATOR_VERSION}"

    @torch.no_grad()
    def encode(self, graphs: Mapping[str, ModelGraph]) -> EncodedGraphs:
        keys = sorted(graphs)
        batch = Batch.from_data_list([graphs[k].data for k in keys])
        embeddings, _ = self._network.encode(batch)
        return EncodedGraphs(
            index={k: i for i, k in enumerate(keys)}, batch=batch, embeddings=embeddings
        )

    @torch.no_grad()
    def predict(self, graphs: EncodedGraphs, samples: Sequence[StrategySample]) -> list[float]:
        corrections = _head_outputs(self._network.corrections, graphs, samples)
        return [
            s.replay_ms * math.exp(self.correction_weight * c)
            for s, c in zip(samples, corrections, strict=True)
        ]

    @torch.no_grad()
    def predict_fused(self, graphs: EncodedGraphs, blocks: Sequence[BlockSample]) -> list[float]:
        ratios = _head_outputs(self._network.fused_ratios, graphs, blocks)
        return [b.eager_ms * math.exp(r) for b, r in zip(blocks, ratios, strict=True)]


class GnnCostModel(LearnedCostModel):
    """The full learned correction."""

    name = "gnn"
    correction_weight = 1.0


class BlendCostModel(LearnedCostModel):
    """Half the learned correction: the geometric mean of the replay's and the GNN's times."""

    name = "blend"
    correction_weight = 0.5


COST_MODELS: dict[str, type[CostModel]] = {
    cls.name: cls for cls in (ReplayCostModel, GnnCostModel, BlendCostModel, AnalyticCostModel)
}
"""Every cost model by its predictor's name."""


def cost_model(
    name: str,
    *,
    network: IterationCostModel | None = None,
    meta: Mapping[str, Any] | None = None,
) -> CostModel:
    """The cost model called ``name`` over ``network``.

    Raises:
        InvalidOptionError: an unknown name (the message lists the choices), or a learned one
            without a network.
    """
    if name not in COST_MODELS:
        raise InvalidOptionError(f"predictor {name!r} is not one of {', '.join(COST_MODELS)}")
    return COST_MODELS[name](network=network, meta=meta)


def load_cost_model(choice: str | None) -> CostModel:
    """The cost model ``--simulator`` names: ``replay`` for the replay alone, ``analytic``
    for the analytical model, a checkpoint path, or (``None``) the user's trained checkpoint,
    else the shipped one. A checkpoint's meta names its predictor (``gnn`` when it names none;
    the replay for one that is not learned); where no checkpoint file exists, the replay alone.

    Raises:
        InvalidOptionError: a file that is not a cost-model checkpoint.
    """
    if choice == "replay":
        return ReplayCostModel()
    if choice == "analytic":
        return AnalyticCostModel()
    path = Path(choice) if choice else default_checkpoint()
    if not path.is_file():
        return ReplayCostModel()
    network, meta = load_checkpoint(path)
    if target_of(meta) != "cpu":
        raise InvalidOptionError(
            f"cost model checkpoint {path} corrects the GPU path (trained on GPU iterations); "
            "it prices GPU clusters (--cluster), not this machine's emulated one"
        )
    return checkpoint_cost_model(network, meta)


def checkpoint_cost_model(network: IterationCostModel, meta: Mapping[str, Any]) -> CostModel:
    """The cost model a checkpoint's meta names (``gnn`` when it names none; the replay,
    carrying the meta, for one that is not learned)."""
    predictor = str(meta.get("predictor", "gnn"))
    if predictor not in ("gnn", "blend"):
        return ReplayCostModel(network=network, meta=meta)
    return cost_model(predictor, network=network, meta=meta)


def _head_outputs(
    head: Callable[[torch.Tensor, Batch, dict[str, int], Sequence[_Item]], torch.Tensor],
    graphs: EncodedGraphs,
    items: Sequence[_Item],
) -> list[float]:
    """``head``'s output for each item (samples or blocks) over the encoded ``graphs``; none
    for no items, whatever the encoding.

    Raises:
        InvalidOptionError: items, and graphs encoded without a network.
    """
    if not items:
        return []
    if graphs.batch is None or graphs.embeddings is None:
        raise InvalidOptionError("graphs encoded without a network: encode them with this model")
    return [float(x) for x in head(graphs.embeddings, graphs.batch, dict(graphs.index), items)]
