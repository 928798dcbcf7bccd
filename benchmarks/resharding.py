"""Cross-mesh resharding: send/recv plus all-gather against broadcast, measured side by side on
the emulated cluster, with the simulator's price beside each.

For each pair of sub-meshes (``--pairs``, ``SRC_RANKS:LAYOUT>DST_RANKS:LAYOUT``) and each size,
:func:`ddlsim.profiler.resharding.measure_resharding` moves a float32 tensor by both methods in
turns (``--repeats`` moves each, the slowest rank's time a move) and
:func:`ddlsim.simulator.resharding.price_resharding` prices both from the store's fits of the
link: ``sendrecv`` fitted over the cluster's ``src + dst`` ranks (or the nearest number the
store has) and ``all_gather`` over the destination's. Issue 19's acceptance: each prediction
within 10 % of the measured median.

    .venv/bin/python benchmarks/resharding.py --db sqlite:///bench.db --out resharding.json
"""

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.resharding import MeshLayout
from ddlsim.data.store import Store
from ddlsim.profiler.resharding import measure_resharding
from ddlsim.simulator.resharding import price_resharding

MIB = 1 << 20


def _mesh(text: str) -> MeshLayout:
    ranks, _, layout = text.partition(":")
    return MeshLayout(int(ranks), layout)


def _fit(store: Store, collective: str, world_size: int, bandwidth: str) -> AlphaBeta:
    """The store's latest fit of ``collective`` over ``world_size`` ranks; for ``sendrecv``
    (one message a rank each way, whatever the ranks) the nearest world size's when that one
    has none."""
    profiles = store.collective_profiles(
        backend="gloo", collective=collective, bandwidth=bandwidth
    )
    fits = [p for p in profiles if p.world_size == world_size]
    if not fits and collective == "sendrecv" and profiles:
        nearest = min({p.world_size for p in profiles}, key=lambda n: (abs(n - world_size), n))
        fits = [p for p in profiles if p.world_size == nearest]
    if not fits:
        raise SystemExit(
            f"the store has no {collective} fit over {world_size} ranks at {bandwidth}: run "
            f"`ddlsim profile collectives --world-size {world_size} --bandwidth {bandwidth}`"
        )
    latest = fits[-1]
    return AlphaBeta(
        collective=collective,
        world_size=latest.world_size,
        alpha_us=latest.alpha_us,
        busbw_gbps=latest.busbw_gbps,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db")
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument(
        "--pairs", nargs="*", default=["2:shard>2:replicate", "2:replicate>2:shard"]
    )
    parser.add_argument("--sizes-mib", nargs="*", type=float, default=[4, 16, 64])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for pair in args.pairs:
        src_text, _, dst_text = pair.partition(">")
        src, dst = _mesh(src_text), _mesh(dst_text)
        sizes = [int(mib * MIB) for mib in args.sizes_mib]
        with Store.open(args.db) as store:
            sendrecv = _fit(store, "sendrecv", src.ranks + dst.ranks, args.bandwidth)
            gather = (
                _fit(store, "all_gather", dst.ranks, args.bandwidth)
                if dst.layout == "replicate" and dst.ranks > 1
                else None
            )
        # Into a sharded destination each tile has one receiver: broadcast is send/recv.
        methods = (
            ["sendrecv_allgather", "broadcast"] if gather is not None else ["sendrecv_allgather"]
        )
        measured = measure_resharding(
            src,
            dst,
            sizes,
            bandwidth=args.bandwidth,
            methods=methods,
            warmup=args.warmup,
            repeats=args.repeats,
        )
        for sample in measured["samples"]:
            prices = price_resharding(
                sample["size_bytes"], src, dst, sendrecv=sendrecv, all_gather=gather
            )
            predicted = prices.get(sample["method"])
            rows.append(
                {
                    "pair": pair,
                    "method": sample["method"],
                    "size_bytes": sample["size_bytes"],
                    "measured_ms": sample["median_ms"],
                    "times_us": sample["times_us"],
                    "predicted_ms": predicted,
                    "error": None if predicted is None else predicted / sample["median_ms"] - 1,
                }
            )
    print("| meshes | size | method | measured (median) | predicted | error |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        predicted = "-" if row["predicted_ms"] is None else f"{row['predicted_ms']:.1f} ms"
        error = "-" if row["error"] is None else f"{row['error'] * 100:+.1f} %"
        print(
            f"| {row['pair']} | {row['size_bytes'] / MIB:.0f} MiB | {row['method']} | "
            f"{row['measured_ms']:.1f} ms | {predicted} | {error} |"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "started": started,
                    "torch": torch.__version__,
                    "machine": platform.machine(),
                }
            ),
            "utf-8",
        )


if __name__ == "__main__":
    main()
