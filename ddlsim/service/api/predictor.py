"""Synchronous predictions for the API: the cost model loaded once, captured graphs memoised.

Unlike ``ddlsim predict``, a prediction asked of the API takes no kernel profile (that is a
profiling run's job) and stores nothing.
"""

import functools
import json
import threading
from typing import Any

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import KernelProfileRecord, Store
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.simulator.cost_model import CostModel, load_cost_model
from ddlsim.simulator.predict import Prediction
from ddlsim.workflows.predict import predict_on_store
from ddlsim.workflows.profiles import normalized_bandwidth
from ddlsim.workflows.requests import PredictRequest


class Predictor:
    """Predicts on ``store`` with the cost model ``simulator`` (as
    :attr:`PredictRequest.simulator`); safe to share between the server's threads."""

    def __init__(self, store: Store, simulator: str | None) -> None:
        self.store = store
        self.simulator = simulator
        self._model: CostModel | None = None
        self._lock = threading.Lock()

    def cost_model(self) -> CostModel:
        """The cost model, loaded on first use."""
        with self._lock:
            if self._model is None:
                self._model = load_cost_model(self.simulator)
            return self._model

    def checkpoint_meta(self) -> dict[str, Any] | None:
        """The loaded checkpoint's scalar metadata (``None``: the replay alone)."""
        meta = self.cost_model().meta
        if meta is None:
            return None
        return {k: v for k, v in meta.items() if isinstance(v, str | int | float | bool)}

    def capture(self, spec: ModelSpec, strategy: Strategy) -> IterationGraph:
        """``spec``'s graph under ``strategy`` (memoised)."""
        return _capture(_key(spec), strategy.to_json())

    def predict(self, request: PredictRequest) -> tuple[Prediction, KernelProfileRecord]:
        """``request``'s prediction and the kernel profile it used (never taken now: the
        request's ``profile_missing`` is not read).

        Raises:
            MissingProfileError: the store has no kernel profile of the rank's micro-batch.
        """
        prediction, profile, _ = predict_on_store(
            self.store,
            request.model,
            request.strategy,
            world_size=request.world_size,
            bandwidth=normalized_bandwidth(request.bandwidth),
            cost_model=self.cost_model(),
            optimizer=request.optimizer,
            profile_iters=request.profile_iters,
            profile_missing=False,
            capture=lambda rank, options: _capture(_key(rank), options.strategy.to_json()),
        )
        return prediction, profile


def _key(spec: ModelSpec) -> str:
    return json.dumps(spec.to_dict(), sort_keys=True)


@functools.lru_cache(maxsize=256)
def _capture(spec_json: str, strategy_json: str) -> IterationGraph:
    """A rank's graph (AdamW, as profiles are taken); capture is deterministic."""
    spec = ModelSpec.from_dict(json.loads(spec_json))
    strategy = Strategy.from_dict(json.loads(strategy_json))
    return capture_graph(spec, CaptureOptions(strategy=strategy))
