"""``ddlsim graph``: capture and summarize the graph of one training iteration."""

import argparse
from pathlib import Path
from typing import Any

from ddlsim.data.graph.format import IterationGraph
from ddlsim.profiler.capture import OPTIMIZERS, CaptureOptions, capture_graph
from ddlsim.service.output import (
    emit_json,
    human,
    human_bytes,
    model_argument,
    positive_int,
    progress,
    strategy_argument,
)


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
    shown = ", ".join(human_bytes(n.grad_bytes) for n in launches[:8])
    sizes = shown + (f", ... ({len(launches) - 8} more)" if len(launches) > 8 else "")
    total_flops = fwd + bwd
    print(f"{spec.label}  {spec.cls} ({spec.source})  inputs: {inputs}")
    print(
        f"  parameters   {human(s['num_params'], '')} in {s['num_param_tensors']} tensors; "
        f"gradients {human_bytes(s['grad_bytes'])}"
    )
    print(f"  nodes        {s['num_nodes']} ({kinds}); edges {s['num_edges']}")
    print(
        f"  FLOPs        forward {human(fwd, 'FLOP')}, backward {human(bwd, 'FLOP')}{ratio}, "
        f"optimizer ({s['optimizer']}) {human(s['optimizer_flops'], 'FLOP')}"
    )
    print(f"  buckets      {s['num_buckets']} ({', '.join(bucket_ops)}): {sizes}")
    print("  top modules by forward+backward FLOPs:")
    for module, flops in _module_flops(graph, 5):
        share = 100.0 * flops / total_flops if total_flops else 0.0
        print(f"    {share:5.1f}%  {human(flops, 'FLOP'):>14}  {module}")
    print(f"  graph hash   {s['graph_hash']}")


def cmd_graph(args: argparse.Namespace) -> int:
    spec = model_argument(args)
    strategy = strategy_argument(args)
    progress(f"capturing one training iteration of {spec.label} ...")
    graph = capture_graph(
        spec, CaptureOptions(strategy=strategy, optimizer=args.optimizer, seed=args.seed)
    )
    if args.out:
        Path(args.out).write_text(graph.to_json(), encoding="utf-8")
    if args.json:
        summary = graph.summary()
        if args.out:
            summary["out"] = str(args.out)
        emit_json(summary)
    else:
        _print_graph_summary(graph)
        if args.out:
            print(f"  written to   {args.out}")
    return 0


def register(sub: Any) -> None:
    graph = sub.add_parser(
        "graph",
        help="capture the graph of one training iteration",
        description="MODEL is a zoo name, a spec file (JSON/YAML) or inline JSON such as "
        '\'{"source": "transformers", "class": "BertForMaskedLM", "config": {...}, '
        '"inputs": {"batch_size": 8, "seq_len": 128}}\'.',
    )
    graph.add_argument("model", metavar="MODEL")
    graph.add_argument("--batch-size", type=positive_int, help="global batch size")
    graph.add_argument("--seq-len", type=positive_int, help="sequence length (text models)")
    graph.add_argument("--image-size", type=positive_int, help="image side (vision models)")
    graph.add_argument(
        "--strategy", help="strategy as inline JSON or a file (default: DDP's defaults)"
    )
    graph.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    graph.add_argument("--seed", type=int, default=0, help="seed of weights and inputs")
    graph.add_argument("--out", metavar="FILE", help="write the whole graph as JSON")
    graph.add_argument("--json", action="store_true", help="print the summary as JSON")
    graph.set_defaults(handler=cmd_graph)
