"""``GpuClusterSpec``: a real GPU cluster on paper (nodes of GPUs, NVLink inside, NICs across),
with presets for the machines published training runs use.

The emulated CPU clusters of :mod:`ddlsim.data.specs.cluster` are measured; these are priced
from their data sheets and the kernel and collective models of :mod:`ddlsim.simulator.gpu`.
Bandwidths are per GPU and per direction, in GB/s (bytes) for memory and NVLink, in Gbit/s for
NICs, as their data sheets give them.
"""

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ddlsim.data.errors import InvalidClusterError
from ddlsim.data.specs._serde import check_keys, expect_int, expect_number, load_json_or_file
from ddlsim.data.specs.cluster import ClusterSpec, Level

DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")
# Fields of a cluster spec a JSON spec may leave out (their defaults apply).
_OPTIONAL_FABRIC: tuple[str, ...] = (
    "nvlink_latency_us",
    "net_latency_us",
    "nvls_gbps",
    "collective_base_us",
    "tree_level_latency_us",
    "nodes_per_leaf",
    "oversubscription",
)


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class AcceleratorSpec:
    """One GPU: dense peak TFLOP/s per dtype (no sparsity), HBM bandwidth and capacity.

    ``measured`` names the folder of :mod:`ddlsim.data.measured` whose per-op times calibrate
    the efficiency curves (``h100``, ``h200``); ``None`` borrows the closest measured GPU's
    curves, scaled to this one's peaks.

    ``clock_mhz`` is the SM clock the part sustains under a training load where it is lower than
    ``peak_clock_mhz``, the clock its ``peak_tflops`` are stated at (a power-capped part): the
    tensor-core peaks scale by their ratio; memory bandwidth does not.
    """

    name: str
    peak_tflops: Mapping[str, float]
    hbm_gbps: float
    memory_gib: float
    measured: str | None = None
    clock_mhz: float | None = None
    peak_clock_mhz: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidClusterError(f"gpu.name must be a non-empty string, got {self.name!r}")
        check_keys(self.peak_tflops, set(DTYPES), "gpu.peak_tflops", InvalidClusterError)
        for dtype, value in self.peak_tflops.items():
            expect_number(value, f"gpu.peak_tflops.{dtype}", InvalidClusterError)
        if "bf16" not in self.peak_tflops:
            raise InvalidClusterError("gpu.peak_tflops needs at least 'bf16'")
        expect_number(self.hbm_gbps, "gpu.hbm_gbps", InvalidClusterError)
        expect_number(self.memory_gib, "gpu.memory_gib", InvalidClusterError)
        object.__setattr__(self, "peak_tflops", dict(self.peak_tflops))
        for name in ("clock_mhz", "peak_clock_mhz"):
            if getattr(self, name) is not None:
                expect_number(getattr(self, name), f"gpu.{name}", InvalidClusterError)
        if (self.clock_mhz is None) != (self.peak_clock_mhz is None):
            raise InvalidClusterError(
                "gpu.clock_mhz and gpu.peak_clock_mhz go together (the sustained clock and the "
                f"one the peaks are stated at); got {self.clock_mhz!r} and "
                f"{self.peak_clock_mhz!r}"
            )

    @property
    def clock_ratio(self) -> float:
        """The sustained clock over the one the peaks are stated at (1 when not given)."""
        if self.clock_mhz is None or self.peak_clock_mhz is None:
            return 1.0
        return self.clock_mhz / self.peak_clock_mhz

    def peak(self, dtype: str) -> float:
        """Peak TFLOP/s for ``dtype``; fp16 falls back to bf16's, and the reverse.

        Raises:
            InvalidClusterError: when the GPU has no figure for ``dtype`` (fp8 on an A100).
        """
        if dtype in self.peak_tflops:
            return self.peak_tflops[dtype] * self.clock_ratio
        if dtype in {"fp16", "bf16"}:
            return self.peak_tflops["bf16" if dtype == "fp16" else "fp16"] * self.clock_ratio
        raise InvalidClusterError(
            f"gpu {self.name!r} has no {dtype} peak; it has: {', '.join(self.peak_tflops)}"
        )


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class GpuClusterSpec(ClusterSpec):
    """``nodes`` machines of ``gpus_per_node`` GPUs, all-to-all NVLink (NVSwitch) inside a node,
    ``nics_per_node`` NICs of ``nic_gbits`` each across nodes (a rail-optimised fat tree: every
    NIC reaches every other node at its full rate), NCCL as the backend.

    ``nvlink_gbps`` is one GPU's NVLink bandwidth per direction (GB/s). The latencies are one
    step of a collective over the fabric (``nvlink_latency_us``, ``net_latency_us``), what
    launching one costs whatever its size (``collective_base_us``) and one level of NCCL's
    tree across nodes, each way (``tree_level_latency_us``).

    The fabric: ``nodes_per_leaf`` nodes share the leaf switches of their rails (a DGX
    SuperPOD's scalable unit: 32); a group spanning more nodes than that crosses the spine,
    whose bandwidth is the leaves' divided by ``oversubscription`` (1: a non-blocking fat
    tree, as the SuperPOD reference designs are).
    ``nvls_gbps`` is the bus bandwidth NCCL's NVLink SHARP all-reduce reaches inside a node
    whose NVSwitches reduce in the switch (0: none, rings and trees only).

    Raises:
        InvalidClusterError: for a non-positive count, rate or latency.
    """

    name: str
    nodes: int
    gpus_per_node: int
    gpu: AcceleratorSpec
    nvlink_gbps: float
    nics_per_node: int
    nic_gbits: float
    nvlink_latency_us: float = 1.0
    net_latency_us: float = 5.0
    nvls_gbps: float = 0.0
    collective_base_us: float = 0.0
    tree_level_latency_us: float = 0.0
    nodes_per_leaf: int = 32
    oversubscription: float = 1.0

    def __post_init__(self) -> None:
        expect_int(self.nodes, "nodes", InvalidClusterError)
        expect_int(self.gpus_per_node, "gpus_per_node", InvalidClusterError)
        expect_int(self.nics_per_node, "nics_per_node", InvalidClusterError)
        expect_number(self.nvlink_gbps, "nvlink_gbps", InvalidClusterError)
        expect_number(self.nic_gbits, "nic_gbits", InvalidClusterError)
        expect_number(self.nvlink_latency_us, "nvlink_latency_us", InvalidClusterError)
        expect_number(self.net_latency_us, "net_latency_us", InvalidClusterError)
        for name in ("nvls_gbps", "collective_base_us", "tree_level_latency_us"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InvalidClusterError(f"{name} must be a number >= 0, got {value!r}")
        expect_int(self.nodes_per_leaf, "nodes_per_leaf", InvalidClusterError)
        over = self.oversubscription
        if isinstance(over, bool) or not isinstance(over, (int, float)) or over < 1:
            raise InvalidClusterError(
                f"oversubscription must be a number >= 1 (1: non-blocking), got {over!r}"
            )

    kind: ClassVar[str] = "gpu"

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def node_size(self) -> int:
        return self.gpus_per_node

    @property
    def levels(self) -> tuple[Level, ...]:
        """NVLink inside a node, the NICs to the nodes of a leaf, the spine above the leaves
        (the leaves' rate over ``oversubscription``); rates per GPU in Gbit/s."""
        nic_gbits = self.nic_gbps_per_gpu * 8
        return (
            Level(
                name="node",
                fanout=self.gpus_per_node,
                bandwidth_gbps=self.nvlink_gbps * 8,
                latency_us=self.nvlink_latency_us,
            ),
            Level(
                name="leaf",
                fanout=self.nodes_per_leaf,
                bandwidth_gbps=nic_gbits,
                latency_us=self.net_latency_us,
            ),
            Level(
                name="spine",
                fanout=max(1, -(-self.nodes // self.nodes_per_leaf)),
                bandwidth_gbps=nic_gbits / self.oversubscription,
                latency_us=self.net_latency_us,
            ),
        )

    @property
    def nic_gbps_per_gpu(self) -> float:
        """Network bandwidth one GPU has across nodes when all of them send at once (GB/s)."""
        return self.nics_per_node * self.nic_gbits / 8 / self.gpus_per_node

    def with_nodes(self, nodes: int) -> "GpuClusterSpec":
        return dataclasses.replace(self, nodes=nodes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "gpu": {
                "name": self.gpu.name,
                "peak_tflops": dict(self.gpu.peak_tflops),
                "hbm_gbps": self.gpu.hbm_gbps,
                "memory_gib": self.gpu.memory_gib,
                "measured": self.gpu.measured,
                **(
                    {"clock_mhz": self.gpu.clock_mhz, "peak_clock_mhz": self.gpu.peak_clock_mhz}
                    if self.gpu.clock_mhz is not None
                    else {}
                ),
            },
            "nvlink_gbps": self.nvlink_gbps,
            "nics_per_node": self.nics_per_node,
            "nic_gbits": self.nic_gbits,
            "nvlink_latency_us": self.nvlink_latency_us,
            "net_latency_us": self.net_latency_us,
            **({"nvls_gbps": self.nvls_gbps} if self.nvls_gbps else {}),
            "collective_base_us": self.collective_base_us,
            "tree_level_latency_us": self.tree_level_latency_us,
            "nodes_per_leaf": self.nodes_per_leaf,
            "oversubscription": self.oversubscription,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "GpuClusterSpec":
        """A cluster from its JSON form; ``{"preset": "dgx-h100", "nodes": 4}`` starts from a
        preset and overrides the fields given.

        Raises:
            InvalidClusterError: naming the bad key or value.
        """
        fields = {field.name for field in dataclasses.fields(cls)}
        check_keys(raw, fields | {"preset"}, "gpu cluster spec", InvalidClusterError)
        values = dict(raw)
        if "preset" in values:
            base = preset(str(values.pop("preset")), nodes=1).to_dict()
            values = {**base, **values}
        missing = sorted(fields - set(_OPTIONAL_FABRIC) - set(values))
        if missing:
            raise InvalidClusterError(
                f"gpu cluster spec misses {', '.join(missing)} (or give 'preset')"
            )
        gpu_raw = values["gpu"]
        check_keys(
            gpu_raw,
            {
                "name",
                "peak_tflops",
                "hbm_gbps",
                "memory_gib",
                "measured",
                "clock_mhz",
                "peak_clock_mhz",
            },
            "gpu",
            InvalidClusterError,
        )
        values["gpu"] = AcceleratorSpec(**gpu_raw)
        return cls(**values)

    @classmethod
    def parse(cls, text: str) -> "GpuClusterSpec":
        """``PRESET:NODES`` (``dgx-h100:32``), a preset alone (one node), inline JSON or a
        JSON/YAML file.

        Raises:
            InvalidClusterError: for an unknown preset, a bad node count or a bad spec.
        """
        match = re.fullmatch(r"\s*([a-z0-9][a-z0-9._-]*)(?::(\S+))?\s*", text)
        if match and match.group(1) in PRESETS:
            nodes_text = match.group(2) or "1"
            if not nodes_text.isdigit() or int(nodes_text) < 1:
                raise InvalidClusterError(
                    f"node count {nodes_text!r} in {text!r} must be a positive integer"
                )
            return preset(match.group(1), nodes=int(nodes_text))
        stripped = text.strip()
        if match and not stripped.startswith("{") and not stripped.endswith((".json", ".yaml")):
            raise InvalidClusterError(
                f"cluster {text!r} is not a preset; allowed: {', '.join(PRESETS)} "
                "(as PRESET:NODES), inline JSON or a JSON/YAML file"
            )
        return cls.from_dict(load_json_or_file(text, "gpu cluster", InvalidClusterError))


# Data-sheet figures: dense tensor-core peaks (no sparsity), HBM bandwidth and NVLink per GPU
# per direction (NVIDIA A100 datasheet: 312 TFLOP/s bf16, 2,039 GB/s, NVLink3 600 GB/s both
# ways; H100 SXM5: 989 TFLOP/s bf16, 1,979 fp8, 3.35 TB/s, NVLink4 900 GB/s both ways; H200:
# the H100's compute with 4.8 TB/s and 141 GB). DGX A100: 8 ConnectX-6 HDR 200 Gb/s compute
# NICs; DGX H100: 8 ConnectX-7 NDR 400 Gb/s. The latencies are NCCL's own per-hop estimates
# for NVLink and the network (its tuning model), rounded.
A100_80G = AcceleratorSpec(
    name="A100-SXM4-80GB",
    peak_tflops={"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    hbm_gbps=2039.0,
    memory_gib=80.0,
)
H100_SXM = AcceleratorSpec(
    name="H100-SXM5-80GB",
    peak_tflops={"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
    hbm_gbps=3350.0,
    memory_gib=80.0,
    measured="h100",
)
H200_SXM = dataclasses.replace(
    H100_SXM, name="H200-SXM5-141GB", hbm_gbps=4800.0, memory_gib=141.0, measured="h200"
)
# The H100 torchtitan's published runs used (its docs/performance.md): 96 GB of HBM2e at
# 2.4 TB/s, held to 500 W on Meta's Grand Teton hosts. The peaks are the SXM5 part's, stated at
# 1,830 MHz (132 SMs x 4,096 dense 16-bit FLOP a clock); under a 500 W cap the part sustains a
# lower clock, the one number fitted to one published row (HBM2E_500W_CLOCK_MHZ; the fit and the
# rows held out are in BENCHMARKS.md, "The 500 W H100").
H100_PEAK_CLOCK_MHZ = 1830.0
HBM2E_500W_CLOCK_MHZ = 1328.0
H100_HBM2E_500W = dataclasses.replace(
    H100_SXM,
    name="H100-96GB-HBM2e-500W",
    hbm_gbps=2400.0,
    memory_gib=96.0,
    clock_mhz=HBM2E_500W_CLOCK_MHZ,
    peak_clock_mhz=H100_PEAK_CLOCK_MHZ,
)


# NVLink SHARP all-reduce of 8 H100s on NVSwitch, nccl-tests' bus bandwidth at 8 GiB
# (NVIDIA/dgxc-benchmarking nccl/README.md, the default algorithm NVLS: 480.16 GB/s).
NVLS_H100_GBPS = 480.0
# NCCL's own latency model (src/graph/tuning.cc, NVIDIA/nccl 5067397c, v2.30.7) for its
# bandwidth-bound protocol (Simple): 8.4 us to launch a ring or tree, 3.4 us a ring step over
# NVLink, 14 us one across the network.
NCCL_BASE_US = 8.4
NCCL_NVLINK_STEP_US = 3.4
NCCL_NET_STEP_US = 14.0
# One level of the tree across nodes, each way, as nccl-tests' all-reduce bus bandwidth falls
# with the node count on H100 clusters of 4 to 1,024 nodes (NVIDIA GTC24 S62129, NVLSTree from
# 32 to 8,192 GPUs; Meta, arXiv 2411.13055, 4 to 512 nodes): the latency the 16 MB to 1 GB
# points imply grows by about 80 us a doubling of the nodes (benchmarks/nccl_busbw.py
# --scaling fits it: 40 us a level, each way; median error of the 13 points 5 %).
TREE_LEVEL_US = 40.0
# The SuperPOD reference design's scalable unit (32 DGX nodes on one set of rail leaves) and its
# non-blocking fat tree above it.
SUPERPOD_NODES_PER_LEAF = 32


def _nccl_fabric() -> dict[str, Any]:
    """A DGX SuperPOD's fabric as NCCL sees it: its tuning model's latencies, the tree's level
    from the scaling figures, 32 nodes a leaf, non-blocking above."""
    return {
        "nvlink_latency_us": NCCL_NVLINK_STEP_US,
        "net_latency_us": NCCL_NET_STEP_US,
        "collective_base_us": NCCL_BASE_US,
        "tree_level_latency_us": TREE_LEVEL_US,
        "nodes_per_leaf": SUPERPOD_NODES_PER_LEAF,
        "oversubscription": 1.0,
    }


def dgx_a100_80g(*, nodes: int = 1) -> GpuClusterSpec:
    return GpuClusterSpec(
        name="dgx-a100-80g",
        nodes=nodes,
        gpus_per_node=8,
        gpu=A100_80G,
        nvlink_gbps=300.0,
        nics_per_node=8,
        nic_gbits=200.0,
        **_nccl_fabric(),
    )


def dgx_h100(*, nodes: int = 1) -> GpuClusterSpec:
    return GpuClusterSpec(
        name="dgx-h100",
        nodes=nodes,
        gpus_per_node=8,
        gpu=H100_SXM,
        nvlink_gbps=450.0,
        nics_per_node=8,
        nic_gbits=400.0,
        nvls_gbps=NVLS_H100_GBPS,
        **_nccl_fabric(),
    )


def grand_teton_h100(*, nodes: int = 1) -> GpuClusterSpec:
    """Meta's Grand Teton hosts as torchtitan's H100 runs used them: eight 500 W HBM2e H100s on
    NVSwitch (NVLink 4), 400 Gb/s RDMA a GPU."""
    return dataclasses.replace(dgx_h100(nodes=nodes), name="grand-teton-h100", gpu=H100_HBM2E_500W)


def dgx_h200(*, nodes: int = 1) -> GpuClusterSpec:
    return dataclasses.replace(dgx_h100(nodes=nodes), name="dgx-h200", gpu=H200_SXM)


PRESETS: dict[str, Callable[..., GpuClusterSpec]] = {
    "dgx-a100-80g": dgx_a100_80g,
    "dgx-h100": dgx_h100,
    "dgx-h200": dgx_h200,
    "grand-teton-h100": grand_teton_h100,
}


def preset(name: str, *, nodes: int = 1) -> GpuClusterSpec:
    """The preset ``name`` with ``nodes`` nodes.

    Raises:
        InvalidClusterError: for an unknown name.
    """
    if name not in PRESETS:
        raise InvalidClusterError(
            f"cluster preset {name!r} is unknown; allowed: {', '.join(PRESETS)}"
        )
    expect_int(nodes, "nodes", InvalidClusterError)
    return PRESETS[name](nodes=nodes)
