"""One reader for a cluster of either kind (:class:`ddlsim.data.specs.cluster.ClusterSpec`):
a GPU cluster on paper or an emulated cluster of this machine."""

from collections.abc import Mapping
from typing import Any

from ddlsim.data.errors import InvalidClusterError
from ddlsim.data.specs._serde import load_json_or_file
from ddlsim.data.specs.cluster import ClusterSpec, EmulatedClusterSpec
from ddlsim.data.specs.gpu_cluster import PRESETS, GpuClusterSpec


def cluster_from_dict(raw: Mapping[str, Any]) -> ClusterSpec:
    """A cluster from its JSON form: an emulated one names its ``world_size``; a GPU cluster
    its ``preset`` or its ``gpu`` and fabric.

    Raises:
        InvalidClusterError: neither form, or a bad field of the one it is.
    """
    if not isinstance(raw, Mapping):
        raise InvalidClusterError(f"a cluster spec must be a JSON object, got {raw!r}")
    if "world_size" in raw:
        return EmulatedClusterSpec.from_dict(raw)
    if "preset" in raw or "gpu" in raw:
        return GpuClusterSpec.from_dict(raw)
    raise InvalidClusterError(
        f"cluster spec with keys {sorted(raw)} is neither an emulated cluster (it names "
        f"'world_size') nor a GPU cluster (it names 'preset' or 'gpu'); presets: "
        f"{', '.join(PRESETS)}"
    )


def parse_cluster(text: str) -> ClusterSpec:
    """A cluster of either kind: ``PRESET[:NODES]`` (``dgx-h100:4``), inline JSON or a
    JSON/YAML file of either form.

    Raises:
        InvalidClusterError: naming the text and what is allowed.
    """
    stripped = text.strip()
    if stripped.startswith("{") or stripped.endswith((".json", ".yaml", ".yml")):
        return cluster_from_dict(load_json_or_file(text, "cluster", InvalidClusterError))
    return GpuClusterSpec.parse(text)
