"""Pipeline-parallel training (GPipe, 1F1B, interleaved 1F1B; alone and with data parallelism)
trains exactly like one process on the global batch; models and plans it cannot run are refused
before any rank starts."""

import dataclasses
import re

import pytest

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.context import RankContext
from ddlsim.executor.pipeline import PipelineTrainer
from ddlsim.executor.plan import check_strategy
from ddlsim.executor.run import RunOptions, run_training
from ddlsim.plans.runnable import check_pipeline
from ddlsim.plans.stages import balanced_cuts
from ddlsim.profiler.capture import capture_graph
from tests.executor.harness import Losses, assert_matches_reference, run_trainer

SPECS: dict[str, ModelSpec] = {
    name: ZOO[name].with_inputs(batch_size=4, seq_len=16)
    for name in ("gpt2-tiny", "bert-tiny", "llama-tiny")
} | {
    "mlp": ZOO["mlp"].with_inputs(batch_size=8),
    # its stages pass permuted (strided) activations, which gloo does not send as they are
    "convnext-atto": ZOO["convnext-atto"].with_inputs(batch_size=4, image_size=32),
}


def _build(ctx: RankContext) -> PipelineTrainer:
    return PipelineTrainer(ctx, ctx.build_model())


def _run(spec: ModelSpec, world_size: int, parallel: dict) -> list[Losses]:
    return run_trainer(world_size, _build, spec, Strategy.from_dict({"parallel": parallel}))


@pytest.mark.parametrize(
    ("name", "schedule", "micro_batches"),
    [
        ("gpt2-tiny", "1f1b", 2),
        ("gpt2-tiny", "gpipe", 4),
        ("bert-tiny", "1f1b", 4),
        ("llama-tiny", "gpipe", 1),
        ("mlp", "interleaved_1f1b", 2),
        ("convnext-atto", "1f1b", 2),
        ("gpt2-tiny", "eager_1f1b", 4),
    ],
)
def test_pp2_losses_match_single_process(name: str, schedule: str, micro_batches: int) -> None:
    # Measured: at most 2e-7 relative on every step (micro-batch losses are summed in another
    # order than one mean over the batch), far inside the 1e-5 bound.
    spec = SPECS[name]
    plan = {"pp": 2, "pp_schedule": schedule, "micro_batches": micro_batches}
    results = _run(spec, 2, plan)
    assert results[0].losses == results[1].losses  # the sum over ranks, on every rank
    assert_matches_reference(results[:1], spec)
    applied = results[0].applied
    assert (applied["plan"], applied["pp"], applied["dp"]) == ("pipeline", 2, 1)
    assert (applied["schedule"], applied["micro_batches"]) == (schedule, micro_batches)
    stages = applied["stages"]
    assert len(stages) == (4 if schedule == "interleaved_1f1b" else 2)
    assert [s["rank_in_pp"] for s in stages] == [i % 2 for i in range(len(stages))]
    # Every block of the stack in exactly one stage, in order.
    blocks = [b for s in stages for b in s["blocks"]]
    assert blocks == [f"{applied['stack']}.{i}" for i in range(len(blocks))]
    assert all(s["blocks"] for s in stages)


def test_tied_embedding_gradients_are_summed_over_stages() -> None:
    results = _run(SPECS["gpt2-tiny"], 2, {"pp": 2, "micro_batches": 2})
    applied = results[0].applied
    # GPT-2's LM head is its input embedding: used on the first and the last stage.
    assert applied["tied"] == ["transformer.wte.weight"]
    assert applied["collectives"] == ["send/recv:pp", "all_reduce:pp"]
    assert [s["blocks"] for s in applied["stages"]] == [["transformer.h.0"], ["transformer.h.1"]]


def test_dp2_pp2_matches_single_process() -> None:
    spec = SPECS["gpt2-tiny"]
    results = _run(spec, 4, {"dp": 2, "pp": 2, "micro_batches": 2})
    assert_matches_reference(results[:1], spec)
    applied = results[0].applied
    assert applied["dp"] == 2
    assert applied["collectives"] == ["send/recv:pp", "all_reduce:pp", "all_reduce:dp"]


@pytest.mark.parametrize(
    ("name", "schedule", "micro_batches"),
    [("gpt2-tiny", "1f1b", 2), ("llama-tiny", "gpipe", 2), ("gpt2-tiny", "eager_1f1b", 4)],
)
def test_a_tensor_parallel_stage_then_a_batch_stage_match_single_process(
    name: str, schedule: str, micro_batches: int
) -> None:
    # Stage 0 tensor-parallel over its two ranks on both ranks' samples, stage 1 batch-split:
    # each stage-0 rank sends its share on; the shares' gradients come back all-gathered.
    # Eager 1F1B with 4 micro-batches: stage 0 runs 3 forwards before its first backward.
    spec = SPECS[name].with_inputs(batch_size=2 * 2 * micro_batches)
    plan = {"dp": 2, "pp": 2, "micro_batches": micro_batches, "pp_schedule": schedule}
    results = _run(spec, 4, {**plan, "stages": ["tp", "batch"]})
    assert_matches_reference(results[:1], spec)
    applied = results[0].applied
    assert applied["stage_layouts"] == ["tp", "batch"]
    assert "all_gather:stage" in applied["collectives"]
    # rank 0 runs stage 0, whose block (and only it) is split column- and row-wise
    split = applied["split_modules"]
    assert split and all(".0." in path for path in split)
    assert results[2].applied["split_modules"] == []  # rank 2 runs stage 1


@pytest.mark.parametrize(
    ("name", "world_size", "message"),
    [
        ("gpt2-tiny", 2, "a tensor-parallel stage needs dp >= 2 ranks"),
        ("mlp", 4, "mlp (MLP) has no tensor-parallel plan"),
    ],
)
def test_tensor_parallel_stages_are_refused_where_they_cannot_run(
    name: str, world_size: int, message: str
) -> None:
    strategy = Strategy.from_dict(
        {"parallel": {"pp": 2, "micro_batches": 2, "stages": ["tp", "batch"]}}
    )
    spec = SPECS[name]
    with pytest.raises(InvalidStrategyError, match=re.escape(message)):
        check_strategy(spec, strategy, world_size, capture_graph(spec))


def test_pipeline_through_ddlsim_run() -> None:
    strategy = Strategy.from_dict({"parallel": {"pp": 2, "micro_batches": 2}})
    result = run_training(
        SPECS["llama-tiny"], strategy, RunOptions(world_size=2, iters=2, budget_s=0)
    )
    assert result.applied["plan"] == "pipeline"
    assert result.applied["stack"] == "model.layers"
    assert len(result.losses) == 4 and result.losses[-1] < result.losses[0]


def test_cuts_balance_flops_and_keep_every_stage_non_empty() -> None:
    assert balanced_cuts([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert balanced_cuts([8, 1, 1, 1, 1], 2) == [(0, 1), (1, 5)]
    assert balanced_cuts([0, 0, 5], 3) == [(0, 1), (1, 2), (2, 3)]
    assert balanced_cuts([1, 2, 3, 4, 5, 6], 3) == [(0, 3), (3, 5), (5, 6)]
    with pytest.raises(ValueError, match="cannot cut 2 blocks into 3"):
        balanced_cuts([1, 1], 3)


@pytest.mark.parametrize(
    ("name", "parallel", "message"),
    [
        ("t5-tiny", {"pp": 2, "micro_batches": 2}, "t5-tiny cannot be pipelined"),
        (
            "gpt2-tiny",
            {"pp": 2, "micro_batches": 2, "pp_schedule": "interleaved_1f1b"},
            "needs 4 stages but gpt2-tiny has 2 blocks in transformer.h",
        ),
        ("gpt2-tiny", {"pp": 2, "tp": 2, "micro_batches": 2}, "tp(2) with a pipeline"),
        (
            "gpt2-4-blocks",
            {"pp": 2, "fsdp": True, "micro_batches": 2, "pp_schedule": "interleaved_1f1b"},
            "parallel.fsdp with a pipeline needs one stage a rank",
        ),
    ],
)
def test_bad_pipelines_are_refused(name: str, parallel: dict, message: str) -> None:
    # Four blocks: enough for the interleaved stages, so that the rule under test is reached.
    gpt2 = ZOO["gpt2-tiny"]
    four = dataclasses.replace(gpt2, config={**gpt2.config, "n_layer": 4})
    spec = four if name == "gpt2-4-blocks" else ZOO[name]
    strategy = Strategy.from_dict({"parallel": parallel})
    world = strategy.parallel.pp * strategy.parallel.tp
    with pytest.raises(InvalidStrategyError, match=re.escape(message)):
        check_strategy(spec, strategy, world, capture_graph(spec))


@pytest.mark.parametrize(
    ("name", "schedule"), [("gpt2-tiny", "1f1b"), ("llama-tiny", "eager_1f1b")]
)
def test_fsdp_beside_a_pipeline_matches_single_process(name: str, schedule: str) -> None:
    """pp 2 x FSDP over dp 2 (4 ranks), ZeRO-2 style: gpt2-tiny's embedding tied to its head
    is summed over the stages as FSDP shards; llama-tiny's untied head is the last stage's."""
    spec = SPECS[name]
    plan = {"pp": 2, "fsdp": True, "pp_schedule": schedule, "micro_batches": 2}
    results = _run(spec, 4, plan)
    assert all(r.losses == results[0].losses for r in results)
    assert_matches_reference(results[:1], spec)
    applied = results[0].applied
    assert (applied["plan"], applied["pp"], applied["dp"], applied["fsdp"]) == (
        "pipeline",
        2,
        2,
        True,
    )
    assert "reduce_scatter:dp" in applied["collectives"]
    assert "all_reduce:dp" not in applied["collectives"]


def test_too_few_micro_batches_for_1f1b_are_refused() -> None:
    with pytest.raises(InvalidStrategyError, match=r"micro_batches\(1\) < pp\(2\)"):
        Strategy.from_dict({"parallel": {"pp": 2}})


def test_check_pipeline_accepts_the_zoo_stacks() -> None:
    for name in ("gpt2-tiny", "bert-tiny", "vit-tiny", "resnet-18", "llama-tiny", "vgg-mini"):
        plan = Strategy.from_dict({"parallel": {"pp": 2, "pp_schedule": "gpipe"}}).parallel
        check_pipeline(ZOO[name], plan)
