"""The executor on CUDA: refusals anywhere, real runs where a GPU is present (``-m gpu``)."""

import pytest
import torch

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.run import RunOptions, run_training
from tests.executor.harness import assert_losses_match, reference_losses

MLP = ZOO["mlp"].with_inputs(batch_size=16)
GPT2 = ZOO["gpt2-tiny"].with_inputs(batch_size=4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device": "tpu"}, r"device 'tpu' is not supported; allowed: cpu, cuda"),
        ({"backend": "mpi"}, r"backend 'mpi' is not supported; allowed: gloo, nccl"),
        ({"backend": "nccl"}, r"backend 'nccl' needs device 'cuda', got device 'cpu'"),
    ],
)
def test_bad_device_options_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        RunOptions(world_size=2, **kwargs)


def test_backend_follows_the_device() -> None:
    assert RunOptions(world_size=2).resolved_backend == "gloo"
    assert RunOptions(world_size=2, device="cuda").resolved_backend == "nccl"
    assert RunOptions(world_size=2, device="cuda", backend="gloo").resolved_backend == "gloo"


def test_cuda_without_a_gpu_is_refused_before_any_rank_starts() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(InvalidOptionError, match="torch sees no CUDA device"):
        run_training(MLP, Strategy(), RunOptions(device="cuda"))


def test_nccl_needs_a_gpu_per_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(InvalidOptionError, match=r"world_size\(2\) > 1 GPU\(s\) here"):
        run_training(MLP, Strategy(), RunOptions(world_size=2, device="cuda"))
    # gloo lets two ranks share the one GPU: refused only later, by the missing GPU itself.
    RunOptions(world_size=2, device="cuda", backend="gloo").check_devices()
    # Under an external launcher only this node's ranks need this node's GPUs.
    RunOptions(world_size=16, device="cuda").check_devices(ranks_here=1)
    with pytest.raises(InvalidOptionError, match=r"2 rank\(s\) of this node > 1 GPU"):
        RunOptions(world_size=16, device="cuda").check_devices(ranks_here=2)


@pytest.mark.gpu
def test_one_rank_on_cuda_matches_the_cpu_reference() -> None:
    result = run_training(GPT2, Strategy(), RunOptions(device="cuda", iters=3, warmup=2))
    assert result.applied["plan"] == "single"
    assert result.applied["device"] == torch.cuda.get_device_name(0)
    # cuBLAS and the CPU's BLAS sum in other orders: equal to float32 rounding, not bit for bit.
    assert_losses_match(result.losses, reference_losses(GPT2, steps=5), rtol=1e-4)
    (peak,) = result.peak_memory_bytes
    assert 0 < peak < torch.cuda.get_device_properties(0).total_memory


@pytest.mark.gpu
@pytest.mark.parametrize(
    "strategy",
    [
        {},
        {"tensor_fusion": {"bucket_cap_mb": 0.5, "implementation": "hooks"}},
        {"tensor_fusion": {"bucket_cap_mb": 0.5, "dear": True}},
    ],
    ids=["ddp", "hooks", "dear"],
)
def test_two_ranks_on_cuda_match_one(strategy: dict) -> None:
    # One GPU is enough: gloo (unlike NCCL) lets both ranks share it.
    backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    options = RunOptions(world_size=2, device="cuda", backend=backend, iters=3, warmup=2)
    result = run_training(GPT2, Strategy.from_dict(strategy), options)
    single = run_training(GPT2, Strategy(), RunOptions(device="cuda", iters=3, warmup=2))
    assert result.applied["backend"] == backend
    assert_losses_match(result.losses, single.losses, rtol=1e-5)


@pytest.mark.gpu
def test_compiled_blocks_on_cuda_match_eager() -> None:
    strategy = Strategy.from_dict({"op_fusion": {"compiled": ["transformer.h.0"]}})
    options = RunOptions(device="cuda", iters=3, warmup=2)
    compiled = run_training(GPT2, strategy, options)
    eager = run_training(GPT2, Strategy(), options)
    assert compiled.applied["compiled_graphs"] >= 1
    assert compiled.compile_time_s is not None
    # Inductor's fused kernels reorder float32 sums.
    assert_losses_match(compiled.losses, eager.losses, rtol=1e-4)
