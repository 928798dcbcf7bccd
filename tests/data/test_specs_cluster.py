import json
from pathlib import Path

import pytest

from ddlsim.data.errors import InvalidClusterError
from ddlsim.data.specs.cluster import (
    ClusterSpec,
    DeviceSpec,
    EmulatedClusterSpec,
    LinkSpec,
    format_bandwidth,
    parse_bandwidth_gbps,
)
from ddlsim.data.specs.clusters import cluster_from_dict, parse_cluster
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec


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
    cluster = EmulatedClusterSpec(world_size=8, nodes=2)
    assert cluster.devices_per_node == 4
    assert cluster.backend == "gloo"
    assert cluster.device.type == "cpu"


def test_round_trip() -> None:
    cluster = EmulatedClusterSpec(
        world_size=16,
        nodes=2,
        device=DeviceSpec(type="cuda", name="H100"),
        backend="nccl",
        intra_node=LinkSpec(bandwidth_gbps=900.0, latency_us=2.0),
        inter_node=LinkSpec(bandwidth_gbps=400.0, latency_us=5.0),
    )
    assert EmulatedClusterSpec.from_dict(cluster.to_dict()) == cluster


def test_parse_inline_and_file(tmp_path: Path) -> None:
    text = '{"world_size": 8, "nodes": 2, "inter_node": {"bandwidth_gbps": "10gbit"}}'
    cluster = EmulatedClusterSpec.parse(text)
    assert cluster.devices_per_node == 4
    assert cluster.inter_node.bandwidth_gbps == pytest.approx(10.0)
    path = tmp_path / "cluster.yaml"
    path.write_text("world_size: 8\nnodes: 2\ninter_node: {bandwidth_gbps: 10gbit}\n")
    assert EmulatedClusterSpec.parse(str(path)) == cluster
    assert EmulatedClusterSpec.parse(cluster.to_json()) == cluster
    with pytest.raises(InvalidClusterError, match="neither inline JSON nor an existing file"):
        EmulatedClusterSpec.parse("nosuch.yaml")


def test_from_dict_reads_rates_as_text() -> None:
    cluster = EmulatedClusterSpec.from_dict(
        {"world_size": 4, "inter_node": {"bandwidth_gbps": "100mbit"}}
    )
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
        EmulatedClusterSpec(**kwargs)


def test_invalid_nested() -> None:
    with pytest.raises(InvalidClusterError, match=r"device\.type 'tpu'"):
        DeviceSpec(type="tpu")  # type: ignore[arg-type]
    with pytest.raises(InvalidClusterError, match="bandwidth_gbps must be > 0"):
        LinkSpec(bandwidth_gbps=0.0)
    with pytest.raises(InvalidClusterError, match=r"unknown key 'size'.*allowed: backend"):
        EmulatedClusterSpec.from_dict({"world_size": 2, "size": 3})


def test_both_kinds_are_clusters_of_levels() -> None:
    emulated = EmulatedClusterSpec.of_link(4, "100mbit")
    assert isinstance(emulated, ClusterSpec)
    assert emulated.link == "100mbit"
    assert [(lv.name, lv.fanout, lv.bandwidth_gbps) for lv in emulated.levels] == [
        ("node", 1, None),
        ("cluster", 4, pytest.approx(0.1)),
    ]
    assert emulated.level_for(1).name == "node"
    assert emulated.level_for(2).name == "cluster"
    pod = parse_cluster("dgx-h100:64")
    assert isinstance(pod, GpuClusterSpec)
    node, leaf, spine = pod.levels
    assert (node.fanout, node.bandwidth_gbps) == (8, pod.nvlink_gbps * 8)
    assert (leaf.fanout, leaf.bandwidth_gbps) == (32, pod.nic_gbps_per_gpu * 8)
    assert spine.fanout == 2
    assert pod.level_for(1).name == "node"
    assert pod.level_for(32).name == "leaf"
    assert pod.level_for(33).name == "spine"


def test_one_reader_for_either_kind(tmp_path: Path) -> None:
    assert parse_cluster('{"world_size": 2, "nodes": 2}') == EmulatedClusterSpec(
        world_size=2, nodes=2
    )
    path = tmp_path / "pod.json"
    path.write_text(json.dumps({"preset": "dgx-a100-80g", "nodes": 3}))
    pod = parse_cluster(str(path))
    assert isinstance(pod, GpuClusterSpec) and pod.world_size == 24
    with pytest.raises(InvalidClusterError, match="neither an emulated cluster"):
        cluster_from_dict({"nodes": 2})
    with pytest.raises(InvalidClusterError, match="not a preset"):
        parse_cluster("dgx-z900:2")


@pytest.mark.parametrize("text", ["1gbit", "100mbit", "2.5gbit", "10kbit", "none"])
def test_link_rates_print_as_they_read(text: str) -> None:
    assert format_bandwidth(parse_bandwidth_gbps(text)) == text
