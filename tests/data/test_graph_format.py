import json

import pytest

from ddlsim.data.errors import InvalidGraphError
from ddlsim.data.graph.format import SCHEMA_VERSION, IterationGraph


def test_summary_totals(tiny_graph: IterationGraph) -> None:
    summary = tiny_graph.summary()
    assert summary["num_nodes"] == 4
    assert summary["num_edges"] == 3
    assert summary["num_params"] == 4
    assert summary["forward_flops"] == 16
    assert summary["backward_flops"] == 16
    assert summary["grad_bytes"] == 16
    assert summary["num_buckets"] == 1
    assert summary["nodes_by_kind"] == {"compute": 2, "grad_ready": 1, "comm": 1, "optimizer": 0}


def test_json_round_trip_is_lossless(tiny_graph: IterationGraph) -> None:
    graph = tiny_graph
    text = graph.to_json()
    again = IterationGraph.from_json(text)
    assert again == graph
    assert again.to_json() == text
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION


def test_hash_ignores_env_but_not_content(tiny_graph: IterationGraph) -> None:
    graph = tiny_graph
    other_env = IterationGraph.from_dict({**graph.to_dict(), "env": {"torch": "other"}})
    assert other_env.graph_hash == graph.graph_hash
    raw = graph.to_dict()
    raw["nodes"][0]["flops"] = 17
    del raw["graph_hash"]
    assert IterationGraph.from_dict(raw).graph_hash != graph.graph_hash


def test_rejects_tampering_and_bad_versions(tiny_graph: IterationGraph) -> None:
    raw = tiny_graph.to_dict()
    raw["nodes"][1]["flops"] = 0
    with pytest.raises(InvalidGraphError, match=r"graph_hash .* does not match"):
        IterationGraph.from_dict(raw)
    with pytest.raises(InvalidGraphError, match="schema_version 99 is not supported; allowed: 1"):
        IterationGraph.from_dict({**tiny_graph.to_dict(), "schema_version": 99})
    with pytest.raises(InvalidGraphError, match="not valid JSON"):
        IterationGraph.from_json("{")


@pytest.mark.parametrize("edge", [(1, 0), (2, 2), (0, 9)])
def test_edges_must_go_forward(edge: tuple[int, int], tiny_graph: IterationGraph) -> None:
    raw = tiny_graph.to_dict()
    raw["edges"].append(list(edge))
    del raw["graph_hash"]
    with pytest.raises(InvalidGraphError, match="must go forward"):
        IterationGraph.from_dict(raw)


def test_bad_node_kind(tiny_graph: IterationGraph) -> None:
    raw = tiny_graph.to_dict()
    raw["nodes"][0]["kind"] = "magic"
    del raw["graph_hash"]
    with pytest.raises(InvalidGraphError, match="kind 'magic'"):
        IterationGraph.from_dict(raw)
