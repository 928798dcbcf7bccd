"""Whole transformer layers on one GPU: what per-op costs must add up to.

Builds decoder layers of the shapes large training runs use (Llama 3 8B / 70B / 405B, GPT-3
175B, and their tensor-parallel shards: heads and MLP width divided by ``tp``) from
transformers configs with random weights (nothing downloaded), and times, in bf16 with SDPA
attention, a stack of ``--layers`` layers:

* forward, and forward + backward of the stack, per micro-batch of ``batch x seq`` tokens;
* with ``recompute`` (activation checkpointing of every layer), forward + backward again.

Each case is the median of CUDA-event timed calls after warm-up; the record keeps the shapes,
the layer's matmul FLOPs (``6 x params x tokens`` plus attention's), the median and quartiles.
Gzipped JSON, like ``gpu_ops.py``; needs torch and transformers only.

    python benchmarks/gpu_layers.py --budget-s 120 --out layers_cuda.json.gz
"""

import argparse
import gzip
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

# name: (family, hidden, heads, kv_heads, ffn, vocab)
SHAPES = {
    "llama3-8b": ("llama", 4096, 32, 8, 14336, 128256),
    "llama3-70b": ("llama", 8192, 64, 8, 28672, 128256),
    "llama3-405b": ("llama", 16384, 128, 8, 53248, 128256),
    "gpt3-175b": ("gpt2", 12288, 96, 96, 49152, 51200),
    "gpt-1.7b": ("gpt2", 2304, 24, 24, 9216, 51200),
}
# (shape, tp, batch, seq)
CASES = [
    ("gpt-1.7b", 1, 4, 2048),
    ("llama3-8b", 1, 1, 8192),
    ("llama3-8b", 1, 2, 4096),
    ("llama3-70b", 8, 1, 8192),
    ("llama3-70b", 4, 1, 4096),
    ("llama3-405b", 8, 1, 8192),
    ("gpt3-175b", 8, 1, 2048),
    ("gpt3-175b", 4, 1, 2048),
]


def build_layers(shape: str, tp: int, layers: int, device: torch.device) -> tuple[Any, Any, int]:
    """A stack of decoder layers with ``1 / tp`` of the heads and of the MLP width, the rotary
    embedding module for Llama (or None), and the layer's parameter count."""
    family, hidden, heads, kv_heads, ffn, _ = SHAPES[shape]
    if family == "llama":
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRotaryEmbedding,
        )

        head_dim = hidden // heads
        config = LlamaConfig(
            hidden_size=hidden,
            num_attention_heads=heads // tp,
            num_key_value_heads=max(1, kv_heads // tp),
            head_dim=head_dim,
            intermediate_size=ffn // tp,
            attn_implementation="sdpa",
        )
        stack = torch.nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(layers))
        rotary = LlamaRotaryEmbedding(config)
    else:
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        # GPT-2's block keeps hidden // heads as the head size: shard by narrowing the
        # attention to heads // tp heads of the same size and the MLP to ffn // tp.
        config = GPT2Config(
            n_embd=hidden,
            n_head=heads,
            n_inner=ffn // tp,
            attn_implementation="sdpa",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        stack = torch.nn.ModuleList(GPT2Block(config, layer_idx=i) for i in range(layers))
        if tp > 1:
            head_dim = hidden // heads
            for block in stack:
                attn: Any = block.attn
                width = heads // tp * head_dim
                attn.c_attn.weight = torch.nn.Parameter(attn.c_attn.weight[:, : 3 * width])
                attn.c_attn.bias = torch.nn.Parameter(attn.c_attn.bias[: 3 * width])
                attn.c_attn.nf = 3 * width
                attn.c_proj.weight = torch.nn.Parameter(attn.c_proj.weight[:width])
                attn.split_size = width
                attn.embed_dim = width
                attn.num_heads = heads // tp
        rotary = None
    stack = stack.to(device=device, dtype=torch.bfloat16)
    params = sum(p.numel() for p in stack.parameters()) // layers
    return stack, rotary, params


def _run(stack: Any, rotary: Any, x: torch.Tensor, recompute: bool) -> torch.Tensor:
    kwargs: dict[str, Any] = {}
    if rotary is not None:
        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        cos, sin = rotary(x, positions)
        kwargs = {"position_embeddings": (cos.to(x.dtype), sin.to(x.dtype))}
    for layer in stack:
        if recompute:
            out = checkpoint(layer, x, use_reentrant=False, **kwargs)
        else:
            out = layer(x, **kwargs)
        x = out[0] if isinstance(out, tuple) else out
    return x


def _time(fn: Callable[[], Any], calls: int, warmup: int = 2) -> dict[str, Any]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(calls):
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end))
    samples.sort()
    return {
        "median_ms": statistics.median(samples),
        "p25_ms": samples[len(samples) // 4],
        "p75_ms": samples[(3 * len(samples)) // 4],
        "calls": len(samples),
    }


def measure_case(
    case: tuple[str, int, int, int],
    *,
    layers: int,
    calls: int,
    device: torch.device,
    compiled: bool = False,
) -> dict[str, Any]:
    shape, tp, batch, seq = case
    stack, rotary, params = build_layers(shape, tp, layers, device)
    if compiled:
        # Each layer compiled on its own, as torchtitan compiles its transformer blocks.
        stack = torch.nn.ModuleList([torch.compile(layer) for layer in stack])  # type: ignore[misc]
    hidden = SHAPES[shape][1]
    x = torch.randn(batch, seq, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn_like(x)
    tokens = batch * seq
    attn_flops = 4 * batch * seq * seq * (hidden // tp) // 2  # causal half, per layer
    record: dict[str, Any] = {
        "shape": shape,
        "tp": tp,
        "batch": batch,
        "seq": seq,
        "layers": layers,
        "params_per_layer": params,
        "forward_flops_per_layer": 2 * params * tokens + attn_flops,
        "compiled": compiled,
    }
    if compiled:
        # Forward + backward only: every other variant would compile graphs of its own.
        def step() -> None:
            _run(stack, rotary, x, False).backward(grad)
            for p in stack.parameters():
                p.grad = None

        started = time.monotonic()
        step()
        torch.cuda.synchronize()
        record["compile_s"] = round(time.monotonic() - started, 1)
        torch.cuda.reset_peak_memory_stats()
        record["forward_backward"] = _time(step, calls)
        record["peak_bytes"] = torch.cuda.max_memory_allocated()
        return record
    with torch.no_grad():
        record["forward"] = _time(lambda: _run(stack, rotary, x, False), calls)

    def both(recompute: bool) -> None:
        _run(stack, rotary, x, recompute).backward(grad)
        for p in stack.parameters():
            p.grad = None

    torch.cuda.reset_peak_memory_stats()
    record["forward_backward"] = _time(lambda: both(False), calls)
    record["peak_bytes"] = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    record["forward_backward_recompute"] = _time(lambda: both(True), calls)
    record["peak_bytes_recompute"] = torch.cuda.max_memory_allocated()
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--budget-s", type=float, default=120.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--compile", action="store_true", help="also each case with every layer compiled"
    )
    parser.add_argument(
        "--cases", nargs="*", help="only these cases, as SHAPE:TP:BATCH:SEQ (default: all)"
    )
    args = parser.parse_args()
    cases = (
        [
            (shape, int(tp), int(batch), int(seq))
            for shape, tp, batch, seq in (text.split(":") for text in args.cases)
        ]
        if args.cases
        else CASES
    )
    device = torch.device("cuda")
    deadline = time.monotonic() + args.budget_s
    records: list[dict[str, Any]] = []
    stopped = None
    variants = (False, True) if args.compile else (False,)
    for case in cases:
        for compiled in variants:
            if time.monotonic() > deadline:
                stopped = case[0]
                break
            record = measure_case(
                case, layers=args.layers, calls=args.calls, device=device, compiled=compiled
            )
            records.append(record)
            print(
                json.dumps({k: record[k] for k in ("shape", "tp", "batch", "seq", "compiled")}),
                round(record["forward_backward"]["median_ms"], 2),
                flush=True,
            )
            torch.cuda.empty_cache()
    import transformers

    meta = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "name": torch.cuda.get_device_name(device),
        "stopped_at": stopped,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt", encoding="utf-8") as handle:
        json.dump({"meta": meta, "records": records}, handle)
    print(json.dumps(meta), flush=True)


if __name__ == "__main__":
    main()
