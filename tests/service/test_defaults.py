"""One source of defaults: the REST API's request bodies, the command line's options and the use
cases' requests (:mod:`ddlsim.workflows.requests`) agree field by field, except where listed
here with the reason."""

import argparse
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from ddlsim.data.specs.strategy import Strategy
from ddlsim.executor.run import RunOptions
from ddlsim.service.api.schemas import (
    INPUT_FIELDS,
    ExecutionRequest,
    PredictionRequest,
    StrategyRequest,
)
from ddlsim.service.cli import build_parser
from ddlsim.service.cmd_search import DEFAULTS as SEARCH_DEFAULTS
from ddlsim.workflows.requests import ExecuteRequest, PredictRequest, SearchRequest, defaults


def _search() -> dict[str, Any]:
    """SearchRequest's defaults by the API's (and the CLI's) names."""
    out = defaults(SearchRequest)
    measure = out.pop("measure")
    out["time_limit"] = out.pop("time_limit_s")
    out.update(
        iters=measure.iters,
        warmup=measure.warmup,
        ci_target=measure.ci_target,
        measure_budget_s=measure.budget_s,
    )
    return out


def _execute() -> dict[str, Any]:
    """ExecuteRequest's defaults (its RunOptions') by the API's (and the CLI's) names."""
    out = {**defaults(RunOptions), **defaults(ExecuteRequest)}
    out["measure_budget_s"] = out.pop("budget_s")
    out["timeout"] = out.pop("timeout_s")
    out["collective_timeout"] = out.pop("collective_timeout_s")
    return out


# (the body, the CLI's argv, the use case's defaults, the API's exceptions: field -> why)
CASES: dict[str, tuple[type[BaseModel], list[str], Callable[[], dict[str, Any]], dict[str, str]]]
CASES = {
    "search": (
        StrategyRequest,
        ["search", "mlp", "--world-size", "2"],
        _search,
        {"world_size": "the API's range starts at 2; a search has no default (a CLI argument)"},
    ),
    "run": (
        ExecutionRequest,
        ["run", "mlp"],
        _execute,
        {"trace": "the API only: an execution profiles one more step, for the dashboard"},
    ),
    "predict": (
        PredictionRequest,
        ["predict", "mlp"],
        lambda: defaults(PredictRequest),
        {"world_size": "the API's range starts at 2 (predictions of several ranks)"},
    ),
}
API_DEFAULTS = {
    ("search", "world_size"): 2,
    ("run", "trace"): True,
    ("predict", "world_size"): 2,
}


def _cli(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


@pytest.mark.parametrize("command", sorted(CASES))
def test_the_api_takes_the_use_cases_defaults(command: str) -> None:
    body, _, use_case, exceptions = CASES[command]
    expected = use_case()
    for name, field in body.model_fields.items():
        if name == "model":
            assert field.is_required()
        elif name in INPUT_FIELDS:
            assert field.default is None, name  # the model's own inputs
        elif name == "strategy":
            assert field.default is None and expected["strategy"] == Strategy()
        elif name in exceptions:
            assert field.default == API_DEFAULTS[(command, name)], (name, exceptions[name])
            assert expected.get(name) != field.default, f"{name} is no exception any more"
        else:
            assert name in expected, f"{command}: the API's {name} is not the use case's"
            assert field.default == expected[name], (command, name)


@pytest.mark.parametrize("command", sorted(CASES))
def test_the_cli_takes_the_use_cases_defaults(command: str) -> None:
    body, argv, use_case, _ = CASES[command]
    expected = use_case()
    given = vars(_cli(argv))
    for name in body.model_fields:
        if name not in given or name == "model" or (name, command) == ("world_size", "search"):
            continue  # an option the CLI does not have, or one this argv sets
        if name in INPUT_FIELDS or name == "strategy":
            assert given[name] is None, (command, name)
        elif (command, name) == ("search", "algo"):
            # Unset on the command line: the CPU loop then takes the use case's default
            # (cmd_search), a --cluster search the GPU path's bound-and-replay search.
            assert given[name] is None and SEARCH_DEFAULTS["algo"] == expected[name]
        else:
            assert given[name] == expected[name], (command, name)
    # the CLI's options that the use case has too
    for name in sorted(set(given) & set(expected) - {"world_size"} - set(body.model_fields)):
        assert given[name] == expected[name], (command, name)
