"""Exporting what a store measured into a dataset file, and merging dataset files.

:func:`export_dataset` reads what a store holds into one compressed JSON file, self-contained:
the graphs the kernel profiles timed, their per-node times, the fusion profiles, the collective
fits, and every run (model, strategy, world size, link, iteration samples). A collection that
spans several sessions merges each one's export into the same file (:func:`merge_datasets`);
a later session measured at another machine speed is added apart (:func:`add_session`).
"""

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddlsim.data.comm_model import LinkFit
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store.records import record_of
from ddlsim.simulator.dataset.entries import (
    Dataset,
    FusionEntry,
    KernelEntry,
    RunEntry,
    key_of,
    spec_key,
)
from ddlsim.simulator.dataset.json_file import load_dataset, save_dataset


def export_dataset(
    store: Any,
    out: Path,
    *,
    meta: Mapping[str, Any],
    models: Sequence[ModelSpec] | None = None,
    merge: bool = False,
    host: str | None = None,
    device: str = "cpu",
) -> dict[str, int]:
    """Write what ``store`` holds (CPU kernel profiles, fusion profiles, collective fits,
    measurements) to ``out`` (gzip JSON); with ``models``, only the runs of those specs and the
    profiles of their labels (a store also used for other runs keeps them out of the dataset);
    with ``merge``, together with what ``out`` already holds (``merge_datasets``). Returns
    counts of what was written, and of the store's runs ``models`` left out.

    Kernel profiles come from one machine: ``host``, or the only one the store has profiles
    of (profiles stored before hosts were recorded count as the unnamed host), and from one
    ``device`` (``cuda``: a GPU dataset, whose bf16 profiles are kept beside the fp32 ones,
    :func:`.entries.kernel_key`).

    Raises:
        InvalidOptionError: profiles of several hosts and no ``host``, or a ``host`` with none.

    Long: one pass over each kind of record the store holds (kernel, fusion and collective
    profiles, runs), a few lines each, in the file's order.
    """
    specs = None if models is None else {spec_key(m) for m in models}
    labels = None if models is None else {m.label for m in models}
    kernels: dict[tuple[str, int], KernelEntry] = {}
    profiles = [p for p in store.kernel_profiles() if p.device == device]
    hosts = sorted({p.host for p in profiles})
    if host is None and len(hosts) > 1:
        raise InvalidOptionError(
            f"the store holds kernel profiles of {len(hosts)} hosts ({', '.join(map(repr, hosts))}"
            "); a dataset's times come from one machine: choose one with --host"
        )
    if host is not None and host not in hosts:
        raise InvalidOptionError(
            f"no kernel profile of host {host!r} in the store; hosts: "
            f"{', '.join(map(repr, hosts)) or 'none'}"
        )
    for profile in profiles:  # oldest first: a newer profile replaces
        if host is not None and profile.host != host:
            continue
        graph = store.load_graph(graph_hash=profile.graph_hash)
        if labels is not None and graph.model.label not in labels:
            continue
        kernel = KernelEntry(
            graph=graph,
            node_ms=dict(profile.node_ms),
            iteration_time_ms=profile.iteration_time_ms,
            probe_ms=_probe(profile.env.get("probe_ms")),
        )
        kernels[key_of(kernel)] = kernel
    links = tuple(record_of(LinkFit, p) for p in store.collective_profiles())
    fusion: dict[tuple[str, int], FusionEntry] = {}
    for fused in store.fusion_profiles():  # oldest first: a newer profile replaces
        if fused.device != device:
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
    left_out = 0
    for m in store.measurements():
        graph = store.load_graph(graph_hash=m.graph_hash)
        if specs is not None and spec_key(graph.model) not in specs:
            left_out += 1
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
        # the store's runs of other models or settings than ``models``
        "runs_left_out": left_out,
    }


def _probe(raw: Any) -> float | None:
    """A recorded speed probe (ms), None where there is none or it is not a positive number."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if value > 0 and value != float("inf") else None


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
    "probe_ms",
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


def merge_datasets(older: Dataset, newer: Dataset) -> Dataset:
    """One dataset holding both: profiles and fits of ``newer`` replace those of ``older`` with
    the same key; runs are the union (a run in both, same launch and strategy, counted once).
    A collection that spans several sessions exports each one's store into the same file."""

    def run_key(run: RunEntry) -> str:
        when = run.extra.get("launch_id") or run.created_at
        return json.dumps(
            [when, spec_key(run.model), run.strategy.to_json(), run.world_size, run.bandwidth],
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
        sessions={**older.sessions, **newer.sessions},
    )


def add_session(
    base: Dataset,
    later: Dataset,
    name: str,
    *,
    replaces: Callable[[RunEntry], bool],
    retires: Sequence[str] = (),
) -> Dataset:
    """``base`` with ``later``'s runs, which replay from ``later``'s own profiles, fits and
    runtime costs (session ``name``), and without ``base``'s runs that ``replaces`` picks
    (runs of code the later session measured again), nor the sessions ``retires`` names with
    their runs (sessions the later one measured again, whose profiles are known wrong).

    :func:`merge_datasets` pools profiles, which is right within one session; across sessions
    the machine may have run at another speed, and a run replayed from another session's
    profiles would be priced at that speed.

    Raises:
        InvalidOptionError: ``name`` is empty or already a session of ``base`` (and not
            retired), or ``retires`` names a session ``base`` does not have.
    """
    unknown = sorted(set(retires) - set(base.sessions))
    if unknown:
        raise InvalidOptionError(
            f"cannot retire session {', '.join(unknown)}: not in the dataset; it has "
            f"{', '.join(sorted(base.sessions)) or 'none'}"
        )
    sessions = {key: value for key, value in base.sessions.items() if key not in retires}
    if not name or name in sessions:
        raise InvalidOptionError(
            f"session name {name!r} must be new and not empty; taken: "
            f"{', '.join(sorted(sessions)) or 'none'}"
        )
    kept = tuple(r for r in base.runs if not replaces(r) and r.extra.get("session") not in retires)
    added = tuple(
        dataclasses.replace(run, extra={**run.extra, "session": name}) for run in later.runs
    )
    session = dataclasses.replace(later, runs=(), sessions={})
    return dataclasses.replace(base, runs=kept + added, sessions={**sessions, name: session})
