"""The zoo's families chosen for structure the classic ones lack: grouped- and multi-query
attention (Mistral, Falcon), attention and MLP in parallel (Falcon, GPT-J), one layer's weights
shared by every layer (ALBERT), factorised embeddings (ALBERT, ELECTRA), a post-norm
encoder-decoder (BART), LayerScale (DINOv2), depthwise convolutions with squeeze-and-excitation
(EfficientNet); each at a test size and a published one.
"""

from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.zoo.entry import zoo_entry


def _factorised_tiny(*, num_hidden_layers: int) -> dict[str, object]:
    """ALBERT's and ELECTRA's test scale (their config keys are the same): embeddings 64 wide,
    narrower than the hidden width of 128."""
    return {
        "num_hidden_layers": num_hidden_layers,
        "hidden_size": 128,
        "embedding_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 512,
        "vocab_size": 8192,
    }


STRUCTURAL_MODELS: list[ModelSpec] = [
    # Mistral 7B (Jiang et al. 2023): a LLaMA-style decoder with grouped-query attention
    # (8 key-value heads for 32 query heads) and sliding-window attention.
    zoo_entry(
        "mistral-tiny",
        "mistral",
        "MistralForCausalLM",
        {
            "num_hidden_layers": 2,
            "hidden_size": 128,
            "intermediate_size": 352,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 8192,
            "max_position_embeddings": 256,
            "sliding_window": 32,
        },
        batch_size=8,
        seq_len=64,
    ),
    zoo_entry(
        "mistral-7b",
        "mistral",
        "MistralForCausalLM",
        {"sliding_window": 4096},
        batch_size=1,
        seq_len=512,
    ),
    # Falcon 7B (Almazrouei et al. 2023): attention and MLP in parallel off one LayerNorm,
    # multi-query attention (one key-value head), a fused query-key-value projection.
    zoo_entry(
        "falcon-tiny",
        "falcon",
        "FalconForCausalLM",
        {
            "num_hidden_layers": 2,
            "hidden_size": 128,
            "num_attention_heads": 4,
            "vocab_size": 8192,
            "multi_query": True,
            "parallel_attn": True,
        },
        batch_size=8,
        seq_len=64,
    ),
    zoo_entry(
        "falcon-7b",
        "falcon",
        "FalconForCausalLM",
        {
            "hidden_size": 4544,
            "num_hidden_layers": 32,
            "num_attention_heads": 71,
            "vocab_size": 65024,
            "multi_query": True,
            "parallel_attn": True,
            "bias": False,
        },
        batch_size=1,
        seq_len=512,
    ),
    # GPT-J 6B (Wang and Komatsuzaki 2021): parallel attention and MLP, rotary embeddings on
    # part of each head.
    zoo_entry(
        "gptj-tiny",
        "gptj",
        "GPTJForCausalLM",
        {
            "n_layer": 2,
            "n_embd": 128,
            "n_head": 4,
            "rotary_dim": 16,
            "vocab_size": 8192,
            "n_positions": 256,
            "bos_token_id": 8191,
            "eos_token_id": 8191,
        },
        batch_size=8,
        seq_len=64,
    ),
    zoo_entry("gptj-6b", "gptj", "GPTJForCausalLM", {}, batch_size=1, seq_len=512),
    # ALBERT (Lan et al. 2020): one encoder layer's weights shared by every layer, and a
    # factorised embedding (128 wide, projected to the hidden width).
    zoo_entry(
        "albert-tiny",
        "albert",
        "AlbertForMaskedLM",
        _factorised_tiny(num_hidden_layers=4),
        batch_size=8,
        seq_len=64,
    ),
    zoo_entry(
        "albert-base",
        "albert",
        "AlbertForMaskedLM",
        {
            "hidden_size": 768,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "vocab_size": 30000,
        },
        batch_size=8,
        seq_len=128,
    ),
    # ELECTRA (Clark et al. 2020): a BERT-like encoder with embeddings narrower than the
    # hidden width; the masked-LM head is its generator's.
    zoo_entry(
        "electra-tiny",
        "electra",
        "ElectraForMaskedLM",
        _factorised_tiny(num_hidden_layers=2),
        batch_size=8,
        seq_len=64,
    ),
    zoo_entry(
        "electra-small",
        "electra",
        "ElectraForMaskedLM",
        {
            "hidden_size": 256,
            "embedding_size": 128,
            "num_attention_heads": 4,
            "intermediate_size": 1024,
        },
        batch_size=8,
        seq_len=128,
    ),
    # BART (Lewis et al. 2020): a post-norm encoder-decoder with learned positions.
    zoo_entry(
        "bart-tiny",
        "bart",
        "BartForConditionalGeneration",
        {
            "encoder_layers": 2,
            "decoder_layers": 2,
            "d_model": 128,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 512,
            "decoder_ffn_dim": 512,
            "vocab_size": 8192,
            "max_position_embeddings": 256,
        },
        batch_size=8,
        seq_len=64,
    ),
    zoo_entry(
        "bart-base",
        "bart",
        "BartForConditionalGeneration",
        {
            "encoder_layers": 6,
            "decoder_layers": 6,
            "d_model": 768,
            "encoder_attention_heads": 12,
            "decoder_attention_heads": 12,
            "encoder_ffn_dim": 3072,
            "decoder_ffn_dim": 3072,
            "vocab_size": 50265,
        },
        batch_size=8,
        seq_len=128,
    ),
    # DINOv2 (Oquab et al. 2024): a ViT with LayerScale, trained self-supervised; ViT-S/14.
    zoo_entry(
        "dinov2-tiny",
        "dinov2",
        "Dinov2ForImageClassification",
        {
            "num_hidden_layers": 2,
            "hidden_size": 128,
            "num_attention_heads": 4,
            "image_size": 64,
            "patch_size": 8,
            "num_labels": 100,
        },
        batch_size=8,
        image_size=64,
    ),
    zoo_entry(
        "dinov2-small",
        "dinov2",
        "Dinov2ForImageClassification",
        {"hidden_size": 384, "num_attention_heads": 6, "image_size": 224, "num_labels": 1000},
        batch_size=8,
        image_size=224,
    ),
    # EfficientNet (Tan and Le 2019): depthwise-separable inverted bottlenecks with
    # squeeze-and-excitation, scaled by width and depth coefficients; B0 at 224 pixels.
    zoo_entry(
        "efficientnet-tiny",
        "efficientnet",
        "EfficientNetForImageClassification",
        {
            "width_coefficient": 0.5,
            "depth_coefficient": 0.5,
            "hidden_dim": 640,
            "image_size": 64,
            "num_labels": 100,
        },
        batch_size=8,
        image_size=64,
    ),
    zoo_entry(
        "efficientnet-b0",
        "efficientnet",
        "EfficientNetForImageClassification",
        {
            "width_coefficient": 1.0,
            "depth_coefficient": 1.0,
            "hidden_dim": 1280,
            "image_size": 224,
            "num_labels": 1000,
        },
        batch_size=8,
        image_size=224,
    ),
]
