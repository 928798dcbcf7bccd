"""The routes' dependencies, read from the app's state (:func:`~ddlsim.service.api.app.create_app`
puts them there): the store, its task queue, the predictor, the metrics, and the bearer token
that every mutating request needs."""

import hmac
from typing import Annotated, cast

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ddlsim.data.store import Store
from ddlsim.data.store.tasks import TaskQueue
from ddlsim.service.api.errors import BadRequestError
from ddlsim.service.api.middleware import Metrics
from ddlsim.service.api.predictor import Predictor

_bearer = HTTPBearer(auto_error=False)


def get_store(request: Request) -> Store:
    """The app's store."""
    return cast(Store, request.app.state.store)


def get_queue(request: Request) -> TaskQueue:
    """The store's task queue."""
    return cast(TaskQueue, request.app.state.queue)


def get_predictor(request: Request) -> Predictor:
    """The app's predictor (its cost model loaded once)."""
    return cast(Predictor, request.app.state.predictor)


def get_metrics(request: Request) -> Metrics:
    """The app's metrics."""
    return cast(Metrics, request.app.state.metrics)


def authorised(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Refuse a request without the service's bearer token (compared in constant time).

    Raises:
        BadRequestError: 401, naming the Authorization header.
    """
    given = credentials.credentials if credentials is not None else ""
    token: str = request.app.state.settings.token
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise BadRequestError(
            "this request needs the service's bearer token (Authorization: Bearer TOKEN)",
            field="header.authorization",
            status=401,
        )


StoreDep = Annotated[Store, Depends(get_store)]
QueueDep = Annotated[TaskQueue, Depends(get_queue)]
PredictorDep = Annotated[Predictor, Depends(get_predictor)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
WRITE = [Depends(authorised)]
"""A mutating route's ``dependencies``: the bearer token."""

# What stays open whatever the settings: a load balancer's probe.
OPEN_PATHS = frozenset({"/healthz"})


def read_authorised(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """The token on reads too when the settings protect them (a service reachable beyond
    this machine: jobs hold whole requests, results and errors).

    Raises:
        BadRequestError: 401, as :func:`authorised`.
    """
    if request.app.state.settings.protect_reads and request.url.path not in OPEN_PATHS:
        authorised(request, credentials)


READ = [Depends(read_authorised)]
"""Every router's ``dependencies``: reads behind the token when the settings say so."""
