"""The dataset's file: one gzip JSON document, written atomically and read back.

The document holds ``format`` (``DATASET_FORMAT``), ``meta``, lists of ``links``, ``kernels``
(graph, per-node ms), ``fusion`` and ``runs`` (a run's fields beside what its measurement
recorded with it), and ``sessions``: by name, documents of the same shape without runs. The
small parts come first, so :func:`read_part` reads ``links`` without parsing the rest.
"""

import dataclasses
import gzip
import json
import re
from pathlib import Path
from typing import Any

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.simulator.dataset.entries import (
    Dataset,
    FusionEntry,
    KernelEntry,
    LinkFit,
    RunEntry,
    key_of,
)

DATASET_FORMAT = 1


def save_dataset(dataset: Dataset, out: Path) -> None:
    """Write ``dataset`` to ``out`` (gzip JSON), atomically."""
    payload = _payload(dataset)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump(payload, f, separators=(",", ":"))
    tmp.replace(out)


def _payload(dataset: Dataset) -> dict[str, Any]:
    return {
        "format": DATASET_FORMAT,
        "meta": dataset.meta,
        "links": [dataclasses.asdict(link) for link in dataset.links],
        "kernels": [
            {
                "graph": entry.graph.to_dict(),
                "node_ms": {str(k): v for k, v in sorted(entry.node_ms.items())},
                "iteration_time_ms": entry.iteration_time_ms,
                **({"probe_ms": entry.probe_ms} if entry.probe_ms is not None else {}),
            }
            for entry in dataset.kernels.values()
        ],
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
        "sessions": {name: _payload(session) for name, session in dataset.sessions.items()},
    }


_RUN_KEYS = frozenset(
    {"model", "strategy", "world_size", "bandwidth", "samples_ms", "seed", "created_at"}
)


_SPACE = re.compile(r"[ \t\n\r]*")


def read_part(path: Path, key: str) -> Any:
    """The top-level ``key`` of a dataset file, reading and parsing only as far as its value
    (a whole file takes seconds to parse; its ``links`` end within a few kilobytes).

    Raises:
        InvalidOptionError: the file cannot be read, is not a JSON object, or lacks ``key``.
    """
    text = ""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            while True:
                # the first 64 KiB hold the small parts; past them, the whole rest at once
                chunk = f.read(1 << 16) if not text else f.read()
                text += chunk
                try:
                    found, value = _top_level(text, key)
                except json.JSONDecodeError:
                    if chunk:
                        continue  # a value runs past what was read: read more
                    raise
                if found:
                    return value
                if not chunk:
                    break
    except (OSError, json.JSONDecodeError, EOFError) as exc:
        raise InvalidOptionError(f"dataset {path} cannot be read: {exc}") from None
    raise InvalidOptionError(f"dataset {path} has no {key!r}")


def _top_level(text: str, key: str) -> tuple[bool, Any]:
    """``(True, value)`` of ``key`` in the JSON object that ``text`` begins, parsing the values
    before it; ``(False, None)`` when ``text`` ends first."""
    decoder = json.JSONDecoder()

    def skip(at: int) -> int:
        return _SPACE.match(text, at).end()  # type: ignore[union-attr]

    at = skip(0)
    if text[at : at + 1] != "{":
        raise json.JSONDecodeError("not a JSON object", text, at)
    at = skip(at + 1)
    while text[at : at + 1] == '"':
        name, at = decoder.raw_decode(text, at)
        at = skip(at)
        if text[at : at + 1] != ":":
            raise json.JSONDecodeError("expected ':'", text, at)
        value, at = decoder.raw_decode(text, skip(at + 1))
        at = skip(at)
        if not text[at : at + 1]:
            break  # a number may go on past the text's end
        if name == key:
            return True, value
        if text[at] != ",":
            break
        at = skip(at + 1)
    return False, None


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
    return _from_payload(raw)


def _from_payload(raw: dict[str, Any]) -> Dataset:
    kernels: dict[tuple[str, int], KernelEntry] = {}
    for entry in raw["kernels"]:
        kernel = KernelEntry(
            graph=IterationGraph.from_dict(entry["graph"]),
            node_ms={int(k): float(v) for k, v in entry["node_ms"].items()},
            iteration_time_ms=float(entry["iteration_time_ms"]),
            probe_ms=None if entry.get("probe_ms") is None else float(entry["probe_ms"]),
        )
        kernels[key_of(kernel)] = kernel
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
        runs=runs,
        kernels=kernels,
        links=links,
        meta=dict(raw.get("meta", {})),
        fusion=fusion,
        # absent from files written before sessions
        sessions={name: _from_payload(part) for name, part in raw.get("sessions", {}).items()},
    )
