"""``ddlsim simulator validate``: predict strategies, run them for real, compare
(:mod:`ddlsim.workflows.validate`); ``ddlsim simulator dataset|train|eval``."""

import argparse
from typing import Any

from ddlsim.data.specs.strategy import Strategy
from ddlsim.service import cmd_dataset, cmd_train, output
from ddlsim.workflows.requests import ValidateRequest, defaults
from ddlsim.workflows.validate import validate

DEFAULTS = defaults(ValidateRequest)


def cmd_validate(args: argparse.Namespace) -> int:
    request = output.request_from(args, ValidateRequest, measure=output.measure_settings(args))
    payload = output.run_on_store(args, validate, request)
    if args.json:
        output.emit_json(payload)
    else:
        _print_table(payload)
    return 0


def _print_table(payload: dict[str, Any]) -> None:
    print(
        f"{payload['model']}, {payload['world_size']} ranks, {payload['bandwidth']} "
        f"({payload['simulator_version']})"
    )
    for row in payload["rows"]:
        error = row["predicted_ms"] / row["measured_ms"] - 1
        print(
            f"  {row['predicted_ms']:9.1f} ms predicted {row['measured_ms']:9.1f} ms measured "
            f"{error:+7.1%}  {Strategy.from_dict(row['strategy']).to_json()}"
        )
    for key in ("mape", "p90_ape", "kendall_tau", "pair_accuracy", "noise_mape"):
        value = payload.get(key)
        print(f"  {key:<14}{'-' if value is None else f'{value:.3f}'}")
    gain = payload.get("speedup_error") or {}
    if gain.get("median") is not None:
        print(
            f"  speed-up over DDP's defaults off by a median {gain['median']:.3f}, p90 "
            f"{gain['p90']:.3f} ({gain['runs']} strategies, "
            f"{'side by side' if payload.get('side_by_side') else 'separate launches'})"
        )


def register(sub: Any) -> None:
    simulator = sub.add_parser(
        "simulator", help="train, evaluate and check the simulator against real runs"
    )
    commands = simulator.add_subparsers(dest="simulator_command", required=True)
    validate = commands.add_parser(
        "validate", help="predict and run K strategies of a model, and compare"
    )
    output.add_input_arguments(validate)
    validate.add_argument("--world-size", type=output.positive_int, default=DEFAULTS["world_size"])
    validate.add_argument(
        "--bandwidth", default=DEFAULTS["bandwidth"], help="link rate per host, or none"
    )
    validate.add_argument("--strategies", type=output.positive_int, default=DEFAULTS["strategies"])
    output.add_protocol_arguments(validate, defaults=DEFAULTS["measure"])
    output.add_prediction_arguments(validate, profile_iters=DEFAULTS["profile_iters"])
    output.add_store_arguments(validate)
    validate.set_defaults(handler=cmd_validate)
    cmd_dataset.register(commands)
    cmd_train.register(commands)
