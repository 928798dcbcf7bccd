"""Data parallelism across many nodes on paper: NCCL's all-reduce bus bandwidth by node count
against the published scaling figures, and a layout's iteration time at a fixed per-replica
batch rising with the data-parallel size as those figures imply."""

import dataclasses
import itertools

import pytest

from benchmarks.nccl_busbw import SCALING, fit_tree_level, scaling_rows
from ddlsim.data.specs.gpu_cluster import TREE_LEVEL_US, preset
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.simulator.gpu.nccl import Group, NcclModel
from ddlsim.workflows.scale import ScaleRequest, predict_at_scale

GPT = ModelSpec.from_dict(
    {
        "source": "transformers",
        "class": "GPT2LMHeadModel",
        "config": {
            "n_embd": 1024,
            "n_head": 16,
            "n_layer": 4,
            "n_positions": 1024,
            "vocab_size": 8192,
        },
        "inputs": {"batch_size": 2, "seq_len": 1024},
    }
)


def test_the_all_reduce_follows_the_published_figures_from_4_to_1024_nodes() -> None:
    rows = scaling_rows()
    assert len(rows) == len(SCALING)
    for row in rows:
        assert abs(row["error"]) <= 0.25, row
    errors = sorted(abs(row["error"]) for row in rows)
    assert errors[len(errors) // 2] <= 0.08
    # The preset's tree level is the one the figures fit (to the fit's 0.5 us grid).
    assert fit_tree_level() == pytest.approx(TREE_LEVEL_US, abs=0.5)


def test_the_tree_wins_across_nodes_and_its_latency_grows_with_log_nodes() -> None:
    latencies = []
    for nodes in (8, 64, 512):
        model = NcclModel(preset("dgx-h100", nodes=nodes))
        group = Group(8 * nodes, 8)
        latency = model.latency_us("all_reduce", group)
        ring = model.latency_us("all_gather", group) * 2  # the ring's steps, twice
        assert latency < ring
        latencies.append(latency)
    # Each 8x more nodes adds three levels up and down: the same step every time.
    steps = [b - a for a, b in itertools.pairwise(latencies)]
    assert steps[0] == pytest.approx(steps[1]) == pytest.approx(2 * 3 * TREE_LEVEL_US)
    # All-gather and reduce-scatter have no tree: their ring latency grows with the ranks.
    small = NcclModel(preset("dgx-h100", nodes=8)).latency_us("all_gather", Group(64, 8))
    large = NcclModel(preset("dgx-h100", nodes=512)).latency_us("all_gather", Group(4096, 8))
    assert large / small == pytest.approx(4095 / 63, rel=0.05)


def test_an_oversubscribed_spine_slows_groups_beyond_a_leaf() -> None:
    cluster = preset("dgx-h100", nodes=64)
    tapered = dataclasses.replace(cluster, oversubscription=2.0)
    within, beyond = Group(32 * 8, 8), Group(64 * 8, 8)
    full, half = NcclModel(cluster), NcclModel(tapered)
    assert half.busbw_gbps("all_gather", within) == full.busbw_gbps("all_gather", within)
    assert half.busbw_gbps("all_gather", beyond) == pytest.approx(
        min(full.busbw_gbps("all_gather", beyond), 8 * 50 * 0.92 / 2)
    )


def test_iteration_time_rises_with_data_parallel_size_at_a_fixed_replica_batch() -> None:
    times: list[float] = []
    exposed: list[float] = []
    compute: list[float] = []
    optimizer: list[float] = []
    for nodes in (8, 32, 128, 512):
        dp = 8 * nodes
        request = ScaleRequest(
            model=GPT,
            cluster=preset("dgx-h100", nodes=nodes),
            plan=ScalePlan(dp=dp, micro_batches=1),
            global_batch=2 * dp,
            seq_len=1024,
        )
        prediction = predict_at_scale(request)
        times.append(prediction.iteration_s)
        exposed.append(prediction.breakdown_ms["exposed_comm_network"])
        compute.append(prediction.breakdown_ms["compute"])
        optimizer.append(prediction.breakdown_ms["optimizer"])
    assert all(b > a for a, b in itertools.pairwise(times)), times
    assert max(compute) == pytest.approx(min(compute))
    assert max(optimizer) == pytest.approx(min(optimizer))
    # The rise is the gradients' all-reduce over more nodes: the tree's levels, each priced as
    # the scaling figures fit them, in every bucket.
    rise_ms = (times[-1] - times[0]) * 1e3
    assert rise_ms == pytest.approx(exposed[-1] - exposed[0], rel=1e-6)
    assert rise_ms > 0
