"""Tensor-parallel plans: which modules of each model family are split, and how.

Shared by the executor, which applies them with DTensor (``executor/tensor_parallel.py`` says
how each style runs), and the simulator, which replays their compute shares and collectives.
A family with an entry in :data:`PLANS` uses it; any other transformers decoder gets a plan
derived from its module structure (:mod:`ddlsim.plans.tp_generic`), through :func:`tp_plan`.
"""

import copy
import dataclasses
import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.models import build_config, build_model, check_model_spec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.plans.tp_generic import derive_split

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
    ``None`` when it has none (``sequence_refusal`` then may say why).

    A plan derived from module structure (``derived``) names its modules by their whole paths
    and adds: ``fused``, the split modules whose output rows are ``[part | part | ...]`` blocks
    of these widths (a fused ``[q | k | v]`` or ``[gate | up]``), which the executor reorders
    so that each rank's column shard holds its slice of every part; ``local_config``, the head
    counts of the config that each attention module gets a copy of with local values;
    ``split_sizes``, the sizes ``tp`` must divide: ``(name, value, what it is)``.
    """

    family: str
    modules: Mapping[str, str]
    attention: str
    divisible: tuple[str, ...]
    blocks: str
    shared_bias: bool = False
    sequence: "SequencePlan | None" = None
    fused: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    local_config: tuple[str, ...] = ()
    split_sizes: tuple[tuple[str, int, str], ...] = ()
    derived: bool = False
    sequence_refusal: str | None = None


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
    "num_kv_heads",
)


def divide_heads(module: "torch.nn.Module", ways: int) -> None:
    """Divide ``module``'s head-counting attributes (``_HEAD_ATTRIBUTES``) by ``ways``, so that
    an attention module computes with its local heads."""
    for attribute in _HEAD_ATTRIBUTES:
        value = getattr(module, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            setattr(module, attribute, value // ways)


def localize_attention(module: "torch.nn.Module", plan: TensorParallelPlan, ways: int) -> None:
    """Make an attention module of ``plan`` compute with its ``1 / ways`` of the heads: its
    head attributes divided and, for a derived plan, its own copy of the config with the head
    counts of ``plan.local_config`` divided (the model's config stays whole)."""
    divide_heads(module, ways)
    config = getattr(module, "config", None)
    if not plan.local_config or config is None:
        return
    # Read every count before writing any: two keys may name one attribute (attribute_map).
    whole = {key: getattr(config, key) for key in plan.local_config}
    local = copy.copy(config)
    for key, value in whole.items():
        setattr(local, key, value // ways)
    module.config = local


def _no_plan(spec: ModelSpec, reason: str, tp: int | None = None) -> InvalidStrategyError:
    cannot = f", so tp({tp}) cannot apply" if tp is not None else ""
    return InvalidStrategyError(
        f"{spec.label} ({spec.cls}) has no tensor-parallel plan{cannot}: {reason}; tensor "
        f"parallelism supports the families {', '.join(sorted(PLANS))} and transformers "
        "decoders whose blocks hold one attention (separate q/k/v projections or a fused one "
        "of known layout) and one MLP of linear layers"
    )


def _plan_or_reason(spec: ModelSpec) -> TensorParallelPlan | str:
    if spec.source != "transformers":
        return "it is not a transformers model"
    model_type = getattr(check_model_spec(spec).config_cls, "model_type", None)
    if model_type in PLANS:
        return PLANS[model_type]
    try:
        return _derived(json.dumps(spec.to_dict(), sort_keys=True))
    except InvalidStrategyError as exc:
        return str(exc)


def tp_plan(spec: ModelSpec) -> TensorParallelPlan:
    """The plan that splits ``spec``: its family's entry in :data:`PLANS`, else one derived
    from its module structure (cached per spec).

    Raises:
        InvalidStrategyError: for a model that is not a transformers model, or whose structure
            the derivation refuses (the module and the reason named).
    """
    found = _plan_or_reason(spec)
    if isinstance(found, str):
        raise _no_plan(spec, found)
    return found


def no_plan_reason(spec: ModelSpec) -> str | None:
    """Why no tensor-parallel plan splits ``spec`` (naming the module), or ``None`` when one
    does."""
    found = _plan_or_reason(spec)
    return found if isinstance(found, str) else None


@functools.lru_cache(maxsize=64)
def _derived(spec_json: str) -> TensorParallelPlan:
    spec = ModelSpec.from_dict(json.loads(spec_json))
    with torch.device("meta"):
        model = build_model(spec)
    split = derive_split(model)
    sequence = split.sequence
    return TensorParallelPlan(
        family=str(getattr(model.config, "model_type", spec.cls)),
        modules=split.modules,
        attention=split.attention,
        divisible=(),
        blocks=split.blocks,
        sequence=(
            SequencePlan(sequence.inputs, sequence.norms, sequence.final_norm)
            if sequence is not None
            else None
        ),
        fused=split.fused,
        local_config=split.local_config,
        split_sizes=split.split_sizes,
        derived=True,
        sequence_refusal=split.sequence_refusal,
    )


def tp_family(spec: ModelSpec) -> str | None:
    """The model family (transformers ``model_type``) whose plan applies, from :data:`PLANS` or
    derived from module structure, or ``None`` when no plan splits it."""
    try:
        return tp_plan(spec).family
    except InvalidStrategyError:
        return None


def check_tensor_parallel(spec: ModelSpec, tp: int) -> None:
    """Refuse a model that ``TensorParallelTrainer`` cannot split ``tp`` ways.

    Reads the config (a family's plan) or builds the model on the meta device (a derived plan);
    no memory, no process group.

    Raises:
        InvalidStrategyError: when the model has no plan (the reason named), or a split
            dimension (heads, key/value heads, intermediate size, vocabulary) is not a
            multiple of ``tp``; the message names the config key or module and its value.
    """
    plan = _plan_or_reason(spec)
    if isinstance(plan, str):
        raise _no_plan(spec, plan, tp)
    config = build_config(spec)
    for key in plan.divisible:
        value = getattr(config, key, None)
        if value is None and key == "n_inner":
            # GPT-2 leaves the MLP width unset to mean four times the embedding width.
            value = 4 * config.n_embd
        if isinstance(value, int) and value % tp:
            raise InvalidStrategyError(
                f"config.{key}({value}) of {spec.label} is not divisible by tp({tp}): "
                "each tensor-parallel rank needs an equal share; pick a tp that divides it"
            )
    for name, value, what in plan.split_sizes:
        if value % tp:
            raise InvalidStrategyError(
                f"{name}({value}) of {spec.label} is not divisible by tp({tp}): {what} split "
                "over the tensor-parallel ranks needs an equal share on each; pick a tp that "
                "divides it"
            )


def check_sequence_parallel(spec: ModelSpec, tp: int) -> None:
    """Refuse sequence parallelism for a family without a sequence-parallel plan, or a
    sequence that does not split ``tp`` ways.

    Raises:
        InvalidStrategyError: naming the family or the sequence length.
    """
    check_tensor_parallel(spec, tp)
    plan = tp_plan(spec)
    if plan.sequence is None:
        with_plan = sorted(name for name, plan in PLANS.items() if plan.sequence is not None)
        why = f": {plan.sequence_refusal}" if plan.sequence_refusal else ""
        raise InvalidStrategyError(
            f"parallel.sequence_parallel has no plan for the {plan.family} family "
            f"({spec.label}){why}; families with one: {', '.join(with_plan)}, and decoders "
            "whose blocks hold their attention, MLP and norms as their own modules"
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
    check_tensor_parallel(spec, parallel.tp)  # a model with a plan, heads tp divides
    plan = tp_plan(spec)
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
