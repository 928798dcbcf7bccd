"""The zoo's first families: GPT-2, BERT, ViT, ResNet, LLaMA, T5, OPT and ConvNeXt, each at a
test size and a published one, after two plain-torch reference models that serve fast tests.

Sizes follow the papers and model cards cited beside each family.
"""

from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.zoo.entry import zoo_entry

_LLAMA_VOCAB = 32000
_T5_VOCAB = 32128
_OPT_VOCAB = 50272

CLASSIC_MODELS: list[ModelSpec] = [
    zoo_entry("mlp", "reference", "MLP", {}, batch_size=64),
    zoo_entry("vgg-mini", "reference", "VGG", {}, batch_size=16, image_size=32),
    # GPT-2: Radford et al. 2019 sizes; "tiny" keeps the architecture at test scale.
    zoo_entry(
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
    zoo_entry("gpt2-small", "gpt2", "GPT2LMHeadModel", {}, batch_size=8, seq_len=128),
    zoo_entry(
        "gpt2-medium",
        "gpt2",
        "GPT2LMHeadModel",
        {"n_layer": 24, "n_embd": 1024, "n_head": 16},
        batch_size=4,
        seq_len=128,
    ),
    # BERT: the compact sizes of Turc et al. 2019 and BERT-base.
    zoo_entry(
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
    zoo_entry(
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
    zoo_entry("bert-base", "bert", "BertForMaskedLM", {}, batch_size=8, seq_len=128),
    # ViT: DeiT-tiny width and ViT-B/16.
    zoo_entry(
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
    zoo_entry(
        "vit-base",
        "vit",
        "ViTForImageClassification",
        {"num_labels": 1000},
        batch_size=8,
        image_size=224,
    ),
    # ResNet: He et al. 2016, basic blocks (18) and bottlenecks (50).
    zoo_entry(
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
    zoo_entry(
        "resnet-50",
        "resnet",
        "ResNetForImageClassification",
        {"num_labels": 1000},
        batch_size=8,
        image_size=224,
    ),
    # LLaMA: a test-scale model and the 160M size of the LLaMA-style draft models.
    zoo_entry(
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
    zoo_entry(
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
    zoo_entry(
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
    zoo_entry(
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
    zoo_entry(
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
    zoo_entry(
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
    zoo_entry(
        "convnext-atto",
        "convnext",
        "ConvNextForImageClassification",
        {"depths": [2, 2, 6, 2], "hidden_sizes": [40, 80, 160, 320], "num_labels": 1000},
        batch_size=8,
        image_size=224,
    ),
    zoo_entry(
        "convnext-tiny",
        "convnext",
        "ConvNextForImageClassification",
        {"depths": [3, 3, 9, 3], "hidden_sizes": [96, 192, 384, 768], "num_labels": 1000},
        batch_size=8,
        image_size=224,
    ),
]
