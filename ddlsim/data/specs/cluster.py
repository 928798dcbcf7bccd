"""``ClusterSpec``: the machines a strategy runs on and the links between them."""

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

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
class ClusterSpec:
    """``nodes`` machines of ``devices_per_node`` devices each, one rank per device.

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

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def parse(cls, text: str) -> "ClusterSpec":
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
    def from_dict(cls, raw: Mapping[str, Any]) -> "ClusterSpec":
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
