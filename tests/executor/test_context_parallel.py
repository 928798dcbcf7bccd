"""Context parallelism (the all-gather variant, load-balanced chunks) trains a decoder as one
process does."""

import pytest

from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.context_parallel import chunk_positions
from ddlsim.executor.plan import build_trainer
from tests.executor.harness import STEPS, assert_losses_match, reference_losses, run_trainer

LLAMA = ZOO["llama-tiny"].with_inputs(batch_size=4, seq_len=16)


def _build(ctx):  # type: ignore[no-untyped-def]
    return build_trainer(ctx, [])


def test_each_rank_holds_an_early_and_a_late_chunk() -> None:
    assert chunk_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert chunk_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]


@pytest.mark.parametrize(("cp", "world_size", "micro_batches"), [(2, 2, 1), (2, 4, 2), (4, 4, 1)])
def test_context_parallel_matches_one_process(
    cp: int, world_size: int, micro_batches: int
) -> None:
    raw = {"parallel": {"cp": cp, "cp_comm": "all_gather", "micro_batches": micro_batches}}
    results = run_trainer(world_size, _build, LLAMA, Strategy.from_dict(raw))
    want = reference_losses(LLAMA, STEPS)
    positions = sorted(p for result in results[:cp] for p in result.applied["positions"])
    assert positions == list(range(16))  # a replica's ranks hold the whole sequence once
    for result in results:
        assert result.applied["plan"] == "context_parallel"
        assert_losses_match(result.losses, want, rtol=1e-5)
