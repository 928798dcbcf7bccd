"""GPU-grade plans (precision, recomputation, sequence parallelism, the distributed optimizer)
train as a single process of the same precision does, and what a device cannot run is refused
before any rank starts."""

import functools
from typing import Any

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.context import RankContext
from ddlsim.executor.plan import build_trainer, check_strategy
from ddlsim.executor.recompute import apply_recompute
from ddlsim.plans.feasibility import Target, check
from ddlsim.profiler.capture import capture_graph
from tests.executor.harness import (
    STEPS,
    Losses,
    assert_losses_match,
    make_context,
    run_trainer,
    train_steps,
)

GPT2 = ZOO["gpt2-tiny"].with_inputs(batch_size=4, seq_len=16)
LLAMA = ZOO["llama-tiny"].with_inputs(batch_size=4, seq_len=16)
# Tolerances: fp32 plans reduce in another order only; 16-bit ones round differently.
RTOL = {"fp32": 1e-5, "bf16": 2e-2, "fp16": 2e-2}


# The layers whose outputs say which precision a forward ran in: autocast runs them in 16 bits,
# FSDP2's policy gives them 16-bit parameters.
PROJECTIONS = (nn.Linear, Conv1D)
SIXTEEN_BITS = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}


class _Observed:
    """A trainer whose ``applied()`` also names the dtypes its projections' outputs had during
    its training steps (not while it was built: a pipeline stage runs a forward of its own then,
    to learn the shapes it sends, outside any step)."""

    def __init__(self, trainer: Any, dtypes: set[str], stepping: list[bool]) -> None:
        self.trainer, self.dtypes, self.stepping = trainer, dtypes, stepping

    def step(self) -> torch.Tensor:
        self.stepping[0] = True
        try:
            return self.trainer.step()
        finally:
            self.stepping[0] = False

    def finish(self) -> None:
        self.trainer.finish()

    def applied(self) -> dict[str, Any]:
        return {**self.trainer.applied(), "projection_dtypes": sorted(self.dtypes)}


def build_observed(ctx: RankContext, buckets: list[Any]) -> _Observed:
    """:func:`build_trainer`, with a forward hook on every projection of the model it builds."""
    dtypes: set[str] = set()
    stepping = [False]
    build_model = ctx.build_model

    def record(module: nn.Module, inputs: Any, out: torch.Tensor) -> None:
        if stepping[0]:
            dtypes.add(str(out.dtype))

    def observed_model() -> nn.Module:
        model = build_model()
        for module in model.modules():
            if isinstance(module, PROJECTIONS):
                module.register_forward_hook(record)
        return model

    ctx.build_model = observed_model  # type: ignore[method-assign]
    return _Observed(build_trainer(ctx, buckets), dtypes, stepping)


def single_losses(spec: Any, strategy: Strategy, steps: int = STEPS) -> Losses:
    """One process of the strategy's precision on the whole batch (the reference)."""
    ctx = make_context(0, 1, spec, strategy, seed=0)
    return train_steps(ctx, functools.partial(build_observed, buckets=[]), steps)


def _distributed(spec: Any, raw: dict[str, Any], world_size: int = 2) -> list[Losses]:
    strategy = Strategy.from_dict(raw)
    buckets = check_strategy(spec, strategy, world_size, capture_graph(spec))
    return run_trainer(
        world_size, functools.partial(build_observed, buckets=buckets), spec, strategy
    )


PLANS: dict[str, tuple[Any, ...]] = {
    "ddp-bf16": (GPT2, {"precision": "bf16"}),
    "ddp-fp16-scaled": (GPT2, {"precision": "fp16"}),
    "fsdp-bf16-full-recompute": (
        GPT2,
        {"parallel": {"fsdp": True, "recompute": "full"}, "precision": "bf16"},
    ),
    "tp2-sequence-parallel": (GPT2, {"parallel": {"tp": 2, "sequence_parallel": True}}),
    "tp2-sequence-parallel-llama": (
        LLAMA,
        {"parallel": {"tp": 2, "sequence_parallel": True, "recompute": "selective"}},
    ),
    "tp2-fsdp-2d": (GPT2, {"parallel": {"tp": 2, "fsdp": True}}, 4),
    "tp2-sp-fsdp-bf16": (
        GPT2,
        {"parallel": {"tp": 2, "fsdp": True, "sequence_parallel": True}, "precision": "bf16"},
        4,
    ),
    "pp2-bf16": (GPT2, {"parallel": {"pp": 2, "micro_batches": 2}, "precision": "bf16"}),
    "distributed-optimizer": (GPT2, {"parallel": {"distributed_optimizer": True}}),
    "distributed-optimizer-bf16": (
        GPT2,
        {"parallel": {"distributed_optimizer": True, "micro_batches": 2}, "precision": "bf16"},
    ),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_losses_match_a_single_process_of_the_same_precision(name: str) -> None:
    spec, raw, *ranks = PLANS[name]
    strategy = Strategy.from_dict(raw)
    results = _distributed(spec, raw, *ranks)
    reference = single_losses(spec, Strategy(precision=strategy.precision))
    for result in results:
        assert_losses_match(result.losses, reference.losses, rtol=RTOL[strategy.precision])
    # Every rank and the reference ran their projections in the strategy's precision (a loss
    # threshold against fp32 would not prove it: how far 16-bit losses drift depends on the
    # CPU's kernels, 2e-6 relative on an AVX2-only host).
    for result in (reference, *results):
        assert result.applied["projection_dtypes"] == [SIXTEEN_BITS[strategy.precision]]
    applied = results[0].applied
    if strategy.parallel.sequence_parallel:
        assert applied["sequence_parallel"] is True
        assert "reduce_scatter:tp" in applied["collectives"]
    if strategy.parallel.distributed_optimizer:
        assert applied["plan"] == "distributed_optimizer"
        assert applied["collectives"] == ["reduce_scatter", "all_gather"]


@pytest.mark.parametrize("mode", ["full", "selective", "selective_op"])
def test_recomputation_changes_memory_not_results(mode: str) -> None:
    plain = single_losses(GPT2, Strategy()).losses
    recomputed = Strategy.from_dict({"parallel": {"recompute": mode}})
    assert_losses_match(single_losses(GPT2, recomputed).losses, plain, rtol=1e-6)


def test_full_recomputation_runs_each_block_forward_twice() -> None:
    ctx = make_context(0, 1, GPT2, Strategy(), seed=0)
    model = ctx.build_model()
    paths = apply_recompute(model, "full")
    assert paths == [f"transformer.h.{i}" for i in range(len(paths))]
    calls = []
    attention = model.get_submodule(f"{paths[0]}.attn")
    attention.register_forward_hook(lambda *a: calls.append(1))
    from ddlsim.executor.context import local_loss

    local_loss(model, ctx.global_batch).backward()
    assert len(calls) == 2  # the forward, then again before its backward


def test_selective_recomputation_keeps_the_projections() -> None:
    """Megatron's selective recomputation saves the projections' outputs: the attention's
    matmuls are not run again, its softmax is."""
    ctx = make_context(0, 1, GPT2, Strategy(), seed=0)
    model = ctx.build_model()
    apply_recompute(model, "selective")
    from torch.utils.flop_counter import FlopCounterMode

    from ddlsim.executor.context import local_loss

    plain = ctx.build_model()
    counted = []
    for candidate in (plain, model):
        with FlopCounterMode(display=False) as counter:
            local_loss(candidate, ctx.global_batch).backward()
        counted.append(counter.get_total_flops())
    # The recomputed attention core (scores and their product with the values) costs a little
    # more than plain; whole projections again would cost far more.
    assert counted[0] <= counted[1] < counted[0] * 1.1


@pytest.mark.parametrize(
    ("raw", "device", "message"),
    [
        ({"precision": "fp8"}, "cpu", "fp8' needs a GPU with fp8"),
        ({"precision": "fp16", "parallel": {"fsdp": True}}, "cpu", "needs a gradient scaler"),
        ({"parallel": {"tp": 2, "async_tp": True}}, "cpu", "async_tp is priced by the simul"),
        ({"precision": "fp16", "parallel": {"tp": 2}}, "cpu", r"parallel.tp > 1 runs bf16"),
    ],
)
def test_what_the_device_cannot_run_is_refused_by_name(
    raw: dict[str, Any], device: str, message: str
) -> None:
    with pytest.raises(InvalidStrategyError, match=message):
        check(GPT2, Strategy.from_dict(raw), Target(world_size=2, where=device, device=device))


@pytest.mark.parametrize(
    ("spec", "raw", "message"),
    [
        (
            ZOO["bert-tiny"],
            {"parallel": {"tp": 2, "sequence_parallel": True}},
            "no plan for the bert family",
        ),
        (
            GPT2.with_inputs(batch_size=4, seq_len=15),
            {"parallel": {"tp": 2, "sequence_parallel": True}},
            r"seq_len\(15\)",
        ),
        (
            GPT2,
            {"parallel": {"tp": 2, "distributed_optimizer": True}},
            "distributed_optimizer runs over data parallelism alone",
        ),
        (ZOO["mlp"], {"parallel": {"recompute": "selective"}}, "have no attention module"),
    ],
)
def test_plans_the_model_cannot_take_are_refused(
    spec: Any, raw: dict[str, Any], message: str
) -> None:
    strategy = Strategy.from_dict(raw)
    with pytest.raises(InvalidStrategyError, match=message):
        check_strategy(spec, strategy, 2, capture_graph(spec))


def test_fp16_scaler_skips_an_overflowing_step() -> None:
    ctx = make_context(0, 1, GPT2, Strategy(precision="fp16"), seed=0)
    assert ctx.precision.scaler is not None
    assert ctx.precision.dtype == torch.float16


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16_bit_projections_round_their_weight_gradients(precision: str) -> None:
    """Under autocast a projection's weight gradient is computed in 16 bits and only then cast
    to the fp32 parameter's dtype: every value is one the 16-bit type holds exactly. In fp32
    most are not (the check can fail)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    rounded = {}
    for name in ("fp32", precision):
        ctx = make_context(0, 1, GPT2, Strategy(precision=name), seed=0)
        model = ctx.build_model()
        ctx.loss(model, ctx.global_batch).backward()
        weight = next(m.weight for m in model.modules() if isinstance(m, PROJECTIONS))
        assert weight.dtype == torch.float32 and weight.grad is not None
        grad = weight.grad
        rounded[name] = bool(torch.equal(grad, grad.to(dtype).to(torch.float32)))
    assert rounded == {"fp32": False, precision: True}
