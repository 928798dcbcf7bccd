"""The roofline corrected by the GNN: what a GPU dataset teaches the GPU path's compute cost.

A GPU dataset (``gpu-v1``: kernel profiles and one-rank launches on one GPU) holds whole
training iterations. Each becomes a sample of the cost model the CPU path trains
(:mod:`ddlsim.simulator.train`), read the way a prediction of a model never measured is:

- its graph (the bf16 one for a bf16 iteration: autocast's casts, 16-bit matmuls) with the
  roofline's time of every node as the node's duration (:func:`roofline_node_ms`), since the
  roofline is all a new model has;
- the iteration's roofline (the nodes' sum, one stream) in the replay's place, and its measured
  median as the label: the strategy head learns ``log(measured / roofline)``, which is what
  launch gaps, small shapes, layouts and the optimizer's per-parameter kernels add or fusion
  removes;
- compiled blocks as compiled rows; a launch's strategies beside its DDP defaults, for the
  ranking and speed-up losses.

:func:`evaluate_holdout` leaves each family out in turn and compares the roofline alone with
the roofline corrected by a model trained on the other families.
"""

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.models import repeated_blocks
from ddlsim.data.specs.gpu_cluster import H100_SXM, H200_SXM, AcceleratorSpec
from ddlsim.simulator.cost_model import GPU_TARGET
from ddlsim.simulator.dataset import Dataset, KernelEntry, RunEntry
from ddlsim.simulator.features import GLOBAL_FEATURES, StrategySample, model_graph
from ddlsim.simulator.gnn import IterationCostModel
from ddlsim.simulator.gpu.cost import roofline_node_ms
from ddlsim.simulator.gpu.roofline import GpuOpCosts
from ddlsim.simulator.train import TrainingSet, TrainOptions, train_cost_model

_GLOBAL = {name: i for i, name in enumerate(GLOBAL_FEATURES)}


def gpu_of(name: str) -> AcceleratorSpec:
    """The accelerator a dataset was measured on, from the name its datasheet or CUDA gives.

    Raises:
        InvalidOptionError: a GPU whose per-op times do not ship, naming those that do.
    """
    for fragment, spec in (("H200", H200_SXM), ("H100", H100_SXM)):
        if fragment in name.upper():
            return spec
    raise InvalidOptionError(
        f"GPU {name!r} has no measured per-op times to price its roofline; allowed: H100, H200"
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuSample:
    """One measured iteration and what it was measured as."""

    sample: StrategySample
    source: str  # "kernels" (a kernel profile's iteration) or "launch" (a one-rank launch)
    model: str
    precision: str
    compiled: bool


def _globals(roofline_ms: float, compiled_share: float) -> tuple[float, ...]:
    values = [0.0] * len(GLOBAL_FEATURES)
    values[_GLOBAL["log_replay_ms"]] = math.log(roofline_ms)
    values[_GLOBAL["compute_share"]] = 1.0
    values[_GLOBAL["compiled_share"]] = compiled_share
    return tuple(values)


def _graph_key(entry: KernelEntry) -> str:
    model = entry.graph.model
    return f"{model.label}@{model.inputs.batch_size}:{entry.precision}"


def gpu_training_set(
    dataset: Dataset, gpu: AcceleratorSpec
) -> tuple[TrainingSet, list[GpuSample]]:
    """The dataset's iterations as samples over graphs priced by ``gpu``'s roofline: one a
    kernel profile (its profiler-off median) and one a launch's run at one rank whose model,
    batch and precision have a profile (the rest are named in ``skipped``)."""
    costs = GpuOpCosts(gpu)
    graphs = {}
    roofline = {}
    for entry in dataset.kernels.values():
        key = _graph_key(entry)
        node_ms = roofline_node_ms(entry.graph, costs)
        graphs[key] = model_graph(entry.graph, node_ms)
        roofline[key] = sum(node_ms.values())
    samples: list[GpuSample] = []
    for entry in dataset.kernels.values():
        key = _graph_key(entry)
        model = entry.graph.model
        sample = StrategySample(
            model_key=key,
            buckets=(),
            bucket_rows=(),
            compiled_rows=(),
            globals=_globals(roofline[key], 0.0),
            replay_ms=roofline[key],
            measured_ms=entry.iteration_time_ms,
            group=f"{key}|kernels",
            family=model.family or model.label,
            kind=f"eager {entry.precision}",
        )
        samples.append(
            GpuSample(
                sample=sample,
                source="kernels",
                model=model.label,
                precision=entry.precision,
                compiled=False,
            )
        )
    skipped = []
    blocks_of: dict[str, list[str]] = {}
    for run in dataset.runs:
        if run.world_size != 1:
            continue
        made = _launch_sample(run, dataset, graphs, roofline, blocks_of)
        if made is None:
            skipped.append(
                f"{run.model.label}@{run.model.inputs.batch_size} {run.strategy.describe()}"
            )
        else:
            samples.append(made)
    data = TrainingSet(graphs=graphs, samples=[s.sample for s in samples], skipped=skipped)
    return data, samples


def _launch_sample(
    run: RunEntry,
    dataset: Dataset,
    graphs: dict[str, Any],
    roofline: dict[str, float],
    blocks_of: dict[str, list[str]],
) -> GpuSample | None:
    precision = "bf16" if run.strategy.precision in ("bf16", "fp8") else run.strategy.precision
    entry = dataset.kernel_for(run.model, precision)
    if entry is None:
        return None
    key = _graph_key(entry)
    graph = graphs[key]
    compiled_rows: tuple[int, ...] = ()
    share = 0.0
    if run.strategy.compile:
        label = run.model.label
        if label not in blocks_of:
            blocks_of[label] = repeated_blocks(run.model)
        blocks = blocks_of[label]
        compiled_rows = tuple(
            row
            for row in sorted(graph.compute_rows)
            if any(
                graph.module_of_row[row] == b or graph.module_of_row[row].startswith(f"{b}.")
                for b in blocks
            )
        )
        share = len(compiled_rows) / max(1, len(graph.compute_rows))
    launch = str(run.extra.get("launch_id") or run.created_at)
    sample = StrategySample(
        model_key=key,
        buckets=(),
        bucket_rows=(),
        compiled_rows=compiled_rows,
        globals=_globals(roofline[key], share),
        replay_ms=roofline[key],
        measured_ms=run.measured_ms,
        group=f"{run.model.label}@{run.model.inputs.batch_size}|{launch}",
        family=run.family,
        kind=("compiled " if run.strategy.compile else "eager ") + precision,
        label_noise=run.ci_half_width,
        reference=run.strategy.precision == "fp32" and not run.strategy.compile,
    )
    return GpuSample(
        sample=sample,
        source="launch",
        model=run.model.label,
        precision=precision,
        compiled=run.strategy.compile,
    )


@torch.no_grad()
def corrected_ms(
    model: IterationCostModel, data: TrainingSet, samples: Sequence[StrategySample]
) -> list[float]:
    """The roofline of each sample corrected by ``model``: ``roofline x exp(correction)``."""
    graphs, index = data.batch()
    h, _ = model.encode(graphs)
    correction = model.corrections(h, graphs, index, list(samples))
    return [s.replay_ms * math.exp(float(c)) for s, c in zip(samples, correction, strict=True)]


def _mape(pairs: Sequence[tuple[float, float]]) -> float:
    return statistics.mean(abs(p - m) / m for p, m in pairs) if pairs else float("nan")


def evaluate_holdout(
    dataset: Dataset,
    gpu: AcceleratorSpec,
    *,
    options: TrainOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Leave each family out in turn: train on the others' iterations, correct the held-out
    family's rooflines. Returns every iteration's measured, roofline and corrected time, and
    the MAPE of each predictor over all of them and by family.

    Raises:
        InvalidOptionError: fewer than two families with measured iterations.
    """
    data, samples = gpu_training_set(dataset, gpu)
    families = sorted({s.sample.family for s in samples})
    if len(families) < 2:
        raise InvalidOptionError(
            f"a held-out evaluation needs iterations of two families or more; the dataset "
            f"has {len(families)} ({', '.join(families) or 'none'})"
        )
    rows: list[dict[str, Any]] = []
    for family in families:
        if progress is not None:
            progress(f"holding out {family}")
        train = [s.sample for s in samples if s.sample.family != family]
        test = [s for s in samples if s.sample.family == family]
        model = train_cost_model(dataclasses.replace(data, samples=train), options=options)
        predicted = corrected_ms(model, data, [s.sample for s in test])
        for item, learned in zip(test, predicted, strict=True):
            measured = float(item.sample.measured_ms or 0.0)
            rows.append(
                {
                    "family": family,
                    "model": item.model,
                    "source": item.source,
                    "precision": item.precision,
                    "compiled": item.compiled,
                    "measured_ms": measured,
                    "roofline_ms": item.sample.replay_ms,
                    "learned_ms": learned,
                }
            )
    by_family = {
        family: {
            "roofline": _mape(
                [(r["roofline_ms"], r["measured_ms"]) for r in rows if r["family"] == family]
            ),
            "learned": _mape(
                [(r["learned_ms"], r["measured_ms"]) for r in rows if r["family"] == family]
            ),
        }
        for family in families
    }
    roofline = _mape([(r["roofline_ms"], r["measured_ms"]) for r in rows])
    learned = _mape([(r["learned_ms"], r["measured_ms"]) for r in rows])
    return {
        "gpu": gpu.name,
        "iterations": len(rows),
        "families": len(families),
        "skipped": data.skipped,
        "mape": {"roofline": roofline, "learned": learned, "ratio": learned / roofline},
        "by_family": by_family,
        "rows": rows,
    }


GPU_PREDICTORS: tuple[str, ...] = ("auto", "gnn", "blend", "replay")
"""What a GPU checkpoint may predict with: ``auto`` lets held-out evaluation choose between
the learned correction and the replay alone."""


def train_gpu_cost_model(
    dataset: Dataset,
    gpu: AcceleratorSpec,
    *,
    options: TrainOptions | None = None,
    predictor: str = "auto",
    progress: Callable[[str], None] | None = None,
) -> tuple[IterationCostModel, dict[str, Any]]:
    """A cost model that corrects the GPU path's replay on clusters of ``gpu``: trained on
    every iteration of ``dataset`` priced over ``gpu``'s op costs, and its checkpoint's meta
    (``target`` ``gpu``, the GPU, the held-out errors). ``auto`` takes the learned correction
    only where, each family held out in turn, it beats the roofline alone (two families or
    more); else the replay alone, named in the meta.

    Raises:
        InvalidOptionError: an unknown predictor, or a dataset with no iteration to learn from.
    """
    if predictor not in GPU_PREDICTORS:
        raise InvalidOptionError(
            f"predictor {predictor!r} is not one of {', '.join(GPU_PREDICTORS)}"
        )
    data, samples = gpu_training_set(dataset, gpu)
    if not samples:
        raise InvalidOptionError(
            "the GPU dataset has no iteration to learn from (kernel profiles, or one-rank "
            "launches of a profiled model)"
        )
    families = sorted({s.sample.family for s in samples})
    holdout = None
    if len(families) >= 2:
        holdout = evaluate_holdout(dataset, gpu, options=options, progress=progress)["mape"]
    chosen = predictor
    if predictor == "auto":
        learned_wins = holdout is not None and holdout["learned"] < holdout["roofline"]
        chosen = "gnn" if learned_wins else "replay"
    if progress is not None:
        progress(f"training on {len(samples)} iterations of {len(families)} families")
    network = train_cost_model(data, options=options)
    meta = {
        "target": GPU_TARGET,
        "gpu": gpu.name,
        "measured": gpu.measured,
        "predictor": chosen,
        "holdout_mape": holdout,
        "iterations": len(samples),
        "families": families,
        "skipped": data.skipped,
    }
    return network, meta
