"""The GPU dataset's plan (``gpu-v1``): whole training iterations of the zoo on one GPU.

Sixteen families at the sizes a GPU trains (the 7B decoders cut to two of their layers, whose
shapes are a real layer's), none of them reserved for unseen-model checks. Each model gives:

- kernel profiles (per-node device times, attributed to the graph) in fp32 and bf16 at its zoo
  batch and at twice it: four iterations measured with a graph to learn from;
- one side-by-side launch on one rank: DDP's defaults (fp32, eager) beside bf16, compiled
  blocks, and both, under the measurement protocol: four whole iterations, eager against
  compiled, each with its interval.

The jobs come in the order a short lease should spend its time: every family's fp32 and bf16
profiles at its zoo batch first, then the launches, then the doubled batches. ``ddlsim profile
batch gpu-v1.yaml --device cuda --db URL`` runs it and resumes where a lease ended; a CPU
dry run is the same file with ``--device cpu``.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.zoo import ZOO

GPU_VERSIONS: tuple[str, ...] = ("gpu-v1",)

# (zoo name, config changes): one model a family. The 7B decoders keep their layer's shapes
# with two layers (about 0.5B parameters: fp32 AdamW state fits one GPU).
_GPU_V1: tuple[tuple[str, Mapping[str, Any]], ...] = (
    ("gpt2-small", {}),
    ("bert-base", {}),
    ("llama-160m", {}),
    ("t5-small", {}),
    ("opt-125m", {}),
    ("vit-base", {}),
    ("resnet-50", {}),
    ("convnext-tiny", {}),
    ("mistral-7b", {"num_hidden_layers": 2}),
    ("falcon-7b", {"num_hidden_layers": 2}),
    ("gptj-6b", {"n_layer": 2}),
    ("albert-base", {}),
    ("electra-small", {}),
    ("bart-base", {}),
    ("dinov2-small", {}),
    ("efficientnet-b0", {}),
)

# Per-node times repeat well on a GPU: fewer iterations than the CPU's profiles.
KERNEL_ITERS = 6
KERNEL_WARMUP = 3
# The launches: the protocol's minimum rounds, then at most this long a strategy.
MEASURE_BUDGET_S = 4.0
SIDE_BY_SIDE: tuple[dict[str, Any], ...] = (
    {"precision": "bf16"},
    {"compile": True},
    {"precision": "bf16", "compile": True},
)


def gpu_models() -> list[ModelSpec]:
    """gpu-v1's models, one a family."""
    models = []
    for name, config in _GPU_V1:
        spec = ZOO[name]
        if config:
            layers = next(iter(config.values()))
            spec = dataclasses.replace(
                spec, name=f"{name}-{layers}l", config={**spec.config, **config}
            )
        models.append(spec)
    return models


def _model(spec: ModelSpec) -> Any:
    """A zoo model by its name, a cut one as its whole spec."""
    return spec.name if spec.name in ZOO else spec.to_dict()


def gpu_plan(models: list[ModelSpec] | None = None) -> list[dict[str, Any]]:
    """The batch jobs of gpu-v1 (device left to ``profile batch --device``), in lease order."""
    models = gpu_models() if models is None else models

    def kernels(spec: ModelSpec, batch: int, precision: str) -> dict[str, Any]:
        return {
            "kind": "kernels",
            "model": _model(spec),
            "batch_size": batch,
            "precision": precision,
            "iters": KERNEL_ITERS,
            "warmup": KERNEL_WARMUP,
        }

    first = [kernels(s, s.inputs.batch_size, p) for s in models for p in ("fp32", "bf16")]
    launches = [
        {
            "kind": "compare",
            "model": _model(spec),
            "world_size": 1,
            "strategies": list(SIDE_BY_SIDE),
            "measure_budget_s": MEASURE_BUDGET_S,
        }
        for spec in models
    ]
    doubled = [kernels(s, 2 * s.inputs.batch_size, p) for s in models for p in ("fp32", "bf16")]
    return [*first, *launches, *doubled]
