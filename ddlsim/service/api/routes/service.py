"""The service itself: health, Prometheus metrics, and the dashboard (its pages and its data)."""

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, PlainTextResponse

from ddlsim.service.api.deps import MetricsDep, QueueDep, StoreDep
from ddlsim.service.api.schemas import Dashboard, Health
from ddlsim.service.dashboard import dashboard_data, page

API_VERSION = "v1"
router = APIRouter()


@router.get("/", tags=["dashboard"], response_class=HTMLResponse, include_in_schema=False)
def dashboard() -> HTMLResponse:
    """The dashboard's page (its script reads ``/v1/dashboard``)."""
    return HTMLResponse(page())


@router.get("/clusters", tags=["dashboard"], response_class=HTMLResponse, include_in_schema=False)
def clusters_page() -> HTMLResponse:
    """GPU clusters on paper: a cluster search's layouts, published runs against their
    predictions (its script reads ``/v1/cluster-searches`` and ``/v1/published``)."""
    return HTMLResponse(page("clusters"))


@router.get("/v1/dashboard", tags=["dashboard"])
def dashboard_json(store: StoreDep, queue: QueueDep) -> Dashboard:
    """What the dashboard plots."""
    return Dashboard.model_validate(dashboard_data(store, queue))


@router.get("/healthz", tags=["service"])
def healthz(queue: QueueDep) -> Health:
    """``ok`` when the database answers."""
    queue.counts()  # the database answers
    return Health(status="ok", version=API_VERSION)


@router.get("/metrics", tags=["service"], response_class=PlainTextResponse)
def metrics(queue: QueueDep, metrics: MetricsDep) -> PlainTextResponse:
    """Prometheus' text format: requests, latency, the queue's tasks."""
    return PlainTextResponse(metrics.exposition(queue), media_type="text/plain; version=0.0.4")
