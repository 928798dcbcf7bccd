"""Training the cost model of the GPU path (:mod:`ddlsim.simulator.gpu.cost`): GPU iterations
(a GPU dataset collected on a lent GPU, or the H100 zoo runs that ship) priced by the roofline,
the learned correction kept only where held out by family it beats the roofline alone
(:func:`ddlsim.simulator.gpu.learned.train_gpu_cost_model`). The checkpoint goes where
``ddlsim predict|search --cluster`` load it by default (:func:`user_gpu_checkpoint`), or to
``out``."""

import dataclasses
import gzip
import json
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.profiler.capture import capture_graph
from ddlsim.simulator.dataset import Dataset, KernelEntry, RunEntry, load_dataset
from ddlsim.simulator.gpu.cost import user_gpu_checkpoint
from ddlsim.simulator.gpu.learned import GPU_PREDICTORS, gpu_of, train_gpu_cost_model
from ddlsim.simulator.train import TrainOptions, save_checkpoint


def shipped_gpu_runs_path() -> Path:
    """The H100 zoo runs that ship (four families, fp32, eager and compiled, 2026-11-23)."""
    return Path(str(resources.files("ddlsim.data") / "measured" / "h100" / "zoo_cuda.json.gz"))


def shipped_gpu_runs(path: Path | None = None) -> tuple[Dataset, str]:
    """The shipped zoo runs on one H100 as a dataset, and the GPU's name: each model's graph
    captured here (the roofline prices its nodes; the file's per-node times are not used), its
    kernel profile's iteration, and its eager and compiled runs as one launch."""
    with gzip.open(path or shipped_gpu_runs_path(), "rt", encoding="utf-8") as handle:
        raw = json.load(handle)
    kernels = {}
    runs = []
    for model in raw["models"]:
        spec = ZOO[model["model"]].with_inputs(**model["inputs"])
        profile = model["kernel_profile"]
        kernels[(spec.label, spec.inputs.batch_size)] = KernelEntry(
            graph=capture_graph(spec), node_ms={}, iteration_time_ms=profile["iteration_time_ms"]
        )
        for mode, strategy in (("eager", Strategy()), ("compiled", Strategy(compile=True))):
            samples = [ms for run in model["runs"][mode] for ms in run["samples_ms"]]
            runs.append(
                RunEntry(
                    model=spec,
                    strategy=strategy,
                    world_size=1,
                    bandwidth="none",
                    samples_ms=tuple(samples),
                    seed=0,
                    created_at=raw["date"],
                    extra={"launch_id": f"zoo_cuda:{spec.label}"},
                )
            )
    return Dataset(runs=tuple(runs), kernels=kernels, links=(), meta={}), str(raw["device"])


def gpu_name_of(dataset: Dataset) -> str:
    """The GPU a collected dataset names in its meta (its data sheet's, or ``gpu``)."""
    sheet = dataset.meta.get("datasheet") or {}
    return str(sheet.get("gpu") or dataset.meta.get("gpu") or "")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class GpuTrainRequest:
    """Train the GPU path's cost model on ``dataset`` (a GPU dataset file; ``None``: the
    shipped H100 zoo runs), measured on ``gpu`` (``None``: the dataset's), for ``epochs``;
    ``predictor`` ``auto`` lets held-out evaluation choose; written to ``out`` (``None``:
    :func:`user_gpu_checkpoint`)."""

    dataset: str | None = None
    gpu: str | None = None
    epochs: int = 200
    seed: int = 0
    predictor: str = "auto"
    out: str | None = None

    def __post_init__(self) -> None:
        if self.predictor not in GPU_PREDICTORS:
            raise InvalidOptionError(
                f"predictor {self.predictor!r} is not one of {', '.join(GPU_PREDICTORS)}"
            )


def train_gpu_simulator(
    request: GpuTrainRequest, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Train, write the checkpoint, and answer what was trained: the GPU, the iterations and
    families, the held-out errors, the predictor chosen, the file.

    Raises:
        InvalidOptionError: a GPU without measured op costs, a dataset without iterations, a
            bad predictor or epoch count.
    """
    started = time.perf_counter()
    if request.dataset is None:
        dataset, name = shipped_gpu_runs()
    else:
        dataset = load_dataset(Path(request.dataset))
        name = gpu_name_of(dataset)
    gpu = gpu_of(request.gpu or name)
    network, meta = train_gpu_cost_model(
        dataset,
        gpu,
        options=TrainOptions(epochs=request.epochs, seed=request.seed),
        predictor=request.predictor,
        progress=progress,
    )
    out = Path(request.out) if request.out else user_gpu_checkpoint()
    save_checkpoint(network, out, meta)
    return {
        **meta,
        "dataset": request.dataset or "shipped H100 zoo runs",
        "out": str(out),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
