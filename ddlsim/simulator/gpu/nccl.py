"""NCCL's collectives on a GPU cluster: an alpha-beta model per level of the fabric.

A group of ``size`` ranks with ``per_node`` of them on each of ``size / per_node`` nodes runs a
collective over NVLink alone (one node) or over NVLink and the NICs (several). Its bus
bandwidth (nccl-tests' busbw) is the slowest level's: NVLink's per-GPU rate, or across nodes
the NICs the group's ``per_node`` ranks drive (one each on a rail-optimised DGX, every group of
the job running at once), each times the efficiency NCCL reaches on it. Time follows
nccl-tests' definitions:

    all_reduce      2 (n-1)/n * S / busbw     reduce_scatter, all_gather   (n-1)/n * S / busbw
    sendrecv        S / (link rate)           all_to_all                   (n-1)/n * S / busbw

(``S`` the buffer size as nccl-tests counts it: the whole buffer of all-reduce, all-gather's
output, reduce-scatter's input), plus a latency term as NCCL's tuning model counts it
(``src/graph/tuning.cc``): a launch cost, then ring algorithms take ``2 (n-1)`` (or ``n-1``)
steps, ``2 (nodes-1)`` (or ``nodes-1``) of them across the network, so their latency grows
linearly with the ranks; the tree NCCL uses for all-reduce across nodes climbs ``log2(nodes)``
levels and back after a ring inside each node. All-gather and reduce-scatter have no tree. NCCL
picks the faster, and so does the model. The tree's level is what the published all-reduce
scaling figures of H100 clusters imply (4 to 1,024 nodes: ``benchmarks/nccl_busbw.py
--scaling``), far above a switch hop's: it holds the chunks' pipeline through the levels.

A group spanning more nodes than a leaf's (``nodes_per_leaf``) crosses the spine, whose rate is
the leaves' over the fabric's ``oversubscription``.

Inside a node whose NVSwitches reduce in the switch (H100's NVLink SHARP, ``nvls_gbps`` of the
cluster), NCCL's default all-reduce of large buffers is NVLS: each GPU sends its buffer to the
switch once and receives the reduced result. Its bus bandwidth grows with the GPUs in the group
and reaches the ring's at four (nccl-tests on 8 H100 SXM, NVIDIA/nccl issue 1455: 370 GB/s at
2-4 GPUs, 420, 440, 460 and 480 GB/s at 5-8, the ring 365-370 at every size); the model
interpolates between the ring's at four and ``nvls_gbps`` at a whole node. All-gather and
reduce-scatter gain nothing from it (NVIDIA/nccl issue 1506: NVLS 300 GB/s, ring 350), and
across nodes the network sets the rate.
"""

import dataclasses
import math

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.cluster import Level
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec

COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "sendrecv",
    "all_to_all",
)
# The share of a link's rate NCCL's bandwidth-bound protocol (Simple) delivers as bus
# bandwidth: its chunked copies through FIFOs in GPU memory on NVLink, the InfiniBand headers and
# the proxy's pipelining on the network.
NVLINK_EFFICIENCY = 0.80
NET_EFFICIENCY = 0.92


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
    """``size`` ranks, ``per_node`` of them in each node they span."""

    size: int
    per_node: int

    def __post_init__(self) -> None:
        if self.size < 1 or self.per_node < 1 or self.size % self.per_node:
            raise InvalidOptionError(
                f"group of size({self.size}) with per_node({self.per_node}): per_node must "
                "divide size, both >= 1"
            )

    @property
    def nodes(self) -> int:
        return self.size // self.per_node


def strided_group(size: int, stride: int, gpus_per_node: int) -> Group:
    """``size`` ranks ``stride`` apart in the job's rank order (nodes of ``gpus_per_node``):
    as many of them in a node as fit and divide the group."""
    per_node = max(1, min(size, gpus_per_node // stride)) if stride < gpus_per_node else 1
    while size % per_node:
        per_node -= 1
    return Group(size, per_node)


def _factor(collective: str, n: int) -> float:
    factors = {
        "all_reduce": 2 * (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_gather": (n - 1) / n,
        "sendrecv": 1.0,
        "all_to_all": (n - 1) / n,
    }
    if collective not in factors:
        raise InvalidOptionError(
            f"collective {collective!r} is not supported; allowed: {', '.join(COLLECTIVES)}"
        )
    return factors[collective]


def _gbytes(level: Level) -> float:
    """A level's rate per GPU in GB/s (the fabric's levels give Gbit/s)."""
    if level.bandwidth_gbps is None:
        raise InvalidOptionError(f"the {level.name} level of a GPU cluster needs a rate")
    return level.bandwidth_gbps / 8


class NcclModel:
    """Collective times on ``cluster`` (immutable, thread-safe): its rates and step latencies
    are its levels' (:attr:`GpuClusterSpec.levels`: NVLink, the leaf's rails, the spine);
    NVLink SHARP, the launch cost and the tree's level are the GPU cluster's own."""

    def __init__(self, cluster: GpuClusterSpec) -> None:
        self.cluster = cluster

    def busbw_gbps(self, collective: str, group: Group) -> float:
        """The bus bandwidth (GB/s) a large message reaches, as nccl-tests reports it."""
        _factor(collective, group.size)
        node = self.cluster.levels[0]
        nvlink = _gbytes(node) * NVLINK_EFFICIENCY
        if group.nodes == 1:
            gpn = node.fanout
            if collective == "all_reduce" and self.cluster.nvls_gbps and group.size > 4 < gpn:
                share = (group.size - 4) / (gpn - 4)
                return max(nvlink, nvlink + share * (self.cluster.nvls_gbps - nvlink))
            return nvlink
        # The level the group's nodes reach: the leaf's rails, or the spine above them
        # (oversubscribed or not) for a group of more nodes than a leaf holds.
        net = _gbytes(self.cluster.level_for(group.nodes)) * NET_EFFICIENCY
        if collective == "sendrecv":
            return net
        if collective == "all_to_all":
            # Each rank sends (n - per_node) / (n - 1) of its data off the node through its NIC.
            off_node = (group.size - group.per_node) / max(group.size - 1, 1)
            return min(nvlink, net / off_node)
        # A ring (or tree) through the node's ranks crosses the network once per node, on the
        # NICs of the group's ranks in it: per rank, one NIC's worth.
        return min(nvlink, net * group.per_node)

    def latency_us(self, collective: str, group: Group) -> float:
        """The size-independent time: NCCL's ring or tree, whichever it would pick.

        The ring takes ``2 (n - 1)`` steps for an all-reduce (``n - 1`` otherwise), ``2 (nodes -
        1)`` (or ``nodes - 1``) of them across the network; the tree (all-reduce across nodes
        only) climbs ``log2(nodes)`` levels and comes back down, after a ring inside each node;
        both after the launch's own ``collective_base_us``, as NCCL's tuning model counts them.
        """
        n = group.size
        if n == 1:
            return 0.0
        cluster = self.cluster
        a_nvl = cluster.levels[0].latency_us
        a_net = cluster.levels[1].latency_us
        if collective == "sendrecv":
            return a_net if group.nodes > 1 else a_nvl
        base = cluster.collective_base_us
        twice = 2 if collective == "all_reduce" else 1
        steps = twice * (n - 1)
        inter_steps = twice * (group.nodes - 1)
        ring = base + (steps - inter_steps) * a_nvl + inter_steps * a_net
        if collective != "all_reduce" or group.nodes == 1:
            return ring
        level = cluster.tree_level_latency_us or a_net
        tree = base + 2 * (group.per_node - 1) * a_nvl + 2 * math.log2(group.nodes) * level
        return min(ring, tree)

    def time_us(self, collective: str, nbytes: float, group: Group) -> float:
        """Microseconds for ``collective`` over a buffer of ``nbytes`` on ``group``."""
        if group.size == 1 and collective != "sendrecv":
            return 0.0
        factor = _factor(collective, group.size)
        bandwidth = self.busbw_gbps(collective, group) * 1e3  # bytes per us
        return self.latency_us(collective, group) + factor * nbytes / bandwidth


def fitted_cluster(
    base: GpuClusterSpec,
    *,
    name: str,
    nodes: int,
    gpus_per_node: int,
    node_busbw_gbps: float | None,
    node_alpha_us: float | None,
    cluster_busbw_gbps: float,
    cluster_alpha_us: float,
) -> GpuClusterSpec:
    """``base`` (its GPU) with the fabric measured on a real cluster: all-reduce's bus
    bandwidth (GB/s) and latency inside one node (``node_*``; ``None`` on one node, where the
    cluster level is the node) and over every GPU (``cluster_*``), fitted as nccl-tests reports
    them. The rates are set so that :class:`NcclModel` gives back the measured bus bandwidths
    (NVLink's inside a node; across nodes one NIC a GPU, a rail-optimised fabric); the latencies
    so that a ring all-reduce's steps add up to the measured ones.

    Raises:
        InvalidClusterError: a rate or latency the cluster spec refuses (not positive).
    """
    inside_busbw = node_busbw_gbps if nodes > 1 else cluster_busbw_gbps
    inside_alpha = node_alpha_us if nodes > 1 else cluster_alpha_us
    nvlink_latency = base.nvlink_latency_us
    if inside_alpha is not None and gpus_per_node > 1:
        nvlink_latency = max(inside_alpha / (2 * (gpus_per_node - 1)), 0.01)
    net_latency = base.net_latency_us
    nic_gbits = base.nic_gbits
    nics = base.nics_per_node
    if nodes > 1:
        n = nodes * gpus_per_node
        inter_steps = 2 * (nodes - 1)
        intra_steps = 2 * (n - 1) - inter_steps
        # NCCL takes the faster of ring and tree (latency_us): solve each for the network's
        # step latency and keep the larger, so that the faster of the two is the measured.
        ring = (cluster_alpha_us - intra_steps * nvlink_latency) / inter_steps
        tree = (cluster_alpha_us - 2 * (gpus_per_node - 1) * nvlink_latency) / (
            2 * math.log2(nodes)
        )
        net_latency = max(ring, tree, 0.01)
        # One NIC a GPU; a ring over whole nodes drives every NIC of a node at once, so the
        # busbw across nodes is all of a node's NICs times NET_EFFICIENCY (busbw_gbps).
        nics = gpus_per_node
        nic_gbits = cluster_busbw_gbps / NET_EFFICIENCY * 8 / gpus_per_node
    return dataclasses.replace(
        base,
        name=name,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        nvlink_gbps=(inside_busbw or base.nvlink_gbps * NVLINK_EFFICIENCY) / NVLINK_EFFICIENCY,
        nvlink_latency_us=nvlink_latency,
        nics_per_node=nics,
        nic_gbits=nic_gbits,
        net_latency_us=net_latency,
        # The measured all-reduce is whatever algorithm NCCL picked there (NVLS included), its
        # latency all of it: no launch cost or tree level of the preset's on top.
        nvls_gbps=0.0,
        collective_base_us=0.0,
        tree_level_latency_us=0.0,
    )
