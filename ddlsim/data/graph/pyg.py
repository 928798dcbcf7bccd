"""Conversion of an ``IterationGraph`` to ``torch_geometric`` ``Data`` and ``HeteroData``.

Node features are the same in both forms (``FEATURE_NAMES`` lists them): one-hot node kind,
phase and op category, then ``log1p`` of FLOPs and byte counts, and the view flag.
"""

import math

import torch
from torch_geometric.data import Data, HeteroData

from ddlsim.data.graph.format import NODE_KINDS, PHASES, GraphNode, IterationGraph
from ddlsim.data.graph.ops import OP_CATEGORIES, op_category

_SCALARS = ("flops", "bytes_read", "bytes_written", "grad_bytes", "param_bytes")
FEATURE_NAMES: tuple[str, ...] = (
    *(f"kind={k}" for k in NODE_KINDS),
    *(f"phase={p}" for p in PHASES),
    *(f"category={c}" for c in OP_CATEGORIES),
    *(f"log1p_{s}" for s in _SCALARS),
    "is_view",
)
_KIND_INDEX = {k: i for i, k in enumerate(NODE_KINDS)}
_PHASE_INDEX = {p: i for i, p in enumerate(PHASES)}
_CATEGORY_INDEX = {c: i for i, c in enumerate(OP_CATEGORIES)}


def node_features(nodes: list[GraphNode] | tuple[GraphNode, ...]) -> torch.Tensor:
    """Feature matrix of ``nodes``.

    Shapes:
        return: ``[num_nodes, len(FEATURE_NAMES)]``, float32.
    """
    width = len(FEATURE_NAMES)
    phase_base = len(NODE_KINDS)
    category_base = phase_base + len(PHASES)
    rows = []
    for node in nodes:
        row = [0.0] * (category_base + len(OP_CATEGORIES))
        row[_KIND_INDEX[node.kind]] = 1.0
        row[phase_base + _PHASE_INDEX[node.phase]] = 1.0
        row[category_base + _CATEGORY_INDEX[op_category(node.op)]] = 1.0
        row += [math.log1p(float(getattr(node, name))) for name in _SCALARS]
        row.append(float(node.is_view))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float32).reshape(len(nodes), width)


def to_pyg(graph: IterationGraph) -> Data:
    """A homogeneous PyG graph with data-dependency edges.

    Shapes:
        x: ``[num_nodes, num_node_features]``; edge_index: ``[2, num_edges]``;
        node_kind, op_category: ``[num_nodes]`` (indices into ``NODE_KINDS``, ``OP_CATEGORIES``);
        flops: ``[num_nodes]`` float64 (raw, for targets and checks).
    """
    edge_index = torch.tensor(graph.edges, dtype=torch.long).t().reshape(2, -1)
    return Data(
        x=node_features(graph.nodes),
        edge_index=edge_index.contiguous(),
        num_nodes=len(graph.nodes),
        node_kind=torch.tensor([_KIND_INDEX[n.kind] for n in graph.nodes], dtype=torch.long),
        op_category=torch.tensor(
            [_CATEGORY_INDEX[op_category(n.op)] for n in graph.nodes], dtype=torch.long
        ),
        flops=torch.tensor([float(n.flops) for n in graph.nodes], dtype=torch.float64),
        graph_hash=graph.graph_hash,
    )


def to_hetero(graph: IterationGraph) -> HeteroData:
    """A heterogeneous PyG graph: one node type per node kind, edges typed by endpoint kinds.

    Shapes:
        ``data[kind].x``: ``[num_nodes_of_kind, num_node_features]``;
        ``data[kind].node_id``: ``[num_nodes_of_kind]`` ids in the ``IterationGraph``;
        ``data[src_kind, "to", dst_kind].edge_index``: ``[2, num_edges_of_type]`` local indices.
    """
    data = HeteroData()
    local: dict[int, int] = {}
    members: dict[str, list[GraphNode]] = {kind: [] for kind in NODE_KINDS}
    for node in graph.nodes:
        local[node.id] = len(members[node.kind])
        members[node.kind].append(node)
    for kind, nodes in members.items():
        if not nodes:
            continue
        data[kind].x = node_features(nodes)
        data[kind].node_id = torch.tensor([n.id for n in nodes], dtype=torch.long)
    typed: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
    for src, dst in graph.edges:
        key: tuple[str, str, str] = (graph.nodes[src].kind, "to", graph.nodes[dst].kind)
        typed.setdefault(key, []).append((local[src], local[dst]))
    for key, pairs in sorted(typed.items()):
        data[key].edge_index = torch.tensor(pairs, dtype=torch.long).t().contiguous()
    return data
