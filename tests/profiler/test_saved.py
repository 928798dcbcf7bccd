"""What a model's forward keeps for backward, by module, on fake tensors: the same bytes autograd
saves on real ones; and the modules whose saved tensors tensor parallelism splits."""

import pytest
import torch

from ddlsim.data.models import build_model, make_batch, training_loss
from ddlsim.data.zoo import resolve_model
from ddlsim.plans.tp_activations import activation_split_paths
from ddlsim.profiler.saved import saved_bytes


def _real_saved_bytes(name: str) -> int:
    """The storages autograd saves in a real forward of the zoo model, parameters left out."""
    spec = resolve_model(name)
    model = build_model(spec)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    batch = make_batch(spec, model)
    params = {id(p) for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        base = tensor._base if tensor._base is not None else tensor
        if id(tensor) not in params and id(base) not in params:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = training_loss(model, batch)
    del loss
    return sum(storages.values())


def test_fake_tensors_save_what_real_ones_do() -> None:
    assert sum(saved_bytes(resolve_model("mlp")).values()) == _real_saved_bytes("mlp")
    # A transformer's: within one activation of 128 KiB in 16 MB (a tensor the fake run keeps
    # apart that the real one shares).
    fake = sum(saved_bytes(resolve_model("gpt2-tiny")).values())
    assert fake == pytest.approx(_real_saved_bytes("gpt2-tiny"), rel=0.01)


def test_saved_bytes_are_attributed_to_the_module_that_saved_them() -> None:
    by_module = saved_bytes(resolve_model("gpt2-tiny"))
    # Each block's MLP activation (GPT-2's tanh GELU, four ops that each keep an input) keeps
    # four tensors of batch x seq x 4 x hidden floats, the same in every block.
    spec = resolve_model("gpt2-tiny")
    wide = 4 * 128  # gpt2-tiny's n_embd 128, MLP four times wider
    tokens = spec.inputs.batch_size * (spec.inputs.seq_len or 0)
    assert by_module["transformer.h.0.mlp.act"] == 4 * tokens * wide * 4
    assert by_module["transformer.h.0.mlp.act"] == by_module["transformer.h.1.mlp.act"]
    # The loss (at the model's root) keeps its log-probabilities: the largest saved tensor.
    assert by_module[""] == max(by_module.values())


def test_tensor_parallelism_splits_the_inside_of_attention_and_mlp() -> None:
    split = activation_split_paths(resolve_model("gpt2-tiny"))
    assert {
        "transformer.h.0.attn",
        "transformer.h.0.attn.c_proj",
        "transformer.h.0.mlp.act",
    } <= split
    # The inputs of the column-split projections and the norms stay whole.
    assert not {"transformer.h.0.attn.c_attn", "transformer.h.0.ln_1", "lm_head"} & split
    assert activation_split_paths(resolve_model("mlp")) == frozenset()
