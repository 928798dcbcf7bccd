"""A mixture of experts searched on a DGX H100 pod for a run (``--target cuda``): every layout
offered is one the executor accepts (checked as it checks before a launch), expert-parallel ones
among them; the best of those, scaled down to this machine's ranks, trains."""

import json
import math

import pytest

from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.run import RunOptions, run_training
from ddlsim.plans.feasibility import check, run_target
from ddlsim.service.cli import main

SPEC = ZOO["qwen3-moe-tiny"]


def _search(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    code = main(
        [
            "search",
            "qwen3-moe-tiny",
            "--cluster",
            "dgx-h100:8",
            "--batch-size",
            "128",
            "--seq-len",
            "64",
            "--top",
            "200",
            "--json",
            *extra,
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_a_search_for_a_run_offers_only_what_the_executor_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    payload = _search(capsys, "--target", "cuda")
    rows = payload["top"]
    assert payload["not_runnable"] > 0 and rows
    strategies = [Strategy.from_dict(row["strategy"]) for row in rows]
    split = [s for s in strategies if s.parallel.ep > 1]
    assert split, "no expert-parallel layout among those searched"
    for strategy in strategies:  # the executor's own check before a launch
        check(SPEC.with_inputs(batch_size=128, seq_len=64), strategy, run_target(64, "cuda"))
    # On paper the search also offers what only Megatron runs (ep beside tp/pp, the
    # distributed optimizer), which a search for a run leaves out.
    paper = _search(capsys)
    assert paper["evaluated"] == payload["evaluated"] + payload["not_runnable"]
    # The best expert-parallel layout, at this machine's scale: 2 CPU ranks, 2 experts' groups.
    best = split[0].parallel
    small = Strategy.from_dict(
        {
            "parallel": {
                "ep": 2,
                "fsdp": best.fsdp,
                "micro_batches": 1,
                "dispatcher": best.dispatcher,
            }
        }
    )
    result = run_training(
        SPEC.with_inputs(batch_size=4, seq_len=16),
        small,
        RunOptions(world_size=2, iters=2, warmup=1, budget_s=0),
    )
    assert result.applied["ep"] == 2 and all(math.isfinite(loss) for loss in result.losses)
