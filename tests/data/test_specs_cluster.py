from pathlib import Path

import pytest

from ddlsim.data.errors import InvalidClusterError
from ddlsim.data.specs.cluster import ClusterSpec, DeviceSpec, LinkSpec, parse_bandwidth_gbps


@pytest.mark.parametrize(
    ("text", "gbps"),
    [
        ("1gbit", 1.0),
        ("100mbit", 0.1),
        ("10gbit", 10.0),
        ("2.5Gbit", 2.5),
        ("125mbps", 1.0),  # tc's bps is bytes per second
        ("none", None),
    ],
)
def test_parse_bandwidth(text: str, gbps: float | None) -> None:
    parsed = parse_bandwidth_gbps(text)
    if gbps is None:
        assert parsed is None
    else:
        assert parsed == pytest.approx(gbps)


@pytest.mark.parametrize("text", ["fast", "1", "1g", "1b", "-1gbit", "0gbit", "1 parsec"])
def test_parse_bandwidth_rejects(text: str) -> None:
    with pytest.raises(InvalidClusterError, match="bandwidth"):
        parse_bandwidth_gbps(text)


def test_defaults_fill_devices_per_node() -> None:
    cluster = ClusterSpec(world_size=8, nodes=2)
    assert cluster.devices_per_node == 4
    assert cluster.backend == "gloo"
    assert cluster.device.type == "cpu"


def test_round_trip() -> None:
    cluster = ClusterSpec(
        world_size=16,
        nodes=2,
        device=DeviceSpec(type="cuda", name="H100"),
        backend="nccl",
        intra_node=LinkSpec(bandwidth_gbps=900.0, latency_us=2.0),
        inter_node=LinkSpec(bandwidth_gbps=400.0, latency_us=5.0),
    )
    assert ClusterSpec.from_dict(cluster.to_dict()) == cluster


def test_parse_inline_and_file(tmp_path: Path) -> None:
    text = '{"world_size": 8, "nodes": 2, "inter_node": {"bandwidth_gbps": "10gbit"}}'
    cluster = ClusterSpec.parse(text)
    assert cluster.devices_per_node == 4
    assert cluster.inter_node.bandwidth_gbps == pytest.approx(10.0)
    path = tmp_path / "cluster.yaml"
    path.write_text("world_size: 8\nnodes: 2\ninter_node: {bandwidth_gbps: 10gbit}\n")
    assert ClusterSpec.parse(str(path)) == cluster
    assert ClusterSpec.parse(cluster.to_json()) == cluster
    with pytest.raises(InvalidClusterError, match="neither inline JSON nor an existing file"):
        ClusterSpec.parse("nosuch.yaml")


def test_from_dict_reads_rates_as_text() -> None:
    cluster = ClusterSpec.from_dict({"world_size": 4, "inter_node": {"bandwidth_gbps": "100mbit"}})
    assert cluster.inter_node.bandwidth_gbps == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 4, "nodes": 3}, r"world_size\(4\) is not divisible by nodes\(3\)"),
        (
            {"world_size": 4, "nodes": 2, "devices_per_node": 4},
            r"nodes\(2\) \* devices_per_node\(4\) != world_size\(4\)",
        ),
        ({"world_size": 0}, "world_size must be >= 1, got 0"),
        ({"world_size": 2, "backend": "mpi"}, "backend 'mpi' is not supported; allowed: gloo"),
        ({"world_size": 2, "backend": "nccl"}, "backend 'nccl' needs device.type 'cuda'"),
    ],
)
def test_invalid(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidClusterError, match=message):
        ClusterSpec(**kwargs)


def test_invalid_nested() -> None:
    with pytest.raises(InvalidClusterError, match=r"device\.type 'tpu'"):
        DeviceSpec(type="tpu")  # type: ignore[arg-type]
    with pytest.raises(InvalidClusterError, match="bandwidth_gbps must be > 0"):
        LinkSpec(bandwidth_gbps=0.0)
    with pytest.raises(InvalidClusterError, match=r"unknown key 'size'.*allowed: backend"):
        ClusterSpec.from_dict({"world_size": 2, "size": 3})
