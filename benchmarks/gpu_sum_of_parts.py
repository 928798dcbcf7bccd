"""The GPU cost model's sums of parts against what GPUs measured (``ddlsim/data/measured``).

Three checks, no GPU needed (the measurements are shipped):

- ``layers``: one block forward + backward (and with full recomputation), eager, against the
  H100's whole decoder layers (``h100/layers_cuda.json.gz``);
- ``compiled``: eager and compiled blocks against the H200's, measured side by side
  (``h200/layers_compiled_cuda.json.gz``);
- ``steps``: whole training steps (embeddings, four blocks, head and loss; eager, recomputed,
  compiled) against the H200's (``h200/step_*_cuda.json.gz``), and a block's activation memory
  (the memory model) against the measured difference between four and two blocks.

Each shard is captured on fake tensors here and priced with the GPU's own per-op times.

    .venv/bin/python benchmarks/gpu_sum_of_parts.py --json
"""

import argparse
import gzip
import json
from importlib import resources
from typing import Any

from ddlsim.data.specs.gpu_cluster import H100_SXM, H200_SXM, AcceleratorSpec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.profiler.shard import capture_shard
from ddlsim.simulator.gpu.memory import block_activation_bytes
from ddlsim.simulator.gpu.roofline import GpuOpCosts
from ddlsim.simulator.gpu.shard_costs import shard_costs

# name: (family, hidden, heads, kv_heads, ffn, vocab), as benchmarks/gpu_layers.py builds them.
SHAPES = {
    "llama3-8b": ("llama", 4096, 32, 8, 14336, 128256),
    "llama3-70b": ("llama", 8192, 64, 8, 28672, 128256),
    "llama3-405b": ("llama", 16384, 128, 8, 53248, 128256),
    "gpt3-175b": ("gpt2", 12288, 96, 96, 49152, 51200),
    "gpt-1.7b": ("gpt2", 2304, 24, 24, 9216, 51200),
}
GIB = 2**30


def measured(gpu: str, name: str) -> list[dict[str, Any]]:
    """The records of a shipped measurement file."""
    path = resources.files("ddlsim.data") / "measured" / gpu / name
    with path.open("rb") as raw, gzip.open(raw, "rt") as text:
        records: list[dict[str, Any]] = json.load(text)["records"]
    return records


def spec_of(
    shape: str, layers: int = 2, seq_len: int = 2048, *, dropout: float = 0.0
) -> ModelSpec:
    """The model the GPU ran: a transformers causal LM at ``shape`` with ``layers`` blocks,
    SDPA attention without dropout, GPT's other dropouts at ``dropout`` (``gpu_layers.py`` ran
    none, ``gpu_step.py`` transformers' default of 0.1)."""
    family, hidden, heads, kv, ffn, vocab = SHAPES[shape]
    if family == "llama":
        cls = "LlamaForCausalLM"
        config: dict[str, Any] = {
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "intermediate_size": ffn,
            "num_hidden_layers": layers,
            "vocab_size": vocab,
            "max_position_embeddings": 131072,
        }
    else:
        cls = "GPT2LMHeadModel"
        config = {
            "n_embd": hidden,
            "n_head": heads,
            "n_inner": ffn,
            "n_layer": layers,
            "n_positions": 8192,
            "vocab_size": vocab,
            "attn_pdrop": 0.0,
            "resid_pdrop": dropout,
            "embd_pdrop": dropout,
        }
    return ModelSpec.from_dict(
        {
            "source": "transformers",
            "class": cls,
            "config": config,
            "inputs": {"batch_size": 1, "seq_len": seq_len},
        }
    )


def block_ratio(record: dict[str, Any], gpu: AcceleratorSpec, *, recompute: bool) -> float:
    """Predicted / measured forward + backward of one block."""
    shard = capture_shard(
        spec_of(record["shape"]),
        tp=record["tp"],
        micro_batch=record["batch"],
        seq_len=record["seq"],
    )
    compiled = bool(record.get("compiled", False))
    block = shard_costs(shard.graph, shard.block, GpuOpCosts(gpu), compiled=compiled).block
    predicted = block.forward_ms + block.backward_ms + (block.forward_ms if recompute else 0.0)
    key = "forward_backward_recompute" if recompute else "forward_backward"
    return predicted / (record[key]["median_ms"] / record["layers"])


def layers_check() -> list[dict[str, Any]]:
    rows = []
    for record in measured("h100", "layers_cuda.json.gz"):
        rows.append(
            {
                "case": f"{record['shape']} tp{record['tp']} b{record['batch']} s{record['seq']}",
                "eager": round(block_ratio(record, H100_SXM, recompute=False), 3),
                "recomputed": round(block_ratio(record, H100_SXM, recompute=True), 3),
            }
        )
    return rows


def compiled_check() -> list[dict[str, Any]]:
    return [
        {
            "case": f"{r['shape']} tp{r['tp']} b{r['batch']} s{r['seq']}",
            "compiled": r["compiled"],
            "ratio": round(block_ratio(r, H200_SXM, recompute=False), 3),
        }
        for r in measured("h200", "layers_compiled_cuda.json.gz")
    ]


def steps_check() -> list[dict[str, Any]]:
    rows = []
    costs = GpuOpCosts(H200_SXM)
    for name in ("step_llama3_8b_cuda.json.gz", "step_gpt_1.7b_cuda.json.gz"):
        records = measured("h200", name)
        by = {(r["compiled"], r["recompute"], r["layers"]): r for r in records}
        first = records[0]
        shard = capture_shard(
            spec_of(first["model"], 4, first["seq"], dropout=0.1),
            tp=1,
            micro_batch=first["batch"],
            seq_len=first["seq"],
        )
        _, hidden, heads, *_ = SHAPES[first["model"]]
        for compiled, recompute in ((False, "none"), (False, "full"), (True, "none")):
            parts = shard_costs(shard.graph, shard.block, costs, compiled=compiled)
            block = parts.block.forward_ms + parts.block.backward_ms
            block += parts.block.forward_ms if recompute == "full" else 0.0
            rest = sum(p.forward_ms + p.backward_ms for p in (parts.first, parts.last))
            two, four = by[(compiled, recompute, 2)], by[(compiled, recompute, 4)]
            grown = (four["peak_bytes"] - two["peak_bytes"]) - (
                four["param_bytes"] - two["param_bytes"]
            )
            estimate = block_activation_bytes(
                seq=first["seq"],
                batch=first["batch"],
                hidden=hidden,
                heads=heads,
                tp=1,
                sequence_parallel=False,
                recompute=recompute,
                fused_attention=True,
            )
            rows.append(
                {
                    "model": first["model"],
                    "compiled": compiled,
                    "recompute": recompute,
                    "step_predicted_ms": round(4 * block + rest, 1),
                    "step_measured_ms": round(four["median_ms"], 1),
                    "step_ratio": round((4 * block + rest) / four["median_ms"], 3),
                    "block_activation_measured_gib": round(grown / 2 / GIB, 2),
                    "block_activation_model_gib": round(estimate / GIB, 2),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = {
        "layers_h100": layers_check(),
        "compiled_h200": compiled_check(),
        "steps_h200": steps_check(),
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for section, rows in result.items():
        print(section)
        for row in rows:
            print("  " + ", ".join(f"{k} {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
