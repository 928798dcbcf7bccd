"""The use cases' requests: validated on construction, frozen, and stored as JSON losslessly."""

import dataclasses
from typing import Any

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.run import RunOptions
from ddlsim.workflows.requests import (
    SEARCH_MEASURE,
    ExecuteRequest,
    MeasureSettings,
    PredictRequest,
    SearchRequest,
    ValidateRequest,
    defaults,
)

GPT2 = ZOO["gpt2-tiny"]


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"world_size": 1}, "world_size(1)"),
        ({"algo": "annealing"}, "algo('annealing')"),
        ({"space": "pipeline"}, "space('pipeline')"),
        ({"budget": 0}, "budget(0)"),
        ({"time_limit_s": 0.0}, "time_limit(0.0)"),
        ({"confidence": 0.3}, "confidence(0.3)"),
        ({"memory_gb": -1.0}, "memory_gb(-1.0)"),
        ({"verify": True, "verify_top": 16}, "verify_top(16) must be <= 15"),
        ({"verify": True, "verify_top": 0}, "verify_top(0)"),
        ({"workers": 2, "algo": "backtrack"}, "workers(2) > 1 needs an Optuna sampler"),
    ],
)
def test_a_bad_search_is_refused_naming_the_value(changes: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidOptionError, match=named.replace("(", r"\(").replace(")", r"\)")):
        SearchRequest(model=GPT2, **{"world_size": 2, **changes})


def test_requests_are_frozen() -> None:
    request = SearchRequest(model=GPT2, world_size=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.budget = 1  # type: ignore[misc]


def test_a_search_round_trips_through_the_queue_json() -> None:
    request = SearchRequest(
        model=GPT2.with_inputs(batch_size=8),
        world_size=4,
        bandwidth="1gbit",
        algo="tpe",
        budget=50,
        time_limit_s=12.5,
        confidence=None,
        verify=True,
        verify_top=2,
        measure=MeasureSettings(iters=3, warmup=1, ci_target=0.02, budget_s=5.0),
    )
    stored = request.to_json()
    assert stored["time_limit"] == 12.5 and stored["measure_budget_s"] == 5.0
    assert SearchRequest.from_json(stored) == request


def test_a_queued_search_cannot_set_what_its_runner_decides() -> None:
    stored = {**SearchRequest(model=GPT2, world_size=2).to_json(), "storage": "sqlite:///x"}
    with pytest.raises(InvalidOptionError, match=r"unknown option\(s\) \['storage'\]"):
        SearchRequest.from_json(stored)


def test_an_execution_round_trips_and_takes_run_options_defaults() -> None:
    request = ExecuteRequest(
        model=GPT2,
        strategy=Strategy.from_dict({"parallel": {"fsdp": True}}),
        options=RunOptions(world_size=2, bandwidth="1gbit", iters=4, trace=True),
        predict=True,
    )
    assert ExecuteRequest.from_json(request.to_json(), predict=True) == request
    minimal = ExecuteRequest.from_json({"model": GPT2.to_dict(), "strategy": None})
    assert minimal.options == RunOptions()
    with pytest.raises(InvalidOptionError, match="unknown execution option"):
        ExecuteRequest.from_json({"model": GPT2.to_dict(), "strategy": {}, "nodes": 3})


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"iters": 0}, "iters(0)"),
        ({"warmup": -1}, "warmup(-1)"),
        ({"ci_target": 1.5}, "ci_target(1.5)"),
        ({"budget_s": -2.0}, "measure_budget_s(-2.0)"),
    ],
)
def test_bad_protocol_settings_are_refused(changes: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidOptionError, match=named.replace("(", r"\(").replace(")", r"\)")):
        MeasureSettings(**changes)


def test_defaults_are_read_off_the_request_types() -> None:
    assert defaults(SearchRequest)["time_limit_s"] == 60.0
    assert defaults(SearchRequest)["measure"] == SEARCH_MEASURE
    assert defaults(PredictRequest)["strategy"] == Strategy()
    assert defaults(ValidateRequest)["bandwidth"] == "1gbit"
    assert "model" not in defaults(SearchRequest) and "world_size" not in defaults(SearchRequest)
    with pytest.raises(InvalidOptionError, match="optimizer"):
        PredictRequest(model=GPT2, optimizer="lamb")
