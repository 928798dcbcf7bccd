"""The REST API (FastAPI): the zoo, graphs, predictions, and the jobs the workers run.

Everything under ``/v1``. Reads are open; every mutating request (POST, DELETE) needs the
bearer token (``Authorization: Bearer TOKEN``). Predictions and graphs are answered at once;
strategy requests (searches), profiling runs and executions become tasks in the store's queue
(:mod:`data.store.tasks`) that a worker (:mod:`service.worker`) runs, reporting progress; their
``GET`` gives status, progress and, once done, the result.

Model specs are data: a request names a zoo or registered model, or gives a spec object; a
string is never read as a path. Bodies over ``max_body_bytes`` are refused (413). Bad input gets
a 4xx whose JSON ``error`` names the field; nothing here answers 5xx on purpose.
"""

import contextlib
import dataclasses
import functools
import hmac
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from ddlsim.data.errors import DdlsimError, one_line
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.models import check_model_spec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store, StoreError
from ddlsim.data.store.tasks import TaskNotFoundError, TaskQueue
from ddlsim.data.zoo import ZOO
from ddlsim.executor.run import MAX_SIDE_BY_SIDE
from ddlsim.profiler.batch import parse_batch_data
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.service.cmd_predict import MissingProfileError, cost_model_for, predict_on_store
from ddlsim.service.dashboard import dashboard_data, page
from ddlsim.simulator.calibration import DEFAULT_CONFIDENCE
from ddlsim.simulator.costs import rank_spec
from ddlsim.simulator.predict import COST_MODEL_VERSION, SIMULATOR_VERSION

MAX_BODY_BYTES = 1 << 20
API_VERSION = "v1"
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """How the app runs: its store, its token, the body limit, the cost model for predictions
    (``None``: the trained or shipped one; ``"replay"``: the replay alone)."""

    db: str
    token: str
    max_body_bytes: int = MAX_BODY_BYTES
    simulator: str | None = None


class BadRequestError(DdlsimError, ValueError):
    """A request that names something that does not exist or cannot be used."""

    def __init__(self, message: str, *, field: str, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


# ----- request bodies ----------------------------------------------------------------------------

ModelRef = Annotated[
    str | dict[str, Any],
    Field(description="a zoo or registered model's name, or a model spec object"),
]
PositiveInt = Annotated[int, Field(ge=1, le=1 << 20)]


# The measurement protocol's settings (executor.protocol), as the command line takes them.
CiTarget = Annotated[
    float,
    Field(
        gt=0,
        lt=1,
        description="measure until the median's 95 % interval is within +- this fraction of it",
    ),
]
MeasureBudget = Annotated[
    float,
    Field(
        ge=0,
        le=3600,
        description="seconds a strategy may measure beyond its minimum steps (0: the minimums)",
    ),
]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Inputs(Body):
    """A model and the inputs it trains on (the model's own when left out)."""

    model: ModelRef
    batch_size: PositiveInt | None = None
    seq_len: PositiveInt | None = None
    image_size: PositiveInt | None = None


class ModelRegistration(Body):
    spec: dict[str, Any] = Field(description="a model spec: source, class, config, inputs, name")


class GraphRequest(Inputs):
    strategy: dict[str, Any] | None = None
    world_size: Annotated[int, Field(ge=1, le=4096)] = 1


class PredictionRequest(Inputs):
    strategy: dict[str, Any] | None = None
    world_size: Annotated[int, Field(ge=2, le=4096)] = 2
    bandwidth: Annotated[str, Field(max_length=32)] = "1gbit"


class StrategyRequest(Inputs):
    world_size: Annotated[int, Field(ge=2, le=4096)] = 2
    bandwidth: Annotated[str, Field(max_length=32)] = "1gbit"
    algo: Literal["backtrack", "tpe", "cmaes", "nsga2", "random"] = "backtrack"
    space: Literal["all", "fusion"] = "all"
    budget: Annotated[int, Field(ge=1, le=1_000_000)] = 2000
    time_limit: Annotated[float, Field(gt=0, le=86_400)] = 600.0
    memory_gb: Annotated[float, Field(gt=0, le=1 << 20)] | None = None
    top: Annotated[int, Field(ge=1, le=100)] = 5
    confidence: Annotated[
        float | None,
        Field(
            ge=0.5,
            le=0.99,
            description="the quantile of each kind's held-out speed-up errors strategies are "
            "scored at; null ranks by the predicted time alone",
        ),
    ] = DEFAULT_CONFIDENCE
    seed: int = 0
    verify: bool = False
    iters: Annotated[int, Field(ge=1, le=1000)] = 6
    warmup: Annotated[int, Field(ge=1, le=100)] = 2
    ci_target: CiTarget = 0.01
    measure_budget_s: MeasureBudget = 30.0
    verify_rounds: Annotated[
        int,
        Field(
            ge=1,
            le=100,
            description="verify: the strategies run side by side, taking turns of iters steps "
            "this many times each",
        ),
    ] = 3
    verify_top: Annotated[
        int,
        Field(
            ge=1,
            le=MAX_SIDE_BY_SIDE - 1,
            description="verify: also run the next candidates of top, up to this many in all, "
            "and keep the measured fastest of them and DDP's defaults (1: verify the pick only)",
        ),
    ] = 1


class ProfilingRun(Body):
    jobs: list[dict[str, Any]] = Field(default_factory=list, max_length=10_000)
    product: list[dict[str, Any]] = Field(default_factory=list, max_length=1000)


class ExecutionRequest(Inputs):
    strategy: dict[str, Any] | None = None
    world_size: Annotated[int, Field(ge=1, le=64)] = 2
    bandwidth: Annotated[str | None, Field(max_length=32)] = "1gbit"
    iters: Annotated[int, Field(ge=1, le=1000)] = 6
    warmup: Annotated[int, Field(ge=0, le=100)] = 2
    ci_target: CiTarget = 0.01
    measure_budget_s: MeasureBudget = 30.0
    seed: int = 0
    trace: bool = Field(True, description="profile one more step on rank 0, for the dashboard")


# ----- the app -----------------------------------------------------------------------------------


def create_app(settings: Settings) -> FastAPI:
    """The app over ``settings.db`` (opened, and migrated, now)."""
    store = Store.open(settings.db)
    queue = TaskQueue(store)
    registry = CollectorRegistry()
    requests = Counter(
        "ddlsim_http_requests", "HTTP requests", ["method", "route", "status"], registry=registry
    )
    latency = Histogram(
        "ddlsim_http_request_seconds", "HTTP request latency", ["route"], registry=registry
    )
    tasks = Gauge("ddlsim_tasks", "tasks in the queue", ["kind", "status"], registry=registry)
    predictor = _Predictor(store, settings.simulator)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()

    app = FastAPI(
        lifespan=lifespan,
        title="ddlsim",
        version=API_VERSION,
        description="Predict and search distributed training strategies; run and measure them.",
    )
    app.state.store = store
    app.state.queue = queue
    app.add_middleware(_BodyLimit, limit=settings.max_body_bytes)
    bearer = HTTPBearer(auto_error=False)

    def authorised(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        given = credentials.credentials if credentials is not None else ""
        if not hmac.compare_digest(given.encode(), settings.token.encode()):
            raise BadRequestError(
                "this request needs the service's bearer token (Authorization: Bearer TOKEN)",
                field="header.authorization",
                status=401,
            )

    write = [Depends(authorised)]

    @app.middleware("http")
    async def count(request: Request, call_next: Any) -> Any:
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        requests.labels(request.method, path, str(response.status_code)).inc()
        latency.labels(path).observe(time.perf_counter() - started)
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"field": ".".join(str(p) for p in e["loc"]), "message": e["msg"]}
            for e in exc.errors()
        ]
        first = problems[0] if problems else {"field": "body", "message": "invalid"}
        return JSONResponse(
            status_code=422,
            content={
                "error": f"{first['field']}: {first['message']}",
                "field": first["field"],
                "problems": problems,
            },
        )

    @app.exception_handler(DdlsimError)
    async def refused(request: Request, exc: DdlsimError) -> JSONResponse:
        status, field = 400, "body"
        if isinstance(exc, BadRequestError):
            status, field = exc.status, exc.field
        elif isinstance(exc, TaskNotFoundError):
            status, field = 404, "path.task_id"
        elif isinstance(exc, MissingProfileError):
            status, field = 409, "body.model"
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse(
            status_code=status,
            content={"error": one_line(exc, limit=2000), "field": field},
            headers=headers,
        )

    @app.get("/", tags=["dashboard"], response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(page())

    @app.get("/v1/dashboard", tags=["dashboard"])
    def dashboard_json() -> dict[str, Any]:
        return dashboard_data(store, queue)

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, Any]:
        queue.counts()  # the database answers
        return {"status": "ok", "version": API_VERSION}

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        tasks.clear()
        for (kind, status), n in queue.counts().items():
            tasks.labels(kind, status).set(n)
        return PlainTextResponse(
            generate_latest(registry).decode(), media_type="text/plain; version=0.0.4"
        )

    # ----- models and graphs -----

    @app.get("/v1/models", tags=["models"])
    def list_models() -> dict[str, Any]:
        zoo = [{**spec.to_dict(), "origin": "zoo"} for spec in ZOO.values()]
        registered = [
            {**spec.to_dict(), "origin": "registered", "spec_hash": spec_hash}
            for spec_hash, spec in store.model_specs()
            if spec.name and spec.name not in ZOO
        ]
        return {"models": zoo + _latest_by_name(registered)}

    @app.get("/v1/models/{name}", tags=["models"])
    def get_model(name: str) -> dict[str, Any]:
        return _resolve(store, name, field="path.name").to_dict()

    @app.post("/v1/models", tags=["models"], status_code=201, dependencies=write)
    def register_model(body: ModelRegistration) -> dict[str, Any]:
        spec = _spec_of(body.spec, field="body.spec")
        if not spec.name:
            raise BadRequestError("a registered spec needs a 'name'", field="body.spec.name")
        if spec.name in ZOO:
            raise BadRequestError(
                f"name {spec.name!r} is a zoo model's; choose another", field="body.spec.name"
            )
        return {"name": spec.name, "spec_hash": store.save_model_spec(spec=spec)}

    @app.post("/v1/graphs", tags=["graphs"], status_code=201, dependencies=write)
    def capture(body: GraphRequest) -> dict[str, Any]:
        spec = _inputs(store, body)
        strategy = _strategy(body.strategy)
        graph = predictor.capture(_rank(spec, strategy, body.world_size), strategy)
        store.save_graph(graph=graph)
        return _graph_json(graph)

    @app.get("/v1/graphs/{graph_hash}", tags=["graphs"])
    def get_graph(graph_hash: Annotated[str, Field(max_length=64)]) -> dict[str, Any]:
        try:
            graph = store.load_graph(graph_hash=graph_hash)
        except StoreError:
            raise BadRequestError(
                f"no graph {graph_hash!r} in the store", field="path.graph_hash", status=404
            ) from None
        return _graph_json(graph)

    # ----- predictions and the simulator -----

    @app.post("/v1/predictions", tags=["predictions"], dependencies=write)
    def prediction(body: PredictionRequest) -> dict[str, Any]:
        spec = _inputs(store, body)
        strategy = _strategy(body.strategy)
        return predictor.predict(spec, strategy, body.world_size, body.bandwidth)

    @app.get("/v1/simulator/versions", tags=["predictions"])
    def versions() -> dict[str, Any]:
        return {
            "simulator": SIMULATOR_VERSION,
            "cost_model": COST_MODEL_VERSION,
            "checkpoint": predictor.checkpoint_meta(),
        }

    # ----- jobs -----

    def submit(kind: str, request: dict[str, Any]) -> dict[str, Any]:
        return queue.submit(kind, request).to_dict()

    @app.post("/v1/strategy-requests", tags=["jobs"], status_code=202, dependencies=write)
    def strategy_request(body: StrategyRequest) -> dict[str, Any]:
        if body.verify_top > 1 and not (body.verify and body.verify_top <= body.top):
            raise BadRequestError(
                f"verify_top({body.verify_top}) > 1 needs verify and must be <= top({body.top})",
                field="body.verify_top",
                status=422,
            )
        spec = _inputs(store, body)
        request = body.model_dump(exclude={"model", "batch_size", "seq_len", "image_size"})
        return submit("search", {**request, "model": spec.to_dict()})

    @app.post("/v1/profiling-runs", tags=["jobs"], status_code=202, dependencies=write)
    def profiling_run(body: ProfilingRun) -> dict[str, Any]:
        raw = body.model_dump()
        _finite(raw, field="body")
        for section in ("jobs", "product"):
            for index, entry in enumerate(raw[section]):
                if "strategy" in entry:
                    # Objects only: a string would be read as a path on the worker.
                    where = f"body.{section}.{index}.strategy"
                    given = entry["strategy"]
                    if section == "product":
                        if not isinstance(given, list):
                            raise BadRequestError(
                                "a product's strategy must be a list", field=where, status=422
                            )
                        entry["strategy"] = [_strategy_object(g, field=where) for g in given]
                    else:
                        entry["strategy"] = _strategy_object(given, field=where)
                if "model" in entry:
                    where = f"body.{section}.{index}.model"
                    models = entry["model"] if section == "product" else [entry["model"]]
                    if not isinstance(models, list):
                        raise BadRequestError(
                            "a product's model must be a list", field=where, status=422
                        )
                    resolved = [_resolve_ref(store, m, field=where).to_dict() for m in models]
                    entry["model"] = resolved if section == "product" else resolved[0]
        jobs = parse_batch_data({k: v for k, v in raw.items() if v})
        return {**submit("profile", raw), "jobs": len(jobs)}

    @app.post("/v1/executions", tags=["jobs"], status_code=202, dependencies=write)
    def execution(body: ExecutionRequest) -> dict[str, Any]:
        spec = _inputs(store, body)
        strategy = _strategy(body.strategy)
        request = body.model_dump(exclude={"model", "batch_size", "seq_len", "image_size"})
        request["strategy"] = strategy.to_dict()
        return submit("execution", {**request, "model": spec.to_dict()})

    for kind, path in (
        ("search", "strategy-requests"),
        ("profile", "profiling-runs"),
        ("execution", "executions"),
    ):
        _routes_of_kind(app, queue, kind, path)

    @app.get("/v1/jobs", tags=["jobs"])
    def list_jobs(
        status: Literal["queued", "running", "done", "failed", "cancelled"] | None = None,
        limit: Annotated[int, Field(ge=1, le=1000)] = 100,
    ) -> dict[str, Any]:
        return {"jobs": [t.to_dict() for t in queue.list(status=status, limit=limit)]}

    @app.get("/v1/jobs/{task_id}", tags=["jobs"])
    def get_job(task_id: Annotated[int, Field(ge=1, le=2**62)]) -> dict[str, Any]:
        return queue.get(task_id).to_dict()

    @app.post("/v1/jobs/{task_id}/cancel", tags=["jobs"], dependencies=write)
    def cancel_job(task_id: Annotated[int, Field(ge=1, le=2**62)]) -> dict[str, Any]:
        return queue.cancel(task_id).to_dict()

    return app


def _routes_of_kind(app: FastAPI, queue: TaskQueue, kind: str, path: str) -> None:
    """``GET /v1/PATH`` (the newest of this kind) and ``GET /v1/PATH/{id}``."""

    def listing(limit: Annotated[int, Field(ge=1, le=1000)] = 100) -> dict[str, Any]:
        return {"jobs": [t.to_dict() for t in queue.list(kind=kind, limit=limit)]}

    def one(task_id: Annotated[int, Field(ge=1, le=2**62)]) -> dict[str, Any]:
        task = queue.get(task_id)
        if task.kind != kind:
            raise TaskNotFoundError(f"no {path} job {task_id} (task {task_id} is a {task.kind})")
        return task.to_dict()

    app.add_api_route(f"/v1/{path}", listing, methods=["GET"], tags=["jobs"], name=f"list {path}")
    app.add_api_route(
        f"/v1/{path}/{{task_id}}", one, methods=["GET"], tags=["jobs"], name=f"get {path}"
    )


# ----- helpers -----------------------------------------------------------------------------------


class _Predictor:
    """Synchronous predictions: the cost model loaded once, captured graphs memoised."""

    def __init__(self, store: Store, simulator: str | None) -> None:
        self.store = store
        self.simulator = simulator
        self._model: Any = None
        self._loaded = False
        self._lock = threading.Lock()

    def cost_model(self) -> Any:
        with self._lock:
            if not self._loaded:
                self._model = cost_model_for(self.simulator)
                self._loaded = True
            return self._model

    def checkpoint_meta(self) -> dict[str, Any] | None:
        loaded = self.cost_model()
        if loaded is None:
            return None
        _, meta = loaded
        return {k: v for k, v in meta.items() if isinstance(v, str | int | float | bool)}

    def capture(self, spec: ModelSpec, strategy: Strategy) -> IterationGraph:
        return _capture(_key(spec), strategy.to_json())

    def predict(
        self, spec: ModelSpec, strategy: Strategy, world_size: int, bandwidth: str
    ) -> dict[str, Any]:
        prediction, profile, _ = predict_on_store(
            self.store,
            spec,
            strategy,
            world_size=world_size,
            bandwidth=bandwidth,
            cost_model=self.cost_model(),
            profile_missing=False,
            capture=lambda rank, options: _capture(_key(rank), options.strategy.to_json()),
        )
        return {
            "model": spec.label,
            "world_size": world_size,
            "bandwidth": bandwidth,
            "strategy": strategy.to_dict(),
            "kernel_profile_id": profile.id,
            **prediction.to_json(),
        }


def _key(spec: ModelSpec) -> str:
    return json.dumps(spec.to_dict(), sort_keys=True)


@functools.lru_cache(maxsize=256)
def _capture(spec_json: str, strategy_json: str) -> IterationGraph:
    """A rank's graph (AdamW, as profiles are taken); capture is deterministic."""
    spec = ModelSpec.from_dict(json.loads(spec_json))
    strategy = Strategy.from_dict(json.loads(strategy_json))
    return capture_graph(spec, CaptureOptions(strategy=strategy))


def _graph_json(graph: IterationGraph) -> dict[str, Any]:
    return {
        "graph_hash": graph.graph_hash,
        "model": graph.model.label,
        "num_nodes": len(graph.nodes),
        "summary": graph.summary(),
    }


def _latest_by_name(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:  # oldest first: a later registration of a name wins
        latest[row["name"]] = row
    return sorted(latest.values(), key=lambda r: r["name"])


def _spec_of(raw: Any, *, field: str) -> ModelSpec:
    _finite(raw, field=field)
    try:
        spec = ModelSpec.from_dict(raw)
        check_model_spec(spec)
    except DdlsimError as exc:
        raise BadRequestError(one_line(exc), field=field, status=422) from None
    return spec


def _resolve(store: Store, name: str, *, field: str) -> ModelSpec:
    """A zoo model, else the newest spec registered under ``name``."""
    if name in ZOO:
        return ZOO[name]
    found = [spec for _, spec in store.model_specs(label=name) if spec.name == name]
    if not found:
        raise BadRequestError(
            f"model {name!r} is neither in the zoo nor registered; zoo: {', '.join(ZOO)}",
            field=field,
            status=404,
        )
    return found[-1]


def _resolve_ref(store: Store, ref: Any, *, field: str) -> ModelSpec:
    if isinstance(ref, str):
        return _resolve(store, ref, field=field)
    if isinstance(ref, dict):
        return _spec_of(ref, field=field)
    raise BadRequestError(
        f"a model is a name or a spec object, got {type(ref).__name__}", field=field, status=422
    )


def _inputs(store: Store, body: Inputs) -> ModelSpec:
    spec = _resolve_ref(store, body.model, field="body.model")
    try:
        return spec.with_inputs(
            batch_size=body.batch_size, seq_len=body.seq_len, image_size=body.image_size
        )
    except DdlsimError as exc:
        raise BadRequestError(one_line(exc), field="body", status=422) from None


def _strategy(raw: dict[str, Any] | None) -> Strategy:
    if raw is None:
        return Strategy()
    return Strategy.from_dict(_strategy_object(raw, field="body.strategy"))


def _strategy_object(raw: Any, *, field: str) -> dict[str, Any]:
    """A strategy given as an object, checked, in canonical form."""
    if not isinstance(raw, dict):
        raise BadRequestError(
            f"a strategy is an object, got {type(raw).__name__}", field=field, status=422
        )
    _finite(raw, field=field)
    try:
        return Strategy.from_dict(raw).to_dict()
    except DdlsimError as exc:
        raise BadRequestError(one_line(exc), field=field, status=422) from None


def _finite(raw: Any, *, field: str) -> None:
    """Refuse NaN and infinities anywhere in ``raw`` (JSON has none; some databases refuse)."""
    try:
        json.dumps(raw, allow_nan=False)
    except ValueError:
        raise BadRequestError(
            "NaN and infinite numbers are not allowed", field=field, status=422
        ) from None


def _rank(spec: ModelSpec, strategy: Strategy, world_size: int) -> ModelSpec:
    return rank_spec(spec, strategy, world_size) if world_size > 1 else spec


class _BodyLimit:
    """Refuse request bodies over ``limit`` bytes (413), by their Content-Length or as they
    stream in."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._too_large(send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLargeError
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLargeError:
            await self._too_large(send)

    async def _too_large(self, send: Send) -> None:
        body = json.dumps(
            {"error": f"request body over {self.limit} bytes", "field": "body"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLargeError(Exception):
    pass
