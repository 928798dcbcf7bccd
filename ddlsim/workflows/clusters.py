"""Users' own clusters: collectives measured under an external launcher (torchrun, srun, a
PyTorchJob, or a Slurm job submitit submits), stored as fits per fabric level and, on GPUs,
as a named cluster profile that ``ddlsim predict|search --cluster NAME`` prices with."""

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ddlsim.cluster.external import ExternalRank
from ddlsim.cluster.launcher import Launcher
from ddlsim.data.comm_model import COLLECTIVES
from ddlsim.data.errors import InvalidClusterError, InvalidOptionError
from ddlsim.data.specs.cluster import ClusterSpec
from ddlsim.data.specs.clusters import parse_cluster
from ddlsim.data.specs.gpu_cluster import PRESETS, GpuClusterSpec, preset
from ddlsim.data.store import Store, add_collective_profile
from ddlsim.profiler.batch_jobs import collective_records
from ddlsim.profiler.collective_fit import CollectiveProfile
from ddlsim.profiler.collectives import profile_collectives, profile_collectives_joined
from ddlsim.simulator.gpu.nccl import fitted_cluster

# Which preset's GPU a measured device is, by a part of its name (torch.cuda.get_device_name).
GPU_NAMES: dict[str, str] = {"H200": "dgx-h200", "H100": "dgx-h100", "A100": "dgx-a100-80g"}
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# A cluster named in a request: a preset or a stored profile, with its node count or without.
_STORED = re.compile(r"\s*([a-z0-9][a-z0-9._-]*)(?::(\d+))?\s*")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CollectivesRequest:
    """Collectives to measure, and (a launched job on GPUs) the cluster profile to make of
    them; on this machine's emulated cluster, ``world_size`` ranks behind links of
    ``bandwidth`` (``cpu_repeats``: also time each collective's CPU work alone)."""

    backend: str = "nccl"
    world_size: int | None = None
    bandwidth: str | None = None
    cpu_repeats: int = 0
    sizes: Sequence[int] | None = None
    collectives: Sequence[str] = COLLECTIVES
    warmup: int = 2
    repeats: int = 5
    timeout_s: float = 600.0
    name: str | None = None
    gpu: str | None = None

    def __post_init__(self) -> None:
        if self.name is not None:
            if not _NAME.match(self.name) or self.name.split(":")[0] in PRESETS:
                raise InvalidOptionError(
                    f"cluster name {self.name!r} must be 1-64 of a-z, 0-9, '.', '_', '-' and "
                    f"not a preset ({', '.join(PRESETS)})"
                )
            if self.backend != "nccl":
                raise InvalidOptionError(
                    "a named cluster profile prices GPUs: measure it with backend 'nccl' "
                    f"(got {self.backend!r})"
                )
        if self.gpu is not None and self.gpu not in PRESETS:
            raise InvalidOptionError(
                f"gpu preset {self.gpu!r} is unknown; allowed: {', '.join(PRESETS)}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Measured:
    """Rank 0's outcome: the profiles by level, and the named cluster when one was made."""

    profiles: dict[str, CollectiveProfile]
    nodes: int
    gpus_per_node: int
    device_name: str
    cluster: GpuClusterSpec | None = None


def measure_joined(request: CollectivesRequest, *, launcher: str = "env") -> Measured | None:
    """This process's rank of the launched job; rank 0's outcome, ``None`` elsewhere."""
    import torch

    place = ExternalRank.from_environ()
    profiles = profile_collectives_joined(
        backend=request.backend,
        sizes=request.sizes,
        collectives=request.collectives,
        warmup=request.warmup,
        repeats=request.repeats,
        timeout_s=request.timeout_s,
        launcher=launcher,
    )
    if profiles is None:
        return None
    device = torch.cuda.get_device_name() if request.backend == "nccl" else "cpu"
    return Measured(
        profiles=profiles,
        nodes=place.nodes,
        gpus_per_node=place.local_world_size,
        device_name=device,
    )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CollectivesJob:
    """The collectives benchmark for a launcher: on this machine's emulated cluster one level
    (``link``, a host a rank), in a launched job each level of its fabric."""

    request: CollectivesRequest
    name = "ddlsim-collectives"

    @property
    def use_gpus(self) -> bool:
        return self.request.backend == "nccl"

    def here(self, progress: Callable[[str], None] | None) -> Measured:
        request = self.request
        if request.name is not None:
            raise InvalidOptionError(
                "--name stores a GPU cluster profile measured on your cluster: use --launcher "
                "env or slurm with --backend nccl"
            )
        world_size = request.world_size or 1
        profile = profile_collectives(
            world_size=world_size,
            backend=request.backend,
            bandwidth=request.bandwidth,
            sizes=request.sizes,
            collectives=request.collectives,
            warmup=request.warmup,
            repeats=request.repeats,
            cpu_repeats=request.cpu_repeats,
            timeout_s=request.timeout_s,
            progress=progress,
        )
        return Measured(
            profiles={"link": profile}, nodes=world_size, gpus_per_node=1, device_name="cpu"
        )

    def as_rank(self, launcher: str, progress: Callable[[str], None] | None) -> Measured | None:
        return measure_joined(self.request, launcher=launcher)


def cluster_from(measured: Measured, *, name: str, gpu: str | None = None) -> GpuClusterSpec:
    """The named cluster of what was measured: the GPU's preset (``gpu``, else recognised
    from the device's name) with the fabric's measured all-reduce.

    Raises:
        InvalidOptionError: an unrecognised GPU without ``gpu``, or no all-reduce measured.
    """
    base_name = gpu or next(
        (preset_name for part, preset_name in GPU_NAMES.items() if part in measured.device_name),
        None,
    )
    if base_name is None:
        raise InvalidOptionError(
            f"GPU {measured.device_name!r} is not one of the presets' ({', '.join(GPU_NAMES)}); "
            f"name the closest with --gpu ({', '.join(PRESETS)})"
        )

    def all_reduce(level: str) -> tuple[float, float] | None:
        profile = measured.profiles.get(level)
        if profile is None:
            return None
        fit = next((f for f in profile.fits if f.collective == "all_reduce"), None)
        if fit is None:
            return None
        return fit.busbw_gbps / 8, fit.alpha_us  # Gbit/s -> GB/s

    whole = all_reduce("cluster")
    if whole is None:
        raise InvalidOptionError("a cluster profile needs all_reduce measured at two sizes")
    inside = all_reduce("node")
    return fitted_cluster(
        preset(base_name),
        name=name,
        nodes=measured.nodes,
        gpus_per_node=measured.gpus_per_node,
        node_busbw_gbps=inside[0] if inside else None,
        node_alpha_us=inside[1] if inside else None,
        cluster_busbw_gbps=whole[0],
        cluster_alpha_us=whole[1],
    )


def collect_collectives(
    request: CollectivesRequest,
    *,
    launcher: Launcher,
    db: str | None,
    progress: Callable[[str], None] | None = None,
    on_submit: Callable[[str], None] | None = None,
) -> tuple[Measured, list[int], str] | None:
    """Measure through ``launcher`` (:class:`CollectivesJob`) and store rank 0's fits (and,
    with ``request.name``, the named cluster) in ``db``; the outcome, the fits' ids and the
    store's URL, ``None`` on the ranks that follow.

    Raises:
        InvalidOptionError: bad settings, no launcher environment, NCCL without GPUs, a
            cluster name on the emulated cluster.
        ClusterRunError: a rank or the Slurm job failed.
    """
    request = dataclasses.replace(request, world_size=launcher.ranks(request.world_size))
    measured: Measured | None = launcher.launch(
        CollectivesJob(request=request), progress=progress, on_submit=on_submit
    )
    if measured is None:
        return None
    with Store.open(db) as store:
        # The fits first: a cluster that cannot be made of them (an unknown GPU) keeps them.
        with store.transaction() as session:
            ids = [
                add_collective_profile(session, profile=record)
                for profile in measured.profiles.values()
                for record in collective_records(profile)
            ]
        if request.name is not None:
            cluster = cluster_from(measured, name=request.name, gpu=request.gpu)
            measured = dataclasses.replace(measured, cluster=cluster)
        if measured.cluster is not None:
            store.save_cluster_profile(
                name=measured.cluster.name,
                spec=measured.cluster.to_dict(),
                measured={
                    level: profile.to_json_dict() for level, profile in measured.profiles.items()
                },
            )
    return measured, ids, store.url


def resolve_cluster(text: str, db: str | None) -> ClusterSpec:
    """``--cluster``: a preset (``PRESET:NODES``), inline JSON or a file of either kind (a
    GPU cluster, an emulated one: :func:`ddlsim.data.specs.clusters.parse_cluster`), or the
    name of a cluster profile stored in ``db`` (``NAME`` or ``NAME:NODES``, nodes as measured
    by default).

    Raises:
        InvalidClusterError: none of those; the message lists the stored names.
    """
    try:
        return parse_cluster(text)
    except InvalidClusterError as exc:
        if _STORED.fullmatch(text) is None:
            raise
        with Store.open(db) as store:
            return _stored_cluster(text, store.cluster_profiles(), exc)


def named_cluster(text: str, store: Store) -> GpuClusterSpec:
    """A cluster by name only (the REST API's form: a string is never read as a path): a
    preset as ``PRESET:NODES`` (one node without), or a cluster profile stored in ``store``
    as ``NAME[:NODES]``.

    Raises:
        InvalidClusterError: naming the text and listing the presets and stored names.
    """
    match = _STORED.fullmatch(text)
    if match is None:
        raise InvalidClusterError(
            f"cluster {text!r} is not NAME or NAME:NODES; presets: {', '.join(PRESETS)}"
        )
    if match.group(1) in PRESETS:
        return GpuClusterSpec.parse(text)
    not_preset = InvalidClusterError(
        f"cluster {text!r} is not a preset; allowed: {', '.join(PRESETS)} (as PRESET:NODES)"
    )
    return _stored_cluster(text, store.cluster_profiles(), not_preset)


def _stored_cluster(
    text: str, stored: Mapping[str, Mapping[str, Any]], exc: InvalidClusterError
) -> GpuClusterSpec:
    match = _STORED.fullmatch(text)
    if match is None or match.group(1) not in stored:
        names = ", ".join(stored) or "none stored"
        raise InvalidClusterError(f"{exc}; or a stored cluster profile: {names}") from None
    spec = GpuClusterSpec.from_dict(stored[match.group(1)]["spec"])
    nodes = match.group(2)
    if nodes is None:
        return spec
    if int(nodes) < 1:
        raise InvalidClusterError(f"node count {nodes!r} in {text!r} must be a positive integer")
    return spec.with_nodes(int(nodes))


def cluster_catalogue(store: Store) -> list[dict[str, Any]]:
    """The GPU clusters a request may name: every preset (one node as named alone; name it
    ``PRESET:NODES``), then the cluster profiles stored in ``store`` (``NAME``: as many nodes
    as were measured; ``NAME:NODES``), each with its GPU, its fabric and its whole spec
    (``GpuClusterSpec.to_dict()``)."""
    listed = [(name, "preset", preset(name)) for name in PRESETS]
    listed += [
        (name, "measured", GpuClusterSpec.from_dict(stored["spec"]))
        for name, stored in store.cluster_profiles().items()
    ]
    return [
        {
            "name": name,
            "origin": origin,
            "usage": f"{name}:NODES",
            "nodes": spec.nodes,
            "gpu": spec.gpu.name,
            "gpu_memory_gib": spec.gpu.memory_gib,
            "gpus_per_node": spec.gpus_per_node,
            "nvlink_gbps": spec.nvlink_gbps,
            "nics_per_node": spec.nics_per_node,
            "nic_gbits": spec.nic_gbits,
            "network_gbps_per_gpu": round(spec.nic_gbps_per_gpu, 3),
            "spec": spec.to_dict(),
        }
        for name, origin, spec in listed
    ]


def describe(measured: Measured) -> dict[str, Any]:
    """What was measured, for ``--json``."""
    return {
        "nodes": measured.nodes,
        "gpus_per_node": measured.gpus_per_node,
        "device": measured.device_name,
        "levels": {level: p.to_json_dict() for level, p in measured.profiles.items()},
        "cluster": measured.cluster.to_dict() if measured.cluster is not None else None,
        # One level (this machine's emulated cluster): its profile's fields at the top too.
        **(
            next(iter(measured.profiles.values())).to_json_dict()
            if len(measured.profiles) == 1
            else {}
        ),
    }
