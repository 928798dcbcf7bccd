"""Data-parallel trainers train exactly like one process on the global batch, and launch the
buckets the strategy asked for."""

import functools
from typing import Any

import pytest

from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.plan import build_trainer, check_strategy
from ddlsim.profiler.capture import capture_graph
from tests.executor.harness import Losses, assert_matches_reference, run_trainer

MLP = ZOO["mlp"].with_inputs(batch_size=16)
GPT2 = ZOO["gpt2-tiny"].with_inputs(batch_size=4, seq_len=16)


def _run(spec, strategy: Strategy) -> tuple[list[Losses], list]:  # type: ignore[no-untyped-def]
    buckets = check_strategy(spec, strategy, 2, capture_graph(spec))
    results = run_trainer(2, functools.partial(build_trainer, buckets=buckets), spec, strategy)
    return results, buckets


STRATEGIES: dict[str, dict[str, Any]] = {
    "ddp-defaults": {},
    "ddp-caps": {"tensor_fusion": {"bucket_caps_mb": [0.05, 0.2]}},
    "hooks-caps": {"tensor_fusion": {"bucket_caps_mb": [0.05, 0.2], "implementation": "hooks"}},
    "dear-ring": {"tensor_fusion": {"bucket_cap_mb": 0.1, "dear": True}},
    "dear-native": {
        "tensor_fusion": {"bucket_cap_mb": 0.1, "dear": True, "reduce_scatter": "native"}
    },
    "micro-batches": {"parallel": {"micro_batches": 2}, "tensor_fusion": {"dear": True}},
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_losses_match_single_process(name: str) -> None:
    strategy = Strategy.from_dict(STRATEGIES[name])
    results, buckets = _run(MLP, strategy)
    assert_matches_reference(results, MLP)
    applied = results[0].applied
    if not strategy.tensor_fusion.uses_ddp:
        # The buckets that launched are the ones asked for, in the order asked.
        launched = [b["params"] for b in applied["buckets"]]
        assert launched == [list(b.params) for b in buckets]
    else:
        launched_params = sorted(p for b in applied["buckets"] for p in b["params"])
        assert launched_params == sorted(p for b in buckets for p in b.params)


def test_any_grouping_of_gpt2_gradients() -> None:
    graph = capture_graph(GPT2)
    order = graph.grad_ready_order
    # Non-contiguous groups: every third gradient together, then the rest in pairs.
    first = order[::3]
    rest = [n for n in order if n not in first]
    groups = [first] + [rest[i : i + 2] for i in range(0, len(rest), 2)]
    strategy = Strategy.from_dict({"tensor_fusion": {"buckets": groups}})
    results, buckets = _run(GPT2, strategy)
    assert_matches_reference(results[:1], GPT2)
    launched = [b["params"] for b in results[0].applied["buckets"]]
    assert sorted(map(tuple, launched)) == sorted(tuple(b.params) for b in buckets)
    assert len(launched) == len(groups)


def test_dear_on_gpt2() -> None:
    strategy = Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": 0.5, "dear": True}})
    results, _ = _run(GPT2, strategy)
    assert_matches_reference(results[1:2], GPT2)
    assert results[0].applied["collectives"] == ["reduce_scatter:ring", "all_gather:ring"]


@pytest.mark.parametrize(
    "parallel",
    [
        {"fsdp": True},
        {
            "fsdp": True,
            "fsdp_groups": [["transformer.h.0", "transformer.h.1"]],
            "micro_batches": 2,
        },
    ],
)
def test_fsdp_matches_single_process(parallel: dict) -> None:
    strategy = Strategy.from_dict({"parallel": parallel})
    results, _ = _run(GPT2, strategy)
    assert_matches_reference(results[:1], GPT2)
    applied = results[0].applied
    assert applied["plan"] == "fsdp"
    want = parallel.get("fsdp_groups") or [[f"transformer.h.{i}"] for i in range(2)]
    assert applied["groups"] == want
