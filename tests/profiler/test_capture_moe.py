"""Mixtures of experts captured in fp32 as in bf16 (transformers' default grouped GEMM has a
bf16-only fake kernel: "Expected inputs of BF16"), the experts' matmuls counted."""

import pytest

from ddlsim.data.zoo import ZOO
from ddlsim.profiler.capture import CaptureOptions, capture_graph


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_experts_are_captured_with_their_flops(precision: str) -> None:
    spec = ZOO["mixtral-tiny"]
    graph = capture_graph(spec, CaptureOptions(autocast=precision))
    config = spec.config
    tokens = spec.inputs.batch_size * (spec.inputs.seq_len or 0)
    pairs = tokens * int(config["num_experts_per_tok"])
    hidden, inner = int(config["hidden_size"]), int(config["intermediate_size"])
    layer0 = [n for n in graph.nodes if n.module == "model.layers.0.mlp.experts"]
    matmuls = [n for n in layer0 if "grouped_mm" in n.op]
    forward = sorted(n.flops for n in matmuls if "backward" not in n.op)
    # up (gate and up fused) and down, each every token copy through its expert's matrix
    assert forward == sorted([2 * pairs * hidden * 2 * inner, 2 * pairs * inner * hidden])
    backward = sum(n.flops for n in matmuls if "backward" in n.op)
    assert backward == 2 * sum(forward)
    # the dispatch (token copies sorted by expert) and the combine are nodes of the layer
    assert any("sort" in n.op for n in layer0) and any("index_add" in n.op for n in layer0)
