"""The model zoo: real architectures at named sizes, with the inputs they train on.

Transformers entries mirror the configs their authors published (sizes from the papers and
model cards); they are built with random weights, never downloaded. Two plain-torch reference
models serve fast tests.
"""

import json
from pathlib import Path

from ddlsim.data.errors import UnknownModelError
from ddlsim.data.specs._serde import load_json_or_file
from ddlsim.data.specs.model import InputSpec, ModelSource, ModelSpec


def _entry(
    name: str, family: str, cls: str, config: dict[str, object], **inputs: int
) -> ModelSpec:
    source: ModelSource = "reference" if family == "reference" else "transformers"
    return ModelSpec(
        source=source,
        cls=cls,
        config=config,
        inputs=InputSpec(**inputs),
        name=name,
        family=family,
    )


_GPT2_VOCAB = 50257
_LLAMA_VOCAB = 32000
_T5_VOCAB = 32128
_BERT_VOCAB = 30522
_OPT_VOCAB = 50272

ZOO: dict[str, ModelSpec] = {
    spec.label: spec
    for spec in [
        _entry("mlp", "reference", "MLP", {}, batch_size=64),
        _entry("vgg-mini", "reference", "VGG", {}, batch_size=16, image_size=32),
        # GPT-2: Radford et al. 2019 sizes; "tiny" keeps the architecture at test scale.
        _entry(
            "gpt2-tiny",
            "gpt2",
            "GPT2LMHeadModel",
            {
                "n_layer": 2,
                "n_embd": 128,
                "n_head": 4,
                "vocab_size": 8192,
                "n_positions": 256,
                "bos_token_id": 8191,
                "eos_token_id": 8191,
            },
            batch_size=4,
            seq_len=64,
        ),
        _entry("gpt2-small", "gpt2", "GPT2LMHeadModel", {}, batch_size=8, seq_len=128),
        _entry(
            "gpt2-medium",
            "gpt2",
            "GPT2LMHeadModel",
            {"n_layer": 24, "n_embd": 1024, "n_head": 16},
            batch_size=4,
            seq_len=128,
        ),
        # BERT: the compact sizes of Turc et al. 2019 and BERT-base.
        _entry(
            "bert-tiny",
            "bert",
            "BertForMaskedLM",
            {
                "num_hidden_layers": 2,
                "hidden_size": 128,
                "num_attention_heads": 2,
                "intermediate_size": 512,
            },
            batch_size=8,
            seq_len=128,
        ),
        _entry(
            "bert-small",
            "bert",
            "BertForMaskedLM",
            {
                "num_hidden_layers": 4,
                "hidden_size": 512,
                "num_attention_heads": 8,
                "intermediate_size": 2048,
            },
            batch_size=8,
            seq_len=128,
        ),
        _entry("bert-base", "bert", "BertForMaskedLM", {}, batch_size=8, seq_len=128),
        # ViT: DeiT-tiny width and ViT-B/16.
        _entry(
            "vit-tiny",
            "vit",
            "ViTForImageClassification",
            {
                "hidden_size": 192,
                "num_hidden_layers": 12,
                "num_attention_heads": 3,
                "intermediate_size": 768,
                "num_labels": 1000,
            },
            batch_size=8,
            image_size=224,
        ),
        _entry(
            "vit-base",
            "vit",
            "ViTForImageClassification",
            {"num_labels": 1000},
            batch_size=8,
            image_size=224,
        ),
        # ResNet: He et al. 2016, basic blocks (18) and bottlenecks (50).
        _entry(
            "resnet-18",
            "resnet",
            "ResNetForImageClassification",
            {
                "depths": [2, 2, 2, 2],
                "hidden_sizes": [64, 128, 256, 512],
                "layer_type": "basic",
                "num_labels": 1000,
            },
            batch_size=8,
            image_size=224,
        ),
        _entry(
            "resnet-50",
            "resnet",
            "ResNetForImageClassification",
            {"num_labels": 1000},
            batch_size=8,
            image_size=224,
        ),
        # LLaMA: a test-scale model and the 160M size of the LLaMA-style draft models.
        _entry(
            "llama-tiny",
            "llama",
            "LlamaForCausalLM",
            {
                "hidden_size": 256,
                "intermediate_size": 688,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": _LLAMA_VOCAB,
                "max_position_embeddings": 512,
            },
            batch_size=4,
            seq_len=128,
        ),
        _entry(
            "llama-160m",
            "llama",
            "LlamaForCausalLM",
            {
                "hidden_size": 768,
                "intermediate_size": 3072,
                "num_hidden_layers": 12,
                "num_attention_heads": 12,
                "num_key_value_heads": 12,
                "vocab_size": _LLAMA_VOCAB,
                "max_position_embeddings": 2048,
            },
            batch_size=4,
            seq_len=128,
        ),
        # T5: an encoder-decoder, Raffel et al. 2020 (t5-small) and a test-scale one.
        _entry(
            "t5-tiny",
            "t5",
            "T5ForConditionalGeneration",
            {
                "d_model": 128,
                "d_ff": 512,
                "d_kv": 32,
                "num_layers": 2,
                "num_heads": 4,
                "vocab_size": _T5_VOCAB,
                "decoder_start_token_id": 0,
                "pad_token_id": 0,
            },
            batch_size=4,
            seq_len=64,
        ),
        _entry(
            "t5-small",
            "t5",
            "T5ForConditionalGeneration",
            {
                "d_model": 512,
                "d_ff": 2048,
                "d_kv": 64,
                "num_layers": 6,
                "num_heads": 8,
                "vocab_size": _T5_VOCAB,
                "decoder_start_token_id": 0,
                "pad_token_id": 0,
            },
            batch_size=8,
            seq_len=128,
        ),
        # OPT: Zhang et al. 2022 (opt-125m) and a test-scale one; ReLU MLPs, learned positions.
        _entry(
            "opt-tiny",
            "opt",
            "OPTForCausalLM",
            {
                "hidden_size": 128,
                "word_embed_proj_dim": 128,
                "ffn_dim": 512,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 8192,
                "max_position_embeddings": 256,
            },
            batch_size=4,
            seq_len=64,
        ),
        _entry(
            "opt-125m",
            "opt",
            "OPTForCausalLM",
            {
                "hidden_size": 768,
                "word_embed_proj_dim": 768,
                "ffn_dim": 3072,
                "num_hidden_layers": 12,
                "num_attention_heads": 12,
                "vocab_size": _OPT_VOCAB,
                "max_position_embeddings": 2048,
            },
            batch_size=4,
            seq_len=128,
        ),
        # ConvNeXt: Liu et al. 2022 (ConvNeXt-T) and the atto size of ConvNeXt V2 (Woo et al.
        # 2023) on the same block: depthwise 7x7 convolutions, LayerNorm, inverted bottlenecks.
        _entry(
            "convnext-atto",
            "convnext",
            "ConvNextForImageClassification",
            {"depths": [2, 2, 6, 2], "hidden_sizes": [40, 80, 160, 320], "num_labels": 1000},
            batch_size=8,
            image_size=224,
        ),
        _entry(
            "convnext-tiny",
            "convnext",
            "ConvNextForImageClassification",
            {"depths": [3, 3, 9, 3], "hidden_sizes": [96, 192, 384, 768], "num_labels": 1000},
            batch_size=8,
            image_size=224,
        ),
        # Mistral 7B (Jiang et al. 2023): a LLaMA-style decoder with grouped-query attention
        # (8 key-value heads for 32 query heads) and sliding-window attention.
        _entry(
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
        _entry(
            "mistral-7b",
            "mistral",
            "MistralForCausalLM",
            {"sliding_window": 4096},
            batch_size=1,
            seq_len=512,
        ),
        # Falcon 7B (Almazrouei et al. 2023): attention and MLP in parallel off one LayerNorm,
        # multi-query attention (one key-value head), a fused query-key-value projection.
        _entry(
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
        _entry(
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
        _entry(
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
        _entry("gptj-6b", "gptj", "GPTJForCausalLM", {}, batch_size=1, seq_len=512),
        # ALBERT (Lan et al. 2020): one encoder layer's weights shared by every layer, and a
        # factorised embedding (128 wide, projected to the hidden width).
        _entry(
            "albert-tiny",
            "albert",
            "AlbertForMaskedLM",
            {
                "num_hidden_layers": 4,
                "hidden_size": 128,
                "embedding_size": 64,
                "num_attention_heads": 4,
                "intermediate_size": 512,
                "vocab_size": 8192,
            },
            batch_size=8,
            seq_len=64,
        ),
        _entry(
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
        _entry(
            "electra-tiny",
            "electra",
            "ElectraForMaskedLM",
            {
                "num_hidden_layers": 2,
                "hidden_size": 128,
                "embedding_size": 64,
                "num_attention_heads": 4,
                "intermediate_size": 512,
                "vocab_size": 8192,
            },
            batch_size=8,
            seq_len=64,
        ),
        _entry(
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
        _entry(
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
        _entry(
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
        _entry(
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
        _entry(
            "dinov2-small",
            "dinov2",
            "Dinov2ForImageClassification",
            {"hidden_size": 384, "num_attention_heads": 6, "image_size": 224, "num_labels": 1000},
            batch_size=8,
            image_size=224,
        ),
        # EfficientNet (Tan and Le 2019): depthwise-separable inverted bottlenecks with
        # squeeze-and-excitation, scaled by width and depth coefficients; B0 at 224 pixels.
        _entry(
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
        _entry(
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
}


def zoo_names() -> list[str]:
    """Zoo names in listing order."""
    return list(ZOO)


def resolve_model(text: str) -> ModelSpec:
    """A zoo name, a spec file (JSON or YAML) or an inline JSON spec.

    Raises:
        UnknownModelError: when ``text`` is none of these, naming the zoo's models.
        InvalidModelSpecError: when the spec itself is malformed.
    """
    if text in ZOO:
        return ZOO[text]
    if text.strip().startswith("{") or Path(text).is_file():
        return ModelSpec.from_dict(load_json_or_file(text, "model spec", UnknownModelError))
    raise UnknownModelError(
        f"model {text!r} is not in the zoo, not a spec file and not inline JSON; "
        f"zoo: {', '.join(ZOO)}"
    )


def spec_json(spec: ModelSpec) -> str:
    """The spec as canonical JSON (sorted keys): what the graph hash covers."""
    return json.dumps(spec.to_dict(), sort_keys=True)
