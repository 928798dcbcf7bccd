from collections.abc import Callable

import torch

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.graph.ops import OP_CATEGORIES, op_category
from ddlsim.data.graph.pyg import FEATURE_NAMES, to_hetero, to_pyg


def test_to_pyg_shapes_and_edges(tiny_graph: IterationGraph) -> None:
    data = to_pyg(tiny_graph)
    assert data.x.shape == (4, len(FEATURE_NAMES))
    assert data.edge_index.tolist() == [[0, 1, 2], [1, 2, 3]]
    assert data.node_kind.tolist() == [0, 0, 1, 2]
    assert torch.allclose(data.flops, torch.tensor([16.0, 16.0, 0.0, 0.0], dtype=torch.float64))
    # One-hot blocks: exactly one kind, one phase, one category per node.
    assert torch.all(data.x[:, :4].sum(dim=1) == 1)
    assert torch.all(data.x[:, 4:8].sum(dim=1) == 1)
    flops_col = FEATURE_NAMES.index("log1p_flops")
    assert torch.allclose(data.x[0, flops_col], torch.log1p(torch.tensor(16.0)))


def test_to_hetero_types_and_local_indices(tiny_graph: IterationGraph) -> None:
    data = to_hetero(tiny_graph)
    assert set(data.node_types) == {"compute", "grad_ready", "comm"}
    assert data["compute"].x.shape == (2, len(FEATURE_NAMES))
    assert data["compute"].node_id.tolist() == [0, 1]
    assert data["compute", "to", "compute"].edge_index.tolist() == [[0], [1]]
    assert data["compute", "to", "grad_ready"].edge_index.tolist() == [[1], [0]]
    assert data["grad_ready", "to", "comm"].edge_index.tolist() == [[0], [0]]


def test_homogeneous_and_hetero_features_agree(zoo_graph: Callable[[str], IterationGraph]) -> None:
    graph = zoo_graph("mlp")
    data = to_pyg(graph)
    hetero = to_hetero(graph)
    assert data.edge_index.shape == (2, len(graph.edges))
    for kind in hetero.node_types:
        ids = hetero[kind].node_id
        assert torch.allclose(hetero[kind].x, data.x[ids])
    assert sum(hetero[k].num_nodes for k in hetero.node_types) == data.num_nodes


def test_op_categories() -> None:
    assert op_category("aten.mm.default") == "matmul"
    assert op_category("aten.convolution_backward.default") == "conv"
    assert op_category("aten._scaled_dot_product_flash_attention_for_cpu.default") == "attention"
    assert op_category("aten.native_layer_norm_backward.default") == "norm"
    assert op_category("aten.view.default") == "view"
    assert op_category("aten.tanh.default") == "activation"
    assert op_category("aten.add.Tensor") == "elementwise"
    assert op_category("all_reduce") == "comm"
    assert set(OP_CATEGORIES) >= {"matmul", "other"}
