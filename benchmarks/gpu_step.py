"""Whole training steps of a cut-down large model on one GPU: what the on-paper simulator's
sum of parts (embeddings, blocks, head and loss, recomputation, compilation) must add up to.

A causal LM built from a published config with only ``--layers`` blocks (random weights, bf16,
SDPA attention) runs forward, loss and backward on one micro-batch, eager or with every block
compiled, with and without full recomputation of its blocks (``torch.utils.checkpoint``); for
each variant the median step time (CUDA events) and the peak memory. Two layer counts let a
block's time and activation memory be told from the rest (the difference per layer).

    python benchmarks/gpu_step.py --model llama3-8b --batch 2 --seq 8192 --layers 2 4 \
        --out step_cuda.json.gz

Gzipped JSON; needs torch and transformers only.
"""

import argparse
import gzip
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

# name: (transformers class, config)
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3-8b": (
        "LlamaForCausalLM",
        {
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "vocab_size": 128256,
            "max_position_embeddings": 131072,
        },
    ),
    "gpt-1.7b": (
        "GPT2LMHeadModel",
        {"n_embd": 2304, "n_head": 24, "n_inner": 9216, "vocab_size": 51200, "n_positions": 2048},
    ),
}
LAYER_KEYS = {"LlamaForCausalLM": "num_hidden_layers", "GPT2LMHeadModel": "n_layer"}


def build(name: str, layers: int, device: torch.device) -> Any:
    import transformers

    cls_name, config = MODELS[name]
    cls = getattr(transformers, cls_name)
    config_cls = getattr(
        transformers, cls_name.replace("ForCausalLM", "Config").replace("LMHeadModel", "Config")
    )
    cfg = config_cls(**config, **{LAYER_KEYS[cls_name]: layers})
    cfg._attn_implementation = "sdpa"
    if hasattr(cfg, "attn_pdrop"):
        cfg.attn_pdrop = 0.0
    cfg.use_cache = False
    with torch.device(device):
        model = cls(cfg).to(torch.bfloat16)
    model.train()
    return model


def blocks_of(model: Any) -> torch.nn.ModuleList:
    inner = getattr(model, "model", None) or model.transformer
    return getattr(inner, "layers", None) or inner.h


def measure(
    name: str, layers: int, *, batch: int, seq: int, compiled: bool, recompute: bool, calls: int
) -> dict[str, Any]:
    device = torch.device("cuda")
    model = build(name, layers, device)
    if recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if compiled:
        blocks = blocks_of(model)
        for i, block in enumerate(blocks):
            blocks[i] = torch.compile(block)  # type: ignore[assignment]
    vocab = MODELS[name][1]["vocab_size"]
    ids = torch.randint(0, vocab, (batch, seq), device=device)

    def step() -> None:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        for p in model.parameters():
            p.grad = None

    started = time.monotonic()
    step()
    torch.cuda.synchronize()
    first_s = time.monotonic() - started
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    samples = []
    for _ in range(calls):
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        step()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end))
    samples.sort()
    record = {
        "model": name,
        "layers": layers,
        "batch": batch,
        "seq": seq,
        "compiled": compiled,
        "recompute": "full" if recompute else "none",
        "median_ms": statistics.median(samples),
        "p25_ms": samples[len(samples) // 4],
        "p75_ms": samples[(3 * len(samples)) // 4],
        "calls": calls,
        "first_step_s": round(first_s, 1),
        "peak_bytes": torch.cuda.max_memory_allocated(),
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
    }

    torch.cuda.empty_cache()
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="llama3-8b")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    records: list[dict[str, Any]] = []
    variants = [(False, False), (False, True), (True, False)]
    stopped = None
    for compiled, recompute in variants:
        for layers in args.layers:
            if time.monotonic() > deadline:
                stopped = {"compiled": compiled, "recompute": recompute, "layers": layers}
                break
            record = measure(
                args.model,
                layers,
                batch=args.batch,
                seq=args.seq,
                compiled=compiled,
                recompute=recompute,
                calls=args.calls,
            )
            records.append(record)
            print(json.dumps(record), flush=True)
    import transformers

    meta = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "name": torch.cuda.get_device_name(),
        "stopped_at": stopped,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt", encoding="utf-8") as handle:
        json.dump({"meta": meta, "records": records}, handle)
    print(json.dumps(meta), flush=True)


if __name__ == "__main__":
    main()
