"""Mixtures of experts as ddlsim builds them: the experts a config declares, where a model
keeps them, and the experts' forward that replaces transformers' grouped GEMM."""

from typing import Any

import pytest
import torch

from ddlsim.data.models import build_model, make_batch
from ddlsim.data.moe import EXPERTS_IMPLEMENTATION, experts_modules, experts_shape
from ddlsim.data.zoo import ZOO

MOE_TINY = ("mixtral-tiny", "qwen3-moe-tiny", "gpt-oss-tiny", "deepseek-v3-tiny")


def test_a_config_names_its_experts_by_its_familys_key() -> None:
    assert experts_shape(ZOO["mixtral-tiny"].config) == experts_shape(
        {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 128}
    )
    shape = experts_shape(ZOO["deepseek-v3-tiny"].config)
    assert shape is not None and (shape.experts, shape.top_k, shape.intermediate) == (8, 2, 32)
    assert experts_shape(ZOO["llama-tiny"].config) is None
    assert experts_shape({"num_local_experts": 4}) is None  # no top-k: not a routed MoE


@pytest.mark.parametrize("name", MOE_TINY)
def test_the_grouped_forward_computes_what_transformers_own_loop_does(name: str) -> None:
    model = build_model(ZOO[name], seed=3)
    config: Any = model.config
    assert config._experts_implementation == EXPERTS_IMPLEMENTATION
    experts = experts_modules(model)
    # DeepSeek-V3's first layer is dense; every other layer has routed experts
    layers = config.num_hidden_layers
    assert len(experts) == layers - (1 if name == "deepseek-v3-tiny" else 0)
    batch = make_batch(ZOO[name], model, seed=1)

    def loss_and_grads() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return loss.detach(), grads

    ours, our_grads = loss_and_grads()
    config._experts_implementation = "eager"  # transformers' loop over the experts
    theirs, their_grads = loss_and_grads()
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert our_grads.keys() == their_grads.keys()
    for key, grad in our_grads.items():
        assert torch.allclose(grad, their_grads[key], rtol=1e-4, atol=1e-6), key


@pytest.mark.parametrize("name", MOE_TINY)
def test_the_expert_parameters_are_those_expert_parallelism_splits(name: str) -> None:
    from ddlsim.data.graph.format import ParamInfo
    from ddlsim.data.moe import expert_param_names

    model = build_model(ZOO[name], seed=0)
    params = [
        ParamInfo(
            name=n,
            module=n.rpartition(".")[0],
            shape=tuple(p.shape),
            dtype="float32",
            numel=p.numel(),
            nbytes=p.numel() * 4,
        )
        for n, p in model.named_parameters()
    ]
    shape = experts_shape(model.config)
    assert shape is not None
    # what the executor's shard_experts keeps 1 / ep of: every per-expert tensor of an
    # experts module (GPT-OSS's biases too), never the router's [experts, hidden] weight
    expected = {
        f"{path}.{n}"
        for path, module in experts_modules(model).items()
        for n, p in module.named_parameters(recurse=False)
        if p.dim() >= 2 and p.shape[0] == shape.experts
    }
    assert expert_param_names(params, model.config) == expected
    assert not any(".gate.weight" in n or "router" in n for n in expected)
    assert expert_param_names(params, ZOO["llama-tiny"].config) == frozenset()
