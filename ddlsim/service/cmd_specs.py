"""``ddlsim models`` (the zoo) and ``ddlsim spec`` (check specs, fill in defaults)."""

import argparse
import json
import sys
from typing import Any

import torch

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.models import build_model, count_parameters
from ddlsim.data.specs.clusters import parse_cluster
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO, resolve_model
from ddlsim.service.output import emit_json, human, progress


def _zoo_rows() -> list[dict[str, Any]]:
    rows = []
    for name, spec in ZOO.items():
        with torch.device("meta"):
            parameters = count_parameters(build_model(spec))
        rows.append(
            {
                "name": name,
                "family": spec.family,
                "source": spec.source,
                "class": spec.cls,
                "parameters": parameters,
                "inputs": spec.inputs.to_dict(),
            }
        )
    return rows


def cmd_models(args: argparse.Namespace) -> int:
    progress("building the zoo on the meta device to count parameters ...")
    rows = _zoo_rows()
    if args.json:
        emit_json(rows)
        return 0
    print(f"{'name':<14}{'family':<11}{'class':<32}{'parameters':>12}  inputs")
    for row in rows:
        inputs = " ".join(f"{k}={v}" for k, v in row["inputs"].items())
        params = human(row["parameters"], "").strip()
        print(f"{row['name']:<14}{row['family']:<11}{row['class']:<32}{params:>12}  {inputs}")
    return 0


def cmd_spec(args: argparse.Namespace) -> int:
    if not (args.strategy or args.cluster or args.model):
        raise InvalidStrategyError("give at least one of --model, --strategy, --cluster to check")
    out: dict[str, Any] = {}
    if args.model:
        out["model"] = resolve_model(args.model).to_dict()
    strategy = Strategy.parse(args.strategy) if args.strategy else None
    cluster = parse_cluster(args.cluster) if args.cluster else None
    if strategy is not None:
        out["strategy"] = strategy.to_dict()
    if cluster is not None:
        out["cluster"] = cluster.to_dict()
    if strategy is not None and cluster is not None:
        strategy.validate_for(cluster.world_size)
        out["data_parallel"] = strategy.parallel.resolve_dp(cluster.world_size)
    if args.json:
        emit_json(out)
    else:
        print(json.dumps(out, indent=2, sort_keys=True))
        print("valid", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    models = sub.add_parser("models", help="list the model zoo")
    models.add_argument("--json", action="store_true", help="print JSON")
    models.set_defaults(handler=cmd_models)

    spec = sub.add_parser(
        "spec",
        help="check specs and print them normalized (defaults filled in)",
        description="Validates each spec given (inline JSON or a JSON/YAML file); with both "
        "--strategy and --cluster, also that dp * tp * pp equals the world size.",
    )
    spec.add_argument("--model", help="a zoo name or a model spec")
    spec.add_argument("--strategy", help="a strategy")
    spec.add_argument(
        "--cluster",
        help="a cluster spec: an emulated one (JSON naming world_size) or a GPU one "
        "(PRESET:NODES, or JSON naming preset or gpu)",
    )
    spec.add_argument("--json", action="store_true", help="print JSON only")
    spec.set_defaults(handler=cmd_spec)
