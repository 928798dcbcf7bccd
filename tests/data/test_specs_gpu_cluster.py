import pytest

from ddlsim.data.errors import InvalidClusterError, InvalidStrategyError
from ddlsim.data.specs.gpu_cluster import A100_80G, GpuClusterSpec, preset
from ddlsim.data.specs.scale_plan import ScalePlan


def test_preset_with_nodes() -> None:
    cluster = GpuClusterSpec.parse("dgx-h100:32")
    assert (cluster.nodes, cluster.gpus_per_node, cluster.world_size) == (32, 8, 256)
    assert cluster.gpu.peak("bf16") == pytest.approx(989.4)
    # 8 NICs of 400 Gb/s shared by 8 GPUs: 50 GB/s each.
    assert cluster.nic_gbps_per_gpu == pytest.approx(50.0)
    assert GpuClusterSpec.parse("dgx-a100-80g").world_size == 8


def test_json_round_trip_and_preset_override() -> None:
    cluster = preset("dgx-a100-80g", nodes=4)
    assert GpuClusterSpec.from_dict(cluster.to_dict()) == cluster
    changed = GpuClusterSpec.parse('{"preset": "dgx-h100", "nodes": 2, "nic_gbits": 200}')
    assert (changed.nodes, changed.nic_gbits, changed.gpu.name) == (2, 200, "H100-SXM5-80GB")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dgx-z100:4", "not a preset; allowed: dgx-a100-80g, dgx-h100"),
        ("dgx-h100:zero", "node count 'zero'"),
        ("dgx-h100:0", "node count '0'"),
        ('{"preset": "dgx-h100", "nodes": -1}', "nodes must be >= 1"),
        ('{"nodes": 1}', "misses gpu, gpus_per_node"),
        ('{"preset": "dgx-h100", "colour": 1}', "unknown key 'colour'"),
    ],
)
def test_bad_cluster_named(text: str, message: str) -> None:
    with pytest.raises(InvalidClusterError, match=message):
        GpuClusterSpec.parse(text)


def test_a100_has_no_fp8_and_fp16_falls_back() -> None:
    assert A100_80G.peak("fp16") == 312.0
    with pytest.raises(InvalidClusterError, match="no fp8 peak"):
        A100_80G.peak("fp8")


def test_scale_plan_round_trip_and_label() -> None:
    plan = ScalePlan.from_dict(
        {
            "parallel": {
                "dp": 2,
                "tp": 8,
                "pp": 4,
                "micro_batches": 8,
                "pp_schedule": "interleaved_1f1b",
                "virtual_stages": 2,
                "recompute": "selective",
                "sequence_parallel": True,
            },
            "precision": "fp8",
            "compile": True,
        }
    )
    assert plan.world_size == 64
    assert ScalePlan.from_dict(plan.to_dict()) == plan
    assert plan.label() == "dp2 tp8 pp4 mb8 v2 rc-selective sp compiled fp8"


@pytest.mark.parametrize(
    ("parallel", "message"),
    [
        ({"tp": 0}, r"parallel.tp must be >= 1"),
        (
            {"dp": 1, "pp": 4, "micro_batches": 6, "pp_schedule": "interleaved_1f1b"},
            "multiple of pp",
        ),
        ({"tp": 2}, "parallel.dp must be given"),
        ({"virtual_stages": 2}, "needs pp_schedule 'interleaved_1f1b'"),
        ({"sequence_parallel": True}, "needs tp > 1"),
        ({"recompute": "half"}, "recompute 'half' is not supported; allowed: none"),
        ({"fsdp": "yes"}, "fsdp must be true or false"),
        ({"zero": 3}, r"parallel.zero must be one of 0, 1, 2 \(FSDP is stage 3"),
        ({"zero": 1, "fsdp": True}, "both shard the optimizer"),
        ({"cp_comm": "a2a"}, "cp_comm 'a2a' is not supported"),
    ],
)
def test_bad_plan_named(parallel: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidStrategyError, match=message):
        ScalePlan.from_dict({"parallel": parallel})
