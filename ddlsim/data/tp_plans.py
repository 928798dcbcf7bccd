"""Tensor-parallel plans: which modules of each model family are split, and how.

Shared by the executor, which applies them with DTensor (``executor/tensor_parallel.py`` says
how each style runs), and the simulator, which replays their compute shares and collectives.
"""

import dataclasses
import re
from collections.abc import Mapping

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.models import build_config, check_model_spec
from ddlsim.data.specs.model import ModelSpec


@dataclasses.dataclass(frozen=True, slots=True)
class TensorParallelPlan:
    """How one model family is split.

    ``modules`` maps a regular expression, matched against the end of a module path (so that it
    applies under any task head: ``transformer.h.0.attn.c_attn``), to a style name of
    ``_STYLES``; ``attention`` matches the modules whose head attributes become local;
    ``divisible`` names the config keys that ``tp`` must divide (``None`` values are skipped).
    """

    family: str
    modules: Mapping[str, str]
    attention: str
    divisible: tuple[str, ...]


# Path fragments: a layer index, so that one expression covers every block.
_N = r"\d+"

PLANS: dict[str, TensorParallelPlan] = {
    "gpt2": TensorParallelPlan(
        family="gpt2",
        modules={
            r"wte": "vocab_embedding",
            rf"h\.{_N}\.attn\.c_attn": "colwise",
            rf"h\.{_N}\.attn\.c_proj": "rowwise",
            rf"h\.{_N}\.mlp\.c_fc": "colwise",
            rf"h\.{_N}\.mlp\.c_proj": "rowwise",
            r"^lm_head": "vocab_head",
        },
        attention=rf"h\.{_N}\.attn",
        divisible=("n_head", "n_inner", "vocab_size"),
    ),
    "bert": TensorParallelPlan(
        family="bert",
        modules={
            r"embeddings\.word_embeddings": "vocab_embedding",
            rf"layer\.{_N}\.attention\.self\.(query|key|value)": "colwise",
            rf"layer\.{_N}\.attention\.output\.dense": "rowwise",
            rf"layer\.{_N}\.intermediate\.dense": "colwise",
            rf"layer\.{_N}\.output\.dense": "rowwise",
            r"^cls\.predictions\.decoder": "vocab_head",
        },
        attention=rf"layer\.{_N}\.attention\.self",
        divisible=("num_attention_heads", "intermediate_size", "vocab_size"),
    ),
    "llama": TensorParallelPlan(
        family="llama",
        modules={
            r"embed_tokens": "vocab_embedding",
            rf"layers\.{_N}\.self_attn\.(q_proj|k_proj|v_proj)": "colwise",
            rf"layers\.{_N}\.self_attn\.o_proj": "rowwise",
            rf"layers\.{_N}\.mlp\.(gate_proj|up_proj)": "colwise",
            rf"layers\.{_N}\.mlp\.down_proj": "rowwise",
            r"^lm_head": "vocab_head",
        },
        attention=rf"layers\.{_N}\.self_attn",
        divisible=(
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "vocab_size",
        ),
    ),
    "vit": TensorParallelPlan(
        family="vit",
        modules={
            rf"layers?\.{_N}\.attention\.(q_proj|k_proj|v_proj)": "colwise",
            rf"layers?\.{_N}\.attention\.o_proj": "rowwise",
            rf"layers?\.{_N}\.mlp\.fc1": "colwise",
            rf"layers?\.{_N}\.mlp\.fc2": "rowwise",
        },
        attention=rf"layers?\.{_N}\.attention",
        divisible=("num_attention_heads", "intermediate_size"),
    ),
    "t5": TensorParallelPlan(
        family="t5",
        modules={
            r"(^shared|embed_tokens)": "vocab_embedding",
            rf"block\.{_N}\.layer\.{_N}\.(SelfAttention|EncDecAttention)\.(q|k|v)": "colwise",
            rf"block\.{_N}\.layer\.{_N}\.(SelfAttention|EncDecAttention)\.o": "rowwise",
            rf"block\.{_N}\.layer\.{_N}\.(SelfAttention|EncDecAttention)"
            r"\.relative_attention_bias": "head_embedding",
            rf"block\.{_N}\.layer\.{_N}\.DenseReluDense\.(wi|wi_0|wi_1)": "colwise",
            rf"block\.{_N}\.layer\.{_N}\.DenseReluDense\.wo": "rowwise",
            r"^lm_head": "vocab_head",
        },
        attention=rf"block\.{_N}\.layer\.{_N}\.(SelfAttention|EncDecAttention)",
        divisible=("num_heads", "d_ff", "vocab_size"),
    ),
}


# Mistral's decoder names its modules as LLaMA's does, grouped-query attention included.
PLANS["mistral"] = dataclasses.replace(PLANS["llama"], family="mistral")


def tp_family(spec: ModelSpec) -> str | None:
    """The model family (transformers ``model_type``) whose plan applies, or ``None``."""
    if spec.source != "transformers":
        return None
    model_type = getattr(check_model_spec(spec).config_cls, "model_type", None)
    return model_type if model_type in PLANS else None


def check_tensor_parallel(spec: ModelSpec, tp: int) -> None:
    """Refuse a model that ``TensorParallelTrainer`` cannot split ``tp`` ways.

    Reads the config only (no model, no process group).

    Raises:
        InvalidStrategyError: when the model's family has no plan, or a split dimension (heads,
            intermediate size, vocabulary) is not a multiple of ``tp``; the message names the
            config key and its value.
    """
    family = tp_family(spec)
    if family is None:
        raise InvalidStrategyError(
            f"{spec.label} ({spec.cls}) has no tensor-parallel plan, so tp({tp}) cannot apply; "
            f"tensor parallelism supports the families {', '.join(sorted(PLANS))}"
        )
    config = build_config(spec)
    for key in PLANS[family].divisible:
        value = getattr(config, key, None)
        if value is None and key == "n_inner":
            # GPT-2 leaves the MLP width unset to mean four times the embedding width.
            value = 4 * config.n_embd
        if isinstance(value, int) and value % tp:
            raise InvalidStrategyError(
                f"config.{key}({value}) of {spec.label} is not divisible by tp({tp}): "
                "each tensor-parallel rank needs an equal share; pick a tp that divides it"
            )


def matches(pattern: str, path: str) -> bool:
    return re.search(rf"(^|\.)(?:{pattern})$", path) is not None
