"""The simulator's measured dataset: what it holds, the batch file that measures it, its file.

Generation is an ordinary batch (``ddlsim profile batch``), so it resumes where it stopped and
runs on any machine: :func:`plan_jobs` lists the link profiles (gloo collectives of every world
size and link rate), the kernel profiles (one rank, every micro-batch a rank will run) and the
fusion profiles (the blocks that compiled strategies compile, timed alone eager and compiled)
and the executor runs (every model under several strategies on every cluster setting, DDP's
defaults in each group, and a repeat of it in half of them to measure the noise). Runs come
last and round-robin over models and settings, so a batch cut short still covers every model
evenly.

:func:`export_dataset` reads what a store holds into one compressed JSON file, self-contained:
the graphs the kernel profiles timed, their per-node times, the fusion profiles, the collective
fits, and every run (model, strategy, world size, link, iteration samples).
:func:`load_dataset` reads it back.
"""

import dataclasses
import gzip
import json
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.simulator.calibration import risk_kind

DATASET_FORMAT = 1

# Two sizes of each of eight families, at inputs that keep one run to seconds on two cores.
_SMALL_TEXT = {"batch_size": 8, "seq_len": 64}
_SMALL_IMAGE = {"batch_size": 8, "image_size": 64}


def _variant(base: str, name: str, config: Mapping[str, Any], **inputs: int) -> ModelSpec:
    spec = ZOO[base]
    return dataclasses.replace(spec, name=name, config={**spec.config, **config}).with_inputs(
        **inputs
    )


def dataset_models() -> list[ModelSpec]:
    """The models of the dataset: two sizes of each of eight families."""
    return [
        ZOO["gpt2-tiny"].with_inputs(**_SMALL_TEXT),
        _variant("gpt2-tiny", "gpt2-mini", {"n_layer": 4, "n_embd": 256}, **_SMALL_TEXT),
        ZOO["bert-tiny"].with_inputs(**_SMALL_TEXT),
        _variant(
            "bert-tiny",
            "bert-mini",
            {
                "num_hidden_layers": 4,
                "hidden_size": 256,
                "num_attention_heads": 4,
                "intermediate_size": 1024,
            },
            **_SMALL_TEXT,
        ),
        _variant("llama-tiny", "llama-tiny-8k", {"vocab_size": 8192}, **_SMALL_TEXT),
        _variant(
            "llama-tiny",
            "llama-mini",
            {
                "num_hidden_layers": 4,
                "hidden_size": 320,
                "intermediate_size": 864,
                "num_attention_heads": 5,
                "num_key_value_heads": 5,
                "vocab_size": 8192,
            },
            **_SMALL_TEXT,
        ),
        _variant("t5-tiny", "t5-tiny-8k", {"vocab_size": 8192}, **_SMALL_TEXT),
        _variant(
            "t5-tiny",
            "t5-mini",
            {
                "num_layers": 3,
                "d_model": 256,
                "d_ff": 1024,
                "d_kv": 32,
                "num_heads": 8,
                "vocab_size": 8192,
            },
            **_SMALL_TEXT,
        ),
        ZOO["opt-tiny"].with_inputs(**_SMALL_TEXT),
        _variant(
            "opt-tiny",
            "opt-mini",
            {
                "num_hidden_layers": 4,
                "hidden_size": 256,
                "word_embed_proj_dim": 256,
                "ffn_dim": 1024,
            },
            **_SMALL_TEXT,
        ),
        _variant("vit-tiny", "vit-tiny-64", {"num_labels": 100}, **_SMALL_IMAGE),
        _variant(
            "vit-tiny",
            "vit-mini-64",
            {
                "num_hidden_layers": 4,
                "hidden_size": 256,
                "num_attention_heads": 4,
                "intermediate_size": 1024,
                "num_labels": 100,
            },
            **_SMALL_IMAGE,
        ),
        _variant("resnet-18", "resnet-18-64", {"num_labels": 100}, **_SMALL_IMAGE),
        _variant(
            "resnet-18",
            "resnet-10-64",
            {"depths": [1, 1, 1, 1], "num_labels": 100},
            **_SMALL_IMAGE,
        ),
        _variant("convnext-atto", "convnext-atto-64", {"num_labels": 100}, **_SMALL_IMAGE),
        _variant(
            "convnext-atto",
            "convnext-mini-64",
            {"depths": [1, 1, 3, 1], "hidden_sizes": [32, 64, 128, 256], "num_labels": 100},
            **_SMALL_IMAGE,
        ),
    ]


# The eight families cpu-v3 adds, each at its zoo's test size and a larger "mini" size, chosen
# for structure the first eight lack: grouped- and multi-query attention (Mistral, Falcon),
# attention and MLP in parallel (Falcon, GPT-J), one layer's weights shared by every layer
# (ALBERT), factorised embeddings (ALBERT, ELECTRA), a post-norm encoder-decoder (BART),
# LayerScale (DINOv2), depthwise convolutions with squeeze-and-excitation (EfficientNet).
_V3_FAMILIES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (
        "mistral-tiny",
        "mistral-mini",
        {
            "num_hidden_layers": 4,
            "hidden_size": 256,
            "intermediate_size": 704,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
        },
    ),
    (
        "falcon-tiny",
        "falcon-mini",
        {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8},
    ),
    ("gptj-tiny", "gptj-mini", {"n_layer": 4, "n_embd": 256, "n_head": 8}),
    (
        "albert-tiny",
        "albert-mini",
        {
            "num_hidden_layers": 6,
            "hidden_size": 256,
            "embedding_size": 128,
            "intermediate_size": 1024,
        },
    ),
    (
        "electra-tiny",
        "electra-mini",
        {
            "num_hidden_layers": 4,
            "hidden_size": 256,
            "embedding_size": 128,
            "intermediate_size": 1024,
        },
    ),
    (
        "bart-tiny",
        "bart-mini",
        {
            "encoder_layers": 3,
            "decoder_layers": 3,
            "d_model": 256,
            "encoder_attention_heads": 8,
            "decoder_attention_heads": 8,
            "encoder_ffn_dim": 1024,
            "decoder_ffn_dim": 1024,
        },
    ),
    ("dinov2-tiny", "dinov2-mini", {"num_hidden_layers": 4, "hidden_size": 256}),
    (
        "efficientnet-tiny",
        "efficientnet-mini",
        {"width_coefficient": 0.75, "depth_coefficient": 0.75, "hidden_dim": 960},
    ),
)

DATASET_VERSIONS: tuple[str, ...] = ("cpu-v2", "cpu-v3")


def dataset_models_v3() -> list[ModelSpec]:
    """cpu-v3's models: cpu-v2's sixteen and two sizes of each of eight more families."""
    added: list[ModelSpec] = []
    for tiny, mini, config in _V3_FAMILIES:
        inputs = _SMALL_IMAGE if ZOO[tiny].inputs.image_size is not None else _SMALL_TEXT
        added.append(ZOO[tiny].with_inputs(**inputs))
        added.append(_variant(tiny, mini, config, **inputs))
    return [*dataset_models(), *added]


def models_of(version: str) -> list[ModelSpec]:
    """The models of dataset ``version``.

    Raises:
        InvalidOptionError: an unknown version, naming the known ones.
    """
    if version not in DATASET_VERSIONS:
        raise InvalidOptionError(
            f"dataset version {version!r} is unknown; allowed: {', '.join(DATASET_VERSIONS)}"
        )
    return dataset_models() if version == "cpu-v2" else dataset_models_v3()


# (world size, link) of every run group: cpu-v2 ran both world sizes at 1 Gbit/s and unshaped;
# cpu-v3 at 1 and 4 Gbit/s (raw TCP on this machine follows a shaped link up to ~6 Gb/s).
SETTINGS: tuple[tuple[int, str], ...] = ((2, "1gbit"), (2, "none"), (4, "1gbit"), (4, "none"))
SETTINGS_V3: tuple[tuple[int, str], ...] = (
    (2, "1gbit"),
    (4, "1gbit"),
    (2, "4gbit"),
    (4, "4gbit"),
)
LINK_SIZES: tuple[int, ...] = tuple(4096 * 4**i for i in range(8))  # 4 KiB .. 64 MiB
LINK_COLLECTIVES: tuple[str, ...] = ("all_reduce", "sendrecv")
# FSDP and tensor parallelism also gather and reduce-scatter.
PARALLEL_COLLECTIVES: tuple[str, ...] = (*LINK_COLLECTIVES, "all_gather", "reduce_scatter")


def strategy_pool(
    grad_order: Sequence[str], blocks: Sequence[str], *, seed: int = 0
) -> list[Strategy]:
    """Twenty data-parallel strategies besides DDP's defaults, for a model whose gradients
    become ready in ``grad_order`` and whose repeated blocks are ``blocks``: DDP's own bucket
    caps, the executor's hook buckets (caps, one bucket, a random contiguous partition, a
    non-contiguous grouping), DeAR, gradient accumulation, and compiled blocks with several of
    these."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(grad_order)), k=min(2, len(grad_order) - 1)))
    contiguous = [
        list(grad_order[a:b]) for a, b in zip([0, *cuts], [*cuts, len(grad_order)], strict=True)
    ]
    interleaved = [list(grad_order[0::2]), list(grad_order[1::2])]
    half = list(blocks[: max(1, len(blocks) // 2)])
    raw: list[dict[str, Any]] = [
        {"tensor_fusion": {"bucket_cap_mb": 1}},
        {"tensor_fusion": {"bucket_cap_mb": 4}},
        {"tensor_fusion": {"bucket_caps_mb": [0.5, 2, 8]}},
        {"tensor_fusion": {"bucket_caps_mb": [65536], "implementation": "hooks"}},
        {"tensor_fusion": {"bucket_cap_mb": 0.25, "implementation": "hooks"}},
        {"tensor_fusion": {"bucket_cap_mb": 1, "implementation": "hooks"}},
        {"tensor_fusion": {"bucket_cap_mb": 4, "implementation": "hooks"}},
        {"tensor_fusion": {"buckets": contiguous}},
        {"tensor_fusion": {"buckets": [b for b in interleaved if b]}},
        {"tensor_fusion": {"bucket_cap_mb": 1, "dear": True}},
        {"tensor_fusion": {"bucket_cap_mb": 4, "dear": True}},
        {"tensor_fusion": {"bucket_caps_mb": [65536], "dear": True}},
        {"parallel": {"micro_batches": 2}},
        {
            "parallel": {"micro_batches": 2},
            "tensor_fusion": {"bucket_cap_mb": 1, "implementation": "hooks"},
        },
        {"parallel": {"micro_batches": 2}, "tensor_fusion": {"bucket_cap_mb": 4, "dear": True}},
        {"tensor_fusion": {"bucket_cap_mb": 0.5}},
        {"op_fusion": {"compiled": list(blocks)}},
        {
            "op_fusion": {"compiled": list(blocks)},
            "tensor_fusion": {"bucket_cap_mb": 1, "implementation": "hooks"},
        },
        {"op_fusion": {"compiled": half}, "tensor_fusion": {"bucket_cap_mb": 4}},
        {
            "op_fusion": {"compiled": list(blocks)},
            "tensor_fusion": {"bucket_cap_mb": 4, "dear": True},
        },
    ]
    if not blocks:
        raw = [r for r in raw if "op_fusion" not in r]
    return [Strategy.from_dict(r) for r in raw]


def parallel_pool() -> list[Strategy]:
    """Parallel plans for the dataset (before any model or world size rules some out): FSDP2
    with and without gradient accumulation, tensor parallelism over 2 and 4 ranks, GPipe and
    1F1B pipelines over 2 stages, and 1F1B over 4. On 4 ranks, the 2-way plans run with 2-way
    data parallelism beside them."""
    raw: list[dict[str, Any]] = [
        {"parallel": {"fsdp": True}},
        {"parallel": {"tp": 2}},
        {"parallel": {"pp": 2, "micro_batches": 2, "pp_schedule": "gpipe"}},
        {"parallel": {"fsdp": True, "micro_batches": 2}},
        {"parallel": {"pp": 2, "micro_batches": 4, "pp_schedule": "1f1b"}},
        {"parallel": {"tp": 4}},
        {"parallel": {"pp": 4, "micro_batches": 4, "pp_schedule": "1f1b"}},
        {"parallel": {"tp": 2, "micro_batches": 2}},
    ]
    return [Strategy.from_dict(r) for r in raw]


def interleaved_pool() -> list[Strategy]:
    """Interleaved 1F1B pipelines (two stages a rank) over 2 ranks, with 2 and 4 micro-batches
    (the pipeline plans of :func:`parallel_pool` run one stage a rank)."""
    return [
        Strategy.from_dict({"parallel": {"pp": 2, "micro_batches": m, "pp_schedule": s}})
        for m, s in ((4, "interleaved_1f1b"), (2, "interleaved_1f1b"))
    ]


def mixed_pool(data_parallel: Sequence[Strategy], parallel: Sequence[Strategy]) -> list[Strategy]:
    """Two data-parallel strategies, then a parallel plan, in turn (the rest of the longer
    pool at the end), so that consecutive picks from it mix kinds."""
    out: list[Strategy] = []
    for index in range(max(len(data_parallel), 2 * len(parallel)) // 2 + 1):
        out.extend(data_parallel[2 * index : 2 * index + 2])
        out.extend(parallel[index : index + 1])
    return out


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PlanOptions:
    """How much to measure: strategies per (model, setting) group besides DDP's defaults, and
    the executor's iterations per run.

    With ``side_by_side`` (cpu-v3) a group is one launch (a ``compare`` job): DDP's defaults
    and the group's strategies take turns of ``iters`` steps, at least ``rounds`` rounds, then
    more until every median's 95 % interval is within ``±ci_target`` or ``measure_budget_s`` a
    strategy is spent (the measurement protocol); no repeat runs (each run carries its
    interval). Without it (cpu-v2) every strategy is a launch of its own, ``iters`` steps.
    """

    per_group: int = 4
    iters: int = 5
    warmup: int = 2
    kernel_iters: int = 15
    fusion_iters: int = 10
    collectives: tuple[str, ...] = LINK_COLLECTIVES
    side_by_side: bool = False
    rounds: int = 3
    ci_target: float = 0.01
    measure_budget_s: float = 10.0

    def __post_init__(self) -> None:
        counts = (
            self.per_group,
            self.iters,
            self.warmup,
            self.kernel_iters,
            self.fusion_iters,
            self.rounds,
        )
        if min(counts) < 1:
            raise InvalidOptionError(
                f"per_group({self.per_group}), iters({self.iters}), warmup({self.warmup}), "
                f"kernel_iters({self.kernel_iters}), fusion_iters({self.fusion_iters}) and "
                f"rounds({self.rounds}) must all be >= 1"
            )
        if not 0 < self.ci_target < 1 or not self.measure_budget_s >= 0:
            raise InvalidOptionError(
                f"ci_target({self.ci_target}) must be in (0, 1) and "
                f"measure_budget_s({self.measure_budget_s}) >= 0"
            )


def plan_jobs(
    models: Sequence[ModelSpec],
    pools: Mapping[str, Sequence[Strategy]],
    settings: Sequence[tuple[int, str]] = SETTINGS,
    options: PlanOptions | None = None,
) -> list[dict[str, Any]]:
    """The batch jobs that measure the dataset (a ``jobs:`` list for ``ddlsim profile batch``).

    Group ``(model, setting)`` runs DDP's defaults and ``per_group`` strategies of the model's
    pool, taken in turn so that a model's groups together use as much of its pool as they can;
    odd groups run DDP's defaults once more with another seed (the repeat measures noise).
    """
    options = options or PlanOptions()
    jobs: list[dict[str, Any]] = []
    for world_size, bandwidth in dict.fromkeys(settings):
        jobs.append(
            {
                "kind": "collectives",
                "world_size": world_size,
                "bandwidth": bandwidth,
                "sizes": list(LINK_SIZES),
                "collectives": list(options.collectives),
            }
        )
    groups: list[tuple[ModelSpec, int, str, list[Strategy]]] = []
    for model_index, spec in enumerate(models):
        pool = list(pools[spec.label])
        for setting_index, (world_size, bandwidth) in enumerate(settings):
            start = (setting_index + model_index) * options.per_group
            chosen = [pool[(start + k) % len(pool)] for k in range(options.per_group)]
            fitting = [
                s for s in [Strategy(), *chosen] if _rank_batch(spec, s, world_size) is not None
            ]
            groups.append((spec, world_size, bandwidth, fitting))
    if options.side_by_side:
        _cover_every_kind(groups, pools)
    rank_batches: dict[str, set[int]] = {}
    for spec, world_size, _, strategies in groups:
        for strategy in strategies:
            rank_batches.setdefault(spec.label, set()).add(
                int(_rank_batch(spec, strategy, world_size) or 0)
            )
    by_label = {spec.label: spec for spec in models}
    for label, batches in rank_batches.items():
        for batch in sorted(batches, reverse=True):
            jobs.append(
                {
                    "kind": "kernels",
                    "model": by_label[label].to_dict(),
                    "batch_size": batch,
                    "iters": options.kernel_iters,
                }
            )
    # Fusion profiles of every block the model's pool compiles, at the micro-batches of the
    # compiled runs and of the first setting's data parallelism, the largest first for every
    # model, so a batch cut short still covers each model.
    fused: dict[str, dict[int, list[str]]] = {}
    for spec, world_size, _, strategies in groups:
        pooled = sorted({b for s in pools[spec.label] for b in s.op_fusion.compiled})
        if not pooled:
            continue
        at_batch = fused.setdefault(spec.label, {})
        if not at_batch:
            at_batch[int(_rank_batch(spec, Strategy(), settings[0][0]) or 0)] = pooled
        for strategy in strategies:
            if strategy.op_fusion.compiled:
                at_batch[int(_rank_batch(spec, strategy, world_size) or 0)] = pooled
    fusion_jobs = [
        (order, label, batch, compiled)
        for label, at_batch in fused.items()
        for order, (batch, compiled) in enumerate(sorted(at_batch.items(), reverse=True))
    ]
    for _, label, batch, compiled in sorted(fusion_jobs, key=lambda job: job[0]):
        jobs.append(
            {
                "kind": "fusion",
                "model": by_label[label].to_dict(),
                "batch_size": batch,
                "blocks": compiled,
                "iters": options.fusion_iters,
            }
        )
    if options.side_by_side:
        jobs.extend(_compare_jobs(groups, len(settings), options))
        return jobs
    run = {"iters": options.iters, "warmup": options.warmup}
    depth = max(len(g[3]) for g in groups)
    for slot in range(depth):
        for spec, world_size, bandwidth, strategies in groups:
            if slot < len(strategies):
                jobs.append(_run_job(spec, strategies[slot], world_size, bandwidth, run, seed=0))
    for index, (spec, world_size, bandwidth, _) in enumerate(groups):
        if index % 2:
            jobs.append(_run_job(spec, Strategy(), world_size, bandwidth, run, seed=1))
    return jobs


def plan_kind(strategy: Strategy) -> str:
    """The kind of plan a strategy is, as the dataset covers them: ``risk_kind`` (tensor
    parallelism, FSDP, compiled blocks, DeAR, the executor's hooks, DDP's reducer), pipelines by
    schedule, and gradient accumulation apart."""
    kind = risk_kind(strategy)
    plan = strategy.parallel
    if kind == "pipeline":
        return f"pipeline:{plan.pp_schedule}"
    return f"{kind}:accumulation" if plan.micro_batches > 1 else kind


def _cover_every_kind(
    groups: list[tuple[ModelSpec, int, str, list[Strategy]]],
    pools: Mapping[str, Sequence[Strategy]],
) -> None:
    """Add to ``groups`` (in place) a strategy of every kind (``plan_kind``) that some model's
    pool has and that fits a setting where the picks in turn left it out: in the group of the
    first model it fits, among the groups of that setting holding the fewest strategies."""
    kinds = {plan_kind(s) for pool in pools.values() for s in pool}
    for setting in dict.fromkeys((g[1], g[2]) for g in groups):
        here = [g for g in groups if (g[1], g[2]) == setting]
        for kind in sorted(kinds - {plan_kind(s) for g in here for s in g[3]}):
            for spec, world_size, _, strategies in sorted(here, key=lambda g: len(g[3])):
                extra = next(
                    (
                        s
                        for s in pools[spec.label]
                        if plan_kind(s) == kind and _rank_batch(spec, s, world_size) is not None
                    ),
                    None,
                )
                if extra is not None:
                    strategies.append(extra)
                    break


def _compare_jobs(
    groups: Sequence[tuple[ModelSpec, int, str, list[Strategy]]],
    settings_count: int,
    options: PlanOptions,
) -> list[dict[str, Any]]:
    """One launch a group, DDP's defaults beside the group's strategies; in rounds that take
    every model once, each round on other settings, so that a batch cut short still covers
    every model and every setting evenly."""
    protocol = {
        "iters": options.iters,
        "warmup": options.warmup,
        "rounds": options.rounds,
        "ci_target": options.ci_target,
        "measure_budget_s": options.measure_budget_s,
        "seed": 0,
    }
    by_model: dict[str, list[tuple[ModelSpec, int, str, list[Strategy]]]] = {}
    for group in groups:
        by_model.setdefault(group[0].label, []).append(group)
    jobs = []
    for turn in range(settings_count):
        for model_index, model_groups in enumerate(by_model.values()):
            if turn >= len(model_groups):
                continue
            spec, world_size, bandwidth, strategies = model_groups[
                (model_index + turn) % len(model_groups)
            ]
            others = [s.to_dict() for s in strategies if s != Strategy()]
            where = {"model": spec.to_dict(), "world_size": world_size, "bandwidth": bandwidth}
            if not others:  # nothing else fits this setting: DDP's defaults alone
                jobs.append({"kind": "run", **where, "strategy": {}, **_single(protocol)})
                continue
            jobs.append({"kind": "compare", **where, "strategies": others, **protocol})
    return jobs


def _single(protocol: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in protocol.items() if k != "rounds"}


def _rank_batch(spec: ModelSpec, strategy: Strategy, world_size: int) -> int | None:
    try:
        parts = strategy.parallel.resolve_dp(world_size) * strategy.parallel.micro_batches
    except InvalidStrategyError:  # the plan needs more (or other) ranks than the setting has
        return None
    batch = spec.inputs.batch_size
    return batch // parts if batch % parts == 0 else None


def _run_job(
    spec: ModelSpec,
    strategy: Strategy,
    world_size: int,
    bandwidth: str,
    run: Mapping[str, int],
    *,
    seed: int,
) -> dict[str, Any]:
    return {
        "kind": "run",
        "model": spec.to_dict(),
        "strategy": strategy.to_dict(),
        "world_size": world_size,
        "bandwidth": bandwidth,
        "seed": seed,
        **run,
    }


# -- the file ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class KernelEntry:
    """A kernel profile: the graph it timed (default strategy, the rank's micro-batch) and the
    median time of each node (ms)."""

    graph: IterationGraph
    node_ms: dict[int, float]
    iteration_time_ms: float


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FusionEntry:
    """A fusion profile: blocks of a model at one batch size, each timed alone (forward and
    backward) eager and compiled, median ms."""

    model: str
    batch_size: int
    blocks: tuple[dict[str, Any], ...]

    def ratios(self) -> dict[str, float]:
        """Compiled over eager time of each block."""
        return {
            str(b["block"]): float(b["compiled_ms"]) / float(b["eager_ms"])
            for b in self.blocks
            if float(b["eager_ms"]) > 0 and float(b["compiled_ms"]) > 0
        }


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LinkFit:
    """A collective's fitted latency-bandwidth model on one cluster setting."""

    collective: str
    world_size: int
    bandwidth: str
    alpha_us: float
    busbw_gbps: float
    r2: float


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RunEntry:
    """One executor run: each iteration's time (slowest rank) after warm-up."""

    model: ModelSpec
    strategy: Strategy
    world_size: int
    bandwidth: str
    samples_ms: tuple[float, ...]
    seed: int
    created_at: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def measured_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def family(self) -> str:
        return self.model.family or self.model.label

    @property
    def ci_half_width(self) -> float | None:
        """Half the median's recorded 95 % interval over the median (0.01: ±1 %), or ``None``
        for a run measured before the protocol recorded one (cpu-v2)."""
        interval = self.extra.get("ci95_ms")
        if not interval or self.measured_ms <= 0:
            return None
        low, high = (float(x) for x in interval)
        return (high - low) / 2 / self.measured_ms

    @property
    def speedup(self) -> float | None:
        """DDP's defaults measured in the same launch over this run's median (above 1: this
        strategy was faster), or ``None`` without such a reference."""
        reference = self.extra.get("reference_ms")
        return float(reference) / self.measured_ms if reference else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Dataset:
    """Runs and everything needed to replay and featurize them."""

    runs: tuple[RunEntry, ...]
    kernels: dict[tuple[str, int], KernelEntry]  # (model label, rank batch size)
    links: tuple[LinkFit, ...]
    meta: dict[str, Any]
    fusion: dict[tuple[str, int], FusionEntry] = dataclasses.field(default_factory=dict)

    @property
    def families(self) -> list[str]:
        return sorted({r.family for r in self.runs})

    def kernel_for(self, spec: ModelSpec) -> KernelEntry | None:
        return self.kernels.get((spec.label, spec.inputs.batch_size))

    def select(
        self, *, families: Iterable[str] | None = None, exclude: Iterable[str] = ()
    ) -> "Dataset":
        keep = set(families) if families is not None else None
        drop = set(exclude)
        runs = tuple(
            r for r in self.runs if (keep is None or r.family in keep) and r.family not in drop
        )
        return dataclasses.replace(self, runs=runs)


def export_dataset(
    store: Any,
    out: Path,
    *,
    meta: Mapping[str, Any],
    models: Sequence[ModelSpec] | None = None,
    merge: bool = False,
) -> dict[str, int]:
    """Write what ``store`` holds (CPU kernel profiles, fusion profiles, collective fits,
    measurements) to ``out`` (gzip JSON); with ``models``, only the runs of those specs and the
    profiles of their labels (a store also used for other runs keeps them out of the dataset);
    with ``merge``, together with what ``out`` already holds (``merge_datasets``). Returns
    counts of what was written."""
    specs = None if models is None else {_spec_key(m) for m in models}
    labels = None if models is None else {m.label for m in models}
    kernels: dict[tuple[str, int], KernelEntry] = {}
    for profile in store.kernel_profiles():  # oldest first: a newer profile replaces
        if profile.device != "cpu":
            continue
        graph = store.load_graph(graph_hash=profile.graph_hash)
        if labels is not None and graph.model.label not in labels:
            continue
        kernels[(graph.model.label, graph.model.inputs.batch_size)] = KernelEntry(
            graph=graph,
            node_ms=dict(profile.node_ms),
            iteration_time_ms=profile.iteration_time_ms,
        )
    links = tuple(
        LinkFit(
            collective=p.collective,
            world_size=p.world_size,
            bandwidth=p.bandwidth,
            alpha_us=p.alpha_us,
            busbw_gbps=p.busbw_gbps,
            r2=p.r2,
        )
        for p in store.collective_profiles()
    )
    fusion: dict[tuple[str, int], FusionEntry] = {}
    for fused in store.fusion_profiles():  # oldest first: a newer profile replaces
        if fused.device != "cpu":
            continue
        model = store.load_graph(graph_hash=fused.graph_hash).model
        if labels is not None and model.label not in labels:
            continue
        fusion[(model.label, model.inputs.batch_size)] = FusionEntry(
            model=model.label,
            batch_size=model.inputs.batch_size,
            blocks=tuple(dict(b) for b in fused.blocks),
        )
    runs = []
    for m in store.measurements():
        graph = store.load_graph(graph_hash=m.graph_hash)
        if specs is not None and _spec_key(graph.model) not in specs:
            continue
        runs.append(
            RunEntry(
                model=graph.model,
                strategy=store.load_strategy(strategy_hash=m.strategy_hash),
                world_size=m.world_size,
                bandwidth=m.bandwidth,
                samples_ms=tuple(m.iteration_time_ms),
                seed=int(m.env.get("seed", 0)),
                created_at=m.created_at.isoformat() if m.created_at else "",
                extra={
                    "network": m.network,
                    "peak_memory_bytes": list(m.peak_memory_bytes),
                    "rank_cores": m.env.get("rank_cores", {}),
                    "compile_time_s": m.env.get("compile_time_s"),
                    **{key: m.env[key] for key in _PROTOCOL_KEYS if key in m.env},
                },
            )
        )
    dataset = Dataset(
        runs=tuple(with_references(runs)),
        kernels=kernels,
        links=links,
        meta=dict(meta),
        fusion=fusion,
    )
    if merge and out.exists():
        dataset = merge_datasets(load_dataset(out), dataset)
    save_dataset(dataset, out)
    return {
        "kernels": len(dataset.kernels),
        "fusion": len(dataset.fusion),
        "links": len(dataset.links),
        "runs": len(dataset.runs),
    }


# What the measurement protocol records with a run (executor.run.RunResult.env) and the file
# keeps: the median's interval, why sampling stopped, the launch it shared with others, the
# round of each sample (for ratio intervals) and the rank-to-core placement.
_PROTOCOL_KEYS: tuple[str, ...] = (
    "ci95_ms",
    "stopped_by",
    "launch_id",
    "side_by_side",
    "sample_rounds",
    "ranks_per_core",
    "pinned",
)


def with_references(runs: Iterable[RunEntry]) -> list[RunEntry]:
    """``runs`` with the reference each was measured beside: where a launch (``launch_id``)
    also ran DDP's defaults, each of its runs gets that run's median and interval as
    ``reference_ms`` and ``reference_ci95_ms`` (the reference itself gets its own)."""
    runs = list(runs)
    references: dict[str, RunEntry] = {}
    for run in runs:
        launch = run.extra.get("launch_id")
        if launch and run.strategy == Strategy():
            references[str(launch)] = run
    out = []
    for run in runs:
        reference = references.get(str(run.extra.get("launch_id") or ""))
        if reference is None:
            out.append(run)
            continue
        extra = {
            **run.extra,
            "reference_ms": reference.measured_ms,
            "reference_ci95_ms": reference.extra.get("ci95_ms"),
        }
        out.append(dataclasses.replace(run, extra=extra))
    return out


def _spec_key(spec: ModelSpec) -> str:
    return json.dumps(spec.to_dict(), sort_keys=True)


def merge_datasets(older: Dataset, newer: Dataset) -> Dataset:
    """One dataset holding both: profiles and fits of ``newer`` replace those of ``older`` with
    the same key; runs are the union (a run in both, same launch and strategy, counted once).
    A collection that spans several sessions exports each one's store into the same file."""

    def run_key(run: RunEntry) -> str:
        when = run.extra.get("launch_id") or run.created_at
        return json.dumps(
            [when, _spec_key(run.model), run.strategy.to_json(), run.world_size, run.bandwidth],
            sort_keys=True,
        )

    links = {(f.collective, f.world_size, f.bandwidth): f for f in older.links}
    links.update({(f.collective, f.world_size, f.bandwidth): f for f in newer.links})
    runs = {run_key(r): r for r in older.runs}
    runs.update({run_key(r): r for r in newer.runs})
    parts = [*older.meta.get("parts", [older.meta]), newer.meta]
    return Dataset(
        runs=tuple(with_references(runs.values())),
        kernels={**older.kernels, **newer.kernels},
        links=tuple(links.values()),
        meta={**newer.meta, "parts": parts},
        fusion={**older.fusion, **newer.fusion},
    )


def drop_done(jobs: Sequence[Mapping[str, Any]], done: Dataset) -> list[dict[str, Any]]:
    """``jobs`` (a plan) less those whose results ``done`` already holds: link fits of every
    collective asked for, kernel and fusion profiles at the batch size, every strategy of a run
    or side-by-side launch (DDP's defaults included) on the model, world size and link. A
    collection resumes from its file this way when the store it wrote to is gone."""
    measured = {
        (_spec_key(r.model), r.world_size, r.bandwidth, r.strategy.to_json()) for r in done.runs
    }
    fitted = {(f.collective, f.world_size, f.bandwidth) for f in done.links}
    out = []
    for job in jobs:
        kind = job["kind"]
        if kind == "collectives":
            finished = all(
                (c, job["world_size"], job["bandwidth"]) in fitted for c in job["collectives"]
            )
        elif kind in ("kernels", "fusion"):
            label = ModelSpec.from_dict(job["model"]).label
            held = done.kernels if kind == "kernels" else done.fusion
            finished = (label, int(job["batch_size"])) in held
        else:
            spec = _spec_key(ModelSpec.from_dict(job["model"]))
            raw = job["strategies"] if kind == "compare" else [job["strategy"]]
            strategies = [Strategy(), *map(Strategy.from_dict, raw)]
            if kind == "run":
                strategies = strategies[1:]
            finished = all(
                (spec, job["world_size"], job["bandwidth"], s.to_json()) in measured
                for s in strategies
            )
        if not finished:
            out.append(dict(job))
    return out


def save_dataset(dataset: Dataset, out: Path) -> None:
    """Write ``dataset`` to ``out`` (gzip JSON), atomically."""
    payload = {
        "format": DATASET_FORMAT,
        "meta": dataset.meta,
        "kernels": [
            {
                "graph": entry.graph.to_dict(),
                "node_ms": {str(k): v for k, v in sorted(entry.node_ms.items())},
                "iteration_time_ms": entry.iteration_time_ms,
            }
            for entry in dataset.kernels.values()
        ],
        "links": [dataclasses.asdict(link) for link in dataset.links],
        "fusion": [
            {"model": entry.model, "batch_size": entry.batch_size, "blocks": list(entry.blocks)}
            for entry in dataset.fusion.values()
        ],
        "runs": [
            {
                "model": run.model.to_dict(),
                "strategy": run.strategy.to_dict(),
                "world_size": run.world_size,
                "bandwidth": run.bandwidth,
                "samples_ms": list(run.samples_ms),
                "seed": run.seed,
                "created_at": run.created_at,
                **run.extra,
            }
            for run in dataset.runs
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump(payload, f, separators=(",", ":"))
    tmp.replace(out)


_RUN_KEYS = frozenset(
    {"model", "strategy", "world_size", "bandwidth", "samples_ms", "seed", "created_at"}
)


def load_dataset(path: Path) -> Dataset:
    """Read a dataset file.

    Raises:
        InvalidOptionError: the file is missing, not a dataset, or of another format.
    """
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError, EOFError) as exc:
        raise InvalidOptionError(f"dataset {path} cannot be read: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != DATASET_FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise InvalidOptionError(f"dataset {path} has format {found!r}; allowed: {DATASET_FORMAT}")
    kernels: dict[tuple[str, int], KernelEntry] = {}
    for entry in raw["kernels"]:
        graph = IterationGraph.from_dict(entry["graph"])
        key = (graph.model.label, graph.model.inputs.batch_size)
        kernels[key] = KernelEntry(
            graph=graph,
            node_ms={int(k): float(v) for k, v in entry["node_ms"].items()},
            iteration_time_ms=float(entry["iteration_time_ms"]),
        )
    links = tuple(LinkFit(**entry) for entry in raw["links"])
    fusion = {
        (str(entry["model"]), int(entry["batch_size"])): FusionEntry(
            model=str(entry["model"]),
            batch_size=int(entry["batch_size"]),
            blocks=tuple(dict(b) for b in entry["blocks"]),
        )
        for entry in raw.get("fusion", [])  # absent from files written before fusion profiles
    }
    runs = tuple(
        RunEntry(
            model=ModelSpec.from_dict(r["model"]),
            strategy=Strategy.from_dict(r["strategy"]),
            world_size=int(r["world_size"]),
            bandwidth=str(r["bandwidth"]),
            samples_ms=tuple(float(x) for x in r["samples_ms"]),
            seed=int(r.get("seed", 0)),
            created_at=str(r.get("created_at", "")),
            extra={k: v for k, v in r.items() if k not in _RUN_KEYS},
        )
        for r in raw["runs"]
    )
    return Dataset(
        runs=runs, kernels=kernels, links=links, meta=dict(raw.get("meta", {})), fusion=fusion
    )
