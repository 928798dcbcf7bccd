"""The calibration of predicted speed-ups by kind: the kinds, the errors, the quantiles."""

import math

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.simulator.calibration import (
    MIN_ERRORS,
    Calibration,
    calibrate,
    check_confidence,
    risk_kind,
)


def _strategy(**raw: object) -> Strategy:
    return Strategy.from_dict(raw)


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ({}, "default"),
        ({"tensor_fusion": {"bucket_cap_mb": 4}}, "ddp"),
        ({"parallel": {"micro_batches": 2}}, "ddp"),
        ({"tensor_fusion": {"buckets": [["a"], ["b"]]}}, "hooks"),
        ({"tensor_fusion": {"bucket_cap_mb": 4, "implementation": "hooks"}}, "hooks"),
        ({"tensor_fusion": {"buckets": [["a", "b"]], "dear": True}}, "dear"),
        ({"op_fusion": {"compiled": ["h.0"]}}, "compiled"),
        ({"parallel": {"fsdp": True}}, "fsdp"),
        ({"parallel": {"tp": 2}}, "tensor"),
        ({"parallel": {"pp": 2, "micro_batches": 2}}, "pipeline"),
    ],
)
def test_risk_kind(raw: dict[str, object], kind: str) -> None:
    assert risk_kind(_strategy(**raw)) == kind


def _row(group: str, kind: str, measured: float, predicted: float) -> dict[str, object]:
    return {"group": group, "risk_kind": kind, "measured_ms": measured, "gnn_ms": predicted}


def test_errors_are_speedup_errors_against_the_groups_defaults() -> None:
    rows = [
        _row("a", "default", 100.0, 80.0),
        _row("a", "default", 110.0, 80.0),  # the repeat: noise, kept under "default"
        _row("a", "dear", 120.0, 72.0),  # predicted 0.9 of DDP, measured 1.2
        _row("b", "pipeline", 50.0, 50.0),
        _row("b", "default", 100.0, 100.0),
        _row("c", "dear", 10.0, 10.0),  # no defaults in its group: nothing to compare with
    ]
    calibration = calibrate(rows, "gnn")
    # group a's defaults measured 105 ms (the median of two runs), DeAR 120: 1.143 of them
    assert calibration.errors["dear"] == pytest.approx((math.log(120 / 105 / 0.9),))
    assert calibration.errors["pipeline"] == pytest.approx((0.0,))
    assert calibration.errors["default"] == pytest.approx((math.log(1.1),))
    with pytest.raises(InvalidOptionError, match="replay_ms"):
        calibrate(rows, "replay")


def test_quantiles_fall_back_to_the_pool_and_never_touch_the_defaults() -> None:
    dear = tuple(0.01 * i for i in range(MIN_ERRORS))  # 0 .. 0.07
    calibration = Calibration(
        predictor="gnn",
        errors={"dear": dear, "tensor": (1.0,), "default": (0.5, 0.6)},
    )
    assert calibration.quantile("dear", 0.5) == pytest.approx(0.035)
    assert calibration.quantile("dear", 0.8) == pytest.approx(0.056)
    # one tensor error is too few: the pool of every non-default kind (nine errors)
    pooled = sorted((*dear, 1.0))
    assert calibration.pooled() == pytest.approx(tuple(pooled))
    assert calibration.quantile("tensor", 0.5) == pytest.approx(pooled[4])
    assert calibration.quantile("fsdp", 0.5) == pytest.approx(pooled[4])  # no errors at all
    assert calibration.quantile("default", 0.99) == 0.0
    assert calibration.factor(Strategy(), 0.9) == 1.0
    dear_strategy = _strategy(tensor_fusion={"buckets": [["a"]], "dear": True})
    assert calibration.factor(dear_strategy, 0.8) == pytest.approx(math.exp(0.056))
    summary = calibration.summary(0.8)
    assert summary["dear"]["runs"] == MIN_ERRORS
    assert summary["default"]["factor"] == 1.0
    assert Calibration(predictor="gnn", errors={}).quantile("dear", 0.8) == 0.0
    # speed-ups measured better than predicted add no margin, and never a discount
    better = Calibration(predictor="gnn", errors={"fsdp": (-0.3,) * MIN_ERRORS})
    assert better.quantile("fsdp", 0.8) == pytest.approx(-0.3)
    assert better.kind_factor("fsdp", 0.8) == 1.0


def test_json_round_trip_and_bad_json() -> None:
    calibration = Calibration(predictor="blend", errors={"dear": (0.1, -0.2), "ddp": (0.0,)})
    back = Calibration.from_json(calibration.to_json())
    assert back.predictor == "blend"
    assert back.errors == {"dear": (-0.2, 0.1), "ddp": (0.0,)}
    with pytest.raises(InvalidOptionError, match="calibration"):
        Calibration.from_json({"predictor": "gnn"})
    with pytest.raises(InvalidOptionError, match="calibration"):
        Calibration.from_json({"predictor": "gnn", "errors": {"dear": ["x"]}})


@pytest.mark.parametrize("value", [0.49, 1.0, -1.0, float("nan")])
def test_confidence_out_of_range(value: float) -> None:
    with pytest.raises(InvalidOptionError, match=r"confidence\("):
        check_confidence(value)
    assert check_confidence(0.8) == 0.8


def test_errors_are_kept_by_world_size_too() -> None:
    rows = [
        _row("m|2|1gbit", "default", 100.0, 100.0),
        _row("m|2|1gbit", "grid", 110.0, 90.0),  # on 2 ranks the grid ran slower than predicted
        _row("m|4|1gbit", "default", 100.0, 100.0),
        _row("m|4|1gbit", "grid", 90.0, 110.0),  # on 4 ranks faster
        _row("s/m|4|1gbit", "default", 100.0, 100.0),
        _row("s/m|4|1gbit", "grid", 90.0, 110.0),
    ]
    calibration = calibrate(rows, "gnn")
    assert calibration.errors["grid@2"] == pytest.approx((math.log(110 / 90),))
    assert calibration.errors["grid@4"] == pytest.approx((math.log(90 / 110),) * 2)
    assert len(calibration.errors["grid"]) == 3
    # the pool does not count an error twice
    assert calibration.pooled() == calibration.errors["grid"]
    assert calibration.pooled(2) == calibration.errors["grid@2"]


def test_a_kind_is_scored_by_its_errors_at_the_search_s_world_size() -> None:
    optimistic = tuple(0.10 + 0.01 * i for i in range(MIN_ERRORS))  # ran slower than predicted
    pessimistic = tuple(-0.20 + 0.01 * i for i in range(MIN_ERRORS))
    others = tuple(0.02 + 0.001 * i for i in range(MIN_ERRORS))
    calibration = Calibration(
        predictor="gnn",
        errors={
            "grid": tuple(sorted(pessimistic)),
            "grid@4": pessimistic,
            "ddp": others,
            "ddp@2": others,
            "layers": optimistic,
            "layers@2": optimistic[:2],  # too few on 2 ranks
        },
    )
    # only 4-rank grids measured: over every size the grid adds no margin ...
    assert calibration.kind_factor("grid", 0.8) == 1.0
    assert calibration.kind_factor("grid", 0.8, 4) == 1.0
    # ... but on 2 ranks, where no grid was measured, it takes the 2-rank pool's margin
    pool_2 = tuple(sorted((*others, *optimistic[:2])))
    assert calibration.pooled(2) == pytest.approx(pool_2)
    assert calibration.quantile("grid", 0.8, 2) == pytest.approx(quantile_of(pool_2, 0.8))
    assert calibration.kind_factor("grid", 0.8, 2) > 1.0
    # too few of a kind at a size: the larger of its own over every size and the size's pool
    assert calibration.quantile("layers", 0.8, 2) == pytest.approx(quantile_of(optimistic, 0.8))
    summary = calibration.summary(0.8, 2)
    assert summary["grid"]["runs"] == 0 and summary["layers"]["runs"] == 2
    # a calibration kept without world sizes (checkpoints before 2026-11-28) reads as before
    old = Calibration(predictor="gnn", errors={"grid": pessimistic, "ddp": others})
    assert old.quantile("grid", 0.8, 2) == old.quantile("grid", 0.8)


def quantile_of(values: tuple[float, ...], q: float) -> float:
    return Calibration(predictor="x", errors={"k": values}).quantile("k", q)
