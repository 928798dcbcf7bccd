"""The replay alone against the executor, per plan kind: what each physics term explains.

Every run of the dataset is replayed (no learned correction) from the dataset's own kernel
profiles and link fits, with the replay's terms added one at a time, and compared with the
run's measured median. For each plan kind and world size the table gives the median signed
error (negative: the replay is faster than the run) and the mean absolute error of each
variant, so that a term's column shows what it explains:

- ``wire``: kernels and collectives' wire time only (the replay before issue 18);
- ``+cpu``: and the compute each collective takes from its rank while in flight, measured by
  ``benchmarks/collective_cpu.py`` (the dataset's links carry it);
- ``+runtime``: and what the plans' runtimes add to the compute (gradient bucket copies, FSDP2
  per group, DTensor per split module), measured by ``benchmarks/runtime_costs.py`` (the
  dataset's meta carries it);
- ``+buckets``: and the fixed cost a gradient bucket adds under the executor's hooks and under
  DDP's reducer, measured by ``benchmarks/runtime_costs.py --buckets-only``.

A second table gives the error of the replay's speed-up over DDP's defaults of the same launch
(``|predicted / measured - 1|``, median and 90th percentile), what a search acts on, by kind
and world size for the last variant.

The runs of a later session (``Dataset.sessions``), replayed from that session's own profiles,
also get rows of their own, their kind followed by the session's name.

    .venv/bin/python benchmarks/replay_error.py [--dataset FILE] [--json FILE]
"""

import argparse
import dataclasses
import json
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from ddlsim.simulator.dataset import Dataset, load_dataset
from ddlsim.simulator.default import shipped_dataset
from ddlsim.simulator.train import build_training_set


def without_cpu(dataset: Dataset) -> Dataset:
    links = tuple(
        dataclasses.replace(link, cpu_alpha_us=0.0, cpu_us_per_byte=0.0) for link in dataset.links
    )
    sessions = {name: without_cpu(session) for name, session in dataset.sessions.items()}
    return dataclasses.replace(dataset, links=links, sessions=sessions)


def without_runtime(dataset: Dataset) -> Dataset:
    sessions = {name: without_runtime(session) for name, session in dataset.sessions.items()}
    return dataclasses.replace(
        dataset, meta={**dataset.meta, "runtime_costs": {}}, sessions=sessions
    )


def without_buckets(dataset: Dataset) -> Dataset:
    sessions = {name: without_buckets(session) for name, session in dataset.sessions.items()}
    costs = {
        key: value
        for key, value in (dataset.meta.get("runtime_costs") or {}).items()
        if not key.endswith("_us_per_bucket")
    }
    return dataclasses.replace(
        dataset, meta={**dataset.meta, "runtime_costs": costs}, sessions=sessions
    )


VARIANTS: dict[str, Callable[[Dataset], Dataset]] = {
    "wire": lambda dataset: without_runtime(without_cpu(dataset)),
    "+cpu": without_runtime,
    "+runtime": without_buckets,
    "+buckets": lambda dataset: dataset,
}


def errors(dataset: Dataset) -> dict[tuple[str, str], list[float]]:
    """Signed relative errors of the replay, by (kind, world size), ``*`` pooling."""
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for sample in build_training_set(dataset).samples:
        assert sample.measured_ms is not None
        error = sample.replay_ms / sample.measured_ms - 1
        world = sample.group.split("|")[1]
        # A later session's runs (``session/model|...``) get rows of their own as well.
        session = sample.group.split("/")[0] if "/" in sample.group else ""
        keys = [(sample.kind, world), (sample.kind, "*"), ("all", "*")]
        if session:
            keys += [(f"{sample.kind} ({session})", world), (f"{sample.kind} ({session})", "*")]
        for key in keys:
            out[key].append(error)
    return out


def speedup_errors(dataset: Dataset) -> dict[tuple[str, str], list[float]]:
    """``|predicted / measured - 1|`` of each run's speed-up over DDP's defaults measured in
    the same launch (its group's reference run), by (kind, world size), ``*`` pooling."""
    samples = build_training_set(dataset).samples
    references = {s.group: s for s in samples if s.reference}
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for sample in samples:
        reference = references.get(sample.group)
        if reference is None or sample is reference:
            continue
        assert sample.measured_ms is not None and reference.measured_ms is not None
        measured = reference.measured_ms / sample.measured_ms
        predicted = reference.replay_ms / sample.replay_ms
        world = sample.group.split("|")[1]
        for key in ((sample.kind, world), ("all", world), ("all", "*")):
            out[key].append(abs(predicted / measured - 1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", type=Path, help="default: the shipped dataset")
    parser.add_argument("--json", type=Path, help="write every variant's errors here")
    args = parser.parse_args()
    dataset = load_dataset(args.dataset or shipped_dataset())
    results = {name: errors(make(dataset)) for name, make in VARIANTS.items()}
    keys = sorted(results["wire"], key=lambda k: (k[0] == "all", k[0], k[1]))
    header = " | ".join(f"{name} median | {name} MAPE" for name in VARIANTS)
    print(f"| kind | ranks | runs | {header} |")
    print("|---|---|---|" + "---|" * (2 * len(VARIANTS)))
    for kind, world in keys:
        cells = []
        for name in VARIANTS:
            values = results[name][(kind, world)]
            cells.append(f"{statistics.median(values):+.3f}")
            cells.append(f"{statistics.fmean(abs(v) for v in values):.3f}")
        count = len(results["wire"][(kind, world)])
        print(f"| {kind} | {world} | {count} | {' | '.join(cells)} |")
    gains = {name: speedup_errors(make(dataset)) for name, make in VARIANTS.items()}
    print("\nSpeed-up over DDP's defaults of the same launch, |replayed / measured - 1|:\n")
    header = " | ".join(f"{name} median | {name} p90" for name in VARIANTS)
    print(f"| kind | ranks | runs | {header} |")
    print("|---|---|---|" + "---|" * (2 * len(VARIANTS)))
    for kind, world in sorted(gains["wire"], key=lambda k: (k[0] == "all", k[0], k[1])):
        cells = []
        for name in VARIANTS:
            ordered = sorted(gains[name][(kind, world)])
            cells.append(f"{statistics.median(ordered):.3f}")
            cells.append(f"{ordered[round(0.9 * (len(ordered) - 1))]:.3f}")
        count = len(gains["wire"][(kind, world)])
        print(f"| {kind} | {world} | {count} | {' | '.join(cells)} |")
    if args.json:
        payload = {
            name: {f"{kind}|{world}": values for (kind, world), values in table.items()}
            for name, table in results.items()
        }
        args.json.write_text(json.dumps(payload), encoding="utf-8")


if __name__ == "__main__":
    main()
