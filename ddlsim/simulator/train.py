"""Training and using the cost model on a measured dataset.

Every run of the dataset becomes a :class:`StrategySample`: its model's kernel profile at the
rank's micro-batch, the collective fits of its world size and link, the closed-form (or, for
DeAR, the full) replay, and the measured median. Training is full-batch (the dataset is
hundreds of runs over tens of graphs): each epoch encodes every graph once, hides a random
share of profiled durations (the duration head learns to fill them in), and minimises

- the squared error of the predicted ``log(measured / replayed)``,
- a pairwise ranking loss between runs of the same model and cluster (after DisCo: search
  needs the order right more than the absolute time),
- the squared error of the predicted log speed-up over DDP's defaults measured in the same
  launch (what a search acts on, and what the noise of a launch does not reach),
- the squared error of the hidden durations,
- the squared error of the predicted ``log(compiled / eager)`` of the blocks with a fusion
  profile.
"""

import contextlib
import dataclasses
import math
import pickle
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch_geometric.data import Batch

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.graph.annotate import with_strategy
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.cluster import parse_bandwidth_gbps
from ddlsim.data.specs.strategy import Strategy
from ddlsim.simulator.costs import comm_models, compute_scale, rank_spec, scaled, uses_ring
from ddlsim.simulator.dataset import Dataset, RunEntry
from ddlsim.simulator.dp_replay import DataParallelReplay, ReplaySummary
from ddlsim.simulator.features import (
    BlockSample,
    ModelGraph,
    StrategySample,
    block_sample,
    model_graph,
    strategy_sample,
)
from ddlsim.simulator.gnn import CostModelConfig, IterationCostModel, network_from_checkpoint
from ddlsim.simulator.plans import is_data_parallel, replay_parallel_plan
from ddlsim.simulator.replay import transfer_durations
from ddlsim.simulator.runtime import RuntimeCosts, runtime_costs_of
from ddlsim.simulator.timeline import UnsupportedPlanError


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TrainOptions:
    """Optimisation settings."""

    epochs: int = 200
    learning_rate: float = 3e-3
    weight_decay: float = 1e-4
    rank_weight: float = 0.5
    speedup_weight: float = 1.0
    duration_weight: float = 0.2
    fusion_weight: float = 0.5
    hide_share: float = 0.15
    seed: int = 0
    # One intra-op thread: the graphs are small, and on a busy two-core machine more threads
    # spin against each other (a test epoch went from 4 ms to 0.4 s with two).
    threads: int = 1

    def __post_init__(self) -> None:
        if self.epochs < 1 or not self.learning_rate > 0 or not 0 <= self.hide_share < 1:
            raise InvalidOptionError(
                f"epochs({self.epochs}) must be >= 1, learning_rate({self.learning_rate}) > 0 "
                f"and hide_share({self.hide_share}) in [0, 1)"
            )


@dataclasses.dataclass(kw_only=True)
class TrainingSet:
    """The graphs (one per model and micro-batch) and the samples that refer to them."""

    graphs: dict[str, ModelGraph]
    samples: list[StrategySample]
    skipped: list[str]
    blocks: list[BlockSample] = dataclasses.field(default_factory=list)

    def batch(self) -> tuple[Batch, dict[str, int]]:
        keys = sorted(self.graphs)
        return Batch.from_data_list([self.graphs[k].data for k in keys]), {
            k: i for i, k in enumerate(keys)
        }


def model_key(label: str, batch_size: int) -> str:
    return f"{label}@{batch_size}"


def build_training_set(dataset: Dataset, runs: Iterable[RunEntry] | None = None) -> TrainingSet:
    """Samples for ``runs`` (default: all of the dataset's); runs without a kernel profile of
    their micro-batch are skipped and named."""
    graphs: dict[str, ModelGraph] = {}
    replays: dict[str, DataParallelReplay] = {}
    samples: list[StrategySample] = []
    skipped: list[str] = []
    selected = list(dataset.runs if runs is None else runs)
    for run in selected:
        # A later session's runs replay from that session's own profiles and fits.
        source = dataset.source_of(run)
        session = run.extra.get("session")
        rank = rank_spec(run.model, run.strategy, run.world_size)
        entry = source.kernel_for(rank)
        key = model_key(rank.label, rank.inputs.batch_size)
        if entry is None:
            skipped.append(f"{key}: no kernel profile")
            continue
        # shared cores, and the machine's own speed then against the profile's
        scale = compute_scale(run.world_size, _cores(run)) * run.speed_ratio(entry)
        key = f"{session}/{key}x{scale:g}" if session else f"{key}x{scale:g}"
        if key not in graphs:
            node_ms = scaled(entry.node_ms, scale)
            graphs[key] = model_graph(entry.graph, node_ms)
            runtime = runtime_costs_of(source.meta).scaled(scale)
            replays[key] = DataParallelReplay(entry.graph, node_ms, runtime)
        dp = run.strategy.parallel.resolve_dp(run.world_size)
        models = comm_models(
            list(source.links),
            world_size=dp,
            bandwidth=run.bandwidth,
            bandwidth_gbps=parse_bandwidth_gbps(run.bandwidth),
            ring=uses_ring(run.strategy, "gloo"),
        ).models
        if is_data_parallel(run.strategy.parallel):
            summary = replays[key].summary(
                run.strategy, models, micro_batches=run.strategy.parallel.micro_batches
            )
        else:
            try:
                summary = _plan_summary(
                    source,
                    run=run,
                    profiled=entry.graph,
                    node_ms=replays[key].node_ms,
                    models=models,
                    runtime=replays[key].runtime,
                )
            except (UnsupportedPlanError, InvalidStrategyError) as exc:
                skipped.append(f"{key} {run.strategy.to_json()}: {exc}")
                continue
        samples.append(
            strategy_sample(
                model_key=key,
                graph=graphs[key],
                strategy=run.strategy,
                summary=summary,
                comm=models,
                dp=dp,
                measured_ms=run.measured_ms,
                group=f"{session + '/' if session else ''}{run.model.label}|{run.world_size}|"
                f"{run.bandwidth}",
                family=run.family,
                compute_scale=scale,
                label_noise=run.ci_half_width,
                reference=run.strategy == Strategy(),
            )
        )
    blocks = []
    for session, source in [("", dataset), *sorted(dataset.sessions.items())]:
        families = {
            r.model.label: r.family for r in selected if r.extra.get("session", "") == session
        }
        blocks += _fused_blocks(source, families, graphs, f"{session}/" if session else "")
    return TrainingSet(graphs=graphs, samples=samples, skipped=skipped, blocks=blocks)


def _fused_blocks(
    dataset: Dataset, families: Mapping[str, str], graphs: dict[str, ModelGraph], session: str
) -> list[BlockSample]:
    """The fusion profiles of the models in ``families`` (label to family) as block samples,
    on a graph of the same model and batch already in ``graphs`` (any compute scale; keys
    begin with ``session``), or on one added at the profile's own times."""
    blocks = []
    for (label, batch), entry in sorted(dataset.fusion.items()):
        if label not in families:
            continue
        prefix = f"{session}{model_key(label, batch)}x"
        key = next((k for k in sorted(graphs) if k.startswith(prefix)), None)
        if key is None:
            kernel = dataset.kernels.get((label, batch))
            if kernel is None:
                continue
            key = f"{prefix}1"
            graphs[key] = model_graph(kernel.graph, kernel.node_ms)
        scale = float(key.removeprefix(prefix))
        for block, ratio in sorted(entry.ratios().items()):
            sample = block_sample(
                model_key=key,
                graph=graphs[key],
                block=block,
                measured_ratio=ratio,
                family=families[label],
                compute_scale=scale,
            )
            if sample is not None:
                blocks.append(sample)
    return blocks


def _plan_summary(
    dataset: Dataset,
    *,
    run: RunEntry,
    profiled: IterationGraph,
    node_ms: Mapping[int, float],
    models: Mapping[str, AlphaBeta],
    runtime: RuntimeCosts,
) -> ReplaySummary:
    """The full replay of a run's FSDP, tensor or pipeline plan."""
    graph = with_strategy(profiled, run.strategy)
    result = replay_parallel_plan(
        graph,
        transfer_durations(profiled, node_ms, graph),
        list(dataset.links),
        models,
        world_size=run.world_size,
        bandwidth=run.bandwidth,
        runtime=runtime,
        compute_scale=compute_scale(run.world_size, _cores(run)),
    )
    return ReplaySummary.of(result)


def _cores(run: RunEntry) -> int:
    """The cores the run's ranks shared (the union of their affinities; 2, the machine the
    dataset was measured on, where a run does not say)."""
    placement = run.extra.get("rank_cores") or {}
    cores = {core for listed in placement.values() for core in listed}
    return len(cores) or 2


def _rank_pairs(samples: Sequence[StrategySample]) -> tuple[torch.Tensor, torch.Tensor]:
    """Index pairs (i, j) of the same group with measured i slower than j by over 2 %."""
    by_group: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by_group.setdefault(s.group, []).append(i)
    slow, fast = [], []
    for members in by_group.values():
        for i in members:
            for j in members:
                mi, mj = samples[i].measured_ms, samples[j].measured_ms
                if mi is not None and mj is not None and mi > mj * 1.02:
                    slow.append(i)
                    fast.append(j)
    return torch.tensor(slow, dtype=torch.long), torch.tensor(fast, dtype=torch.long)


def _speedup_pairs(samples: Sequence[StrategySample]) -> tuple[torch.Tensor, torch.Tensor]:
    """Index pairs (reference, i): each run of a group that holds DDP's defaults measured in
    the same launch, with that reference run (itself excluded)."""
    references = {s.group: i for i, s in enumerate(samples) if s.reference}
    pairs = [
        (references[s.group], i)
        for i, s in enumerate(samples)
        if s.group in references and references[s.group] != i
    ]
    return (
        torch.tensor([r for r, _ in pairs], dtype=torch.long),
        torch.tensor([i for _, i in pairs], dtype=torch.long),
    )


def train_cost_model(
    data: TrainingSet,
    *,
    config: CostModelConfig | None = None,
    options: TrainOptions | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> IterationCostModel:
    """Fit a cost model to ``data`` (full batch; ``progress(epoch, epochs, loss)``).

    Raises:
        InvalidOptionError: no sample has a measured time.
    """
    options = options or TrainOptions()
    samples = [s for s in data.samples if s.measured_ms is not None]
    if not samples:
        raise InvalidOptionError("no measured runs to train on (is the dataset empty?)")
    with intra_op_threads(options.threads):
        return _train(data, samples, config or CostModelConfig(), options, progress)


@contextlib.contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` intra-op threads, then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _train(
    data: TrainingSet,
    samples: list[StrategySample],
    config: CostModelConfig,
    options: TrainOptions,
    progress: Callable[[int, int, float], None] | None,
) -> IterationCostModel:
    torch.manual_seed(options.seed)
    model = IterationCostModel(config)
    graphs, index = data.batch()
    target = torch.tensor([math.log(float(s.measured_ms or 1.0) / s.replay_ms) for s in samples])
    log_replay = torch.tensor([math.log(s.replay_ms) for s in samples])
    slow, fast = _rank_pairs(samples)
    reference, other = _speedup_pairs(samples)
    log_measured = torch.tensor([math.log(float(s.measured_ms or 1.0)) for s in samples])
    blocks = [b for b in data.blocks if b.measured_ratio]
    fused_target = torch.tensor([math.log(float(b.measured_ratio or 1.0)) for b in blocks])
    timed = graphs.timed
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=options.learning_rate, weight_decay=options.weight_decay
    )
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=options.epochs)
    model.train()
    for epoch in range(options.epochs):
        hide = timed & (torch.rand(timed.shape[0]) < options.hide_share)
        h, durations = model.encode(graphs, hide)
        correction = model.corrections(h, graphs, index, samples)
        loss = torch.mean((correction - target) ** 2)
        predicted = log_replay + correction
        if len(slow):
            margin = predicted[slow] - predicted[fast]
            loss = loss + options.rank_weight * torch.nn.functional.softplus(-margin * 20).mean()
        if len(reference) and options.speedup_weight > 0:
            # what a search acts on: the log speed-up over DDP's defaults of the same launch
            predicted_gain = predicted[reference] - predicted[other]
            measured_gain = log_measured[reference] - log_measured[other]
            error = predicted_gain - measured_gain
            loss = loss + options.speedup_weight * torch.mean(error**2)
        if bool(hide.any()):
            error = durations[hide] - graphs.duration[hide]
            loss = loss + options.duration_weight * torch.mean(error**2)
        if blocks:
            fused = model.fused_ratios(h, graphs, index, blocks)
            loss = loss + options.fusion_weight * torch.mean((fused - fused_target) ** 2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if progress is not None:
            progress(epoch + 1, options.epochs, float(loss.detach()))
    model.eval()
    return model


@torch.no_grad()
def predict_fused(
    model: IterationCostModel, graphs: dict[str, ModelGraph], blocks: Sequence[BlockSample]
) -> list[float]:
    """Each block's predicted time compiled (ms): its eager time in the profile times the
    predicted compiled/eager ratio."""
    if not blocks:
        return []
    keys = sorted({b.model_key for b in blocks})
    batch = Batch.from_data_list([graphs[k].data for k in keys])
    h, _ = model.encode(batch)
    ratios = model.fused_ratios(h, batch, {k: i for i, k in enumerate(keys)}, blocks)
    return [b.eager_ms * math.exp(float(r)) for b, r in zip(blocks, ratios, strict=True)]


def fusion_error(
    model: IterationCostModel, graphs: dict[str, ModelGraph], blocks: Sequence[BlockSample]
) -> tuple[float, float]:
    """Median absolute percentage error of the compiled time of measured ``blocks``: the fused-
    block head's, and that of taking the eager time for the compiled one (no model of fusion).
    NaN without measured blocks."""
    measured = [b for b in blocks if b.measured_ratio]
    if not measured:
        return float("nan"), float("nan")
    predicted = predict_fused(model, graphs, measured)
    truth = [b.eager_ms * float(b.measured_ratio or 1.0) for b in measured]
    learned = [abs(p - t) / t for p, t in zip(predicted, truth, strict=True)]
    unfused = [abs(b.eager_ms - t) / t for b, t in zip(measured, truth, strict=True)]
    return statistics.median(learned), statistics.median(unfused)


@torch.no_grad()
def duration_error(model: IterationCostModel, graphs: dict[str, ModelGraph]) -> float:
    """Median absolute percentage error of the duration head on every profiled op of
    ``graphs`` with all durations hidden (ops over 10 µs, where timing is meaningful)."""
    keys = sorted(graphs)
    batch = Batch.from_data_list([graphs[k].data for k in keys])
    _, predicted = model.encode(batch, hide=batch.timed)
    mask = batch.timed & (batch.duration > math.log1p(10.0))
    if not bool(mask.any()):
        return float("nan")
    truth = torch.expm1(batch.duration[mask])
    guess = torch.expm1(predicted[mask].clamp(min=0.0))
    return float(torch.median((guess - truth).abs() / truth))


def save_checkpoint(model: IterationCostModel, path: Path, meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(model.checkpoint(meta), tmp)
    tmp.replace(path)


def load_checkpoint(path: Path) -> tuple[IterationCostModel, dict[str, Any]]:
    """Read a checkpoint with ``weights_only=True``: tensors and plain data, never code.

    Raises:
        InvalidOptionError: the file is missing or not a cost-model checkpoint.
    """
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise InvalidOptionError(f"cost model checkpoint {path} cannot be read: {exc}") from None
    return network_from_checkpoint(raw)
