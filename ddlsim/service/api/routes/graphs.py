"""``/v1/graphs``: a rank's iteration graph, captured and stored, and read back."""

from typing import Annotated

from fastapi import APIRouter
from pydantic import Field

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.store import StoreError
from ddlsim.service.api.deps import WRITE, PredictorDep, StoreDep
from ddlsim.service.api.errors import BadRequestError
from ddlsim.service.api.inputs import inputs_of, rank_of, strategy_of
from ddlsim.service.api.schemas import GraphPublic, GraphRequest

router = APIRouter(prefix="/v1/graphs", tags=["graphs"])


@router.post("", status_code=201, dependencies=WRITE)
def capture(body: GraphRequest, store: StoreDep, predictor: PredictorDep) -> GraphPublic:
    """Capture one rank's graph of the model under the strategy, and store it."""
    spec = inputs_of(store, body)
    strategy = strategy_of(body.strategy)
    graph = predictor.capture(rank_of(spec, strategy, body.world_size), strategy)
    store.save_graph(graph=graph)
    return _public(graph)


@router.get("/{graph_hash}")
def get_graph(graph_hash: Annotated[str, Field(max_length=64)], store: StoreDep) -> GraphPublic:
    """A stored graph."""
    try:
        graph = store.load_graph(graph_hash=graph_hash)
    except StoreError:
        raise BadRequestError(
            f"no graph {graph_hash!r} in the store", field="path.graph_hash", status=404
        ) from None
    return _public(graph)


def _public(graph: IterationGraph) -> GraphPublic:
    return GraphPublic(
        graph_hash=graph.graph_hash,
        model=graph.model.label,
        num_nodes=len(graph.nodes),
        summary=graph.summary(),
    )
