"""The app: its settings, its state (store, queue, predictor, metrics), the middleware (body
limit, request metrics), the error handlers that answer ``{"error", "field"}`` JSON, and the
routers of :mod:`ddlsim.service.api.routes`."""

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ddlsim.data.errors import DdlsimError, one_line
from ddlsim.data.store import Store
from ddlsim.data.store.tasks import TaskNotFoundError, TaskQueue
from ddlsim.service.api.deps import READ
from ddlsim.service.api.errors import BadRequestError
from ddlsim.service.api.middleware import BodyLimit, Metrics
from ddlsim.service.api.predictor import Predictor
from ddlsim.service.api.routes import (
    clusters,
    graphs,
    jobs,
    models,
    predictions,
    published,
    service,
    simulator,
)
from ddlsim.service.api.routes.service import API_VERSION
from ddlsim.service.api.warm import warm_up
from ddlsim.workflows.profiles import MissingProfileError

_LOG = logging.getLogger("ddlsim.service")

MAX_BODY_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """How the app runs: its store, its token, the body limit, the cost model for predictions
    (``None``: the trained or shipped one; ``"replay"``: the replay alone)."""

    db: str
    token: str
    max_body_bytes: int = MAX_BODY_BYTES
    simulator: str | None = None
    protect_reads: bool = False
    """Reads need the token too (``serve`` sets it when it binds beyond loopback)."""


def create_app(settings: Settings) -> FastAPI:
    """The app over ``settings.db`` (opened, and migrated, now)."""
    store = Store.open(settings.db)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        warm_up(app.state.predictor)  # before the first request is taken
        yield
        store.close()

    app = FastAPI(
        lifespan=lifespan,
        title="ddlsim",
        version=API_VERSION,
        description="Predict and search distributed training strategies; run and measure them.",
    )
    metrics = Metrics()
    app.state.settings = settings
    app.state.store = store
    app.state.queue = TaskQueue(store)
    app.state.predictor = Predictor(store, settings.simulator)
    app.state.metrics = metrics
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.middleware("http")(metrics.count)
    app.exception_handler(RequestValidationError)(_invalid)
    app.exception_handler(DdlsimError)(_refused)
    app.exception_handler(Exception)(_unexpected)
    for routes in (service, models, graphs, predictions, jobs, clusters, published, simulator):
        app.include_router(routes.router, dependencies=READ)
    return app


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A body, path or query that fails its schema: 422 naming the first bad field."""
    problems = [
        {"field": ".".join(str(p) for p in e["loc"]), "message": e["msg"]} for e in exc.errors()
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


async def _refused(request: Request, exc: DdlsimError) -> JSONResponse:
    """The tools' refusals: 400 unless the error says otherwise (a missing job 404, a missing
    kernel profile 409, a :class:`BadRequestError` its own status)."""
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


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    """Anything else: 500 with an id to find it by in the server's log, where the traceback
    goes; the client sees no traceback and no internals."""
    request_id = uuid.uuid4().hex[:12]
    _LOG.error(
        "request %s %s %s failed", request_id, request.method, request.url.path, exc_info=exc
    )
    return JSONResponse(
        status_code=500,
        content={
            "error": f"internal error (request id {request_id}; the server's log has it)",
            "field": None,
            "request_id": request_id,
        },
        headers={"X-Request-ID": request_id},
    )
