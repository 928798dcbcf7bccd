"""Synchronous predictions for the API: the cost model loaded once, captured graphs memoised.

Unlike ``ddlsim predict``, a prediction asked of the API takes no kernel profile (that is a
profiling run's job) and stores nothing.
"""

import collections
import concurrent.futures
import json
import os
import threading
from typing import Any

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import KernelProfileRecord, Store
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.service.api.errors import BadRequestError
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
        # At most this many predictions compute at once; the others wait their turn in line
        # rather than share the interpreter forty ways (which starved some for a minute).
        slots = _positive_env(CONCURRENCY_ENV, float(len(os.sched_getaffinity(0))))
        self._slots = threading.BoundedSemaphore(max(1, int(slots)))

    def cost_model(self) -> CostModel:
        """The cost model, loaded on first use."""
        with self._lock:
            if self._model is None:
                self._model = load_cost_model(self.simulator)
            return self._model

    @property
    def loaded(self) -> bool:
        """Whether the cost model is loaded (the service's start loads it)."""
        return self._model is not None

    def slot(self) -> threading.BoundedSemaphore:
        """A slot to compute a prediction in (``with predictor.slot():``): the GPU path's
        predictions wait their turn in the same line as the others."""
        return self._slots

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
        cost_model = self.cost_model()

        def capture(rank: ModelSpec, options: CaptureOptions) -> IterationGraph:
            return _capture(_key(rank), options.strategy.to_json(), holding=self._slots)

        with self._slots:
            prediction, profile, _ = predict_on_store(
                self.store,
                request.model,
                request.strategy,
                world_size=request.world_size,
                bandwidth=normalized_bandwidth(request.bandwidth),
                cost_model=cost_model,
                optimizer=request.optimizer,
                profile_iters=request.profile_iters,
                profile_missing=False,
                capture=capture,
            )
        return prediction, profile


def _key(spec: ModelSpec) -> str:
    return json.dumps(spec.to_dict(), sort_keys=True)


CAPTURE_DEADLINE_ENV = "DDLSIM_CAPTURE_DEADLINE_S"
CONCURRENCY_ENV = "DDLSIM_PREDICT_CONCURRENCY"
GRAPH_CACHE_ENV = "DDLSIM_GRAPH_CACHE_BYTES"
# Captures run on threads of their own, so that a request waits for one at most its deadline;
# a capture past it goes on and fills the cache for the next request.
_CAPTURES = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="capture")


class CaptureTimeoutError(BadRequestError):
    """A capture ran past its deadline (503: try again, or a smaller model)."""


def _positive_env(name: str, default: float) -> float:
    raw = os.environ.get(name)
    try:
        value = float(raw) if raw is not None else default
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InvalidOptionError(f"{name}={raw!r} must be a positive number")
    return value


class _GraphCache:
    """Captured graphs by key, least recently used first out, at most ``limit_bytes`` of them
    by estimate (nodes and parameters as their JSON takes them)."""

    def __init__(self) -> None:
        self._graphs: collections.OrderedDict[str, tuple[IterationGraph, int]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    @staticmethod
    def size_of(graph: IterationGraph) -> int:
        return 600 * len(graph.nodes) + 200 * len(graph.params) + 16 * len(graph.edges)

    def get(self, key: str) -> IterationGraph | None:
        with self._lock:
            found = self._graphs.get(key)
            if found is None:
                return None
            self._graphs.move_to_end(key)
            return found[0]

    def put(self, key: str, graph: IterationGraph, limit_bytes: float) -> None:
        size = self.size_of(graph)
        with self._lock:
            self._graphs[key] = (graph, size)
            self._graphs.move_to_end(key)
            total = sum(s for _, s in self._graphs.values())
            while total > limit_bytes and len(self._graphs) > 1:
                _, (_, dropped) = self._graphs.popitem(last=False)
                total -= dropped

    def __len__(self) -> int:
        return len(self._graphs)


GRAPHS = _GraphCache()


def _capture(
    spec_json: str, strategy_json: str, *, holding: threading.BoundedSemaphore | None = None
) -> IterationGraph:
    """A rank's graph (AdamW, as profiles are taken), from the cache or captured on a thread
    of its own within ``$DDLSIM_CAPTURE_DEADLINE_S`` (default 60 s); a caller ``holding`` a
    prediction slot gives it up while it waits for a capture.

    Raises:
        CaptureTimeoutError: the capture ran past the deadline.
    """
    key = spec_json + "\n" + strategy_json
    cached = GRAPHS.get(key)
    if cached is not None:
        return cached
    deadline_s = _positive_env(CAPTURE_DEADLINE_ENV, 60.0)
    limit_bytes = _positive_env(GRAPH_CACHE_ENV, 1 << 30)

    def capture() -> IterationGraph:
        spec = ModelSpec.from_dict(json.loads(spec_json))
        strategy = Strategy.from_dict(json.loads(strategy_json))
        graph = capture_graph(spec, CaptureOptions(strategy=strategy))
        GRAPHS.put(key, graph, limit_bytes)
        return graph

    future = _CAPTURES.submit(capture)
    if holding is not None:
        holding.release()
    try:
        return future.result(timeout=deadline_s)
    except concurrent.futures.TimeoutError:
        raise CaptureTimeoutError(
            f"capturing the graph took longer than {deadline_s:g} s ({CAPTURE_DEADLINE_ENV}); "
            "it goes on in the background: ask again later, or for a smaller model",
            field="body.model",
            status=503,
        ) from None
    finally:
        if holding is not None:
            holding.acquire()
