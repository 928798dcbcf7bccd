"""``ddlsim run`` launches what the executor newly runs, through the launcher and the feasibility
check, on real ranks: expert parallelism on a mixture of experts captured in fp32 (it failed
with "Expected inputs of BF16" before), context parallelism and ZeRO-1 on a decoder."""

import pytest

from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.run import RunOptions, run_training
from tests.executor.harness import assert_losses_match, reference_losses

MIXTRAL = ZOO["mixtral-tiny"].with_inputs(batch_size=8, seq_len=16)
LLAMA = ZOO["llama-tiny"].with_inputs(batch_size=4, seq_len=16)


@pytest.mark.parametrize(
    ("spec", "raw", "plan"),
    [
        (MIXTRAL, {"parallel": {"ep": 2}}, "expert_parallel"),
        (LLAMA, {"parallel": {"cp": 2, "cp_comm": "all_gather"}}, "context_parallel"),
        (LLAMA, {"parallel": {"zero": 1}}, "zero1"),
    ],
)
def test_run_launches_the_plan_and_trains_as_one_process(spec, raw, plan) -> None:  # type: ignore[no-untyped-def]
    options = RunOptions(world_size=2, iters=2, warmup=1, budget_s=0)
    result = run_training(spec, Strategy.from_dict(raw), options)
    assert result.applied["plan"] == plan
    steps = len(result.losses)
    assert_losses_match(result.losses, reference_losses(spec, steps), rtol=1e-5)
