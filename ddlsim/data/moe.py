"""Mixtures of experts as transformers builds them: what a config says of its experts, where a
built model keeps them, and the experts' forward every ddlsim build uses.

transformers stores a layer's routed experts as one module of fused 3-D parameters
(``gate_up_proj`` ``[experts, 2 x intermediate, hidden]`` and ``down_proj`` ``[experts,
hidden, intermediate]`` in Mixtral, Qwen3-MoE and DeepSeek-V3; GPT-OSS transposed, with
biases), beside a router (``gate``: a ``[experts, hidden]`` weight, top-k) and, in DeepSeek-V3,
shared experts and dense first layers. Its default forward calls torch's grouped GEMM, whose
fake kernel takes bf16 only: a model that trains in fp32 could not be captured ("Expected inputs
of BF16"). ddlsim builds every such model with :func:`grouped_experts_forward` (registered with
transformers' experts interface as :data:`EXPERTS_IMPLEMENTATION`): token copies sorted by
expert (the dispatch), each expert's matmuls over its own tokens (torch's grouped GEMM in bf16,
transformers' own per-expert loop op in every other dtype, real or fake), the outputs weighted
and summed back onto their tokens (the combine). Shapes stay static, so a capture records it.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

EXPERTS_IMPLEMENTATION = "ddlsim_grouped"
# A config's count of routed experts, by the name each family gives it.
_EXPERT_COUNT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts")
_INTERMEDIATE_KEYS = ("moe_intermediate_size", "intermediate_size")


@dataclasses.dataclass(frozen=True, slots=True)
class ExpertsShape:
    """A config's routed experts: how many, how many a token takes, each one's hidden width."""

    experts: int
    top_k: int
    intermediate: int


def experts_shape(config: Any) -> ExpertsShape | None:
    """The routed experts a transformers config (or its dict) declares; ``None`` for a dense
    model."""
    values = config if isinstance(config, dict) else vars(config)
    ints = {key: value for key, value in values.items() if isinstance(value, int)}
    experts = next((ints[k] for k in _EXPERT_COUNT_KEYS if k in ints), 0)
    top_k = ints.get("num_experts_per_tok", 0)
    if not experts or not top_k:
        return None
    intermediate = next((ints[k] for k in _INTERMEDIATE_KEYS if k in ints), 0)
    return ExpertsShape(experts=experts, top_k=top_k, intermediate=intermediate)


def is_experts(module: nn.Module) -> bool:
    """Whether ``module`` holds a layer's routed experts as fused 3-D parameters."""
    weight = getattr(module, "gate_up_proj", None)
    if weight is None:
        weight = getattr(module, "up_proj", None)
    return (
        isinstance(weight, nn.Parameter)
        and weight.dim() == 3
        and isinstance(getattr(module, "down_proj", None), nn.Parameter)
    )


def experts_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Every routed-experts module of ``model`` by its path, in model order."""
    return {name: module for name, module in model.named_modules() if is_experts(module)}


def _grouped_linear(
    tokens: torch.Tensor,
    weight: torch.Tensor,
    offsets: torch.Tensor,
    *,
    transposed: bool,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """Each expert's linear layer over its run of ``tokens`` (sorted by expert, runs ending at
    ``offsets``). Shapes: tokens ``[S, in]``; weight ``[experts, out, in]`` (``[experts, in,
    out]`` transposed); bias ``[S, out]`` (each token's expert's)."""
    grouped = weight if transposed else weight.transpose(-2, -1)
    if grouped.dtype == torch.bfloat16 and hasattr(torch.nn.functional, "grouped_mm"):
        out = torch.nn.functional.grouped_mm(tokens.to(grouped.dtype), grouped, offs=offsets)
    else:
        out = torch.ops.transformers.grouped_mm_fallback(
            tokens.to(grouped.dtype), grouped.contiguous(), offs=offsets
        )
    return out if bias is None else out + bias


def run_experts(
    module: Any, tokens: torch.Tensor, expert_ids: torch.Tensor, counts: torch.Tensor
) -> torch.Tensor:
    """Each expert of ``module`` on its run of ``tokens`` (sorted by expert: ``counts[e]`` rows
    of expert ``e``, ``expert_ids`` each row's, for the biases): up (and gate), the activation,
    down. Shapes: tokens ``[S, hidden]``; expert_ids ``[S]``; counts ``[experts]``; returns
    ``[S, hidden]``."""
    offsets = torch.cumsum(counts, 0).to(torch.int32)
    transposed = bool(module.is_transposed)
    up = module.gate_up_proj if module.has_gate else module.up_proj
    up_bias = None
    if module.has_bias:
        up_bias = (module.gate_up_proj_bias if module.has_gate else module.up_proj_bias)[
            expert_ids
        ]
    inner = _grouped_linear(tokens, up, offsets, transposed=transposed, bias=up_bias)
    inner = module._apply_gate(inner) if module.has_gate else module.act_fn(inner)
    down_bias = module.down_proj_bias[expert_ids] if module.has_bias else None
    out = _grouped_linear(inner, module.down_proj, offsets, transposed=transposed, bias=down_bias)
    if module.has_post_expert_norm:
        out = module.post_expert_norm(out)
    return out


def grouped_experts_forward(
    self: Any,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """A layer's routed experts on its tokens: each token's copies sorted by expert (the
    dispatch), the experts run (:func:`run_experts`), the outputs weighted and summed onto
    their tokens (the combine). Shapes: hidden_states ``[T, hidden]``; top_k_index and
    top_k_weights ``[T, k]``; returns ``[T, hidden]``."""
    top_k = top_k_index.shape[-1]
    pair_expert = top_k_index.reshape(-1)
    order = torch.argsort(pair_expert, stable=True)
    token_of = order // top_k
    sorted_expert = pair_expert[order]
    counts = nn.functional.one_hot(sorted_expert, int(self.num_experts)).sum(0)
    out = run_experts(self, hidden_states[token_of], sorted_expert, counts)
    return combine(out, top_k_weights.reshape(-1)[order], token_of, hidden_states)


def combine(
    out: torch.Tensor, weights: torch.Tensor, token_of: torch.Tensor, like: torch.Tensor
) -> torch.Tensor:
    """Each token copy's output weighted by its router weight and summed onto its token.
    Shapes: out ``[S, hidden]``; weights and token_of ``[S]``; like ``[T, hidden]``."""
    weighted = out * weights.unsqueeze(-1).to(out.dtype)
    combined = torch.zeros_like(like, dtype=weighted.dtype)
    return combined.index_add(0, token_of, weighted).to(like.dtype)


def use_grouped_experts(config: Any) -> None:
    """Build the model of ``config`` with :func:`grouped_experts_forward` where it has routed
    experts (registered with transformers' experts interface once)."""
    if experts_shape(config) is None or not hasattr(config, "_experts_implementation"):
        return
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

    if EXPERTS_IMPLEMENTATION not in ALL_EXPERTS_FUNCTIONS:
        ExpertsInterface.register(EXPERTS_IMPLEMENTATION, grouped_experts_forward)
    config._experts_implementation = EXPERTS_IMPLEMENTATION


def expert_param_names(params: Sequence[Any], config: Any) -> frozenset[str]:
    """The routed experts' parameters among ``params`` (objects with ``name``, ``module`` and
    ``shape``, as a graph's :class:`~ddlsim.data.graph.format.ParamInfo`): those whose first
    dimension is the expert count in a module holding a 3-D such parameter (the fused
    projections, and GPT-OSS's per-expert biases beside them). Empty for a dense model.

    These are what expert parallelism splits over ``ep`` ranks, as the executor's
    ``shard_experts`` does, and what DDP leaves to the expert-data-parallel group."""
    shape = experts_shape(config)
    if shape is None:
        return frozenset()
    per_expert = [p for p in params if len(p.shape) >= 2 and p.shape[0] == shape.experts]
    fused = {p.module for p in per_expert if len(p.shape) == 3}
    return frozenset(p.name for p in per_expert if p.module in fused)
