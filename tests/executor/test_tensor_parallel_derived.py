"""Tensor parallelism from a plan derived from module structure (no family entry): two gloo ranks
train exactly like one process on the global batch."""

from typing import Any

import pytest

from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.executor.context import RankContext
from ddlsim.executor.tensor_parallel import TensorParallelTrainer, interleaved_rows
from ddlsim.plans.tp_plans import PLANS, check_sequence_parallel, check_tensor_parallel
from tests.executor.harness import Losses, assert_matches_reference, run_trainer
from tests.tiny_models import transformers_spec

_DIMS = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 32,
}


def _spec(cls: str, **config: Any) -> ModelSpec:
    return transformers_spec(cls, _DIMS, batch_size=4, seq_len=16, **config)


SPECS = {
    # Grouped-query attention with q/k/v biases, SwiGLU MLP.
    "qwen2": _spec("Qwen2ForCausalLM"),
    # Squared-ReLU MLP (up_proj, down_proj, no gate), LayerNorm1P, partial rotary; its loss
    # views the logits by the model's own vocab_size.
    "nemotron": _spec("NemotronForCausalLM", head_dim=16),
    # Fused [q | k | v] and [gate | up] projections, reordered before the split.
    "phi3": _spec("Phi3ForCausalLM", pad_token_id=0),
    # q_norm / k_norm of one head, shared by all: whole on each rank, gradients summed.
    "qwen3": _spec("Qwen3ForCausalLM", head_dim=16),
}
EXPECTED_STYLES = {
    "qwen2": {
        "model.embed_tokens": "vocab_embedding",
        "model.layers.1.self_attn.k_proj": "colwise",
        "model.layers.1.self_attn.o_proj": "rowwise",
        "model.layers.1.mlp.gate_proj": "colwise",
        "model.layers.1.mlp.down_proj": "rowwise",
        "lm_head": "vocab_head",
    },
    "nemotron": {
        "model.layers.1.self_attn.q_proj": "colwise",
        "model.layers.1.mlp.up_proj": "colwise",
        "model.layers.1.mlp.down_proj": "rowwise",
    },
    "phi3": {
        "model.layers.1.self_attn.qkv_proj": "colwise",
        "model.layers.1.self_attn.o_proj": "rowwise",
        "model.layers.1.mlp.gate_up_proj": "colwise",
        "model.layers.1.mlp.down_proj": "rowwise",
    },
    "qwen3": {
        "model.layers.1.self_attn.q_proj": "colwise",
        "model.layers.1.self_attn.o_proj": "rowwise",
    },
}


def _build(ctx: RankContext) -> TensorParallelTrainer:
    check_tensor_parallel(ctx.spec, ctx.tp)
    if ctx.strategy.parallel.sequence_parallel:
        check_sequence_parallel(ctx.spec, ctx.tp)
    return TensorParallelTrainer(ctx, ctx.build_model())


def _run(spec: ModelSpec, parallel: dict[str, Any]) -> list[Losses]:
    return run_trainer(2, _build, spec, Strategy.from_dict({"parallel": parallel}))


def test_the_families_have_no_entry() -> None:
    assert not set(SPECS) & set(PLANS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_tp2_losses_match_single_process(name: str) -> None:
    spec = SPECS[name]
    results = _run(spec, {"tp": 2})
    assert_matches_reference(results, spec)
    applied = results[0].applied
    assert (applied["family"], applied["derived"], applied["tp"]) == (name, True, 2)
    for path, style in EXPECTED_STYLES[name].items():
        assert applied["styles"].get(path) == style, path


def test_sequence_parallel_on_a_derived_plan_matches_single_process() -> None:
    spec = SPECS["qwen2"]
    results = _run(spec, {"tp": 2, "sequence_parallel": True})
    assert_matches_reference(results, spec)
    assert results[0].applied["styles"]["model.layers.0.mlp.down_proj"] == "rowwise_sequence"
    assert "reduce_scatter:tp" in results[0].applied["collectives"]


def test_unequal_parts_interleave_by_rank() -> None:
    # [q | k | v] of 4, 2 and 2 rows over 2 ranks: rank 0 holds q0 q1 k0 v0.
    assert interleaved_rows((4, 2, 2), 2).tolist() == [0, 1, 4, 6, 2, 3, 5, 7]
