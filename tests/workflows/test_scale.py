"""Predictions and searches on GPU clusters on paper, end to end (capture on fake tensors)."""

import dataclasses
import json
import re
from importlib import resources

import pytest

from benchmarks.published import RowError, parse_row
from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.simulator.gpu.prediction import BREAKDOWN_KEYS
from ddlsim.workflows.scale import ScaleRequest, predict_at_scale, search_at_scale

GPT = ModelSpec.from_dict(
    {
        "source": "transformers",
        "class": "GPT2LMHeadModel",
        "config": {
            "n_embd": 256,
            "n_head": 8,
            "n_layer": 8,
            "n_positions": 512,
            "vocab_size": 1024,
        },
        "inputs": {"batch_size": 32, "seq_len": 512},
    }
)


def _request(plan: ScalePlan, nodes: int = 1) -> ScaleRequest:
    return ScaleRequest(
        model=GPT,
        cluster=GpuClusterSpec.parse(f"dgx-h100:{nodes}"),
        plan=plan,
        global_batch=32,
        seq_len=512,
    )


def test_prediction_is_consistent() -> None:
    plan = ScalePlan(dp=2, tp=2, pp=2, micro_batches=4, recompute="full", sequence_parallel=True)
    prediction = predict_at_scale(_request(plan))
    tokens = 32 * 512
    assert prediction.micro_batch_size == 4
    assert prediction.tokens_per_s_per_gpu == pytest.approx(tokens / prediction.iteration_s / 8)
    assert prediction.fits and 0 < prediction.memory.total_gib < 80
    # Full recomputation costs time and saves memory.
    lighter = predict_at_scale(_request(dataclasses.replace(plan, recompute="none")))
    assert lighter.iteration_s < prediction.iteration_s
    assert lighter.memory.activations > prediction.memory.activations
    # More, smaller micro-batches shrink the pipeline bubble (the time beyond the stage's work).
    more = predict_at_scale(_request(dataclasses.replace(plan, micro_batches=8)))
    assert 0 < more.breakdown_ms["pipeline_bubble"] < prediction.breakdown_ms["pipeline_bubble"]
    # The breakdown's parts add up to the iteration.
    for each in (prediction, lighter, more):
        assert set(each.breakdown_ms) == set(BREAKDOWN_KEYS)
        assert sum(each.breakdown_ms.values()) == pytest.approx(each.iteration_s * 1e3)
    assert prediction.breakdown_ms["recompute"] > 0 == lighter.breakdown_ms["recompute"]
    assert 0 < prediction.mfu < 1
    assert prediction.model_tflops_per_gpu < prediction.tflops_per_gpu


def test_plans_that_do_not_fit_the_cluster_are_refused() -> None:
    with pytest.raises(
        InvalidStrategyError, match=re.escape("dp(4) * tp(1) * pp(1) != world_size(8)")
    ):
        predict_at_scale(_request(ScalePlan(dp=4)))
    with pytest.raises(InvalidStrategyError, match=r"batch_size\(32\) is not divisible"):
        predict_at_scale(_request(ScalePlan(dp=8, micro_batches=3)))


def test_search_finds_a_fitting_layout_fast() -> None:
    result = search_at_scale(GPT, GpuClusterSpec.parse("dgx-h100:2"), global_batch=32, seq_len=512)
    assert result.best is not None and result.best.replayed
    assert result.best.plan.world_size == 16
    assert result.evaluated > 50
    published = predict_at_scale(_request(ScalePlan(dp=16, micro_batches=1), nodes=2))
    assert result.best.iteration_s <= published.iteration_s * 1.000001


def test_the_search_keeps_the_memory_margin_it_is_given() -> None:
    cluster = GpuClusterSpec.parse("dgx-h100:1")
    free = search_at_scale(GPT, cluster, global_batch=32, seq_len=512)
    assert free.best is not None
    # A margin that leaves the fastest layout too little room: it is refused, and every layout
    # offered leaves the margin free.
    margin = cluster.gpu.memory_gib - free.best.memory_gib + 0.01
    kept = search_at_scale(GPT, cluster, global_batch=32, seq_len=512, memory_margin_gib=margin)
    assert kept.refused_memory > free.refused_memory
    for ranked in kept.ranked:
        assert ranked.memory_gib + margin <= cluster.gpu.memory_gib
        assert ranked.plan != free.best.plan
    for bad in (-1.0, 80.0, True):
        with pytest.raises(InvalidOptionError, match=r"memory_margin_gib\(.*\) must be a number"):
            search_at_scale(GPT, cluster, global_batch=32, seq_len=512, memory_margin_gib=bad)


@pytest.mark.parametrize(
    "name", ["megatron_sc21.json", "torchtitan_llama3.json", "torchtitan_a100.json"]
)
def test_shipped_published_rows_parse(name: str) -> None:
    raw = json.loads((resources.files("ddlsim.data") / "published" / name).read_text("utf-8"))
    for row in raw["rows"]:
        row_name, request, metric, value = parse_row(row)
        assert row_name and value > 0
        assert request.plan.world_size == request.cluster.world_size
        assert request.global_batch % (request.plan.dp * request.plan.micro_batches) == 0
        assert metric in {"tflops_per_gpu", "tokens_per_s_per_gpu", "iteration_s"}
        assert row["source"]


def test_bad_row_is_named() -> None:
    with pytest.raises(RowError, match="row 'x' misses 'cluster'"):
        parse_row({"name": "x", "source": "s", "model": {}, "strategy": {}})
    row = {
        "name": "y",
        "source": "s",
        "model": GPT.to_dict(),
        "cluster": "dgx-h100:1",
        "strategy": {"parallel": {"dp": 8}},
        "global_batch": 8,
        "seq_len": 512,
        "published": {"mfu": 0.5},
    }
    with pytest.raises(RowError, match="unknown key 'mfu'"):
        parse_row(row)
