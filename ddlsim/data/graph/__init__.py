"""The training-iteration graph: format, JSON schema, content hash, PyG conversion."""

from ddlsim.data.graph.format import (
    SCHEMA_VERSION,
    GraphNode,
    IterationGraph,
    NodeKind,
    ParamInfo,
    Phase,
    TensorMeta,
)
from ddlsim.data.graph.ops import OP_CATEGORIES, op_category

__all__ = [
    "OP_CATEGORIES",
    "SCHEMA_VERSION",
    "GraphNode",
    "IterationGraph",
    "NodeKind",
    "ParamInfo",
    "Phase",
    "TensorMeta",
    "op_category",
]
