"""One tensor-parallel shard of decoders without a family plan (the plan derived from their
module structure), captured on fake tensors."""

from typing import Any

import pytest

from ddlsim.data.specs.model import ModelSpec
from ddlsim.profiler.shard import ShardGraph, capture_shard


def _spec(cls: str, **config: Any) -> ModelSpec:
    dims = {
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "max_position_embeddings": 64,
    }
    return ModelSpec.from_dict(
        {
            "source": "transformers",
            "class": cls,
            "config": {**dims, **config},
            "inputs": {"batch_size": 1, "seq_len": 32},
        }
    )


QWEN2 = _spec("Qwen2ForCausalLM")
NEMOTRON = _spec("NemotronForCausalLM", head_dim=16)


def _mm_outputs(shard: ShardGraph, module_end: str) -> list[tuple[int, ...]]:
    return [
        node.outputs[0].shape
        for node in shard.graph.nodes
        if node.phase == "forward" and "mm" in node.op and node.module.endswith(module_end)
    ]


@pytest.mark.parametrize("spec", [QWEN2, NEMOTRON], ids=["qwen2", "nemotron"])
def test_two_way_shard_of_a_derived_plan(spec: ModelSpec) -> None:
    shard = capture_shard(spec, tp=2, micro_batch=2, seq_len=32)
    assert (shard.layers, shard.block, shard.tp) == (4, r"model\.layers\.\d+", 2)
    assert not [n for n in shard.graph.nodes if ".layers.1." in n.module]
    # 8 query heads of 16 and 2 key/value heads: 4 and 1 on each rank.
    assert _mm_outputs(shard, "self_attn.q_proj") == [(64, 64)]
    assert _mm_outputs(shard, "self_attn.k_proj") == [(64, 16)]
    assert _mm_outputs(shard, "self_attn.o_proj") == [(64, 128)]
    assert _mm_outputs(shard, "mlp.up_proj") == [(64, 192)]
    assert _mm_outputs(shard, "mlp.down_proj") == [(64, 128)]
    assert _mm_outputs(shard, "lm_head") == [(64, 256)]
    # Nemotron's squared-ReLU MLP has no gate.
    assert bool(_mm_outputs(shard, "mlp.gate_proj")) == (spec is QWEN2)


def test_shard_holds_what_dtensor_gives_a_rank() -> None:
    """The weights split on paper are the local shards the executor gives rank 0 under the
    derived plan (DTensor over a fake two-rank process group), fused Phi-3 included."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ddlsim.data.models import build_model
    from ddlsim.executor.tensor_parallel import apply_tensor_parallel
    from ddlsim.plans.tp_plans import tp_plan

    phi3 = _spec("Phi3ForCausalLM", pad_token_id=0)
    for spec in (QWEN2, NEMOTRON, phi3):
        one_block = ModelSpec.from_dict(
            {**spec.to_dict(), "config": {**spec.config, "num_hidden_layers": 1}}
        )
        shard = capture_shard(spec, tp=2, micro_batch=1, seq_len=32)
        on_paper = {p.name: p.numel for p in shard.graph.params}
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        try:
            model = build_model(one_block)
            apply_tensor_parallel(model, tp_plan(one_block), init_device_mesh("cpu", (2,)), 2)
            local = {
                name: (p.to_local() if isinstance(p, DTensor) else p).numel()
                for name, p in model.named_parameters()
            }
        finally:
            dist.destroy_process_group()
        assert on_paper == local, spec.cls
