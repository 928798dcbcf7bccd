"""Tensor-parallel plans derived from module structure: what each decoder's blocks split into,
and the refusals, each naming the module or config key and why."""

import re
from typing import Any

import pytest

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.zoo import ZOO
from ddlsim.plans.tp_plans import (
    PLANS,
    check_sequence_parallel,
    check_tensor_parallel,
    matches,
    tp_family,
    tp_plan,
)
from tests.tiny_models import transformers_spec

_DIMS = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}


def _spec(cls: str, **config: Any) -> ModelSpec:
    return transformers_spec(cls, _DIMS, batch_size=2, seq_len=16, **config)


QWEN2 = _spec("Qwen2ForCausalLM", intermediate_size=96, num_key_value_heads=2)
NEMOTRON = _spec("NemotronForCausalLM", intermediate_size=96, num_key_value_heads=2, head_dim=16)


def _styles(spec: ModelSpec, paths: list[str]) -> dict[str, str | None]:
    plan = tp_plan(spec)
    return {
        path: next((s for p, s in plan.modules.items() if matches(p, path)), None)
        for path in paths
    }


def test_qwen2_splits_like_llama() -> None:
    plan = tp_plan(QWEN2)
    assert plan.derived and plan.family == "qwen2" and "qwen2" not in PLANS
    styles = _styles(
        QWEN2,
        [
            "model.embed_tokens",
            "model.layers.1.self_attn.k_proj",
            "model.layers.1.self_attn.o_proj",
            "model.layers.1.mlp.gate_proj",
            "model.layers.1.mlp.up_proj",
            "model.layers.1.mlp.down_proj",
            "model.layers.1.input_layernorm",
            "lm_head",
        ],
    )
    assert list(styles.values()) == [
        "vocab_embedding",
        "colwise",
        "rowwise",
        "colwise",
        "colwise",
        "rowwise",
        None,
        "vocab_head",
    ]
    assert matches(plan.blocks, "model.layers.1") and matches(
        plan.attention, "model.layers.1.self_attn"
    )
    assert plan.local_config == ("num_attention_heads", "num_key_value_heads")
    assert plan.sequence is not None and matches(plan.sequence.final_norm, "model.norm")
    assert matches(plan.sequence.norms, "model.layers.1.post_attention_layernorm")
    assert tp_family(QWEN2) == "qwen2"


def test_a_layer_of_experts_stays_whole_beside_split_attention() -> None:
    """Expert tensor parallelism 1 (Megatron-Core's default): the router and the experts' 3-D
    tensors are on every tensor-parallel rank; attention and the vocabulary split as usual."""
    spec = _spec("MixtralForCausalLM", intermediate_size=96, num_key_value_heads=2,
                 num_local_experts=2)  # fmt: skip
    check_tensor_parallel(spec, 2)
    styles = _styles(
        spec,
        [
            "model.layers.1.self_attn.q_proj",
            "model.layers.1.self_attn.o_proj",
            "model.layers.1.mlp.gate",
            "model.layers.1.mlp.experts",
            "lm_head",
        ],
    )
    assert list(styles.values()) == ["colwise", "rowwise", None, None, "vocab_head"]


def test_nemotron_squared_relu_mlp_has_no_gate() -> None:
    styles = _styles(
        NEMOTRON,
        [
            "model.layers.0.mlp.up_proj",
            "model.layers.0.mlp.down_proj",
            "model.layers.0.mlp.act_fn",
        ],
    )
    assert list(styles.values()) == ["colwise", "rowwise", None]
    check_tensor_parallel(NEMOTRON, 2)
    check_sequence_parallel(NEMOTRON, 2)


@pytest.mark.parametrize(
    ("spec", "fused"),
    [
        # [q | k | v] of 4 query and 2 key/value heads of 16, [gate | up] of 96 each.
        (
            _spec("Phi3ForCausalLM", intermediate_size=96, num_key_value_heads=2, pad_token_id=0),
            {"qkv_proj": (64, 32, 32), "gate_up_proj": (96, 96)},
        ),
        # Falcon's grouped layout [q q k v] per key/value group: a plain column split.
        (
            _spec("FalconForCausalLM", num_kv_heads=2, new_decoder_architecture=True),
            {},
        ),
    ],
)
def test_fused_projections_of_known_layout(
    spec: ModelSpec, fused: dict[str, tuple[int, ...]]
) -> None:
    plan = tp_plan(spec)
    got = {pattern.rpartition("\\.")[2]: parts for pattern, parts in plan.fused.items()}
    assert got == fused
    check_tensor_parallel(spec, 2)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            _spec("CodeGenForCausalLM", n_embd=64, n_head=4, n_layer=2, rotary_dim=8),
            r"transformer\.h\.0\.attn\.qkv_proj \(CodeGenAttention\.qkv_proj, 192 outputs\) is a "
            r"fused projection whose row layout .* is not known",
        ),
        (
            _spec("FalconForCausalLM", multi_query=True),
            r"transformer\.h\.0\.self_attention\.query_key_value .* cannot be split: it is "
            r"multi-query",
        ),
        (
            _spec("Olmo2ForCausalLM", intermediate_size=96),
            r"model\.layers\.0\.self_attn\.q_norm\.weight \(shape \[64\]\) normalizes across all "
            "heads",
        ),
        (
            _spec(
                "StableLmForCausalLM",
                intermediate_size=96,
                num_key_value_heads=2,
                qk_layernorm=True,
            ),
            r"model\.layers\.0\.self_attn\.q_layernorm\.norms\.0\.weight .* holds parameters per "
            "head",
        ),
    ],
)
def test_what_cannot_be_split_is_refused_by_module(spec: ModelSpec, message: str) -> None:
    with pytest.raises(InvalidStrategyError, match=message) as info:
        check_tensor_parallel(spec, 2)
    assert f"{spec.label} ({spec.cls}) has no tensor-parallel plan" in str(info.value)
    assert tp_family(spec) is None


@pytest.mark.parametrize(
    ("spec", "tp", "message"),
    [
        (QWEN2, 4, "config.num_key_value_heads(2) of Qwen2ForCausalLM is not divisible by tp(4)"),
        (QWEN2, 3, "config.num_attention_heads(4) of Qwen2ForCausalLM is not divisible by tp(3)"),
        (
            _spec("Qwen2ForCausalLM", intermediate_size=90, num_key_value_heads=4),
            4,
            "model.layers.0.mlp.gate_proj.out_features(90) of Qwen2ForCausalLM is not divisible "
            "by tp(4): the width of MLP model.layers.0.mlp",
        ),
        (
            _spec("Qwen2ForCausalLM", intermediate_size=96, num_key_value_heads=4, vocab_size=130),
            4,
            "config.vocab_size(130) of Qwen2ForCausalLM is not divisible by tp(4)",
        ),
    ],
)
def test_sizes_tp_does_not_divide_are_refused(spec: ModelSpec, tp: int, message: str) -> None:
    with pytest.raises(InvalidStrategyError, match=re.escape(message)):
        check_tensor_parallel(spec, tp)


def test_sequence_parallel_without_block_modules_is_refused_by_name() -> None:
    opt = _spec("OPTForCausalLM", ffn_dim=96, word_embed_proj_dim=64)
    check_tensor_parallel(opt, 2)
    with pytest.raises(
        InvalidStrategyError, match=r"no plan for the opt family .*model\.decoder\.layers\.0"
    ):
        check_sequence_parallel(opt, 2)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny", "t5-tiny"])
def test_families_keep_their_own_plans(name: str) -> None:
    plan = tp_plan(ZOO[name])
    assert plan is PLANS[plan.family] and not plan.derived
