"""Declarative, validated, JSON round-tripping specs shared by every layer."""

from ddlsim.data.specs.cluster import (
    ClusterSpec,
    DeviceSpec,
    EmulatedClusterSpec,
    Level,
    LinkSpec,
    parse_bandwidth_gbps,
)
from ddlsim.data.specs.model import InputSpec, ModelSpec
from ddlsim.data.specs.strategy import (
    Bucket,
    OpFusionPlan,
    ParallelPlan,
    Strategy,
    TensorFusionPlan,
)

__all__ = [
    "Bucket",
    "ClusterSpec",
    "DeviceSpec",
    "EmulatedClusterSpec",
    "InputSpec",
    "Level",
    "LinkSpec",
    "ModelSpec",
    "OpFusionPlan",
    "ParallelPlan",
    "Strategy",
    "TensorFusionPlan",
    "parse_bandwidth_gbps",
]
