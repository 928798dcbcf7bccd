import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.strategy import (
    MIB,
    OpFusionPlan,
    ParallelPlan,
    Strategy,
    TensorFusionPlan,
)


def test_defaults_are_ddp_defaults() -> None:
    strategy = Strategy()
    assert strategy.tensor_fusion.bucket_cap_mb == 25.0
    assert strategy.tensor_fusion.first_bucket_cap_mb == 1.0
    assert strategy.tensor_fusion.buckets is None
    assert not strategy.tensor_fusion.dear
    assert strategy.op_fusion.compiled == ()
    assert strategy.parallel.resolve_dp(8) == 8
    # The same caps DistributedDataParallel uses by default.
    assert strategy.tensor_fusion.first_bucket_cap_mb * MIB == dist._DEFAULT_FIRST_BUCKET_BYTES


def test_json_round_trip() -> None:
    strategy = Strategy(
        parallel=ParallelPlan(dp=2, tp=2, pp=2, micro_batches=4, pp_schedule="gpipe"),
        tensor_fusion=TensorFusionPlan(buckets=(("a", "b"), ("c",)), dear=True),
        op_fusion=OpFusionPlan(compiled=("encoder.layer.0", "encoder.layer.1")),
    )
    text = strategy.to_json()
    assert Strategy.parse(text) == strategy
    assert json.loads(text)["tensor_fusion"]["buckets"] == [["a", "b"], ["c"]]


def test_parse_file(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("tensor_fusion:\n  bucket_caps_mb: [1, 4]\n")
    assert Strategy.parse(str(path)).tensor_fusion.bucket_caps_mb == (1.0, 4.0)


@pytest.mark.parametrize("seed", range(5))
def test_cap_assignment_matches_ddp(seed: int) -> None:
    """Our cap-based buckets equal DDP's own assignment for the same gradients and caps."""
    rng = random.Random(seed)
    numels = [rng.choice([10, 1000, 300_000, 2_000_000, 7_000_000]) for _ in range(40)]
    grads = [(f"p{i}", n * 4) for i, n in enumerate(numels)]
    plan = TensorFusionPlan(bucket_cap_mb=4.0, first_bucket_cap_mb=1.0)
    ours = [[int(name[1:]) for name in b.params] for b in plan.assign(grads)]
    tensors = [torch.empty(n) for n in numels]
    theirs, _ = dist._compute_bucket_assignment_by_size(tensors, [1 * MIB, 4 * MIB])
    assert ours == theirs


def test_per_bucket_caps_last_repeats() -> None:
    grads = [(f"p{i}", MIB) for i in range(6)]
    buckets = TensorFusionPlan(bucket_caps_mb=(1.0, 2.0, 3.0)).assign(grads)
    assert [len(b.params) for b in buckets] == [1, 2, 3]
    assert [b.grad_bytes for b in buckets] == [MIB, 2 * MIB, 3 * MIB]


def test_explicit_buckets_any_grouping_in_launch_order() -> None:
    grads = [("a", 4), ("b", 8), ("c", 16), ("d", 32)]
    plan = TensorFusionPlan(buckets=(("d", "a"), ("c", "b")))
    buckets = plan.assign(grads)
    # ("c", "b") completes when c is ready (index 2), before ("d", "a") completes (index 3).
    assert [b.params for b in buckets] == [("b", "c"), ("a", "d")]
    assert [b.grad_bytes for b in buckets] == [24, 36]


@pytest.mark.parametrize(
    ("buckets", "message"),
    [
        ((("a", "b"), ("c",)), "miss 1 gradient"),
        ((("a", "b"), ("c", "d", "zz")), "names 'zz', which is not a gradient"),
    ],
)
def test_explicit_buckets_must_partition(buckets: tuple, message: str) -> None:
    grads = [("a", 4), ("b", 4), ("c", 4), ("d", 4)]
    with pytest.raises(InvalidStrategyError, match=message):
        TensorFusionPlan(buckets=buckets).assign(grads)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"tensor_fusion": {"buckets": [["a"], ["a", "b"]]}}, "gradient 'a' appears in more"),
        ({"tensor_fusion": {"buckets": [["a"], []]}}, r"tensor_fusion.buckets\[1\] is empty"),
        ({"tensor_fusion": {"buckets": []}}, "must hold at least one bucket"),
        ({"tensor_fusion": {"bucket_cap_mb": 0}}, "bucket_cap_mb must be > 0"),
        ({"tensor_fusion": {"bucket_caps_mb": []}}, "must not be empty"),
        ({"tensor_fusion": {"dear": "yes"}}, "dear must be true or false"),
        ({"tensor_fusion": {"buckets": [["a"]], "bucket_caps_mb": [1]}}, "exclusive"),
        ({"parallel": {"tp": 0}}, "parallel.tp must be >= 1"),
        ({"parallel": {"pp_schedule": "zb"}}, "pp_schedule 'zb' is not supported"),
        ({"parallel": {"pp": 4, "micro_batches": 2}}, r"micro_batches\(2\) < pp\(4\)"),
        ({"parallel": {"fsdp_groups": [["a"]]}}, "fsdp is false"),
        ({"op_fusion": {"compiled": "encoder"}}, "must be a list of module paths"),
        ({"op_fusion": {"compiled": ["a", "a"]}}, "repeats a block"),
        ({"op_fusion": {"backend": "xla"}}, "backend 'xla' is not supported"),
        (
            {"parallel": {"tpp": 2}},
            "unknown key 'tpp' in parallel; allowed: async_tp, capacity_factor, cp, cp_comm, "
            "dispatcher, distributed_optimizer, dp, ep, ep_overlap, etp, fsdp",
        ),
        ({"fusion": {}}, "unknown key 'fusion' in strategy"),
    ],
)
def test_invalid(raw: dict, message: str) -> None:
    with pytest.raises(InvalidStrategyError, match=message):
        Strategy.from_dict(raw)


def test_validate_for_world_size() -> None:
    Strategy(parallel=ParallelPlan(tp=2, pp=2, micro_batches=2)).validate_for(8)
    with pytest.raises(InvalidStrategyError, match=r"dp\(3\) \* tp\(2\) \* pp\(1\) != world"):
        Strategy(parallel=ParallelPlan(dp=3, tp=2)).validate_for(4)
    with pytest.raises(InvalidStrategyError, match=r"tp\(3\).*world_size\(4\)"):
        Strategy(parallel=ParallelPlan(tp=3)).validate_for(4)


def test_parse_reports_bad_json() -> None:
    with pytest.raises(InvalidStrategyError, match="not valid JSON"):
        Strategy.parse("{nope")
    with pytest.raises(InvalidStrategyError, match="neither inline JSON nor an existing file"):
        Strategy.parse("missing.json")


def test_rank_batch_size_splits_the_global_batch_or_says_why_not() -> None:
    plan = ParallelPlan(tp=2, micro_batches=2)
    assert plan.rank_batch_size(16, 8) == 2  # dp 4, 2 micro-batches of 2
    assert plan.fits(16, 8) and not plan.fits(12, 8)
    with pytest.raises(InvalidStrategyError, match=r"batch_size\(12\).*dp\(4\).*micro_batches"):
        plan.rank_batch_size(12, 8)
    assert not ParallelPlan(tp=3).fits(12, 4)  # no dp fits


@pytest.mark.parametrize(
    ("raw", "kind", "label", "line"),
    [
        ({}, "buckets", "ddp", "DDP's defaults"),
        (
            {"tensor_fusion": {"bucket_cap_mb": 4, "dear": True}},
            "dear",
            "ddp",
            "bucket cap 4 MB, DeAR",
        ),
        (
            {"parallel": {"fsdp": True, "micro_batches": 2}},
            "fsdp",
            "fsdp m2",
            "FSDP, 2 micro-batches",
        ),
        ({"parallel": {"tp": 2}}, "tensor", "tp2", "tp2"),
        (
            {"parallel": {"pp": 2, "micro_batches": 4, "pp_schedule": "gpipe"}},
            "pipeline",
            "pp2 gpipe m4",
            "pp2, gpipe, 4 micro-batches",
        ),
        (
            {"op_fusion": {"compiled": ["h.0"]}},
            "compiled",
            "ddp",
            "bucket cap 25 MB, 1 blocks compiled",
        ),
    ],
)
def test_a_strategy_names_itself_one_way(raw: dict, kind: str, label: str, line: str) -> None:
    strategy = Strategy.from_dict(raw)
    assert (strategy.kind, strategy.parallel.label, strategy.describe()) == (kind, label, line)


def test_gpu_grade_settings_round_trip_and_stay_out_of_default_json() -> None:
    raw = {
        "parallel": {
            "dp": 2,
            "tp": 2,
            "pp": 2,
            "micro_batches": 4,
            "pp_schedule": "interleaved_1f1b",
            "virtual_stages": 3,
            "recompute": "selective",
            "sequence_parallel": True,
            "distributed_optimizer": True,
        },
        "precision": "bf16",
        "compile": True,
    }
    strategy = Strategy.from_dict(raw)
    assert Strategy.from_dict(strategy.to_dict()) == strategy
    assert strategy.parallel.chunks == 3
    assert "sp" in strategy.describe() and "bf16" in strategy.describe()
    # A strategy without them writes the JSON it wrote before they existed.
    assert Strategy().to_dict() == {
        "parallel": {
            "dp": None,
            "tp": 1,
            "pp": 1,
            "fsdp": False,
            "fsdp_groups": None,
            "micro_batches": 1,
            "pp_schedule": "1f1b",
        },
        "tensor_fusion": Strategy().to_dict()["tensor_fusion"],
        "op_fusion": {"compiled": [], "backend": "inductor"},
    }
    interleaved = Strategy.from_dict(
        {"parallel": {"pp": 2, "micro_batches": 2, "pp_schedule": "interleaved_1f1b"}}
    )
    assert interleaved.parallel.chunks == 2


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"precision": "fp64"}, "precision 'fp64' is not supported; allowed: fp32, bf16"),
        ({"compile": "yes"}, "compile must be true or false"),
        ({"parallel": {"recompute": "half"}}, "recompute 'half' is not supported"),
        ({"parallel": {"sequence_parallel": True}}, r"sequence_parallel needs tp > 1"),
        ({"parallel": {"async_tp": True}}, r"async_tp needs tp > 1"),
        (
            {"parallel": {"fsdp": True, "distributed_optimizer": True}},
            "distributed_optimizer and parallel.fsdp",
        ),
        ({"parallel": {"virtual_stages": 2}}, "needs pp_schedule 'interleaved_1f1b'"),
        (
            {
                "parallel": {
                    "pp": 2,
                    "micro_batches": 2,
                    "pp_schedule": "interleaved_1f1b",
                    "virtual_stages": 1,
                }
            },
            "needs parallel.virtual_stages >= 2",
        ),
        (
            {"parallel": {"tp": 2, "grid": [1, 2, 1], "sequence_parallel": True}},
            "does not combine with parallel.grid",
        ),
    ],
)
def test_gpu_grade_settings_refused_by_name(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidStrategyError, match=message):
        Strategy.from_dict(raw)


def test_scale_plan_is_a_strategy_and_back() -> None:
    from ddlsim.data.specs.scale_plan import ScalePlan

    plan = ScalePlan(
        dp=2,
        tp=4,
        pp=2,
        micro_batches=4,
        pp_schedule="interleaved_1f1b",
        virtual_stages=2,
        recompute="full",
        sequence_parallel=True,
        distributed_optimizer=True,
        precision="fp8",
    )
    strategy = Strategy.from_dict(plan.to_dict())
    assert strategy == plan.to_strategy()
    assert ScalePlan.from_strategy(strategy) == plan
    with pytest.raises(InvalidStrategyError, match="fp32' is not priced on GPU clusters"):
        ScalePlan.from_strategy(Strategy(parallel=ParallelPlan(dp=1)))
    with pytest.raises(InvalidStrategyError, match=r"tensor_fusion\.dear is not priced"):
        ScalePlan.from_strategy(
            Strategy.from_dict({"tensor_fusion": {"dear": True}, "precision": "bf16"}), 8
        )
