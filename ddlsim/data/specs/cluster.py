"""``ClusterSpec``: the machines a strategy runs on and the links between them, as levels.

Every cluster is a tree of levels (:class:`Level`): the devices of a node, the nodes under a
switch, the switches under the one above. Two kinds share the type:

- :class:`EmulatedClusterSpec`: ranks on this machine's emulated cluster (network namespaces
  behind rate-limited links), measured;
- :class:`ddlsim.data.specs.gpu_cluster.GpuClusterSpec`: GPU nodes on paper (NVLink inside,
  NICs on a leaf-spine fabric), priced from data sheets.

:func:`ddlsim.data.specs.clusters.parse_cluster` reads either from one text.
"""

import abc
import dataclasses
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ddlsim.data.errors import InvalidClusterError
from ddlsim.data.specs._serde import (
    check_keys,
    expect_choice,
    expect_int,
    expect_number,
    load_json_or_file,
)

DeviceType = Literal["cpu", "cuda"]
Backend = Literal["gloo", "nccl"]
DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda")
BACKENDS: tuple[str, ...] = ("gloo", "nccl")

# tc's units: "bit" is bits per second, "bps" is bytes per second.
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|bps)\s*$", re.IGNORECASE)
_RATE_SCALE_GBPS = {"": 1e-9, "k": 1e-6, "m": 1e-3, "g": 1.0, "t": 1e3}
_UNIT_BITS = {"bit": 1, "bps": 8}


# Burst: 1 ms of line rate, at least 32 KiB. Measured with a 200 MB TCP stream between two
# hosts: 1gbit → 0.957 Gb/s (a 32 KiB burst gives 0.86), 100mbit → 0.096, 10gbit → 9.6; the
# ceiling is TCP payload over Ethernet frames (1448 / 1514 bytes). A larger burst only lets the
# first ~burst bytes of each message through unshaped.
_BURST_S = 1e-3
_MIN_BURST_BYTES = 32 * 1024


def burst_bytes(bandwidth_gbps: float | None) -> int:
    """The bytes an emulated link shaped to ``bandwidth_gbps`` lets through at line rate after
    it has been idle (its token bucket); 0 for an unshaped link (``None``)."""
    if bandwidth_gbps is None:
        return 0
    return max(int(bandwidth_gbps * 1e9 / 8 * _BURST_S), _MIN_BURST_BYTES)


def parse_bandwidth_gbps(text: str) -> float | None:
    """Parse a link rate as ``tc`` writes it (``1gbit``, ``100mbit``, ``10gbit``) into Gbit/s.

    ``none`` (or ``unlimited``) means an unshaped link and returns ``None``.

    Raises:
        InvalidClusterError: when the text is not a rate.
    """
    if text.strip().lower() in {"none", "unlimited", "unshaped"}:
        return None
    match = _RATE.match(text)
    if match is None:
        raise InvalidClusterError(
            f"bandwidth {text!r} is not a rate; allowed: a number with kbit/mbit/gbit/tbit "
            "(bits per second, e.g. 1gbit, 100mbit, 10gbit), kbps/mbps/gbps (bytes per "
            "second, as tc reads them) or none"
        )
    value = float(match.group(1))
    if value <= 0:
        raise InvalidClusterError(f"bandwidth {text!r} must be > 0")
    scale = _RATE_SCALE_GBPS[match.group(2).lower()]
    return value * scale * _UNIT_BITS[match.group(3).lower()]


def format_bandwidth(gbps: float | None) -> str:
    """A rate in Gbit/s as ``tc`` (and ``--bandwidth``) write it: ``1gbit``, ``100mbit``,
    ``2.5gbit``; ``none`` for an unshaped link. :func:`parse_bandwidth_gbps` reads it back."""
    if gbps is None:
        return "none"
    if gbps >= 1:
        return f"{gbps:g}gbit"
    if gbps >= 1e-3:
        return f"{gbps * 1e3:g}mbit"
    return f"{gbps * 1e6:g}kbit"


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class DeviceSpec:
    """The accelerator (or CPU) each rank runs on; ``name`` is free text (``"H100"``)."""

    type: DeviceType = "cpu"
    name: str = "cpu"

    def __post_init__(self) -> None:
        expect_choice(self.type, DEVICE_TYPES, "device.type", InvalidClusterError)
        if not isinstance(self.name, str) or not self.name:
            raise InvalidClusterError(f"device.name must be a non-empty string, got {self.name!r}")


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class LinkSpec:
    """One class of link: ``bandwidth_gbps`` (``None`` = unshaped) and a fixed latency."""

    bandwidth_gbps: float | None = None
    latency_us: float = 0.0

    def __post_init__(self) -> None:
        if self.bandwidth_gbps is not None:
            expect_number(self.bandwidth_gbps, "bandwidth_gbps", InvalidClusterError)
        expect_number(self.latency_us, "latency_us", InvalidClusterError, positive=False)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str) -> "LinkSpec":
        check_keys(raw, {"bandwidth_gbps", "latency_us"}, where, InvalidClusterError)
        bandwidth = raw.get("bandwidth_gbps")
        if isinstance(bandwidth, str):
            bandwidth = parse_bandwidth_gbps(bandwidth)
        return cls(bandwidth_gbps=bandwidth, latency_us=raw.get("latency_us", 0.0))


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class Level:
    """One level of a cluster: ``fanout`` members of the level below (devices, nodes, leaves)
    joined by one kind of link. A device sends across it at ``bandwidth_gbps`` (Gbit/s, each
    direction; ``None``: unshaped), and one step of a collective across it takes
    ``latency_us``."""

    name: str
    fanout: int
    bandwidth_gbps: float | None
    latency_us: float


class ClusterSpec(abc.ABC):
    """A cluster: ``world_size`` ranks, one a device, ``devices_per_node`` on each of ``nodes``
    nodes, joined by :attr:`levels` (innermost first). The type every interface that takes a
    cluster takes; :attr:`kind` says which of the two it is (``emulated``: measured on this
    machine; ``gpu``: priced on paper)."""

    __slots__ = ()
    kind: ClassVar[str]

    if TYPE_CHECKING:  # fields of the kinds (a property here would be their default)

        @property
        def name(self) -> str:
            """What the cluster is called (a preset's, a stored profile's, ``emulated``)."""

        @property
        def world_size(self) -> int:
            """Ranks: one a device."""

        @property
        def nodes(self) -> int:
            """Machines."""

    @property
    @abc.abstractmethod
    def node_size(self) -> int:
        """Devices (ranks) a node."""

    @property
    @abc.abstractmethod
    def levels(self) -> tuple[Level, ...]:
        """The fabric, innermost level first: the node's, then each above it."""

    @abc.abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The JSON form its kind's ``from_dict`` reads back."""

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def level_for(self, nodes: int) -> Level:
        """The innermost level a group spanning ``nodes`` nodes stays inside (the node's for
        one node): the slowest link its traffic crosses."""
        span = 1
        for level in self.levels:
            span *= level.fanout
            if nodes * self.node_size <= span:
                return level
        return self.levels[-1]


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class EmulatedClusterSpec(ClusterSpec):
    """``nodes`` machines of ``devices_per_node`` devices each, one rank per device.

    On this machine's emulated cluster a node is a network namespace (one rank each) behind a
    link of ``inter_node``'s rate: :meth:`of_link` is the cluster ``--world-size`` and
    ``--bandwidth`` name.

    Raises:
        InvalidClusterError: when ``nodes * devices_per_node != world_size``, the backend does not
            fit the device (NCCL needs CUDA) or a link rate is not positive.
    """

    world_size: int
    nodes: int = 1
    devices_per_node: int | None = None
    device: DeviceSpec = dataclasses.field(default_factory=DeviceSpec)
    backend: Backend = "gloo"
    intra_node: LinkSpec = dataclasses.field(default_factory=LinkSpec)
    inter_node: LinkSpec = dataclasses.field(default_factory=LinkSpec)

    def __post_init__(self) -> None:
        expect_int(self.world_size, "world_size", InvalidClusterError)
        expect_int(self.nodes, "nodes", InvalidClusterError)
        if self.devices_per_node is None:
            if self.world_size % self.nodes:
                raise InvalidClusterError(
                    f"world_size({self.world_size}) is not divisible by nodes({self.nodes})"
                )
            object.__setattr__(self, "devices_per_node", self.world_size // self.nodes)
        per_node = expect_int(self.devices_per_node, "devices_per_node", InvalidClusterError)
        if self.nodes * per_node != self.world_size:
            raise InvalidClusterError(
                f"nodes({self.nodes}) * devices_per_node({per_node}) "
                f"!= world_size({self.world_size})"
            )
        expect_choice(self.backend, BACKENDS, "backend", InvalidClusterError)
        if self.backend == "nccl" and self.device.type != "cuda":
            raise InvalidClusterError(
                f"backend 'nccl' needs device.type 'cuda', got {self.device.type!r}; "
                "use backend 'gloo' on CPU"
            )

    kind: ClassVar[str] = "emulated"

    @property
    def name(self) -> str:
        return "emulated"

    @property
    def node_size(self) -> int:
        return int(self.devices_per_node or 1)

    @property
    def levels(self) -> tuple[Level, ...]:
        return (
            Level(
                name="node",
                fanout=self.node_size,
                bandwidth_gbps=self.intra_node.bandwidth_gbps,
                latency_us=self.intra_node.latency_us,
            ),
            Level(
                name="cluster",
                fanout=self.nodes,
                bandwidth_gbps=self.inter_node.bandwidth_gbps,
                latency_us=self.inter_node.latency_us,
            ),
        )

    @property
    def link(self) -> str:
        """The link rate between nodes as ``--bandwidth`` writes it (``1gbit``, ``none``)."""
        return format_bandwidth(self.inter_node.bandwidth_gbps)

    @classmethod
    def of_link(cls, world_size: int, bandwidth: str | None) -> "EmulatedClusterSpec":
        """The emulated cluster of ``world_size`` ranks, each its own node behind a link of
        ``bandwidth`` (``None`` or ``none``: unshaped).

        Raises:
            InvalidClusterError: a bad rank count or rate.
        """
        rate = parse_bandwidth_gbps(bandwidth) if bandwidth is not None else None
        return cls(
            world_size=world_size, nodes=world_size, inter_node=LinkSpec(bandwidth_gbps=rate)
        )

    @classmethod
    def parse(cls, text: str) -> "EmulatedClusterSpec":
        """A cluster from inline JSON or a JSON/YAML file path."""
        return cls.from_dict(load_json_or_file(text, "cluster", InvalidClusterError))

    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "nodes": self.nodes,
            "devices_per_node": self.devices_per_node,
            "device": {"type": self.device.type, "name": self.device.name},
            "backend": self.backend,
            "intra_node": dataclasses.asdict(self.intra_node),
            "inter_node": dataclasses.asdict(self.inter_node),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "EmulatedClusterSpec":
        allowed = {
            "world_size",
            "nodes",
            "devices_per_node",
            "device",
            "backend",
            "intra_node",
            "inter_node",
        }
        check_keys(raw, allowed, "cluster spec", InvalidClusterError)
        if "world_size" not in raw:
            raise InvalidClusterError("cluster spec needs 'world_size'")
        device_raw = raw.get("device", {})
        check_keys(device_raw, {"type", "name"}, "device", InvalidClusterError)
        return cls(
            world_size=raw["world_size"],
            nodes=raw.get("nodes", 1),
            devices_per_node=raw.get("devices_per_node"),
            device=DeviceSpec(
                type=device_raw.get("type", "cpu"), name=device_raw.get("name", "cpu")
            ),
            backend=raw.get("backend", "gloo"),
            intra_node=LinkSpec.from_dict(raw.get("intra_node", {}), "intra_node"),
            inter_node=LinkSpec.from_dict(raw.get("inter_node", {}), "inter_node"),
        )
