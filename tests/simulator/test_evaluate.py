"""Accuracy metrics on values worked out by hand."""

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.simulator.evaluate import Accuracy, accuracy, grouped_accuracy
from ddlsim.simulator.holdout import MAPE_TIE, best_predictor


def test_perfect_prediction() -> None:
    result = accuracy([10.0, 20.0, 30.0], [10.0, 20.0, 30.0])
    assert (result.mape, result.p90_ape, result.kendall_tau) == (0.0, 0.0, 1.0)
    assert result.pair_accuracy == 1.0 and result.pairs_counted == 3


def test_errors_and_a_swapped_pair() -> None:
    # Errors of 10 %, 0 % and 20 %; every pair keeps its order.
    result = accuracy([11.0, 20.0, 24.0], [10.0, 20.0, 30.0])
    assert result.mape == pytest.approx(0.1)
    assert result.p90_ape == pytest.approx(0.18)  # between 10 % and 20 % at 0.9 of the way
    assert result.kendall_tau == 1.0
    swapped = accuracy([20.0, 10.0, 30.0], [10.0, 20.0, 30.0])
    assert swapped.kendall_tau == pytest.approx(1 / 3)  # 2 concordant, 1 discordant
    assert swapped.pair_accuracy == pytest.approx(2 / 3)


def test_close_pairs_are_not_counted() -> None:
    # 100 and 102 differ by 2 %: within noise, so the swap does not count against the ranking.
    result = accuracy([102.0, 100.0, 200.0], [100.0, 102.0, 200.0])
    assert result.pairs_counted == 2 and result.pair_accuracy == 1.0
    assert accuracy([1.0, 1.0], [100.0, 101.0]).pair_accuracy is None
    # 100 and 104 differ by more than the margin of 3 %: that swap counts.
    swapped = accuracy([104.0, 100.0], [100.0, 104.0])
    assert swapped.pairs_counted == 1 and swapped.pair_accuracy == 0.0


def test_bad_input_is_named() -> None:
    with pytest.raises(InvalidOptionError, match="need two or more paired times"):
        accuracy([1.0], [1.0])
    with pytest.raises(InvalidOptionError, match="measured times must be > 0"):
        accuracy([1.0, 2.0], [0.0, 2.0])


def test_grouped_accuracy_ranks_within_groups_only() -> None:
    # two groups, each ordered right; across groups the order would be wrong
    predicted = [10.0, 20.0, 1.0, 2.0]
    measured = [1.0, 2.0, 10.0, 20.0]
    result = grouped_accuracy(predicted, measured, ["a", "a", "b", "b"])
    assert result.kendall_tau == 1.0
    assert result.pair_accuracy == 1.0 and result.pairs_counted == 2
    assert accuracy(predicted, measured).kendall_tau < 1.0
    with pytest.raises(InvalidOptionError, match="3 groups for 4 rows"):
        grouped_accuracy(predicted, measured, ["a", "a", "b"])


def test_the_best_predictor_breaks_a_tie_on_error_by_its_order() -> None:
    def metrics(mape: float, pairs: float | None) -> Accuracy:
        return Accuracy(
            mape=mape, p90_ape=2 * mape, kendall_tau=0.5, pair_accuracy=pairs, pairs_counted=9
        )

    # the held-out figures of 2026-11-26: errors within MAPE_TIE, the blend orders more pairs
    tied = {
        "replay": metrics(0.0886, 0.882),
        "gnn": metrics(0.1206, 0.920),
        "blend": metrics(0.0911, 0.932),
    }
    assert best_predictor(tied) == "blend"
    # outside the tie the lowest error wins, whatever its order
    apart = {**tied, "replay": metrics(0.0911 - MAPE_TIE - 0.001, 0.5)}
    assert best_predictor(apart) == "replay"
    assert best_predictor({"gnn": metrics(0.1, None), "blend": metrics(0.1, None)}) == "gnn"
