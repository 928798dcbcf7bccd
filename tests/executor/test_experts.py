"""Expert parallelism trains as one process does: each rank holds its share of the experts and
exchanges tokens (all-to-all or all-gather), two MoE families, two and four ranks."""

import pytest

from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.plan import build_trainer
from tests.executor.harness import (
    STEPS,
    assert_losses_match,
    reference_losses,
    run_trainer,
)

MIXTRAL = ZOO["mixtral-tiny"].with_inputs(batch_size=8, seq_len=16)
QWEN3 = ZOO["qwen3-moe-tiny"].with_inputs(batch_size=8, seq_len=16)


@pytest.mark.parametrize(
    ("spec", "world_size", "ep", "dispatcher", "fsdp"),
    [
        (MIXTRAL, 2, 2, "all_to_all", False),
        (MIXTRAL, 4, 2, "all_to_all", False),
        (QWEN3, 4, 4, "all_to_all", False),
        (QWEN3, 2, 2, "all_gather", False),
        (MIXTRAL, 4, 4, "all_gather", False),
        (MIXTRAL, 2, 2, "all_to_all", True),
        (QWEN3, 4, 2, "all_to_all", True),
        (MIXTRAL, 4, 2, "all_gather", True),
        (QWEN3, 4, 4, "all_to_all", True),
    ],
)
def test_expert_parallel_training_matches_one_process(
    spec: ModelSpec, world_size: int, ep: int, dispatcher: str, fsdp: bool
) -> None:
    raw = {"parallel": {"ep": ep, "dispatcher": dispatcher, "fsdp": fsdp}}
    strategy = Strategy.from_dict(raw)
    results = run_trainer(world_size, build_trainer_of, spec, strategy)
    want = reference_losses(spec, STEPS)
    for result in results:
        assert result.applied["ep"] == ep and result.applied["edp"] == world_size // ep
        assert result.applied["plan"] == ("expert_parallel_fsdp" if fsdp else "expert_parallel")
        assert_losses_match(result.losses, want, rtol=1e-5)


def build_trainer_of(ctx):  # type: ignore[no-untyped-def]
    return build_trainer(ctx, [])


@pytest.mark.parametrize("fsdp", [False, True])
def test_micro_batches_accumulate_the_experts_gradients_once(fsdp: bool) -> None:
    raw = {"parallel": {"ep": 2, "fsdp": fsdp, "micro_batches": 2}}
    results = run_trainer(4, build_trainer_of, MIXTRAL, Strategy.from_dict(raw))
    want = reference_losses(MIXTRAL, STEPS)
    for result in results:
        assert_losses_match(result.losses, want, rtol=1e-5)
