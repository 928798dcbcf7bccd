"""A tensor-parallel plan derived from a transformers decoder's module structure, for the
families without an entry in :data:`ddlsim.plans.tp_plans.PLANS` (Qwen2, Nemotron, Phi-3,
Gemma 2, Falcon, OLMo, StableLM, ...).

The model is built on the meta device (no memory) and read as Megatron-LM splits a block:

1. The block stack: the one ``ModuleList`` whose blocks, all of one class, each hold an
   attention and an MLP.
2. In a block, the linear layers grouped by the module that holds them: the attention's group
   (its module's class names attention, or its layers are named like ``q_proj``) and the
   MLP's (the other one; OPT keeps its ``fc1`` / ``fc2`` in the block itself).
3. The attention: the output projection (``o_proj``, ``out_proj``, ``dense``, ...) is
   row-parallel, the inputs column-parallel: separate ``q`` / ``k`` / ``v`` projections, or
   one fused projection whose row layout is known (:mod:`ddlsim.plans.tp_fused`): per head
   or per key/value group, which a plain column split keeps whole (Falcon), or as ``[q | k |
   v]`` parts, whose rows the executor reorders so that each rank's column shard holds its
   slice of each part, as GPT-2's ``c_attn`` (Phi-3). Head counts from the config and the
   projections' shapes; norms inside the attention are allowed when they normalize one head
   (Qwen3's ``q_norm``): shared by every head, they stay whole, and the executor sums their
   gradients over the tensor-parallel ranks.
4. The MLP: inputs (``gate_proj``, ``up_proj``, ``fc1``, ``c_fc``, ``dense_h_to_4h``, ...)
   column-parallel, the output (``down_proj``, ``fc2``, ``c_proj``, ``dense_4h_to_h``, ...)
   row-parallel; a fused ``[gate | up]`` projection is reordered like a fused ``[q | k | v]``.
5. The token embedding (split by vocabulary rows) and the LM head (by vocabulary columns).
6. Sequence parallelism where the attention and MLP are the block's own modules, its other
   parameters are norms, and one norm follows the stack.

Attention modules compute with their local heads: their head-counting attributes are divided
(:func:`ddlsim.plans.tp_plans.divide_heads`) and so are the head counts of a copy of their
config (Phi-3 reads ``config.num_attention_heads`` in its forward). Whatever cannot be split
is refused by name (:func:`derive_split`). :func:`ddlsim.plans.tp_plans.tp_plan` turns the
derived split into a ``TensorParallelPlan``.
"""

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from torch import nn

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.moe import is_experts
from ddlsim.plans.tp_fused import FUSED_MLP_PARTS, Heads, fused_qkv_parts

_Q_NAMES = frozenset({"q_proj", "query", "q", "wq", "query_proj"})
_K_NAMES = frozenset({"k_proj", "key", "k", "wk", "key_proj"})
_V_NAMES = frozenset({"v_proj", "value", "v", "wv", "value_proj"})
_ATTENTION_OUT = frozenset({"o_proj", "out_proj", "dense", "o", "wo", "c_proj", "proj"})
_MLP_IN = frozenset(
    {"gate_proj", "up_proj", "fc1", "c_fc", "dense_h_to_4h", "w1", "w3", "fc_in", "wi"}
    | {"wi_0", "wi_1", "gate_up_proj"}
)
_MLP_OUT = frozenset({"down_proj", "fc2", "c_proj", "dense_4h_to_h", "w2", "fc_out", "wo"})
# Config keys that count query heads and key/value heads, in the order they are looked up.
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads")


@dataclasses.dataclass(frozen=True, slots=True)
class SequencePatterns:
    """Where sequence parallelism acts (the fields of ``tp_plans.SequencePlan``)."""

    inputs: str
    norms: str
    final_norm: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DerivedSplit:
    """A decoder's split read from its module structure, in the terms of
    ``tp_plans.TensorParallelPlan`` (module patterns and their styles, the attention and block
    patterns, fused parts, local config keys, sizes ``tp`` must divide), with its
    sequence-parallel patterns or why there are none."""

    modules: dict[str, str]
    attention: str
    blocks: str
    fused: dict[str, tuple[int, ...]]
    local_config: tuple[str, ...]
    split_sizes: tuple[tuple[str, int, str], ...]
    sequence: SequencePatterns | None
    sequence_refusal: str | None


@dataclasses.dataclass(slots=True)
class _Found:
    """What the derivation collects: a style and the fused parts per module path, the sizes
    that ``tp`` must divide (name, value, what they are)."""

    styles: dict[str, str] = dataclasses.field(default_factory=dict)
    fused: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    sizes: list[tuple[str, int, str]] = dataclasses.field(default_factory=list)


def derive_split(model: nn.Module) -> DerivedSplit:
    """The tensor-parallel split of ``model`` (built on any device, meta included), read from
    its module structure.

    Raises:
        InvalidStrategyError: naming the module that cannot be split and why: no block stack
            or several, no attention or MLP in a block, projections that are neither separate
            nor fused in a known layout, a norm across all heads or other per-head parameters,
            an MLP without recognisable input and output projections (experts, routers),
            a position bias computed for all heads outside the attention (ALiBi).
    """
    config: Any = model.config
    if any("alibi" in key and value for key, value in config.to_dict().items()):
        raise InvalidStrategyError(
            "its ALiBi position bias is computed for all heads outside the attention modules, "
            "so they cannot compute with local heads"
        )
    stack, blocks = _block_stack(model)
    block = blocks[0]
    block_path = f"{stack}.0"
    groups = _linear_groups(block, block_path)
    attention_path, mlp_path = _attention_and_mlp(block, groups, block_path)
    found = _Found()
    at = f"{block_path}.{attention_path}"
    heads = _attention(
        block.get_submodule(attention_path), at, groups[attention_path], config, found
    )
    mlp = block.get_submodule(mlp_path) if mlp_path else block
    if mlp_path in groups:
        _mlp(mlp, f"{block_path}.{mlp_path}".rstrip("."), groups[mlp_path], bool(mlp_path), found)
    _vocabulary(model, found)
    local_keys = tuple(key for key in (heads.heads_key, heads.kv_key) if key is not None)
    pattern = re.escape(stack) + r"\.\d+"

    def generic(path: str) -> str:
        """``path``'s pattern: under block 0, any block's."""
        if path.startswith(f"{block_path}."):
            return pattern + re.escape(path[len(block_path) :])
        return re.escape(path)

    sequence, refusal = _sequence(model, stack, block, attention_path, mlp_path)
    return DerivedSplit(
        modules={generic(path): style for path, style in found.styles.items()},
        attention=pattern + re.escape(f".{attention_path}"),
        blocks=pattern,
        fused={generic(path): parts for path, parts in found.fused.items()},
        local_config=local_keys,
        split_sizes=tuple(found.sizes),
        sequence=sequence,
        sequence_refusal=refusal,
    )


def _block_stack(model: nn.Module) -> tuple[str, list[nn.Module]]:
    """The path of the one ModuleList of blocks and its blocks."""
    stacks: list[tuple[str, list[nn.Module]]] = []
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        if any(path.startswith(f"{s}.") for s, _ in stacks):
            continue
        children = list(module)
        if len({type(child) for child in children}) != 1:
            continue
        if sum(isinstance(m, nn.Linear) for m in children[0].modules()) >= 2:
            stacks.append((path, children))
    if not stacks:
        raise InvalidStrategyError(
            "it has no block stack (a ModuleList of blocks of one class holding linear layers)"
        )
    if len(stacks) > 1:
        raise InvalidStrategyError(
            f"it has several block stacks ({', '.join(s for s, _ in stacks)}); the plan derived "
            "from module structure splits decoders with one"
        )
    return stacks[0]


def _linear_groups(block: nn.Module, block_path: str) -> dict[str, dict[str, nn.Linear]]:
    """The block's linear layers by the path (relative to the block) of the module holding
    them."""
    groups: dict[str, dict[str, nn.Linear]] = {}
    for path, module in block.named_modules():
        if type(module).__name__ == "Conv1D":
            raise InvalidStrategyError(
                f"{block_path}.{path} is a transformers Conv1D; the plan derived from module "
                "structure splits nn.Linear layers"
            )
        if isinstance(module, nn.Linear):
            parent, _, name = path.rpartition(".")
            groups.setdefault(parent, {})[name] = module
    return groups


def _is_attention(path: str, module_names: set[str]) -> bool:
    last = path.rpartition(".")[2].lower()
    return "attn" in last or "attention" in last or bool(module_names & (_Q_NAMES | _K_NAMES))


def _attention_and_mlp(
    block: nn.Module, groups: Mapping[str, Mapping[str, nn.Linear]], block_path: str
) -> tuple[str, str]:
    """The paths (relative to the block) of its attention and of its MLP ("": the block)."""
    attention = [p for p, names in groups.items() if _is_attention(p, set(names))]
    others = [p for p in groups if p not in attention]
    where = ", ".join(f"{block_path}.{p}".rstrip(".") for p in groups)
    if len(attention) != 1:
        raise InvalidStrategyError(
            f"its blocks ({block_path}) hold {len(attention)} attention modules among the "
            f"holders of linear layers ({where}); the derived plan splits one self-attention"
        )
    if not others:
        # An MLP without linear layers: a layer of routed experts (3-D tensors and a router,
        # left whole on every tensor-parallel rank: expert tensor parallelism 1, as
        # Megatron-Core's default), or something the split cannot place.
        for name, child in block.named_children():
            params = [n for n, _ in child.named_parameters()]
            if name != attention[0].partition(".")[0] and params and not _is_norm(child):
                if any(is_experts(m) for m in child.modules()):
                    return attention[0], name
                raise InvalidStrategyError(
                    f"MLP {block_path}.{name} ({type(child).__name__}) has no recognisable "
                    f"input and output projections (its parameters: {', '.join(params)}): "
                    "the derived plan splits an MLP of linear layers, not experts or routers"
                )
    if len(others) != 1:
        raise InvalidStrategyError(
            f"its blocks ({block_path}) hold {len(others)} MLPs beside the attention "
            f"{block_path}.{attention[0]} among the holders of linear layers ({where}); the "
            "derived plan splits one MLP of linear layers (no experts)"
        )
    return attention[0], others[0]


def _config_int(config: Any, keys: tuple[str, ...]) -> tuple[str, int] | None:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return key, value
    return None


def _attention(
    module: nn.Module, path: str, linears: Mapping[str, nn.Linear], config: Any, found: _Found
) -> Heads:
    outs = sorted(set(linears) & _ATTENTION_OUT)
    if len(outs) != 1:
        raise InvalidStrategyError(
            f"attention {path} has no single output projection among {sorted(linears)} (one of "
            f"{', '.join(sorted(_ATTENTION_OUT))})"
        )
    out = linears[outs[0]]
    inputs = {name: linear for name, linear in linears.items() if name != outs[0]}
    hidden = out.out_features
    for name, linear in inputs.items():
        if linear.in_features != hidden:
            raise InvalidStrategyError(
                f"{path}.{name} reads {linear.in_features} features, not the block's {hidden}: "
                "the derived plan splits self-attention"
            )
    found_heads = _config_int(config, HEAD_KEYS)
    if found_heads is None:
        raise InvalidStrategyError(
            f"its config has no head count ({', '.join(HEAD_KEYS)}) for attention {path}"
        )
    heads_key, heads = found_heads
    head_dim = out.in_features // heads
    kv = _config_int(config, KV_HEAD_KEYS)
    separate = _separate_qkv(inputs)
    if separate is not None:
        q, k, v = separate
        head_dim = q.out_features // heads
        whole = q.out_features % heads == 0 and k.out_features % head_dim == 0
        if not whole or k.out_features != v.out_features or out.in_features != q.out_features:
            raise InvalidStrategyError(
                f"the q/k/v projections of {path} ({q.out_features}, {k.out_features}, "
                f"{v.out_features} outputs; {outs[0]} reads {out.in_features}) do not hold "
                f"whole heads of {heads} queries"
            )
        kv_heads = k.out_features // head_dim
        kv_key = kv[0] if kv is not None and kv[1] == kv_heads else None
        result = Heads(heads, kv_heads, head_dim, heads_key, kv_key)
        for name in inputs:
            found.styles[f"{path}.{name}"] = "colwise"
    elif len(inputs) == 1:
        ((name, fused),) = inputs.items()
        kv_heads = kv[1] if kv is not None else heads
        result = Heads(heads, kv_heads, head_dim, heads_key, kv[0] if kv else None)
        found.styles[f"{path}.{name}"] = "colwise"
        parts = fused_qkv_parts(module, path, name, fused, result)
        if parts is not None:
            found.fused[f"{path}.{name}"] = parts
    else:
        raise InvalidStrategyError(
            f"attention {path} has input projections {sorted(inputs)}: neither separate "
            "q/k/v projections nor one fused q/k/v projection"
        )
    found.styles[f"{path}.{outs[0]}"] = "rowwise"
    _check_head_norms(module, path, set(linears), result)
    attention = f"the query heads of {path}"
    found.sizes.append((f"config.{heads_key}", heads, attention))
    if result.kv_key is not None or result.kv_heads != heads:
        kv_name = f"config.{result.kv_key}" if result.kv_key else f"key/value heads of {path}"
        found.sizes.append((kv_name, result.kv_heads, f"the key/value heads of {path}"))
    return result


def _separate_qkv(
    inputs: Mapping[str, nn.Linear],
) -> tuple[nn.Linear, nn.Linear, nn.Linear] | None:
    if len(inputs) != 3:
        return None
    picked = [
        [inputs[n] for n in inputs if n in names] for names in (_Q_NAMES, _K_NAMES, _V_NAMES)
    ]
    if any(len(p) != 1 for p in picked):
        return None
    return picked[0][0], picked[1][0], picked[2][0]


def _check_head_norms(module: nn.Module, path: str, linears: set[str], heads: Heads) -> None:
    """Refuse parameters in the attention other than its projections' and one head's norms."""
    for name, param in module.named_parameters():
        owner = name.rpartition(".")[0]
        if owner.partition(".")[0] in linears:
            continue
        # One norm's weights shared by every head (a direct child, as Qwen3's q_norm); a
        # ModuleList of norms per head (StableLM's qk_layernorm) would pair local heads with
        # the first heads' norms.
        if tuple(param.shape) != (heads.head_dim,) or "." in owner:
            across = param.dim() == 1 and param.numel() in {
                heads.heads * heads.head_dim,
                heads.kv_heads * heads.head_dim,
            }
            why = (
                "normalizes across all heads (it needs the whole query or key)"
                if across
                else "holds parameters per head or across heads that the split cannot place"
            )
            raise InvalidStrategyError(
                f"{path}.{name} (shape {list(param.shape)}) {why}; heads of {heads.head_dim} "
                "features each"
            )


def _mlp(
    module: nn.Module, path: str, linears: Mapping[str, nn.Linear], own: bool, found: _Found
) -> None:
    ins = sorted(set(linears) & _MLP_IN)
    outs = sorted(set(linears) & _MLP_OUT - set(ins))
    stray = sorted(set(linears) - set(ins) - set(outs))
    if not ins or len(outs) != 1 or stray:
        raise InvalidStrategyError(
            f"MLP {path} has no recognisable input and output projections among "
            f"{sorted(linears)}: inputs are among {', '.join(sorted(_MLP_IN))}, the one output "
            f"among {', '.join(sorted(_MLP_OUT))}"
        )
    out = linears[outs[0]]
    width = out.in_features
    for name in ins:
        linear = linears[name]
        count = FUSED_MLP_PARTS.get((type(module).__name__, name))
        if name == "gate_up_proj" and count is None:
            raise InvalidStrategyError(
                f"{path}.{name} ({type(module).__name__}.{name}) is a fused projection whose row "
                "layout is not known; the known fused MLP inputs: "
                f"{', '.join(f'{c}.{n}' for c, n in FUSED_MLP_PARTS)}"
            )
        parts = (linear.out_features // count,) * count if count else None
        expected = parts[0] if parts else linear.out_features
        if expected != width or linear.in_features != out.out_features:
            raise InvalidStrategyError(
                f"MLP {path}: {name} ({linear.in_features} -> {linear.out_features}) does not "
                f"feed {outs[0]} ({out.in_features} -> {out.out_features})"
            )
        found.styles[f"{path}.{name}"] = "colwise"
        if parts is not None:
            found.fused[f"{path}.{name}"] = parts
        found.sizes.append((f"{path}.{name}.out_features", width, f"the width of MLP {path}"))
    found.styles[f"{path}.{outs[0]}"] = "rowwise"
    if own:
        extra = [
            name for name, _ in module.named_parameters() if name.partition(".")[0] not in linears
        ]
        if extra:
            raise InvalidStrategyError(
                f"MLP {path} holds parameters besides its projections ({', '.join(extra)}): "
                "the derived plan splits an MLP of linear layers (no experts or routers)"
            )


def _vocabulary(model: nn.Module, found: _Found) -> None:
    """Split the token embedding and the LM head along the vocabulary."""
    paths = {id(module): path for path, module in model.named_modules()}
    transformers_model: Any = model
    try:
        embedding = transformers_model.get_input_embeddings()
        head = transformers_model.get_output_embeddings()
    except (AttributeError, NotImplementedError):  # a model without a token embedding
        return
    if isinstance(embedding, nn.Embedding) and id(embedding) in paths:
        found.styles[paths[id(embedding)]] = "vocab_embedding"
        found.sizes.append(("config.vocab_size", embedding.num_embeddings, "the vocabulary"))
    if isinstance(head, nn.Linear) and id(head) in paths:
        found.styles[paths[id(head)]] = "vocab_head"


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or "norm" in type(module).__name__.lower()


def _sequence(
    model: nn.Module, stack: str, block: nn.Module, attention: str, mlp: str
) -> tuple[SequencePatterns | None, str | None]:
    """The sequence-parallel patterns, or ``None`` and why there are none."""
    pattern = re.escape(stack) + r"\.\d+"
    if not mlp or "." in attention or "." in mlp:
        return None, (
            f"the attention and MLP of {stack}.0 are not both the block's own modules, so "
            "their inputs cannot be gathered as they start"
        )
    norms = []
    for name, child in block.named_children():
        if name in (attention, mlp):
            continue
        if _is_norm(child):
            norms.append(name)
        elif any(True for _ in child.parameters()):
            return None, (
                f"{stack}.0.{name} ({type(child).__name__}) holds parameters and is not a norm: "
                "it is not known to compute token by token on sequence shards"
            )
    parent_path = stack.rpartition(".")[0]
    parent = model.get_submodule(parent_path) if parent_path else model
    finals = [name for name, child in parent.named_children() if _is_norm(child)]
    prefix = f"{parent_path}." if parent_path else ""
    if len(finals) != 1:
        return None, (
            f"{parent_path or 'the model'} has {len(finals)} norms beside {stack} "
            f"({', '.join(finals) or 'none'}), not one final norm whose output to gather"
        )
    return (
        SequencePatterns(
            inputs=pattern + r"\." + f"(?:{re.escape(attention)}|{re.escape(mlp)})",
            norms=pattern + r"\." + f"(?:{'|'.join(re.escape(n) for n in norms)})",
            final_norm=re.escape(prefix + finals[0]),
        ),
        None,
    )
