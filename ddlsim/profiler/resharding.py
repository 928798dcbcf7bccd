"""Cross-mesh resharding measured on an emulated cluster: a tensor moved from a source sub-mesh
to a destination sub-mesh by each method of :mod:`ddlsim.data.resharding`, side by side.

``src.ranks + dst.ranks`` ranks start, one network namespace each with links shaped to the
given rate (:class:`EmulatedCluster`); :mod:`.reshard_rank` checks once that each method
delivers what the destination's layout says, then times ``repeats`` moves a size and method,
the methods taking turns.
"""

import json
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ddlsim.cluster import EmulatedCluster
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.resharding import RESHARD_METHODS, MeshLayout
from ddlsim.data.specs.cluster import parse_bandwidth_gbps

RANK_MODULE = "ddlsim.profiler.reshard_rank"
MAX_RANKS = 16
# Every rank holds the whole tensor twice (and every rank runs on this machine).
MAX_SIZE_BYTES = 1 << 30


def measure_resharding(
    src: MeshLayout,
    dst: MeshLayout,
    sizes: Sequence[int],
    *,
    bandwidth: str | None = "1gbit",
    methods: Sequence[str] = RESHARD_METHODS,
    warmup: int = 2,
    repeats: int = 7,
    timeout_s: float = 600.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Per method and size, every repeat's time (slowest rank, us) and their median (ms):
    ``{"samples": [{"method", "size_bytes", "times_us", "median_ms"}], "network": ...}``.

    Raises:
        InvalidOptionError: more than ``MAX_RANKS`` ranks, no sizes or one over
            ``MAX_SIZE_BYTES``, an unknown method, or counts below 1, before any process starts.
        InvalidClusterError: ``bandwidth`` is not a rate.
        ClusterRunError: a rank failed (a method delivered wrong values) or the run passed
            ``timeout_s``.
    """
    world_size = src.ranks + dst.ranks
    if world_size > MAX_RANKS:
        raise InvalidOptionError(f"src + dst = {world_size} ranks; at most {MAX_RANKS}")
    if not sizes or any(size < 1 or size > MAX_SIZE_BYTES for size in sizes):
        raise InvalidOptionError(
            f"sizes must be byte counts from 1 to {MAX_SIZE_BYTES} (1 GiB), got {list(sizes)}"
        )
    for method in methods:
        if method not in RESHARD_METHODS:
            raise InvalidOptionError(
                f"resharding method {method!r} is not supported; allowed: "
                f"{', '.join(RESHARD_METHODS)}"
            )
    if warmup < 0 or repeats < 1:
        raise InvalidOptionError(f"warmup({warmup}) must be >= 0 and repeats({repeats}) >= 1")
    parse_bandwidth_gbps("none" if bandwidth is None else bandwidth)
    with tempfile.TemporaryDirectory(prefix="ddlsim-reshard-") as tmp:
        output = Path(tmp) / "reshard.json"
        args = [
            *("--output", str(output)),
            *("--src", f"{src.ranks}:{src.layout}", "--dst", f"{dst.ranks}:{dst.layout}"),
            *("--methods", ",".join(methods), "--sizes", ",".join(str(s) for s in sizes)),
            *("--warmup", str(warmup), "--repeats", str(repeats)),
            *("--timeout-s", str(timeout_s)),
        ]
        with EmulatedCluster(world_size, bandwidth) as cluster:
            result = cluster.launch(
                RANK_MODULE,
                args,
                {},
                timeout_s=timeout_s,
                output_paths=[output],
                stdout_callback=progress,
            )
            link = cluster.bandwidth
        raw = json.loads(output.read_text(encoding="utf-8"))
    for sample in raw["samples"]:
        sample["median_ms"] = statistics.median(sample["times_us"]) / 1e3
    return {
        "samples": raw["samples"],
        "src": dataclass_dict(src),
        "dst": dataclass_dict(dst),
        "bandwidth": link,
        "network": result.network,
    }


def dataclass_dict(mesh: MeshLayout) -> dict[str, Any]:
    return {"ranks": mesh.ranks, "layout": mesh.layout}
