"""Tensor-parallel training (alone and with data parallelism) trains exactly like one process on
the global batch; models that cannot be split are refused before any rank starts."""

import copy
import dataclasses
import re
from typing import Any

import pytest
import torch

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.models import build_model, make_batch
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.context import RankContext, disable_dropout, local_loss
from ddlsim.executor.tensor_parallel import (
    TensorParallelTrainer,
    conv1d_to_linear,
    interleaved_qkv_rows,
)
from ddlsim.plans.tp_plans import check_tensor_parallel
from tests.executor.harness import Losses, assert_matches_reference, run_ranks, run_trainer

# ViT-tiny (DeiT) has 3 heads, which two ranks cannot share: a 4-head, 2-layer variant.
VIT_4_HEADS = dataclasses.replace(
    ZOO["vit-tiny"],
    name="vit-tiny-4-heads",
    config={
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "num_labels": 10,
    },
).with_inputs(batch_size=4, image_size=32)
SPECS: dict[str, ModelSpec] = {
    name: ZOO[name].with_inputs(batch_size=4, seq_len=16)
    for name in ("gpt2-tiny", "bert-tiny", "llama-tiny", "mistral-tiny", "t5-tiny")
} | {"vit-4-heads": VIT_4_HEADS}
# A few module paths per model and the style each must get (the first block stands for all).
EXPECTED_STYLES: dict[str, dict[str, str]] = {
    "gpt2-tiny": {
        "transformer.wte": "vocab_embedding",
        "transformer.h.1.attn.c_attn": "colwise",
        "transformer.h.1.attn.c_proj": "rowwise",
        "transformer.h.1.mlp.c_fc": "colwise",
        "transformer.h.1.mlp.c_proj": "rowwise",
        "lm_head": "vocab_head",
    },
    "bert-tiny": {
        "bert.embeddings.word_embeddings": "vocab_embedding",
        "bert.encoder.layer.1.attention.self.value": "colwise",
        "bert.encoder.layer.1.attention.output.dense": "rowwise",
        "bert.encoder.layer.1.intermediate.dense": "colwise",
        "bert.encoder.layer.1.output.dense": "rowwise",
        "cls.predictions.decoder": "vocab_head",
    },
    "llama-tiny": {
        "model.embed_tokens": "vocab_embedding",
        "model.layers.1.self_attn.k_proj": "colwise",
        "model.layers.1.self_attn.o_proj": "rowwise",
        "model.layers.1.mlp.gate_proj": "colwise",
        "model.layers.1.mlp.down_proj": "rowwise",
        "lm_head": "vocab_head",
    },
    "mistral-tiny": {
        "model.embed_tokens": "vocab_embedding",
        "model.layers.1.self_attn.k_proj": "colwise",
        "model.layers.1.self_attn.o_proj": "rowwise",
        "model.layers.1.mlp.up_proj": "colwise",
        "model.layers.1.mlp.down_proj": "rowwise",
        "lm_head": "vocab_head",
    },
    "t5-tiny": {
        "encoder.embed_tokens": "vocab_embedding",
        "decoder.block.0.layer.0.SelfAttention.relative_attention_bias": "head_embedding",
        "decoder.block.1.layer.1.EncDecAttention.q": "colwise",
        "decoder.block.1.layer.1.EncDecAttention.o": "rowwise",
        "encoder.block.1.layer.1.DenseReluDense.wi": "colwise",
        "encoder.block.1.layer.1.DenseReluDense.wo": "rowwise",
        "lm_head": "vocab_head",
    },
    "vit-4-heads": {
        "vit.layers.1.attention.q_proj": "colwise",
        "vit.layers.1.attention.o_proj": "rowwise",
        "vit.layers.1.mlp.fc1": "colwise",
        "vit.layers.1.mlp.fc2": "rowwise",
    },
}


def _build(ctx: RankContext) -> TensorParallelTrainer:
    # As executor.plan.build_trainer does: check, build the whole model, then split it.
    check_tensor_parallel(ctx.spec, ctx.tp)
    return TensorParallelTrainer(ctx, ctx.build_model())


def _run(spec: ModelSpec, world_size: int, parallel: dict[str, Any]) -> list[Losses]:
    return run_trainer(world_size, _build, spec, Strategy.from_dict({"parallel": parallel}))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_tp2_losses_match_single_process(name: str) -> None:
    # Measured: at most 2e-7 relative on every step (row-parallel sums add two partial
    # products in another order than one matmul), far inside the 1e-5 bound.
    spec = SPECS[name]
    results = _run(spec, 2, {"tp": 2})
    assert_matches_reference(results, spec)
    applied = results[0].applied
    assert (applied["plan"], applied["tp"], applied["dp"]) == ("tp", 2, 1)
    assert applied["collectives"][0] == "all_reduce:tp"
    assert applied["parallelized"] == sorted(applied["styles"])
    for path, style in EXPECTED_STYLES[name].items():
        assert applied["styles"].get(path) == style, path


def test_dp2_tp2_with_micro_batches_matches_single_process() -> None:
    spec = SPECS["gpt2-tiny"]
    results = _run(spec, 4, {"dp": 2, "tp": 2, "micro_batches": 2})
    assert_matches_reference(results[:1], spec)
    assert results[0].applied["collectives"] == ["all_reduce:tp", "all_gather:tp", "all_reduce:dp"]
    assert results[0].applied["dp"] == 2


def test_fused_qkv_rows_interleave_by_rank() -> None:
    # [q | k | v], 4 rows each, 2 ranks: rank 0 holds q0 q1 k0 k1 v0 v1 (rows 0-1, 4-5, 8-9).
    order = interleaved_qkv_rows(12, 2).tolist()
    assert order == [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]


def test_conv1d_to_linear_keeps_the_function() -> None:
    spec = SPECS["gpt2-tiny"]
    model = build_model(spec)
    disable_dropout(model)
    converted = copy.deepcopy(model)
    conv1d_to_linear(converted, tp=1)
    assert isinstance(converted.get_submodule("transformer.h.0.attn.c_attn"), torch.nn.Linear)
    batch = make_batch(spec, model)
    torch.testing.assert_close(local_loss(converted, batch), local_loss(model, batch))


@pytest.mark.parametrize("name", ["mlp", "resnet-18"])
def test_model_without_plan_is_refused(name: str) -> None:
    with pytest.raises(InvalidStrategyError, match="has no tensor-parallel plan") as info:
        check_tensor_parallel(ZOO[name], 2)
    assert "tp(2)" in str(info.value)
    assert "bert, gpt2, llama, mistral, t5, vit" in str(info.value)


@pytest.mark.parametrize(
    ("name", "tp", "message"),
    [
        ("vit-tiny", 2, "config.num_attention_heads(3) of vit-tiny is not divisible by tp(2)"),
        ("llama-tiny", 3, "config.num_attention_heads(4) of llama-tiny is not divisible by tp(3)"),
        ("gpt2-tiny", 3, "config.n_head(4) of gpt2-tiny is not divisible by tp(3)"),
    ],
)
def test_indivisible_heads_are_refused(name: str, tp: int, message: str) -> None:
    with pytest.raises(InvalidStrategyError, match=re.escape(message)):
        check_tensor_parallel(ZOO[name], tp)


def test_indivisible_vocabulary_is_refused() -> None:
    spec = dataclasses.replace(
        ZOO["gpt2-tiny"], config={**ZOO["gpt2-tiny"].config, "vocab_size": 8190}
    )
    with pytest.raises(InvalidStrategyError, match=r"config\.vocab_size\(8190\)"):
        check_tensor_parallel(spec, 4)


@pytest.mark.parametrize(("name", "tp"), [("gpt2-tiny", 4), ("llama-tiny", 2), ("t5-tiny", 4)])
def test_divisible_models_are_accepted(name: str, tp: int) -> None:
    check_tensor_parallel(ZOO[name], tp)


def _gradient_placements(ctx: RankContext) -> list[tuple[str, str, str]]:
    """Each split parameter's placements beside its gradient's, after one step."""
    from torch.distributed.tensor import DTensor

    trainer = _build(ctx)
    trainer.step()
    return [
        (name, str(param.placements), str(param.grad.placements))
        for name, param in trainer.model.named_parameters()
        if isinstance(param, DTensor) and isinstance(param.grad, DTensor)
    ]


@pytest.mark.parametrize("name", ["llama-tiny", "mistral-tiny"])
def test_split_parameters_keep_split_gradients(name: str) -> None:
    # Without resharding as they land, the vocabulary-split embedding's gradient came out
    # Replicate (the whole table) in the first plan a process built: twice its shard's bytes
    # in the data-parallel all-reduce and the optimizer.
    spec = SPECS[name]
    for placements in run_ranks(
        2, _gradient_placements, spec, Strategy.from_dict({"parallel": {"tp": 2}})
    ):
        assert placements, "no split parameter got a gradient"
        mismatched = [(n, p, g) for n, p, g in placements if p != g]
        assert not mismatched, mismatched
