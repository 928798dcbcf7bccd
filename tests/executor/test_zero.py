"""ZeRO-1 (optimizer states sharded over the data-parallel ranks) and ZeRO-2 (gradients too)
train a decoder as one process does."""

import pytest

from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.plan import build_trainer
from tests.executor.harness import STEPS, assert_losses_match, reference_losses, run_trainer

LLAMA = ZOO["llama-tiny"].with_inputs(batch_size=4, seq_len=16)


def _build(ctx):  # type: ignore[no-untyped-def]
    return build_trainer(ctx, [])


@pytest.mark.parametrize(("zero", "world_size"), [(1, 2), (1, 4), (2, 2), (2, 4)])
def test_zero_matches_one_process(zero: int, world_size: int) -> None:
    strategy = Strategy.from_dict({"parallel": {"zero": zero}})
    results = run_trainer(world_size, _build, LLAMA, strategy)
    want = reference_losses(LLAMA, STEPS)
    for result in results:
        assert result.applied["plan"] == f"zero{zero}"
        assert_losses_match(result.losses, want, rtol=1e-5)
