"""The GPU op costs against what GPUs measured (ddlsim/data/measured): whole decoder layers on
an H100, eager and compiled layers and whole training steps on an H200."""

import pytest

from benchmarks.gpu_sum_of_parts import measured, spec_of
from ddlsim.data.graph.format import GraphNode, TensorMeta
from ddlsim.data.specs.gpu_cluster import A100_80G, H100_SXM, H200_SXM
from ddlsim.profiler.shard import capture_shard
from ddlsim.simulator.gpu.roofline import GpuOpCosts
from ddlsim.simulator.gpu.shard_costs import shard_costs


def test_block_matches_measured_layers_h100() -> None:
    """Forward + backward of one block, eager, within 15 % of the H100's layers."""
    costs = GpuOpCosts(H100_SXM)
    for record in measured("h100", "layers_cuda.json.gz"):
        shard = capture_shard(
            spec_of(record["shape"]),
            tp=record["tp"],
            micro_batch=record["batch"],
            seq_len=record["seq"],
        )
        block = shard_costs(shard.graph, shard.block, costs).block
        layer_ms = record["forward_backward"]["median_ms"] / record["layers"]
        assert block.forward_ms + block.backward_ms == pytest.approx(layer_ms, rel=0.15), record


def test_compiled_block_matches_measured_h200() -> None:
    costs = GpuOpCosts(H200_SXM)
    for record in measured("h200", "layers_compiled_cuda.json.gz"):
        shard = capture_shard(
            spec_of(record["shape"]),
            tp=record["tp"],
            micro_batch=record["batch"],
            seq_len=record["seq"],
        )
        block = shard_costs(shard.graph, shard.block, costs, compiled=record["compiled"]).block
        layer_ms = record["forward_backward"]["median_ms"] / record["layers"]
        assert block.forward_ms + block.backward_ms == pytest.approx(layer_ms, rel=0.15), record


@pytest.mark.parametrize("name", ["step_llama3_8b_cuda.json.gz", "step_gpt_1.7b_cuda.json.gz"])
def test_whole_step_matches_measured_h200(name: str) -> None:
    """Embeddings, four blocks, head and loss, with and without full recomputation: within 10 %."""
    costs = GpuOpCosts(H200_SXM)
    records = [r for r in measured("h200", name) if r["layers"] == 4]
    first = records[0]
    shape = first["model"]
    shard = capture_shard(
        spec_of(shape, 4, first["seq"], dropout=0.1),
        tp=1,
        micro_batch=first["batch"],
        seq_len=first["seq"],
    )
    for record in records:
        parts = shard_costs(shard.graph, shard.block, costs, compiled=record["compiled"])
        block = parts.block.forward_ms + parts.block.backward_ms
        if record["recompute"] == "full":
            block += parts.block.forward_ms
        rest = sum(p.forward_ms + p.backward_ms for p in (parts.first, parts.last))
        assert 4 * block + rest == pytest.approx(record["median_ms"], rel=0.10), record


def _gemm(m: int, k: int, n: int) -> GraphNode:
    return GraphNode(
        id=0,
        kind="compute",
        phase="forward",
        op="aten.mm.default",
        module="h.0.mlp",
        inputs=(
            TensorMeta(shape=(m, k), dtype="bfloat16"),
            TensorMeta(shape=(k, n), dtype="bfloat16"),
        ),
        outputs=(TensorMeta(shape=(m, n), dtype="bfloat16"),),
        flops=2 * m * k * n,
        bytes_read=2 * (m * k + k * n),
        bytes_written=2 * m * n,
    )


def test_gemm_efficiency_and_borrowed_curves() -> None:
    h100 = GpuOpCosts(H100_SXM)
    big, small = _gemm(16384, 8192, 8192), _gemm(128, 768, 768)
    big_ms = h100.node_ms(big)
    achieved = big.flops / big_ms / 1e9
    assert 0.5 * 989.4 < achieved < 989.4  # a large GEMM runs near, never above, the peak
    assert small.flops / h100.node_ms(small) / 1e9 < achieved / 4  # small ones do not fill it
    # An A100 borrows the H100's efficiency and scales it to its own peak.
    a100_ms = GpuOpCosts(A100_80G).node_ms(big)
    assert a100_ms == pytest.approx(big_ms * 989.4 / 312.0, rel=1e-6)
    # fp8 matmuls are faster than bf16 ones even with their operands' casts.
    assert GpuOpCosts(H100_SXM, matmul_dtype="fp8").node_ms(big) < big_ms
    # Views and allocations cost nothing.
    view = GraphNode(
        id=1, kind="compute", phase="forward", op="aten._unsafe_view.default", module=""
    )
    assert h100.node_ms(view) == 0.0
