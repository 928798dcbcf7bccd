"""The ``ddlsim`` command line.

Every subcommand takes ``--json`` for machine-readable output. Bad input (an unknown model, a
bad spec or strategy) ends with one ``ddlsim: error: ...`` line on stderr and exit status 2.
"""

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from data.errors import DdlsimError, InvalidStrategyError, one_line
from data.graph.format import IterationGraph
from data.models import build_model, count_parameters
from data.specs.cluster import ClusterSpec
from data.specs.model import ModelSpec
from data.specs.strategy import Strategy
from data.zoo import ZOO, resolve_model
from profiler.capture import OPTIMIZERS, CaptureOptions, capture_graph

EXIT_BAD_INPUT = 2


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def _emit_json(payload: Any) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True))


def _human(value: float, unit: str) -> str:
    """Decimal prefixes (FLOPs, counts): ``1.23 GFLOP``."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def _bytes(value: float) -> str:
    """Binary prefixes, as bucket caps are given (MiB)."""
    for scale, prefix in ((2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}B"
    return f"{value:.0f} B"


def _progress(message: str) -> None:
    """A status line on a terminal (never in pipes or --json output)."""
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


# ----- models ------------------------------------------------------------------------------


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
    _progress("building the zoo on the meta device to count parameters ...")
    rows = _zoo_rows()
    if args.json:
        _emit_json(rows)
        return 0
    print(f"{'name':<14}{'family':<11}{'class':<32}{'parameters':>12}  inputs")
    for row in rows:
        inputs = " ".join(f"{k}={v}" for k, v in row["inputs"].items())
        params = _human(row["parameters"], "").strip()
        print(f"{row['name']:<14}{row['family']:<11}{row['class']:<32}{params:>12}  {inputs}")
    return 0


# ----- graph -------------------------------------------------------------------------------


def _module_flops(graph: IterationGraph, top: int) -> list[tuple[str, int]]:
    totals: dict[str, int] = {}
    for node in graph.nodes:
        if node.kind == "compute" and node.flops:
            totals[node.module or "(model)"] = totals.get(node.module or "(model)", 0) + node.flops
    return sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:top]


def _print_graph_summary(graph: IterationGraph) -> None:
    s = graph.summary()
    spec = graph.model
    inputs = " ".join(f"{k}={v}" for k, v in s["inputs"].items())
    kinds = ", ".join(f"{k} {v}" for k, v in s["nodes_by_kind"].items())
    fwd, bwd = s["forward_flops"], s["backward_flops"]
    ratio = f" (x{bwd / fwd:.2f} forward)" if fwd else ""
    buckets = [n for n in graph.nodes if n.kind == "comm"]
    bucket_ops = sorted({n.op for n in buckets})
    launches = [n for n in buckets if n.op != "all_gather"]
    shown = ", ".join(_bytes(n.grad_bytes) for n in launches[:8])
    sizes = shown + (f", ... ({len(launches) - 8} more)" if len(launches) > 8 else "")
    total_flops = fwd + bwd
    print(f"{spec.label}  {spec.cls} ({spec.source})  inputs: {inputs}")
    print(
        f"  parameters   {_human(s['num_params'], '')} in {s['num_param_tensors']} tensors; "
        f"gradients {_bytes(s['grad_bytes'])}"
    )
    print(f"  nodes        {s['num_nodes']} ({kinds}); edges {s['num_edges']}")
    print(
        f"  FLOPs        forward {_human(fwd, 'FLOP')}, backward {_human(bwd, 'FLOP')}{ratio}, "
        f"optimizer ({s['optimizer']}) {_human(s['optimizer_flops'], 'FLOP')}"
    )
    print(f"  buckets      {s['num_buckets']} ({', '.join(bucket_ops)}): {sizes}")
    print("  top modules by forward+backward FLOPs:")
    for module, flops in _module_flops(graph, 5):
        share = 100.0 * flops / total_flops if total_flops else 0.0
        print(f"    {share:5.1f}%  {_human(flops, 'FLOP'):>14}  {module}")
    print(f"  graph hash   {s['graph_hash']}")


def cmd_graph(args: argparse.Namespace) -> int:
    spec: ModelSpec = resolve_model(args.model)
    spec = spec.with_inputs(
        batch_size=args.batch_size, seq_len=args.seq_len, image_size=args.image_size
    )
    strategy = Strategy.parse(args.strategy) if args.strategy else Strategy()
    _progress(f"capturing one training iteration of {spec.label} ...")
    graph = capture_graph(
        spec, CaptureOptions(strategy=strategy, optimizer=args.optimizer, seed=args.seed)
    )
    if args.out:
        Path(args.out).write_text(graph.to_json(), encoding="utf-8")
    if args.json:
        summary = graph.summary()
        if args.out:
            summary["out"] = str(args.out)
        _emit_json(summary)
    else:
        _print_graph_summary(graph)
        if args.out:
            print(f"  written to   {args.out}")
    return 0


# ----- spec --------------------------------------------------------------------------------


def cmd_spec(args: argparse.Namespace) -> int:
    if not (args.strategy or args.cluster or args.model):
        raise InvalidStrategyError("give at least one of --model, --strategy, --cluster to check")
    out: dict[str, Any] = {}
    if args.model:
        out["model"] = resolve_model(args.model).to_dict()
    strategy = Strategy.parse(args.strategy) if args.strategy else None
    cluster = ClusterSpec.parse(args.cluster) if args.cluster else None
    if strategy is not None:
        out["strategy"] = strategy.to_dict()
    if cluster is not None:
        out["cluster"] = cluster.to_dict()
    if strategy is not None and cluster is not None:
        strategy.validate_for(cluster.world_size)
        out["data_parallel"] = strategy.parallel.resolve_dp(cluster.world_size)
    if args.json:
        _emit_json(out)
    else:
        print(json.dumps(out, indent=2, sort_keys=True))
        print("valid", file=sys.stderr)
    return 0


# ----- parser ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddlsim",
        description="Predict and search distributed training strategies before spending GPU time.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    models = sub.add_parser("models", help="list the model zoo")
    models.add_argument("--json", action="store_true", help="print JSON")
    models.set_defaults(handler=cmd_models)

    graph = sub.add_parser(
        "graph",
        help="capture the graph of one training iteration",
        description="MODEL is a zoo name, a spec file (JSON/YAML) or inline JSON such as "
        '\'{"source": "transformers", "class": "BertForMaskedLM", "config": {...}, '
        '"inputs": {"batch_size": 8, "seq_len": 128}}\'.',
    )
    graph.add_argument("model", metavar="MODEL")
    graph.add_argument("--batch-size", type=_positive_int, help="global batch size")
    graph.add_argument("--seq-len", type=_positive_int, help="sequence length (text models)")
    graph.add_argument("--image-size", type=_positive_int, help="image side (vision models)")
    graph.add_argument(
        "--strategy", help="strategy as inline JSON or a file (default: DDP's defaults)"
    )
    graph.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    graph.add_argument("--seed", type=int, default=0, help="seed of weights and inputs")
    graph.add_argument("--out", metavar="FILE", help="write the whole graph as JSON")
    graph.add_argument("--json", action="store_true", help="print the summary as JSON")
    graph.set_defaults(handler=cmd_graph)
    spec = sub.add_parser(
        "spec",
        help="check specs and print them normalized (defaults filled in)",
        description="Validates each spec given (inline JSON or a JSON/YAML file); with both "
        "--strategy and --cluster, also that dp * tp * pp equals the world size.",
    )
    spec.add_argument("--model", help="a zoo name or a model spec")
    spec.add_argument("--strategy", help="a strategy")
    spec.add_argument("--cluster", help="a cluster spec")
    spec.add_argument("--json", action="store_true", help="print JSON only")
    spec.set_defaults(handler=cmd_spec)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except (DdlsimError, OSError) as exc:
        print(f"ddlsim: error: {one_line(exc, limit=2000)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("ddlsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
