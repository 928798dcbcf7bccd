"""The dataset's models: two sizes of each of eight families (cpu-v2), and of eight more (cpu-v3).

Each model is a zoo entry, or a variant of one with another config, at inputs that keep one run
to seconds on two cores: text at batch 8 x 64 tokens, images at batch 8, 64 x 64 pixels.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.zoo import ZOO

# Two sizes of each of eight families, at inputs that keep one run to seconds on two cores.
_SMALL_TEXT = {"batch_size": 8, "seq_len": 64}
_SMALL_IMAGE = {"batch_size": 8, "image_size": 64}


def _variant(base: str, name: str, config: Mapping[str, Any], **inputs: int) -> ModelSpec:
    spec = ZOO[base]
    return dataclasses.replace(spec, name=name, config={**spec.config, **config}).with_inputs(
        **inputs
    )


def dataset_models() -> list[ModelSpec]:
    """The models of the dataset: two sizes of each of eight families.

    Long: a table of data, one entry a model.
    """
    return [
        ZOO["gpt2-tiny"].with_inputs(**_SMALL_TEXT),
        _variant("gpt2-tiny", "gpt2-mini", {"n_layer": 4, "n_embd": 256}, **_SMALL_TEXT),
        ZOO["bert-tiny"].with_inputs(**_SMALL_TEXT),
        _variant(
            "bert-tiny",
            "bert-mini",
            {
                "num_hidden_layers": 4,
                "hidden_size": 256,
                "num_attention_heads": 4,
                "intermediate_size": 1024,
            },
            **_SMALL_TEXT,
        ),
        _variant("llama-tiny", "llama-tiny-8k", {"vocab_size": 8192}, **_SMALL_TEXT),
        _variant(
            "llama-tiny",
            "llama-mini",
            {
                "num_hidden_layers": 4,
                "hidden_size": 320,
                "intermediate_size": 864,
                "num_attention_heads": 5,
                "num_key_value_heads": 5,
                "vocab_size": 8192,
            },
            **_SMALL_TEXT,
        ),
        _variant("t5-tiny", "t5-tiny-8k", {"vocab_size": 8192}, **_SMALL_TEXT),
        _variant(
            "t5-tiny",
            "t5-mini",
            {
                "num_layers": 3,
                "d_model": 256,
                "d_ff": 1024,
                "d_kv": 32,
                "num_heads": 8,
                "vocab_size": 8192,
            },
            **_SMALL_TEXT,
        ),
        ZOO["opt-tiny"].with_inputs(**_SMALL_TEXT),
        _variant(
            "opt-tiny",
            "opt-mini",
            {
                "num_hidden_layers": 4,
                "hidden_size": 256,
                "word_embed_proj_dim": 256,
                "ffn_dim": 1024,
            },
            **_SMALL_TEXT,
        ),
        _variant("vit-tiny", "vit-tiny-64", {"num_labels": 100}, **_SMALL_IMAGE),
        _variant(
            "vit-tiny",
            "vit-mini-64",
            {
                "num_hidden_layers": 4,
                "hidden_size": 256,
                "num_attention_heads": 4,
                "intermediate_size": 1024,
                "num_labels": 100,
            },
            **_SMALL_IMAGE,
        ),
        _variant("resnet-18", "resnet-18-64", {"num_labels": 100}, **_SMALL_IMAGE),
        _variant(
            "resnet-18",
            "resnet-10-64",
            {"depths": [1, 1, 1, 1], "num_labels": 100},
            **_SMALL_IMAGE,
        ),
        _variant("convnext-atto", "convnext-atto-64", {"num_labels": 100}, **_SMALL_IMAGE),
        _variant(
            "convnext-atto",
            "convnext-mini-64",
            {"depths": [1, 1, 3, 1], "hidden_sizes": [32, 64, 128, 256], "num_labels": 100},
            **_SMALL_IMAGE,
        ),
    ]


# The eight families cpu-v3 adds, each at its zoo's test size and a larger "mini" size, chosen
# for structure the first eight lack: grouped- and multi-query attention (Mistral, Falcon),
# attention and MLP in parallel (Falcon, GPT-J), one layer's weights shared by every layer
# (ALBERT), factorised embeddings (ALBERT, ELECTRA), a post-norm encoder-decoder (BART),
# LayerScale (DINOv2), depthwise convolutions with squeeze-and-excitation (EfficientNet).
_V3_FAMILIES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (
        "mistral-tiny",
        "mistral-mini",
        {
            "num_hidden_layers": 4,
            "hidden_size": 256,
            "intermediate_size": 704,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
        },
    ),
    (
        "falcon-tiny",
        "falcon-mini",
        {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8},
    ),
    ("gptj-tiny", "gptj-mini", {"n_layer": 4, "n_embd": 256, "n_head": 8}),
    (
        "albert-tiny",
        "albert-mini",
        {
            "num_hidden_layers": 6,
            "hidden_size": 256,
            "embedding_size": 128,
            "intermediate_size": 1024,
        },
    ),
    (
        "electra-tiny",
        "electra-mini",
        {
            "num_hidden_layers": 4,
            "hidden_size": 256,
            "embedding_size": 128,
            "intermediate_size": 1024,
        },
    ),
    (
        "bart-tiny",
        "bart-mini",
        {
            "encoder_layers": 3,
            "decoder_layers": 3,
            "d_model": 256,
            "encoder_attention_heads": 8,
            "decoder_attention_heads": 8,
            "encoder_ffn_dim": 1024,
            "decoder_ffn_dim": 1024,
        },
    ),
    ("dinov2-tiny", "dinov2-mini", {"num_hidden_layers": 4, "hidden_size": 256}),
    (
        "efficientnet-tiny",
        "efficientnet-mini",
        {"width_coefficient": 0.75, "depth_coefficient": 0.75, "hidden_dim": 960},
    ),
)

DATASET_VERSIONS: tuple[str, ...] = ("cpu-v2", "cpu-v3")


def dataset_models_v3() -> list[ModelSpec]:
    """cpu-v3's models: cpu-v2's sixteen and two sizes of each of eight more families."""
    added: list[ModelSpec] = []
    for tiny, mini, config in _V3_FAMILIES:
        inputs = _SMALL_IMAGE if ZOO[tiny].inputs.image_size is not None else _SMALL_TEXT
        added.append(ZOO[tiny].with_inputs(**inputs))
        added.append(_variant(tiny, mini, config, **inputs))
    return [*dataset_models(), *added]


def models_of(version: str) -> list[ModelSpec]:
    """The models of dataset ``version``.

    Raises:
        InvalidOptionError: an unknown version, naming the known ones.
    """
    from ddlsim.simulator.dataset.gpu_plan import GPU_VERSIONS, gpu_models

    if version in GPU_VERSIONS:
        return gpu_models()
    if version not in DATASET_VERSIONS:
        allowed = ", ".join([*DATASET_VERSIONS, *GPU_VERSIONS])
        raise InvalidOptionError(f"dataset version {version!r} is unknown; allowed: {allowed}")
    return dataset_models() if version == "cpu-v2" else dataset_models_v3()
