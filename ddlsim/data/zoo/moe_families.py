"""Mixtures of experts: Mixtral (Jiang et al. 2024: eight experts, two a token), Qwen3-MoE
(the Qwen3 report, 2025: 128 experts, eight a token, normalised top-k), GPT-OSS (OpenAI's
model card, 2025: experts stored transposed with biases, a clamped SwiGLU) and DeepSeek-V3
(DeepSeek-AI 2024: 256 routed experts and a shared one, grouped routing, dense first layers,
multi-head latent attention). Each at a tiny size for runs and tests, and at a published size
(the configs' defaults) for pricing."""

from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.zoo.entry import zoo_entry

_TINY = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 256,
}

MOE_MODELS: list[ModelSpec] = [
    zoo_entry(
        "mixtral-tiny",
        "mixtral",
        "MixtralForCausalLM",
        {**_TINY, "intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2},
        batch_size=8,
        seq_len=32,
    ),
    # Mixtral 8x7B: 46.7B parameters, 12.9B active.
    zoo_entry("mixtral-8x7b", "mixtral", "MixtralForCausalLM", {}, batch_size=1, seq_len=512),
    zoo_entry(
        "qwen3-moe-tiny",
        "qwen3_moe",
        "Qwen3MoeForCausalLM",
        {
            **_TINY,
            "intermediate_size": 128,
            "moe_intermediate_size": 64,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
        },
        batch_size=8,
        seq_len=32,
    ),
    # Qwen3-30B-A3B: 30.5B parameters, 3.3B active.
    zoo_entry(
        "qwen3-30b-a3b",
        "qwen3_moe",
        "Qwen3MoeForCausalLM",
        {"num_hidden_layers": 48, "head_dim": 128},
        batch_size=1,
        seq_len=512,
    ),
    zoo_entry(
        "gpt-oss-tiny",
        "gpt_oss",
        "GptOssForCausalLM",
        {
            **_TINY,
            "head_dim": 16,
            "intermediate_size": 64,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 16,
        },
        batch_size=8,
        seq_len=32,
    ),
    # gpt-oss-120b: 116.8B parameters, 5.1B active.
    zoo_entry("gpt-oss-120b", "gpt_oss", "GptOssForCausalLM", {}, batch_size=1, seq_len=512),
    zoo_entry(
        "deepseek-v3-tiny",
        "deepseek_v3",
        "DeepseekV3ForCausalLM",
        {
            **_TINY,
            "num_hidden_layers": 3,
            "num_key_value_heads": 4,
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "n_group": 2,
            "topk_group": 1,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
        },
        batch_size=8,
        seq_len=32,
    ),
    # DeepSeek-V3: 671B parameters (without its multi-token prediction module), 37B active.
    zoo_entry(
        "deepseek-v3", "deepseek_v3", "DeepseekV3ForCausalLM", {}, batch_size=1, seq_len=512
    ),
]
