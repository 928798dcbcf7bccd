"""The compute a gloo collective takes from its rank while in flight, on the emulated cluster.

For each cluster setting of the dataset (2 and 4 ranks, links of 1 and 4 Gbit/s) and each
collective the replay meets (all-reduce, reduce-scatter, all-gather, send/recv, and DeAR's ring
reduce-scatter and all-gather on their own thread, as the executor runs them), every rank runs
units of compute while the collective is in flight, as a rank's backward does while its buckets
are all-reduced, and the compute it lost against the same units with no collective is the
collective's CPU cost (``ddlsim profile collectives --cpu-repeats``). The fits
``cpu_alpha_us + cpu_us_per_byte * bytes`` are printed beside the wire time, and with
``--dataset`` written into that dataset's link fits (its wire fits kept; the ring's fits,
which the collection did not measure, added whole), which is what the replay then charges to
the compute stream (:class:`simulator.replay.CpuLoad`).

    .venv/bin/python benchmarks/collective_cpu.py [--out FILE.json] [--dataset FILE.json.gz]
        [--from FILE.json]    # --from: reuse a run's measurements instead of measuring again
"""

import argparse
import dataclasses
import gzip
import json
import platform
import time
from pathlib import Path
from typing import Any

from ddlsim.data.comm_model import LinkFit
from ddlsim.profiler.collective_fit import CollectiveProfile
from ddlsim.profiler.collectives import profile_collectives
from ddlsim.simulator.dataset import load_dataset, save_dataset

SETTINGS = ((2, "1gbit"), (4, "1gbit"), (2, "4gbit"), (4, "4gbit"))
COLLECTIVES = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "sendrecv",
    "ring_reduce_scatter",
    "ring_all_gather",
)
MIB = 1024 * 1024
SIZES = [64 * 1024, 256 * 1024, MIB, 4 * MIB, 16 * MIB]


def measure(repeats: int, cpu_repeats: int) -> dict[str, Any]:
    profiles = {}
    for world_size, bandwidth in SETTINGS:
        prefix = f"{world_size} x {bandwidth}"

        def report(line: str, prefix: str = prefix) -> None:
            print(f"{prefix}: {line}")

        profile = profile_collectives(
            world_size=world_size,
            bandwidth=bandwidth,
            collectives=COLLECTIVES,
            sizes=SIZES,
            repeats=repeats,
            cpu_repeats=cpu_repeats,
            progress=report,
        )
        profiles[f"{world_size}|{bandwidth}"] = profile.to_json_dict()
    return profiles


def table(profiles: dict[str, Any]) -> None:
    print(
        "| ranks | link | collective | wire 1 MiB | taken 1 MiB | wire 16 MiB | taken 16 MiB "
        "| fit: a call | fit: a MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for key, raw in profiles.items():
        profile = CollectiveProfile.from_json_dict(raw)
        world_size, bandwidth = key.split("|")
        for fit in profile.fits:
            cells = []
            for size in (MIB, 16 * MIB):
                sample = next(
                    s
                    for s in profile.samples
                    if s.collective == fit.collective and s.size_bytes == size
                )
                stolen = sorted(sample.stolen_us)[len(sample.stolen_us) // 2]
                cells += [f"{sample.time_us_median / 1e3:.1f} ms", f"{stolen / 1e3:.1f} ms"]
            print(
                f"| {world_size} | {bandwidth} | {fit.collective} | {' | '.join(cells)} "
                f"| {fit.cpu_alpha_us / 1e3:.2f} ms | {fit.cpu_us_per_byte * MIB / 1e3:.2f} ms |"
            )


def write_into(dataset_path: Path, profiles: dict[str, Any], when: str) -> None:
    dataset = load_dataset(dataset_path)
    fits = {
        (f.collective, f.world_size, f.bandwidth): f
        for raw in profiles.values()
        for f in CollectiveProfile.from_json_dict(raw).fits
    }
    links = []
    for link in dataset.links:
        fit = fits.pop((link.collective, link.world_size, link.bandwidth), None)
        if fit is None:
            links.append(link)
            continue
        links.append(
            dataclasses.replace(
                link, cpu_alpha_us=fit.cpu_alpha_us, cpu_us_per_byte=fit.cpu_us_per_byte
            )
        )
    # Fits of collectives the dataset had none of (the ring), wire and CPU both.
    links += [
        LinkFit(**{f.name: getattr(fit, f.name) for f in dataclasses.fields(LinkFit)})
        for fit in fits.values()
        if fit.collective.startswith("ring_")
    ]
    meta = {**dataset.meta, "collective_cpu": f"benchmarks/collective_cpu.py, {when}"}
    save_dataset(dataclasses.replace(dataset, links=tuple(links), meta=meta), dataset_path)
    print(f"wrote the CPU costs and the ring's fits into {dataset_path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu-repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the profiles (JSON, .gz to compress)")
    parser.add_argument("--from", dest="source", type=Path, help="a run's --out to reuse")
    parser.add_argument("--dataset", type=Path, help="write the CPU fits into this dataset")
    args = parser.parse_args()
    if args.source:
        opener = gzip.open if args.source.suffix == ".gz" else open
        with opener(args.source, "rt", encoding="utf-8") as handle:
            payload = json.load(handle)
    else:
        began = time.time()
        payload = {
            "profiles": measure(args.repeats, args.cpu_repeats),
            "machine": platform.machine(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(began)),
            "seconds": round(time.time() - began),
        }
    if args.out:
        opener = gzip.open if args.out.suffix == ".gz" else open
        with opener(args.out, "wt", encoding="utf-8") as handle:
            json.dump(payload, handle)
    table(payload["profiles"])
    if args.dataset:
        write_into(args.dataset, payload["profiles"], payload["date"])


if __name__ == "__main__":
    main()
