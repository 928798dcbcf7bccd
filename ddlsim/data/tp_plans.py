"""Tensor-parallel plans: which modules of each model family are split, and how.

Shared by the executor, which applies them with DTensor (``executor/tensor_parallel.py`` says
how each style runs), and the simulator, which replays their compute shares and collectives.
"""

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.models import build_config, build_model, check_model_spec
from ddlsim.data.specs.model import ModelSpec

if TYPE_CHECKING:
    from ddlsim.data.specs.strategy import ParallelPlan


@dataclasses.dataclass(frozen=True, slots=True)
class TensorParallelPlan:
    """How one model family is split.

    ``modules`` maps a regular expression, matched against the end of a module path (so that it
    applies under any task head: ``transformer.h.0.attn.c_attn``), to a style name of
    ``_STYLES``; ``attention`` matches the modules whose head attributes become local;
    ``divisible`` names the config keys that ``tp`` must divide (``None`` values are skipped);
    ``blocks`` matches the repeated blocks that per-layer placements (``ParallelPlan.layers``)
    address, in model order; ``shared_bias`` says that a stack's blocks share a position bias
    computed by its first block with its heads (T5), so that they must share one layout.

    ``sequence`` is the family's sequence-parallel plan (``parallel.sequence_parallel``), or
    ``None`` when it has none.
    """

    family: str
    modules: Mapping[str, str]
    attention: str
    divisible: tuple[str, ...]
    blocks: str
    shared_bias: bool = False
    sequence: "SequencePlan | None" = None


@dataclasses.dataclass(frozen=True, slots=True)
class SequencePlan:
    """Sequence parallelism (Korthikanti et al.) over a family's blocks: between the blocks'
    split modules, activations hold ``1 / tp`` of the sequence. ``inputs`` matches the modules
    (attention, MLP) whose input is all-gathered from sequence shards as they start (their
    row-parallel outputs are reduce-scattered back into shards); the rest of a block (norms,
    residual additions, dropout) computes on its shard. ``final_norm`` matches the norm after
    the last block, whose output is all-gathered for the head; ``norms`` the blocks' norms,
    whose weights stay whole (replicated DTensors: their gradients, partial sums over the
    shards, are summed over the tensor-parallel ranks)."""

    inputs: str
    norms: str
    final_norm: str


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
        blocks=rf"h\.{_N}",
        sequence=SequencePlan(
            inputs=rf"h\.{_N}\.(attn|mlp)", norms=rf"h\.{_N}\.ln_(1|2)", final_norm=r"ln_f"
        ),
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
        blocks=rf"layer\.{_N}",
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
        blocks=rf"layers\.{_N}",
        sequence=SequencePlan(
            inputs=rf"layers\.{_N}\.(self_attn|mlp)",
            norms=rf"layers\.{_N}\.(input_layernorm|post_attention_layernorm)",
            final_norm=r"norm",
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
        blocks=rf"layers?\.{_N}",
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
        blocks=rf"block\.{_N}",
        shared_bias=True,
    ),
}


# Mistral's decoder names its modules as LLaMA's does, grouped-query attention included.
PLANS["mistral"] = dataclasses.replace(PLANS["llama"], family="mistral")


# Attributes of attention modules that count heads or widths derived from the head count; each is
# divided by ``tp`` so that the module computes with its local heads.
_HEAD_ATTRIBUTES = (
    "num_heads",
    "num_attention_heads",
    "num_key_value_heads",
    "n_heads",
    "embed_dim",
    "split_size",
    "all_head_size",
    "inner_dim",
)


def divide_heads(module: "torch.nn.Module", ways: int) -> None:
    """Divide ``module``'s head-counting attributes (``_HEAD_ATTRIBUTES``) by ``ways``, so that
    an attention module computes with its local heads."""
    for attribute in _HEAD_ATTRIBUTES:
        value = getattr(module, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            setattr(module, attribute, value // ways)


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


def check_sequence_parallel(spec: ModelSpec, tp: int) -> None:
    """Refuse sequence parallelism for a family without a sequence-parallel plan, or a
    sequence that does not split ``tp`` ways.

    Raises:
        InvalidStrategyError: naming the family or the sequence length.
    """
    check_tensor_parallel(spec, tp)
    family = tp_family(spec)
    assert family is not None
    if PLANS[family].sequence is None:
        with_plan = sorted(name for name, plan in PLANS.items() if plan.sequence is not None)
        raise InvalidStrategyError(
            f"parallel.sequence_parallel has no plan for the {family} family ({spec.label}); "
            f"families with one: {', '.join(with_plan)}"
        )
    seq_len = spec.inputs.seq_len
    if seq_len is not None and seq_len % tp:
        raise InvalidStrategyError(
            f"parallel.sequence_parallel splits the sequence tp ways: seq_len({seq_len}) of "
            f"{spec.label} is not divisible by tp({tp})"
        )


def block_paths(plan: TensorParallelPlan, paths: Iterable[str]) -> list[str]:
    """The repeated blocks among module ``paths`` (in their order): paths matching
    ``plan.blocks`` that lie in no other match."""
    found: list[str] = []
    for path in paths:
        if matches(plan.blocks, path) and not any(path.startswith(f"{b}.") for b in found):
            found.append(path)
    return found


def block_of(blocks: Sequence[str], module: str) -> int | None:
    """The index in ``blocks`` of the block that holds ``module``, or ``None``."""
    for index, block in enumerate(blocks):
        if module == block or module.startswith(f"{block}."):
            return index
    return None


def check_layouts(
    spec: ModelSpec, parallel: "ParallelPlan", *, rank_batch: int | None
) -> list[str]:
    """Refuse per-layer placements the model cannot take; the block paths they address.

    Builds the model on the meta device (no memory, no process group).

    Raises:
        InvalidStrategyError: naming the value: ``layers`` whose length is not the number of
            blocks, a ``batch`` block whose micro-batch of ``rank_batch`` samples ``tp`` does
            not divide (not checked when ``rank_batch`` is ``None``), or mixed layouts in a
            stack whose blocks share a position bias.
    """
    check_tensor_parallel(spec, parallel.tp)  # a family with a plan, heads tp divides
    family = tp_family(spec)
    assert family is not None  # check_tensor_parallel refused the others
    plan = PLANS[family]
    with torch.device("meta"):
        model = build_model(spec)
    blocks = block_paths(plan, (path for path, _ in model.named_modules() if path))
    if not parallel.layers:
        return blocks
    if len(parallel.layers) != len(blocks):
        raise InvalidStrategyError(
            f"parallel.layers has {len(parallel.layers)} entries but {spec.label} has "
            f"{len(blocks)} blocks ({blocks[0]} ... {blocks[-1]}): give one layout per block"
        )
    for index, layout in enumerate(parallel.layers):
        if layout == "batch" and rank_batch is not None and rank_batch % parallel.tp:
            raise InvalidStrategyError(
                f"parallel.layers[{index}] is 'batch' ({blocks[index]}): a micro-batch of "
                f"{rank_batch} samples does not split into tp({parallel.tp}) equal parts; use "
                "'tp' or 'replicate' there, or a batch that tp divides"
            )
    if plan.shared_bias:
        stacks: dict[str, set[str]] = {}
        for path, layout in zip(blocks, parallel.layers, strict=True):
            stacks.setdefault(path.rsplit(".", 1)[0], set()).add(layout)
        for stack, layouts in stacks.items():
            if len(layouts) > 1:
                raise InvalidStrategyError(
                    f"the blocks of {stack} share the position bias their first block computes, "
                    f"so they need one layout; parallel.layers gives them {sorted(layouts)}"
                )
    return blocks


def matches(pattern: str, path: str) -> bool:
    return re.search(rf"(^|\.)(?:{pattern})$", path) is not None
