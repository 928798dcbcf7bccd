"""Collective microbenchmarks on an emulated cluster, fitted with :mod:`.collective_fit`.

Each collective is timed at each message size (nccl-tests' sizes: a tensor's total bytes) by
``world_size`` ranks (:mod:`.collective_rank`) on links shaped to the given rate; the medians
of each collective are fitted as ``time_us = alpha_us + factor * bytes / busbw``.

What is measured is what ``torch.distributed`` does, not what a collective ideally costs: on
gloo (torch 2.13) ``reduce_scatter_tensor`` runs a full all-reduce internally, so its busbw
comes out at about half the link's, and ``broadcast`` sends the whole buffer from the root to
each other rank (busbw about the link's / (n - 1)); the profile says so in ``notes``. Measured
at 1gbit, 4 ranks, 4 KiB-256 MiB: all_reduce 0.95, reduce_scatter 0.40, all_gather 0.83,
broadcast 0.32, sendrecv 0.91 Gbit/s busbw.
"""

import json
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddlsim.cluster import ClusterRunError, EmulatedCluster, groups
from ddlsim.data.comm_model import COLLECTIVES
from ddlsim.data.errors import InvalidOptionError, one_line
from ddlsim.data.specs.cluster import BACKENDS, burst_bytes, parse_bandwidth_gbps
from ddlsim.profiler.collective_fit import CollectiveProfile, fit_latency_bandwidth, make_sample

RANK_MODULE = "ddlsim.profiler.collective_rank"

_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_DEFAULT_RANGE_FACTOR = 4


class InvalidSizesError(InvalidOptionError):
    """A message-size list or range cannot be parsed."""


def default_sizes() -> list[int]:
    """Powers of 4 from 4 KiB to 256 MiB (9 sizes)."""
    return [4 * 1024 * 4**i for i in range(9)]


def _parse_one_size(text: str, whole: str) -> int:
    match = _SIZE.match(text)
    if match is None:
        raise InvalidSizesError(
            f"size {text.strip()!r} in {whole!r} is not a size; allowed: a byte count with an "
            "optional unit k/m/g (binary: 4k = 4KiB = 4KB = 4096), e.g. '4KiB,1MiB,64MiB' or "
            "a range '4k:256m' (x4 steps) or '4k:256m:2'"
        )
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value < 1 or value != int(value):
        raise InvalidSizesError(
            f"size {text.strip()!r} in {whole!r} must be a whole number of bytes >= 1"
        )
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """Message sizes from text: a comma-separated list of sizes and ranges, sorted and unique.

    A size is a byte count with an optional binary unit (``4096``, ``4k``, ``4KiB``, ``1.5m``;
    k/KB/KiB all mean 1024, as in nccl-tests). A range ``START:END[:FACTOR]`` is START, START *
    FACTOR, ... up to END (FACTOR defaults to 4): ``4k:256m`` is the default set.

    Raises:
        InvalidSizesError: naming the part that is not a size or range.
    """
    sizes: set[int] = set()
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise InvalidSizesError(f"sizes {text!r} is empty; allowed: e.g. '4KiB,1MiB' or '4k:256m'")
    for item in items:
        parts = item.split(":")
        if len(parts) == 1:
            sizes.add(_parse_one_size(parts[0], text))
            continue
        if len(parts) > 3:
            raise InvalidSizesError(
                f"range {item.strip()!r} in {text!r} has {len(parts)} parts; allowed: "
                "START:END or START:END:FACTOR"
            )
        start, end = _parse_one_size(parts[0], text), _parse_one_size(parts[1], text)
        factor_text = parts[2].strip() if len(parts) == 3 else str(_DEFAULT_RANGE_FACTOR)
        if not factor_text.isdigit() or int(factor_text) < 2:
            raise InvalidSizesError(
                f"range factor {factor_text!r} in {item.strip()!r} must be an integer >= 2"
            )
        if start > end:
            raise InvalidSizesError(
                f"range {item.strip()!r} in {text!r} starts above its end ({start} > {end})"
            )
        size = start
        while size <= end:
            sizes.add(size)
            size *= int(factor_text)
    return sorted(sizes)


def check_options(
    *,
    world_size: int,
    backend: str,
    sizes: Sequence[int],
    collectives: Sequence[str],
    warmup: int,
    repeats: int,
    cpu_repeats: int,
    timeout_s: float,
    on_this_host: bool = True,
) -> None:
    """Refuse options :func:`profile_collectives` cannot run, before any process starts;
    ``on_this_host`` false: leave out what depends on this machine's devices (a submission
    checked for a worker elsewhere).

    Raises:
        InvalidOptionError: naming the value and what is allowed.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise InvalidOptionError(
            f"world_size({world_size!r}) is not supported; allowed: an integer >= 2"
        )
    if backend not in BACKENDS:
        raise InvalidOptionError(
            f"backend {backend!r} is not supported; allowed: {', '.join(BACKENDS)}"
        )
    if backend == "nccl" and on_this_host:
        if not torch.cuda.is_available():
            raise InvalidOptionError(
                "backend 'nccl' needs CUDA, which is not available here; use backend 'gloo'"
            )
        if torch.cuda.device_count() < world_size:
            raise InvalidOptionError(
                f"backend 'nccl' needs one CUDA device per rank: world_size({world_size}) > "
                f"{torch.cuda.device_count()} devices"
            )
    unknown = [c for c in collectives if c not in COLLECTIVES]
    if unknown or not collectives:
        raise InvalidOptionError(
            f"collectives {list(collectives)} are not supported; allowed: a non-empty subset "
            f"of {', '.join(COLLECTIVES)}"
        )
    bad_sizes = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or s < 1]
    if bad_sizes or not sizes:
        raise InvalidSizesError(
            f"sizes {list(sizes)} are not usable; allowed: integers >= 1 (bytes), at least one"
        )
    if warmup < 0:
        raise InvalidOptionError(f"warmup({warmup}) must be >= 0")
    if repeats < 1:
        raise InvalidOptionError(f"repeats({repeats}) must be >= 1")
    if cpu_repeats < 0:
        raise InvalidOptionError(f"cpu_repeats({cpu_repeats}) must be >= 0")
    if not timeout_s > 0:
        raise InvalidOptionError(f"timeout_s({timeout_s}) must be > 0")


def profile_collectives(
    *,
    world_size: int,
    backend: str = "gloo",
    bandwidth: str | None = "1gbit",
    sizes: Sequence[int] | None = None,
    collectives: Sequence[str] = COLLECTIVES,
    warmup: int = 2,
    repeats: int = 5,
    cpu_repeats: int = 0,
    timeout_s: float = 600,
    progress: Callable[[str], None] | None = None,
) -> CollectiveProfile:
    """Benchmark ``collectives`` over ``sizes`` on an emulated cluster and fit each.

    Starts ``world_size`` ranks (one namespace each, links shaped to ``bandwidth``; loopback
    with a warning where namespaces are unavailable), runs ``warmup`` untimed and ``repeats``
    timed iterations per collective and size, and fits the medians (a collective needs two
    distinct sizes to be fitted; otherwise ``notes`` says so). ``progress`` receives one
    line per finished size. ``sizes`` defaults to ``default_sizes()``; each is rounded down to
    whole float32 elements (and a multiple of the world size for reduce-scatter and
    all-gather), and samples report the size used.

    Raises:
        InvalidOptionError: a bad world size, backend, collective, size list, count or timeout
            (``InvalidSizesError`` for sizes), before any process starts.
        InvalidClusterError: ``bandwidth`` is not a rate.
        ClusterRunError: a rank failed or the run passed ``timeout_s``.

    Long: it holds the emulated cluster for the measurement's whole life (namespaces, ranks,
    their cleanup on every way out), which its steps share.
    """
    size_list = list(default_sizes() if sizes is None else sizes)
    collective_list = list(collectives)
    check_options(
        world_size=world_size,
        backend=backend,
        sizes=size_list,
        collectives=collective_list,
        warmup=warmup,
        repeats=repeats,
        cpu_repeats=cpu_repeats,
        timeout_s=timeout_s,
    )
    # A shaped link's token bucket lets its first bytes through at line rate; the fit takes
    # them out of the bytes it prices.
    burst = burst_bytes(parse_bandwidth_gbps("none" if bandwidth is None else bandwidth))
    env: dict[str, str] = {}
    if backend == "nccl":
        # Only the network transport crosses the shaped links; P2P and shared memory would not.
        env = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket"}
    with tempfile.TemporaryDirectory(prefix="ddlsim-collectives-") as tmp:
        output = Path(tmp) / "collectives.json"
        args = [
            "--output",
            str(output),
            "--backend",
            backend,
            "--collectives",
            ",".join(collective_list),
            "--sizes",
            ",".join(str(s) for s in size_list),
            "--warmup",
            str(warmup),
            "--repeats",
            str(repeats),
            "--timeout-s",
            str(timeout_s),
            "--cpu-repeats",
            str(cpu_repeats),
        ]
        with EmulatedCluster(world_size, bandwidth) as cluster:
            result = cluster.launch(
                RANK_MODULE,
                args,
                env,
                timeout_s=timeout_s,
                output_paths=[output],
                stdout_callback=progress,
            )
            link = cluster.bandwidth
        raw = json.loads(output.read_text(encoding="utf-8"))
    samples = tuple(
        make_sample(
            s["collective"],
            s["size_bytes"],
            s["times_us"],
            world_size=world_size,
            stolen_us=s.get("stolen_us", ()),
        )
        for s in raw["samples"]
    )
    fits = []
    notes = []
    for collective in collective_list:
        mine = [s for s in samples if s.collective == collective]
        if len({s.size_bytes for s in mine}) < 2:
            notes.append(f"no fit for {collective}: it needs at least 2 distinct sizes")
            continue
        fits.append(
            fit_latency_bandwidth(
                mine,
                world_size=world_size,
                backend=backend,
                bandwidth=link,
                burst_bytes=burst if result.network != "loopback" else 0,
            )
        )
    if result.network == "loopback":
        notes.append(f"loopback fallback: bandwidth {link!r} was not enforced")
    if backend == "gloo" and "reduce_scatter" in collective_list:
        notes.append(
            "gloo's reduce_scatter_tensor runs a full all-reduce internally: its busbw "
            "(factor (n-1)/n) is about half the link's"
        )
    if backend == "gloo" and "broadcast" in collective_list and world_size > 2:
        notes.append(
            "gloo's broadcast sends the whole buffer from the root to each other rank: its "
            "busbw (factor 1) is about the link's / (n-1)"
        )
    return CollectiveProfile(
        fits=tuple(fits),
        samples=samples,
        network=result.network,
        backend=backend,
        world_size=world_size,
        bandwidth=link,
        rank_cores=result.rank_cores,
        rank_last_core=result.last_cores,
        notes=tuple(notes),
    )


# Fabric levels of a job launched across nodes: the first node's ranks alone, and every rank.
LEVELS: tuple[str, ...] = ("node", "cluster")


def profile_collectives_joined(
    *,
    backend: str,
    sizes: Sequence[int] | None = None,
    collectives: Sequence[str] = COLLECTIVES,
    warmup: int = 2,
    repeats: int = 5,
    timeout_s: float = 600,
    launcher: str = "env",
    progress: Callable[[str], None] | None = None,
) -> dict[str, CollectiveProfile] | None:
    """Benchmark the collectives as one rank of a process group that an external launcher made
    (torchrun, srun, a PyTorchJob; NCCL on ``cuda:LOCAL_RANK``, gloo on the CPU), per level of
    the fabric: ``node`` (the first node's ranks alone: NVLink on a DGX; only when the job spans
    nodes of several ranks each, and only the collectives a group can run) and ``cluster``
    (every rank: the network). Rank 0 returns each level's fitted profile (its ``bandwidth``
    names the level, ``{launcher}:{level}``); the other ranks return ``None``.

    Raises:
        InvalidOptionError: no launcher environment, NCCL without a GPU, or bad options, before
            the group is joined.

    Long: every rank runs the same collectives per fabric level in lockstep; the order of its
    steps is the protocol.
    """
    from ddlsim.cluster.external import ExternalRank
    from ddlsim.profiler.collective_rank import GROUP_COLLECTIVES, close_comm_threads, measure

    place = ExternalRank.from_environ()
    size_list = list(default_sizes() if sizes is None else sizes)
    collective_list = list(collectives)
    check_options(
        world_size=place.world_size,
        backend=backend,
        sizes=size_list,
        collectives=collective_list,
        warmup=warmup,
        repeats=repeats,
        cpu_repeats=0,
        timeout_s=timeout_s,
        on_this_host=False,  # the group spans nodes: this node's GPUs are checked below
    )
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise InvalidOptionError("backend 'nccl' needs a CUDA GPU; torch sees none here")
        if torch.cuda.device_count() < place.local_world_size:
            raise InvalidOptionError(
                f"backend 'nccl' needs one GPU per rank: LOCAL_WORLD_SIZE"
                f"({place.local_world_size}) > {torch.cuda.device_count()} GPU(s) on this node"
            )
        device = torch.device("cuda", place.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    say = progress if progress is not None and place.rank == 0 else None
    groups.join(backend, timeout_s)
    measured: dict[str, tuple[int, list[dict[str, Any]]]] = {}
    try:
        if place.nodes > 1 and place.local_world_size > 1:
            node_ranks = list(range(place.local_world_size))
            group = groups.subgroup(node_ranks)
            in_node = [c for c in collective_list if c in GROUP_COLLECTIVES]
            if place.rank in node_ranks and in_node:
                if say:
                    say(f"level node: {place.local_world_size} ranks of one node")
                measured["node"] = (
                    place.local_world_size,
                    measure(in_node, size_list, warmup=warmup, repeats=repeats, cpu_repeats=0,
                            device=device, group=group, say=say),
                )  # fmt: skip
            dist.barrier()
        if say:
            say(f"level cluster: {place.world_size} ranks on {place.nodes} node(s)")
        measured["cluster"] = (
            place.world_size,
            measure(collective_list, size_list, warmup=warmup, repeats=repeats, cpu_repeats=0,
                    device=device, say=say),
        )  # fmt: skip
        close_comm_threads()
        dist.barrier()
    except (RuntimeError, dist.DistError) as exc:
        # A peer that crashed or hung ends this rank's collectives with torch's error.
        raise ClusterRunError(f"rank {place.rank}: {one_line(exc, limit=2000)}") from exc
    finally:
        dist.destroy_process_group()
    if place.rank != 0:
        return None
    network = place.network(launcher, backend)
    profiles = {}
    for level, (size, raw) in measured.items():
        samples = tuple(
            make_sample(s["collective"], s["size_bytes"], s["times_us"], world_size=size)
            for s in raw
        )
        label = f"{launcher}:{level}"
        fits = tuple(
            fit_latency_bandwidth(
                [s for s in samples if s.collective == collective],
                world_size=size,
                backend=backend,
                bandwidth=label,
            )
            for collective in dict.fromkeys(s.collective for s in samples)
            if len({s.size_bytes for s in samples if s.collective == collective}) >= 2
        )
        profiles[level] = CollectiveProfile(
            fits=fits,
            samples=samples,
            network=network,
            backend=backend,
            world_size=size,
            bandwidth=label,
            rank_cores={},
            notes=(f"{level} level of a {launcher}-launched job",),
        )
    return profiles
