"""Declarative, validated, JSON round-tripping specs shared by every layer."""

from data.specs.cluster import ClusterSpec, DeviceSpec, LinkSpec, parse_bandwidth_gbps
from data.specs.model import InputSpec, ModelSpec
from data.specs.strategy import (
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
    "InputSpec",
    "LinkSpec",
    "ModelSpec",
    "OpFusionPlan",
    "ParallelPlan",
    "Strategy",
    "TensorFusionPlan",
    "parse_bandwidth_gbps",
]
