"""The per-op timer: calls timed within a case's time and the budget's deadline."""

import time

import pytest
import torch

from ddlsim.profiler.op_timer import OutOfBudgetError, Timer


def test_times_calls_and_reports_their_median_and_quartiles() -> None:
    calls: list[int] = []

    def op() -> None:
        calls.append(1)

    timer = Timer(torch.device("cpu"), budget_s=60.0, case_s=0.0)
    result = timer.time(op, warmup=2, max_calls=10)
    # warm-up calls run but are not timed; at least three timed calls, then the case's time
    assert result["calls"] == 3 and len(calls) == 5
    assert 0.0 <= result["p25_ms"] <= result["median_ms"] <= result["p75_ms"]


def test_a_spent_budget_runs_nothing() -> None:
    timer = Timer(torch.device("cpu"), budget_s=0.0, case_s=1.0)
    time.sleep(0.01)
    ran: list[int] = []
    with pytest.raises(OutOfBudgetError):
        timer.time(lambda: ran.append(1))
    assert not ran
