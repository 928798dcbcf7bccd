import json

import pytest

from data.errors import InvalidGraphError
from data.graph.format import SCHEMA_VERSION, GraphNode, IterationGraph, ParamInfo, TensorMeta
from data.specs.model import InputSpec, ModelSpec
from data.specs.strategy import Strategy


def tiny_graph() -> IterationGraph:
    """A 4-node iteration: matmul forward, its backward, the weight's gradient, an all-reduce."""
    t = TensorMeta(shape=(2, 2), dtype="float32")
    nodes = (
        GraphNode(
            id=0,
            kind="compute",
            phase="forward",
            op="aten.mm.default",
            module="fc",
            inputs=(t, t),
            outputs=(t,),
            flops=16,
            bytes_read=32,
            bytes_written=16,
        ),
        GraphNode(
            id=1,
            kind="compute",
            phase="backward",
            op="aten.mm.default",
            module="fc",
            inputs=(t, t),
            outputs=(t,),
            flops=16,
            bytes_read=32,
            bytes_written=16,
            forward_id=0,
        ),
        GraphNode(
            id=2,
            kind="grad_ready",
            phase="backward",
            op="grad_ready",
            module="fc",
            param="fc.weight",
            params=("fc.weight",),
            param_bytes=16,
            grad_bytes=16,
        ),
        GraphNode(
            id=3,
            kind="comm",
            phase="comm",
            op="all_reduce",
            module="",
            params=("fc.weight",),
            grad_bytes=16,
            bucket=0,
        ),
    )
    return IterationGraph(
        model=ModelSpec(source="reference", cls="MLP", config={}, inputs=InputSpec(batch_size=2)),
        strategy=Strategy(),
        optimizer="sgd",
        params=(
            ParamInfo(
                name="fc.weight", module="fc", shape=(2, 2), dtype="float32", numel=4, nbytes=16
            ),
        ),
        nodes=nodes,
        edges=((0, 1), (1, 2), (2, 3)),
        env={"torch": "test"},
    )


def test_summary_totals() -> None:
    summary = tiny_graph().summary()
    assert summary["num_nodes"] == 4
    assert summary["num_edges"] == 3
    assert summary["num_params"] == 4
    assert summary["forward_flops"] == 16
    assert summary["backward_flops"] == 16
    assert summary["grad_bytes"] == 16
    assert summary["num_buckets"] == 1
    assert summary["nodes_by_kind"] == {"compute": 2, "grad_ready": 1, "comm": 1, "optimizer": 0}


def test_json_round_trip_is_lossless() -> None:
    graph = tiny_graph()
    text = graph.to_json()
    again = IterationGraph.from_json(text)
    assert again == graph
    assert again.to_json() == text
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION


def test_hash_ignores_env_but_not_content() -> None:
    graph = tiny_graph()
    other_env = IterationGraph.from_dict({**graph.to_dict(), "env": {"torch": "other"}})
    assert other_env.graph_hash == graph.graph_hash
    raw = graph.to_dict()
    raw["nodes"][0]["flops"] = 17
    del raw["graph_hash"]
    assert IterationGraph.from_dict(raw).graph_hash != graph.graph_hash


def test_rejects_tampering_and_bad_versions() -> None:
    raw = tiny_graph().to_dict()
    raw["nodes"][1]["flops"] = 0
    with pytest.raises(InvalidGraphError, match=r"graph_hash .* does not match"):
        IterationGraph.from_dict(raw)
    with pytest.raises(InvalidGraphError, match="schema_version 99 is not supported; allowed: 1"):
        IterationGraph.from_dict({**tiny_graph().to_dict(), "schema_version": 99})
    with pytest.raises(InvalidGraphError, match="not valid JSON"):
        IterationGraph.from_json("{")


@pytest.mark.parametrize("edge", [(1, 0), (2, 2), (0, 9)])
def test_edges_must_go_forward(edge: tuple[int, int]) -> None:
    raw = tiny_graph().to_dict()
    raw["edges"].append(list(edge))
    del raw["graph_hash"]
    with pytest.raises(InvalidGraphError, match="must go forward"):
        IterationGraph.from_dict(raw)


def test_bad_node_kind() -> None:
    raw = tiny_graph().to_dict()
    raw["nodes"][0]["kind"] = "magic"
    del raw["graph_hash"]
    with pytest.raises(InvalidGraphError, match="kind 'magic'"):
        IterationGraph.from_dict(raw)
