"""The graph of one tensor-parallel shard of a large model, captured on fake tensors with one
repeated block: what a GPU cluster's simulator replicates per layer and per pipeline stage.

A 1T-parameter GPT never exists here: the model is built with one block on the meta device,
each split weight is replaced by its local shard (``tp`` ways, as Megatron-LM's column and row
parallel layers hold them: the family's plan in :data:`ddlsim.plans.tp_plans.PLANS`, or one
derived from the model's module structure), attention modules keep their local heads, and the
iteration runs on fake tensors, so the graph's ops have the shapes one GPU computes and no
memory is allocated. Collectives of the split are not in the graph: the
simulator adds them where the plan puts them.
"""

import dataclasses
from typing import Any

import torch
from torch import nn

from ddlsim.data.errors import InvalidModelSpecError, InvalidStrategyError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.limits import LAYER_KEYS, layer_key
from ddlsim.data.models import build_config
from ddlsim.data.specs.model import ModelSpec
from ddlsim.plans.tp_plans import (
    TensorParallelPlan,
    check_tensor_parallel,
    localize_attention,
    matches,
    tp_plan,
)
from ddlsim.profiler.capture import CaptureOptions, capture_graph

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    # fp8 training keeps activations and weights in bf16; only the GEMMs' inputs are cast.
    "fp8": torch.bfloat16,
}
ATTENTION_DROPOUT_KEYS = ("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob")


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class ShardGraph:
    """One shard's iteration with ``graph`` holding one block; ``layers`` is how many the model
    has; ``block`` is the plan's block pattern (``TensorParallelPlan.blocks``), which tells
    a node of the block from the model's other nodes (embeddings, head, loss)."""

    graph: IterationGraph
    layers: int
    block: str
    tp: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    micro_batch: int


def layer_count(spec: ModelSpec) -> tuple[str, int]:
    """The config key counting the model's blocks and its value.

    Raises:
        InvalidModelSpecError: when the config has none of :data:`LAYER_KEYS`.
    """
    found = layer_key(build_config(spec))
    if found is not None:
        return found
    raise InvalidModelSpecError(
        f"{spec.label} ({spec.cls}) has no layer count among {', '.join(LAYER_KEYS)}"
    )


def _config_keys(spec: ModelSpec) -> set[str]:
    return set(build_config(spec).to_dict())


def _width(config: Any, *keys: str) -> int:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    raise InvalidModelSpecError(f"config has none of {', '.join(keys)}")


def capture_shard(
    spec: ModelSpec, *, tp: int = 1, micro_batch: int, seq_len: int, dtype: str = "bf16"
) -> ShardGraph:
    """Capture one training iteration of one ``tp``-way shard of ``spec`` with one block, on
    a micro-batch of ``micro_batch`` sequences of ``seq_len`` tokens, weights and activations
    in ``dtype``.

    Raises:
        InvalidModelSpecError: when the spec is invalid or the model cannot run.
        InvalidStrategyError: when the model has no tensor-parallel plan (the reason named) or
            ``tp`` does not divide its heads, MLP width or vocabulary.
    """
    if dtype not in DTYPES:
        raise InvalidStrategyError(
            f"dtype {dtype!r} is not supported; allowed: {', '.join(DTYPES)}"
        )
    check_tensor_parallel(spec, tp)
    plan = tp_plan(spec)
    key, layers = layer_count(spec)
    config = {**spec.config, key: 1}
    if config.get("attn_implementation", "sdpa") != "eager":
        # On a GPU, SDPA's flash kernel applies attention dropout inside the kernel; the CPU's
        # flash kernel has none and falls back to the unfused math path in fp32, which is not
        # what a GPU runs: record the kernel without the dropout instead.
        config.update({k: 0.0 for k in ATTENTION_DROPOUT_KEYS if k in _config_keys(spec)})
    one_block = dataclasses.replace(
        spec.with_inputs(batch_size=micro_batch, seq_len=seq_len), config=config
    )
    torch_dtype = DTYPES[dtype]

    def prepare(model: nn.Module) -> None:
        _shard(model, tp, plan, torch_dtype)
        if tp > 1 and "vocab_head" in plan.modules.values():
            # The loss views the logits as rows of config.vocab_size columns (or of the
            # model's own vocab_size, Nemotron): the local ones, as a vocabulary-parallel cross
            # entropy computes them.
            config: Any = model.config
            config.vocab_size //= tp
            root: Any = model
            if isinstance(getattr(root, "vocab_size", None), int):
                root.vocab_size //= tp

    graph = capture_graph(one_block, CaptureOptions(), prepare=prepare)
    config = build_config(spec)
    return ShardGraph(
        graph=graph,
        layers=layers,
        block=plan.blocks,
        tp=tp,
        hidden=_width(config, "hidden_size", "n_embd", "d_model"),
        heads=_width(config, "num_attention_heads", "n_head", "num_heads"),
        vocab=_width(config, "vocab_size"),
        seq_len=seq_len,
        micro_batch=micro_batch,
    )


def _shard(model: nn.Module, tp: int, plan: TensorParallelPlan, dtype: torch.dtype) -> None:
    """Replace each weight of ``model`` by its local ``1/tp`` shard where split, all of them in
    ``dtype`` (fake tensors); tied weights stay tied."""
    from transformers.pytorch_utils import Conv1D

    new: dict[int, nn.Parameter] = {}

    def local(param: nn.Parameter, dim: int | None) -> nn.Parameter:
        if id(param) not in new:
            shape = list(param.shape)
            if dim is not None:
                shape[dim] //= tp
            new[id(param)] = nn.Parameter(
                torch.empty(shape, dtype=dtype, device=param.device),
                requires_grad=param.requires_grad,
            )
        return new[id(param)]

    for path, module in model.named_modules():
        style = next((s for pattern, s in plan.modules.items() if matches(pattern, path)), None)
        if tp > 1 and matches(plan.attention, path):
            localize_attention(module, plan, tp)
        if style is None or tp == 1:
            for key, param in module._parameters.items():
                if param is not None:
                    module._parameters[key] = local(param, None)
            continue
        # Linear and Embedding keep outputs (or rows) on dim 0; Conv1D keeps them on dim 1.
        out_dim, in_dim = (1, 0) if isinstance(module, Conv1D) else (0, 1)
        if style in {"colwise", "vocab_head", "head_embedding"}:
            module.weight = local(module.weight, out_dim)
            if getattr(module, "bias", None) is not None:
                module.bias = local(module.bias, 0)
        elif style == "rowwise":
            module.weight = local(module.weight, in_dim)
        elif style == "vocab_embedding":
            module.weight = local(module.weight, 0)
        for key, param in module._parameters.items():
            if param is not None and param.dtype != dtype:
                module._parameters[key] = local(param, None)
        if isinstance(module, Conv1D):
            module.nf = module.weight.shape[1]
            module.nx = module.weight.shape[0]
        for attribute, dim in (("out_features", 0), ("in_features", 1), ("num_embeddings", 0)):
            if hasattr(module, attribute):
                setattr(module, attribute, module.weight.shape[dim])
