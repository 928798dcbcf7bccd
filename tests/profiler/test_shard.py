import pytest

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.profiler.shard import capture_shard

GPT = ModelSpec.from_dict(
    {
        "source": "transformers",
        "class": "GPT2LMHeadModel",
        "config": {"n_embd": 64, "n_head": 4, "n_layer": 6, "n_positions": 64, "vocab_size": 256},
        "inputs": {"batch_size": 1, "seq_len": 32},
    }
)
LLAMA = ModelSpec.from_dict(
    {
        "source": "transformers",
        "class": "LlamaForCausalLM",
        "config": {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "num_hidden_layers": 3,
            "vocab_size": 256,
            "max_position_embeddings": 64,
        },
        "inputs": {"batch_size": 1, "seq_len": 32},
    }
)


def _mm_outputs(shard, module_end: str) -> list[tuple[int, ...]]:  # type: ignore[no-untyped-def]
    return [
        node.outputs[0].shape
        for node in shard.graph.nodes
        if node.phase == "forward" and "mm" in node.op and node.module.endswith(module_end)
    ]


def test_one_block_of_a_two_way_shard() -> None:
    whole = capture_shard(GPT, tp=1, micro_batch=2, seq_len=32, dtype="bf16")
    half = capture_shard(GPT, tp=2, micro_batch=2, seq_len=32, dtype="bf16")
    assert (whole.layers, half.layers, half.block) == (6, 6, r"h\.\d+")
    # One block captured: no node under block 1.
    assert not [n for n in half.graph.nodes if ".h.1." in n.module]
    # Column-parallel QKV and MLP-in keep half their outputs, row-parallel outputs stay whole.
    assert _mm_outputs(whole, "attn.c_attn") == [(64, 192)]
    assert _mm_outputs(half, "attn.c_attn") == [(64, 96)]
    assert _mm_outputs(half, "mlp.c_fc") == [(64, 128)]
    assert _mm_outputs(half, "mlp.c_proj") == [(64, 64)]
    # The vocabulary-parallel head: half the logits.
    assert _mm_outputs(half, "lm_head") == [(64, 128)]
    dtypes = {n.outputs[0].dtype for n in half.graph.nodes if "mm" in n.op and n.outputs}
    assert dtypes == {"bfloat16"}
    block_params = sum(p.numel for p in half.graph.params if ".h.0." in p.module)
    whole_params = sum(p.numel for p in whole.graph.params if ".h.0." in p.module)
    assert whole_params / 2 < block_params < whole_params  # norms and row biases stay whole


def test_llama_shard_keeps_head_size() -> None:
    shard = capture_shard(LLAMA, tp=2, micro_batch=1, seq_len=32)
    assert _mm_outputs(shard, "q_proj") == [(32, 32)]
    assert _mm_outputs(shard, "k_proj") == [(32, 16)]
    assert _mm_outputs(shard, "down_proj") == [(32, 64)]
    assert shard.heads == 4 and shard.hidden == 64


def test_split_that_does_not_divide_is_refused() -> None:
    with pytest.raises(InvalidStrategyError, match=r"n_head\(4\) .* not divisible by tp\(8\)"):
        capture_shard(GPT, tp=8, micro_batch=1, seq_len=32)
    with pytest.raises(InvalidStrategyError, match="dtype 'int8' is not supported"):
        capture_shard(GPT, tp=1, micro_batch=1, seq_len=32, dtype="int8")


def test_shard_holds_what_dtensor_gives_a_rank() -> None:
    """The weights split on paper are the local shards the executor's tensor parallelism
    (DTensor over a fake two-rank process group) gives rank 0, parameter for parameter."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ddlsim.data.models import build_model
    from ddlsim.executor.tensor_parallel import apply_tensor_parallel
    from ddlsim.plans.tp_plans import PLANS

    for spec, family in ((GPT, "gpt2"), (LLAMA, "llama")):
        one_block = spec.with_inputs(batch_size=1)
        key = "n_layer" if family == "gpt2" else "num_hidden_layers"
        one_block = type(spec).from_dict(
            {**one_block.to_dict(), "config": {**spec.config, key: 1}}
        )
        shard = capture_shard(spec, tp=2, micro_batch=1, seq_len=32)
        on_paper = {p.name: p.numel for p in shard.graph.params}
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        try:
            model = build_model(one_block)
            mesh = init_device_mesh("cpu", (2,))
            apply_tensor_parallel(model, PLANS[family], mesh, 2)
            local = {
                name: (p.to_local() if isinstance(p, DTensor) else p).numel()
                for name, p in model.named_parameters()
            }
        finally:
            dist.destroy_process_group()
        assert on_paper == local, family
