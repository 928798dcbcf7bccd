"""What the speed probe changes in the replay of a collection that carries it.

A collection exported from a store whose kernel profiles and launches recorded the probe
(``ddlsim simulator dataset export``) is added to the shipped dataset as a session (its runs
replay from its own profiles and fits), and its runs are replayed twice: scaled by each run's
probe over its kernel profile's (``RunEntry.speed_ratio``), and with the runs' probes removed
(ratio 1). For each plan kind: runs, median signed error (negative: the replay is faster than
the run) and mean absolute error; then the probes themselves.

    .venv/bin/python benchmarks/probe_session.py --session FILE.json.gz [--dataset FILE]
"""

import argparse
import dataclasses
import statistics
from pathlib import Path

from ddlsim.simulator.dataset import Dataset, add_session, load_dataset
from ddlsim.simulator.default import shipped_dataset
from ddlsim.simulator.train import build_training_set

SESSION = "probed"


def without_probes(dataset: Dataset) -> Dataset:
    runs = tuple(
        dataclasses.replace(r, extra={k: v for k, v in r.extra.items() if k != "probe_ms"})
        for r in dataset.runs
    )
    return dataclasses.replace(dataset, runs=runs)


def errors(base: Dataset, session: Dataset) -> dict[str, list[float]]:
    combined = add_session(base, session, SESSION, replaces=lambda run: False)
    runs = [r for r in combined.runs if r.extra.get("session") == SESSION]
    out: dict[str, list[float]] = {}
    for sample in build_training_set(combined, runs).samples:
        assert sample.measured_ms is not None
        error = sample.replay_ms / sample.measured_ms - 1
        out.setdefault(sample.kind, []).append(error)
        out.setdefault("all", []).append(error)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--session", type=Path, required=True)
    parser.add_argument("--dataset", type=Path, help="default: the shipped dataset")
    args = parser.parse_args()
    base = load_dataset(args.dataset or shipped_dataset())
    session = load_dataset(args.session)
    scaled, plain = errors(base, session), errors(base, without_probes(session))
    print("| kind | runs | probe ignored: median | MAPE | scaled by the probe: median | MAPE |")
    print("|---|---|---|---|---|---|")
    for kind in sorted(scaled, key=lambda k: (k == "all", k)):
        a, b = plain[kind], scaled[kind]
        print(
            f"| {kind} | {len(b)} | {statistics.median(a):+.3f} "
            f"| {statistics.fmean(abs(x) for x in a):.3f} | {statistics.median(b):+.3f} "
            f"| {statistics.fmean(abs(x) for x in b):.3f} |"
        )
    runs = [float(r.extra["probe_ms"]) for r in session.runs if "probe_ms" in r.extra]
    kernels = [k.probe_ms for k in session.kernels.values() if k.probe_ms is not None]
    if runs and kernels:
        print(
            f"\nprobe a unit: runs {min(runs):.2f}-{max(runs):.2f} ms, "
            f"kernel profiles {min(kernels):.2f}-{max(kernels):.2f} ms"
        )


if __name__ == "__main__":
    main()
