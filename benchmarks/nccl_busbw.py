"""ddlsim's NCCL model against published nccl-tests bus bandwidths on the two presets.

Every figure below was published by its source as nccl-tests output (or NVIDIA's own statement
of what nccl-tests reaches) for a DGX A100 / DGX H100 class system: 8 GPUs per node on NVSwitch,
8 InfiniBand NICs per node. The model's bus bandwidth at the same size is
``factor * size / time``, nccl-tests' own definition. The model prices NCCL's ring and tree
algorithms and, inside an H100 node, NVLink SHARP's all-reduce (NVLS); a figure measured with
the ring forced (``NCCL_ALGO=RING``) is priced without NVLS. Figures from systems whose fabric is
uncertain (``"trusted": false``) and InfiniBand SHARP's are listed and kept out of the figure.

    .venv/bin/python benchmarks/nccl_busbw.py --json

``--scaling`` sets the model against all-reduce bus bandwidths published at 4 to 1,024 nodes of
H100s (``SCALING``: read off the sources' plots, so good to about 10 GB/s), and fits the one
number they determine, the latency of a level of NCCL's tree across nodes (the preset's
``tree_level_latency_us``): the value whose predictions have the least squared log error.

    .venv/bin/python benchmarks/nccl_busbw.py --scaling
"""

import argparse
import dataclasses
import json
import math
import statistics
from typing import Any

from ddlsim.data.specs.gpu_cluster import preset
from ddlsim.simulator.gpu.nccl import Group, NcclModel, _factor

GB = 1e9
# (preset, collective, nodes, size bytes, published busbw GB/s, algorithm, trusted, source)
PUBLISHED: list[tuple[str, str, int, float, float, str, bool, str]] = [
    (
        "dgx-a100-80g",
        "all_reduce",
        1,
        8 * 2**30,
        231.58,
        "ring",
        True,
        "Azure/AI-benchmarking-guide, Azure Results/ND_A100_v4 (8 A100 80GB, NVSwitch)",
    ),
    (
        "dgx-a100-80g",
        "all_reduce",
        1,
        2**30,
        231.45,
        "ring",
        True,
        "microsoft/mscclpp docs/performance-ndmv4.md (NCCL column)",
    ),
    (
        "dgx-a100-80g",
        "all_gather",
        1,
        2**30,
        253.6,
        "ring",
        True,
        "microsoft/mscclpp docs/performance-ndmv4.md (NCCL column)",
    ),
    (
        "dgx-a100-80g",
        "all_to_all",
        1,
        2**30,
        254.7,
        "ring",
        True,
        "microsoft/mscclpp docs/performance-ndmv4.md (NCCL column)",
    ),
    (
        "dgx-a100-80g",
        "all_reduce",
        2,
        4 * 2**30,
        188.2,
        "ring",
        True,
        "microsoft/mscclpp docs/performance-ndmv4.md, 2 nodes x 8, 8 x HDR",
    ),
    (
        "dgx-a100-80g",
        "all_gather",
        2,
        4 * 2**30,
        186.0,
        "ring",
        True,
        "microsoft/mscclpp docs/performance-ndmv4.md, 2 nodes x 8, 8 x HDR",
    ),
    (
        "dgx-a100-80g",
        "all_to_all",
        2,
        4 * 2**30,
        37.8,
        "ring",
        True,
        "microsoft/mscclpp docs/performance-ndmv4.md, 2 nodes x 8, 8 x HDR",
    ),
    (
        "dgx-h100",
        "all_reduce",
        1,
        4 * 2**30,
        367.5,
        "ring",
        True,
        "NVIDIA/nccl issue 1455 (NCCL_ALGO=RING, 365-370 GB/s on 8 H100 SXM); "
        "NVIDIA/nccl-tests issue 212 (about 370 GB/s for ring and non-all-reduce ops)",
    ),
    (
        "dgx-h100",
        "all_gather",
        1,
        2**30,
        352.7,
        "ring",
        True,
        "Azure/msccl docs/performance-nd-h100-v5.md (NCCL column, 2663.8 us at 1 GB)",
    ),
    (
        "dgx-h100",
        "all_reduce",
        1,
        8 * 2**30,
        480.16,
        "nvls",
        True,
        "NVIDIA/dgxc-benchmarking nccl/README.md sample output (default algorithm: NVLS)",
    ),
    (
        "dgx-h100",
        "all_reduce",
        4,
        8 * 2**30,
        330.93,
        "ring",
        False,
        "ZiyanIshani/vpbenchmarking results/nccl/nccl_multinode (4 x 8 H100, 400 Gb/s ports; "
        "its summary is unsure how many ports are active)",
    ),
    (
        "dgx-h100",
        "all_gather",
        4,
        8 * 2**30,
        323.53,
        "ring",
        False,
        "ZiyanIshani/vpbenchmarking results/nccl/nccl_multinode (as above)",
    ),
    (
        "dgx-h100",
        "all_reduce",
        8,
        8 * 2**30,
        386.56,
        "sharp",
        False,
        "coreweave/nccl-tests README (8 x 8 H100, 8 x NDR, InfiniBand SHARP: COLLNETCHAIN)",
    ),
]


# (nodes of 8 H100s, message bytes, published all-reduce busbw GB/s, source). Read off plots.
_GTC = (
    "NVIDIA GTC24 S62129 (Collective communication), slide 35: NCCL all-reduce busbw, "
    "ALGO=NVLSTree, 32 to 8K GPUs; the plot as copied in stas00/ml-engineering "
    "network/images/nccl-all-reduce-scan-nvlstree.png (744d01e1)"
)
_META = (
    "Fernandez et al. (Meta), Hardware Scaling Trends and Diminishing Returns in Large-Scale "
    "Distributed Training, arXiv 2411.13055: NCCL-tests scaling, all-reduce, 4 to 512 nodes of "
    "H100s; the plot as copied in stas00/ml-engineering network/images/nccl-all-reduce-scan.png"
)
SCALING: list[tuple[int, float, float, str]] = [
    (4, 16e6, 125.0, _GTC),
    (1024, 16e6, 33.0, _GTC),
    (4, 64e6, 230.0, _GTC),
    (1024, 64e6, 105.0, _GTC),
    (4, 256e6, 313.0, _GTC),
    (1024, 256e6, 220.0, _GTC),
    (4, 1e9, 350.0, _GTC),
    (1024, 1e9, 305.0, _GTC),
    (4, 128 * 2**20, 255.0, _META),
    (512, 128 * 2**20, 165.0, _META),
    (4, 32 * 2**20, 167.0, _META),
    (8, 32 * 2**20, 137.0, _META),
    (512, 32 * 2**20, 65.0, _META),
]


def scaling_rows(tree_level_us: float | None = None) -> list[dict[str, Any]]:
    """The ``SCALING`` figures beside the model's (DGX H100, all-reduce across every GPU),
    with the preset's tree level or ``tree_level_us``."""
    rows = []
    for nodes, nbytes, published, source in SCALING:
        cluster = preset("dgx-h100", nodes=nodes)
        if tree_level_us is not None:
            cluster = dataclasses.replace(cluster, tree_level_latency_us=tree_level_us)
        gpus = nodes * cluster.gpus_per_node
        seconds = NcclModel(cluster).time_us("all_reduce", nbytes, Group(gpus, 8)) / 1e6
        predicted = _factor("all_reduce", gpus) * nbytes / seconds / GB
        rows.append(
            {
                "nodes": nodes,
                "size_bytes": int(nbytes),
                "published_busbw_gbps": published,
                "model_busbw_gbps": round(predicted, 1),
                "error": round(predicted / published - 1, 4),
                "source": source,
            }
        )
    return rows


def fit_tree_level() -> float:
    """The tree level (us) whose predictions of ``SCALING`` have the least squared log error."""

    def loss(level: float) -> float:
        return sum(math.log1p(row["error"]) ** 2 for row in scaling_rows(level))

    return min((level / 2 for level in range(2, 401)), key=loss)


def _scaling(as_json: bool) -> None:
    rows = scaling_rows()
    errors = [abs(row["error"]) for row in rows]
    result = {
        "rows": rows,
        "fitted_tree_level_us": fit_tree_level(),
        "max_abs_error": round(max(errors), 4),
        "median_abs_error": round(statistics.median(errors), 4),
    }
    if as_json:
        print(json.dumps(result, indent=1))
        return
    for row in rows:
        print(
            f"dgx-h100 all_reduce {row['nodes']:5d} nodes {row['size_bytes'] / 1e6:7.1f} MB: "
            f"published {row['published_busbw_gbps']:6.1f} model {row['model_busbw_gbps']:6.1f}"
            f" GB/s ({row['error']:+.1%})"
        )
    print(
        f"max |error| {result['max_abs_error']:.1%}, median {result['median_abs_error']:.1%}; "
        f"tree level fitted: {result['fitted_tree_level_us']} us"
    )


def model_busbw(
    name: str, collective: str, nodes: int, nbytes: float, *, nvls: bool = True
) -> float:
    cluster = preset(name, nodes=nodes)
    if not nvls:
        cluster = dataclasses.replace(cluster, nvls_gbps=0.0)
    gpus = nodes * cluster.gpus_per_node
    group = Group(gpus, cluster.gpus_per_node)
    seconds = NcclModel(cluster).time_us(collective, nbytes, group) / 1e6
    return _factor(collective, gpus) * nbytes / seconds / GB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--scaling", action="store_true", help="the node-count figures")
    args = parser.parse_args()
    if args.scaling:
        _scaling(args.json)
        return
    rows: list[dict[str, Any]] = []
    for name, collective, nodes, nbytes, published, algorithm, trusted, source in PUBLISHED:
        predicted = model_busbw(name, collective, nodes, nbytes, nvls=algorithm != "ring")
        rows.append(
            {
                "preset": name,
                "collective": collective,
                "nodes": nodes,
                "size_bytes": int(nbytes),
                "published_busbw_gbps": published,
                "model_busbw_gbps": round(predicted, 1),
                "error": round(predicted / published - 1, 4),
                "algorithm": algorithm,
                "counted": trusted and algorithm in {"ring", "nvls"},
                "source": source,
            }
        )
    counted = [abs(row["error"]) for row in rows if row["counted"]]
    result = {
        "rows": rows,
        "counted": len(counted),
        "max_abs_error": round(max(counted), 4),
        "median_abs_error": round(statistics.median(counted), 4),
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for row in rows:
        mark = "" if row["counted"] else f"  (not counted: {row['algorithm']})"
        print(
            f"{row['preset']:13s} {row['collective']:11s} {row['nodes']} node(s) "
            f"{row['size_bytes'] / 2**30:4.0f} GiB: published {row['published_busbw_gbps']:7.1f} "
            f"model {row['model_busbw_gbps']:7.1f} GB/s ({row['error']:+.1%}){mark}"
        )
    print(
        f"counted {result['counted']}: max |error| {result['max_abs_error']:.1%}, "
        f"median {result['median_abs_error']:.1%}"
    )


if __name__ == "__main__":
    main()
