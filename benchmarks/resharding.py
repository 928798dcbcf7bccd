"""Cross-mesh resharding: send/recv plus all-gather against broadcast, measured side by side on
the emulated cluster, with the simulator's price beside each.

For each pair of sub-meshes (``--pairs``, ``SRC_RANKS:LAYOUT>DST_RANKS:LAYOUT``) and each size,
:func:`ddlsim.workflows.resharding.reshard` moves a float32 tensor by each method in turns
(``--repeats`` moves each, the slowest rank's time a move; into a sharded destination the
methods coincide and one is measured) and prices each from the store's fits of the link:
``sendrecv`` fitted over the cluster's ``src + dst`` ranks (or the nearest number the store
has) and ``all_gather`` over the destination's. Issue 19's acceptance: each prediction
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

from ddlsim.data.resharding import MeshLayout
from ddlsim.data.store import Store
from ddlsim.workflows.resharding import reshard

MIB = 1 << 20


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
        src, dst = MeshLayout.parse(src_text), MeshLayout.parse(dst_text)
        with Store.open(args.db) as store:
            found = reshard(
                store,
                src,
                dst,
                [int(mib * MIB) for mib in args.sizes_mib],
                bandwidth=args.bandwidth,
                warmup=args.warmup,
                repeats=args.repeats,
            )
        rows += [{"pair": pair, **row} for row in found]
    print("| meshes | size | method | measured (median) | predicted | error |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        predicted = f"{row['predicted_ms']:.1f} ms"
        error = f"{row['error'] * 100:+.1f} %"
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
