"""NCCL model, pipeline schedules, memory model and the whole prediction at scale."""

from typing import Any

import pytest

from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.specs.gpu_cluster import preset
from ddlsim.simulator.gpu.memory import block_activation_bytes, in_flight
from ddlsim.simulator.gpu.nccl import Group, NcclModel
from ddlsim.simulator.gpu.schedule import (
    StageTimes,
    analytic_pipeline_ms,
    replay_pipeline,
    schedule_order,
)

GIB = 2**30


def test_nccl_levels() -> None:
    a100 = NcclModel(preset("dgx-a100-80g", nodes=4))
    node = Group(8, 8)
    across = Group(32, 8)
    one_per_node = Group(4, 1)
    # Inside a node NVLink, across nodes the group's NICs bound the bus bandwidth.
    assert a100.busbw_gbps("all_reduce", node) == pytest.approx(300 * 0.8)
    assert a100.busbw_gbps("all_reduce", across) == pytest.approx(8 * 25 * 0.92)
    assert a100.busbw_gbps("all_reduce", one_per_node) == pytest.approx(25 * 0.92)
    # Time: latency plus nccl-tests' factor times size over bus bandwidth.
    size = 2**30
    expected = a100.latency_us("all_reduce", node) + 2 * 7 / 8 * size / (240 * 1e3)
    assert a100.time_us("all_reduce", size, node) == pytest.approx(expected)
    assert a100.time_us("all_gather", size, node) < a100.time_us("all_reduce", size, node)
    assert a100.time_us("all_reduce", size, Group(1, 1)) == 0.0
    # Across many nodes the tree's log2 latency beats the ring's linear one.
    big = NcclModel(preset("dgx-h100", nodes=128))
    ring_steps = 2 * (1024 - 1)
    assert big.latency_us("all_reduce", Group(1024, 8)) < ring_steps * 1.0
    with pytest.raises(InvalidOptionError, match="per_node must divide size"):
        Group(12, 8)
    with pytest.raises(InvalidOptionError, match="collective 'gossip' is not supported"):
        a100.time_us("gossip", 1, node)


def test_schedule_orders_hold_every_op_once() -> None:
    for kind, chunks in (("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("interleaved", 3)):
        for stage in range(4):
            order = schedule_order(kind, stage, 4, chunks, 8)
            assert sorted(order) == sorted(
                (k, c, m) for k in "fb" for c in range(chunks) for m in range(8)
            )
    # 1F1B's first stage warms up with p - 1 forwards, its last stage with none.
    assert [op[0] for op in schedule_order("1f1b", 0, 4, 1, 8)[:4]] == ["f", "f", "f", "f"]
    assert [op[0] for op in schedule_order("1f1b", 3, 4, 1, 8)[:2]] == ["f", "b"]
    with pytest.raises(InvalidStrategyError, match=r"micro_batches\(6\) to be a multiple"):
        schedule_order("interleaved", 0, 4, 2, 6)


def test_replay_matches_closed_form_and_interleaving_shrinks_the_bubble() -> None:
    p, m, f, b = 4, 8, 1.0, 2.0
    times = StageTimes(forward_ms=[[f]] * p, backward_ms=[[b]] * p)
    one_f_one_b = max(replay_pipeline("1f1b", times, micro_batches=m))
    assert one_f_one_b == pytest.approx((m + p - 1) * (f + b))
    assert one_f_one_b == pytest.approx(
        analytic_pipeline_ms("1f1b", f, b, stages=p, chunks=1, micro_batches=m, send_ms=0.0)
    )
    assert max(replay_pipeline("gpipe", times, micro_batches=m)) == pytest.approx(one_f_one_b)
    halves = StageTimes(forward_ms=[[f / 2, f / 2]] * p, backward_ms=[[b / 2, b / 2]] * p)
    interleaved = max(replay_pipeline("interleaved", halves, micro_batches=m))
    assert m * (f + b) < interleaved < one_f_one_b
    # Sends between stages lengthen the pipeline.
    assert max(replay_pipeline("1f1b", times, micro_batches=m, send_ms=0.5)) > one_f_one_b


def test_activation_memory_by_recomputation() -> None:
    kwargs: dict[str, Any] = {"seq": 2048, "batch": 1, "hidden": 12288, "heads": 96, "tp": 8}
    none = block_activation_bytes(
        **kwargs, sequence_parallel=False, recompute="none", fused_attention=False
    )
    selective = block_activation_bytes(
        **kwargs, sequence_parallel=False, recompute="selective", fused_attention=False
    )
    full = block_activation_bytes(
        **kwargs, sequence_parallel=True, recompute="full", fused_attention=False
    )
    sp = block_activation_bytes(
        **kwargs, sequence_parallel=True, recompute="selective", fused_attention=False
    )
    assert full < sp < selective < none
    # Korthikanti et al.'s table: 34 s b h / t with sequence parallelism and selective recompute.
    assert sp == pytest.approx(2048 * 12288 * 34 / 8)
    assert in_flight("1f1b", stages=8, chunks=1, micro_batches=64) == 8
    assert in_flight("gpipe", stages=8, chunks=1, micro_batches=64) == 64
    assert 8 < in_flight("interleaved", stages=8, chunks=2, micro_batches=64) < 16
