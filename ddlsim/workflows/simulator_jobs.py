"""Training the simulator and exporting its dataset, as use cases: typed requests in, JSON
payloads out, for the command line (``ddlsim simulator train``, ``ddlsim dataset export``) and
the worker's jobs (``POST /v1/simulator-trainings``, ``POST /v1/dataset-exports``) alike.

A job from the REST service names no path of the worker's machine: it trains on the service's
own store or the shipped dataset and writes its checkpoint, or the exported file, under the
user's data directory, named by the job (:func:`job_file`).
"""

import dataclasses
import os
import platform
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs._serde import check_keys
from ddlsim.data.store import Store, mask_url
from ddlsim.simulator.calibration import DEFAULT_CONFIDENCE, Calibration, calibrate
from ddlsim.simulator.cost_model import PREDICTORS, load_cost_model
from ddlsim.simulator.dataset import Dataset, export_dataset, load_dataset, models_of
from ddlsim.simulator.default import data_dir, shipped_dataset, user_checkpoint
from ddlsim.simulator.gnn import CostModelConfig
from ddlsim.simulator.holdout import (
    HoldoutReport,
    best_predictor,
    cross_validate,
    evaluate_holdout,
)
from ddlsim.simulator.train import (
    TrainOptions,
    build_training_set,
    save_checkpoint,
    train_cost_model,
)
from ddlsim.workflows.requests import Progress, no_progress

MAX_EPOCHS = 10_000
MAX_WIDTH = 1024


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TrainRequest:
    """Train the simulator's cost model: on ``dataset`` (a file; ``None``: the shipped one) or
    on the store ``db``'s runs and profiles (exported on the fly), ``epochs`` of a network of
    ``hidden`` x ``layers``; ``predictor`` ``auto`` picks what predictions use by holding out
    each family in turn (``workers`` processes), which also calibrates the search's scores.
    The checkpoint goes to ``out`` (``None``: the user's, which ``predict`` then uses).

    Raises:
        InvalidOptionError: naming the bad value and what is allowed.
    """

    dataset: str | None = None
    db: str | None = None
    epochs: int = TrainOptions().epochs
    hidden: int = CostModelConfig().hidden
    layers: int = CostModelConfig().layers
    seed: int = 0
    predictor: str = "auto"
    workers: int | None = None
    out: str | None = None

    def __post_init__(self) -> None:
        if self.dataset is not None and self.db is not None:
            raise InvalidOptionError("train on a dataset file or on a store (db), not both")
        for name, high in (("epochs", MAX_EPOCHS), ("hidden", MAX_WIDTH), ("layers", 16)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise InvalidOptionError(f"{name}({value!r}) must be an integer in 1..{high}")
        if self.predictor not in ("auto", *PREDICTORS):
            raise InvalidOptionError(
                f"predictor {self.predictor!r} is unknown; allowed: auto, {', '.join(PREDICTORS)}"
            )
        if self.workers is not None and not 1 <= self.workers <= 64:
            raise InvalidOptionError(f"workers({self.workers!r}) must be in 1..64")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "TrainRequest":
        """Raises: InvalidOptionError: an unknown key, or a bad value."""
        check_keys(
            raw, {f.name for f in dataclasses.fields(cls)}, "a training", InvalidOptionError
        )
        return cls(**raw)


def training_data(request: TrainRequest) -> tuple[Dataset, str]:
    """The dataset ``request`` trains on, and where it came from (a store's URL masked)."""
    if request.db:
        with tempfile.TemporaryDirectory() as tmp, Store.open(request.db) as store:
            path = Path(tmp) / "dataset.json.gz"
            # The source is stored and printed: its password never is.
            source = mask_url(store.url)
            export_dataset(store, path, meta={"source": source})
            return load_dataset(path), source
    path = Path(request.dataset) if request.dataset else shipped_dataset()
    return load_dataset(path), str(path)


def train_simulator(
    request: TrainRequest,
    progress: Progress = no_progress,
    *,
    epoch: Callable[[int, int, float], None] | None = None,
) -> dict[str, Any]:
    """Train as ``request`` says and write the checkpoint; its meta (predictor, dataset, runs,
    graphs, families, held-out errors, calibration) with ``out`` and ``elapsed_s``.
    ``epoch(done, total, loss)`` hears each epoch.

    Raises:
        DdlsimError: a dataset that cannot be read or trained on.
    """
    dataset, source = training_data(request)
    config = CostModelConfig(hidden=request.hidden, layers=request.layers)
    options = TrainOptions(epochs=request.epochs, seed=request.seed)
    started = time.perf_counter()
    cv = None
    calibration: dict[str, Any] | None = None
    predictor: str = request.predictor
    if predictor == "auto":
        progress(
            None,
            f"choosing the predictor: {len(dataset.families)} folds, one family held out each",
        )
        reports, cv = cross_validate(
            dataset,
            config=config,
            options=options,
            progress=lambda message: progress(None, message),
            workers=request.workers or os.cpu_count() or 1,
        )
        predictor = best_predictor(cv)
        held_out = [row for report in reports for row in report.rows]
        calibration = {name: calibrate(held_out, name).to_json() for name in PREDICTORS}
        errors = ", ".join(f"{name} {m.mape:.3f}" for name, m in cv.items())
        progress(None, f"held-out MAPE: {errors}; default: {predictor}")
    data = build_training_set(dataset)
    for reason in data.skipped:
        progress(None, f"skipped: {reason}")

    def tick(done: int, total: int, loss: float) -> None:
        progress(0.5 + 0.5 * done / total, f"epoch {done} of {total}, loss {loss:.4f}")
        if epoch is not None:
            epoch(done, total, loss)

    model = train_cost_model(data, config=config, options=options, progress=tick)
    out = Path(request.out) if request.out else user_checkpoint()
    meta = {
        "predictor": predictor,
        "dataset": source,
        "runs": len(data.samples),
        "graphs": len(data.graphs),
        "families": dataset.families,
        "epochs": options.epochs,
        "cross_validation": {n: m.to_json() for n, m in cv.items()} if cv else None,
        # Held-out errors of predicted speed-ups by kind, which searches score picks by.
        "calibration": calibration,
    }
    save_checkpoint(model, out, meta)
    payload = {**meta, "out": str(out), "elapsed_s": time.perf_counter() - started}
    if calibration is not None:
        payload["calibration"] = Calibration.from_json(calibration[predictor]).summary(
            DEFAULT_CONFIDENCE
        )
    return payload


def evaluate_simulator(
    request: TrainRequest, holdout: Sequence[str], progress: Progress = no_progress
) -> tuple[HoldoutReport, dict[str, Any]]:
    """Train on ``request``'s dataset without the ``holdout`` families and measure every
    predictor on them; the report and its JSON, with the default predictor (the user's
    checkpoint's, else the replay) and its figures.

    Raises:
        InvalidOptionError: a held-out family the dataset has not.
    """
    dataset, source = training_data(request)
    report, _ = evaluate_holdout(
        dataset,
        list(holdout),
        config=CostModelConfig(hidden=request.hidden, layers=request.layers),
        options=TrainOptions(epochs=request.epochs, seed=request.seed),
        progress=lambda message: progress(None, message),
    )
    meta = load_cost_model(None).meta
    default = str(meta.get("predictor", "replay")) if meta is not None else "replay"
    payload = {
        **report.to_json(),
        "dataset": source,
        "default_predictor": default,
        "default": report.metrics[default].to_json(),
    }
    return report, payload


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ExportRequest:
    """Export a store's runs and profiles to ``out`` (gzip JSON): the ``models`` of a dataset
    version (``None``: every run), ``host``'s kernel profiles and ``device``'s; ``merge`` keeps
    what ``out`` holds; ``note`` and ``datasheet`` go into the file's meta.

    Raises:
        InvalidOptionError: naming the bad value.
    """

    out: str
    version: str
    all_models: bool = False
    note: str = ""
    host: str | None = None
    device: str = "cpu"
    merge: bool = False
    datasheet: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise InvalidOptionError(f"device {self.device!r} is unknown; allowed: cpu, cuda")
        if len(self.note) > 2000:
            raise InvalidOptionError(f"note of {len(self.note)} characters: at most 2000")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "ExportRequest":
        """Raises: InvalidOptionError: an unknown key, or a bad value."""
        fields = {f.name for f in dataclasses.fields(cls)}
        check_keys(raw, fields, "an export request", InvalidOptionError)
        return cls(**raw)


def export_store(
    request: ExportRequest, store: Store, progress: Progress = no_progress
) -> dict[str, Any]:
    """Write ``store``'s runs and profiles as ``request`` says; what was written (counts, and
    the store's runs left out) with ``out``.

    Raises:
        InvalidOptionError: profiles of several hosts and no ``host``; an unknown version.
    """
    meta: dict[str, Any] = {
        "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "torch": torch.__version__,
        "note": request.note,
        "version": request.version,
    }
    if request.device == "cuda":
        meta["device"] = "cuda"
    if request.datasheet:
        meta["datasheet"] = dict(request.datasheet)
    progress(0.0, f"exporting {mask_url(store.url)} to {request.out}")
    counts = export_dataset(
        store,
        Path(request.out),
        meta=meta,
        models=None if request.all_models else models_of(request.version),
        merge=request.merge,
        host=request.host,
        device=request.device,
    )
    return {"out": request.out, **counts}


TRAINING_KIND = "simulator-training"
EXPORT_KIND = "dataset-export"
_TOKEN = re.compile(r"^[0-9a-f]{16}$")


def job_file(kind: str, token: str, suffix: str) -> Path:
    """Where a queued job writes its file: ``jobs/KIND-TOKEN.SUFFIX`` under the user's data
    directory (the token the service drew; never a path a request names).

    Raises:
        InvalidOptionError: a token that is not 16 hexadecimal digits.
    """
    if not _TOKEN.match(token):
        raise InvalidOptionError(f"job token {token!r} is not 16 hexadecimal digits")
    folder = data_dir() / "jobs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{kind}-{token}{suffix}"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TrainingJob:
    """A queued training: on the service's store (``source`` ``store``) or the shipped
    dataset, its checkpoint written to :func:`job_file` of ``token``."""

    source: str = "shipped"
    epochs: int = TrainOptions().epochs
    hidden: int = CostModelConfig().hidden
    layers: int = CostModelConfig().layers
    seed: int = 0
    predictor: str = "auto"
    token: str

    def __post_init__(self) -> None:
        if self.source not in ("store", "shipped"):
            raise InvalidOptionError(f"source {self.source!r} is unknown; allowed: store, shipped")
        job_file(TRAINING_KIND, self.token, ".pt")  # checks the token
        self.request("sqlite://")  # checks the rest

    def request(self, db: str) -> TrainRequest:
        """The training on the store ``db`` (read with ``source`` ``store``)."""
        return TrainRequest(
            db=db if self.source == "store" else None,
            epochs=self.epochs,
            hidden=self.hidden,
            layers=self.layers,
            seed=self.seed,
            predictor=self.predictor,
            workers=1,  # the worker's host runs other jobs' ranks too
            out=str(job_file(TRAINING_KIND, self.token, ".pt")),
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "TrainingJob":
        """Raises: InvalidOptionError: an unknown key, or a bad value."""
        fields = {f.name for f in dataclasses.fields(cls)}
        check_keys(raw, fields, "a training job", InvalidOptionError)
        return cls(**raw)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ExportJob:
    """A queued export of the service's store: the ``version``'s models (``all_models``:
    every run), written to :func:`job_file` of ``token``."""

    version: str
    all_models: bool = False
    note: str = ""
    token: str

    def request(self) -> ExportRequest:
        return ExportRequest(
            out=str(job_file(EXPORT_KIND, self.token, ".json.gz")),
            version=self.version,
            all_models=self.all_models,
            note=self.note,
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "ExportJob":
        """Raises: InvalidOptionError: an unknown key, or a bad value."""
        fields = {f.name for f in dataclasses.fields(cls)}
        check_keys(raw, fields, "an export job", InvalidOptionError)
        job = cls(**raw)
        job.request()  # checks the token and the note
        return job
