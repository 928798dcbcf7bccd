"""GPU op costs: a roofline per op class whose efficiencies come from measured per-op times.

Every compute node of a captured graph falls in a class: matrix multiplies (``mm``, ``addmm``,
``bmm``, ``baddbmm``), fused attention (SDPA's flash kernels), memory-bound ops (norms,
softmax, activations, element-wise, copies, embedding, loss) and views (free). A node costs

    max(flops / (peak(dtype) * eff_flops), bytes / (hbm * eff_bytes))   (at least a kernel)

where ``eff_flops`` is the efficiency measured at the nearest shapes of the same class and
``eff_bytes`` the bandwidth measured for the class at the nearest size
(``ddlsim/data/measured/<gpu>/ops_cuda.json.gz``: what one GPU achieved, CUDA-event timed).
A GPU without its own measurements borrows the H100's efficiencies (fractions of peak) and
scales them to its own peaks: the shapes that fill an H100's 132 SMs fill an A100's 108 too.
"""

import bisect
import dataclasses
import functools
import gzip
import json
import math
from collections.abc import Sequence
from importlib import resources
from typing import Any

from ddlsim.data.graph.format import GraphNode
from ddlsim.data.specs.gpu_cluster import H100_SXM, H200_SXM, AcceleratorSpec

# Ops that move no data: views the schema does not mark as such, and allocations.
FREE_OPS = (
    "aten._unsafe_view.",
    "aten.empty.",
    "aten.empty_like.",
    "aten.empty_strided.",
    "aten.new_empty.",
    "aten.new_empty_strided.",
    "aten.lift_fresh.",
    "aten.detach.",
    "aten.alias.",
)
# The GPUs whose measured per-op times ship (ddlsim/data/measured/<name>/).
_REFERENCE_GPUS = {"h100": H100_SXM, "h200": H200_SXM}
GEMM_OPS = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.")
ATTENTION_OPS = ("scaled_dot_product", "flash_attention", "efficient_attention")
# The least time a kernel takes in a training step: launch to completion of an empty-ish
# kernel on a busy stream (the smallest timed calls, 13 us, also include two CUDA events).
KERNEL_FLOOR_MS = 0.005
# The rows of a grouped GEMM's tile (CUTLASS's and cuBLAS's grouped kernels on Hopper tile the
# token dimension by 128): an expert's rows are padded up to a multiple of it.
GROUPED_TILE_ROWS = 128
# ATen op name fragments and the measured memory-bound class whose bandwidth curve prices them.
_MEMORY_CLASSES: tuple[tuple[str, str], ...] = (
    ("layer_norm", "layer_norm"),
    ("rms_norm", "rms_norm"),
    ("_fused_rms_norm", "rms_norm"),
    ("softmax", "softmax"),
    ("nll_loss", "cross_entropy"),
    ("cross_entropy", "cross_entropy"),
    ("gelu", "gelu"),
    ("silu", "silu_mul"),
    ("tanh", "gelu"),
    ("copy", "copy"),
    ("clone", "copy"),
    ("_to_copy", "copy"),
    ("cat", "copy"),
    ("embedding", "copy"),
)


@functools.cache
def _records(name: str) -> tuple[dict[str, Any], ...]:
    """The per-op records measured on ``name`` (``h100``, ``h200``), fp8 GEMMs included."""
    folder = resources.files("ddlsim.data") / "measured" / name
    rows: list[dict[str, Any]] = []
    for file in ("ops_cuda.json.gz", "ops_fp8_cuda.json.gz"):
        path = folder / file
        if path.is_file():
            with path.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as text:
                rows.extend(json.load(text)["records"])
    return tuple(rows)


@dataclasses.dataclass(frozen=True, slots=True)
class _Curve:
    """Efficiency as a piecewise-linear function of log(size), flat beyond the ends."""

    log_sizes: tuple[float, ...]
    values: tuple[float, ...]

    def __call__(self, size: float) -> float:
        x = math.log(max(size, 1.0))
        i = bisect.bisect_left(self.log_sizes, x)
        if i == 0:
            return self.values[0]
        if i == len(self.log_sizes):
            return self.values[-1]
        x0, x1 = self.log_sizes[i - 1], self.log_sizes[i]
        w = (x - x0) / (x1 - x0) if x1 > x0 else 0.0
        return self.values[i - 1] * (1 - w) + self.values[i] * w


def _curve(points: Sequence[tuple[float, float]]) -> _Curve:
    """A curve through ``(size, efficiency)`` points; equal sizes averaged, efficiency made
    non-decreasing with size (a bigger kernel never runs at a lower fraction of peak: the
    dips between measured sizes are noise and wave quantisation the model does not know)."""
    by_size: dict[float, list[float]] = {}
    for size, eff in points:
        by_size.setdefault(round(math.log(size), 6), []).append(eff)
    sizes = sorted(by_size)
    values: list[float] = []
    for size in sizes:
        mean = sum(by_size[size]) / len(by_size[size])
        values.append(max(mean, values[-1]) if values else mean)
    return _Curve(tuple(sizes), tuple(values))


@dataclasses.dataclass(frozen=True, slots=True)
class _GemmPoint:
    log_mkn: tuple[float, float, float]
    efficiency: float


class GpuOpCosts:
    """Prices the compute nodes of a graph on ``gpu`` (thread-safe, immutable after init).

    ``matmul_dtype`` is the dtype the GEMMs run in (``fp8``: the block's linear layers as
    float8 training casts them; attention and the rest stay in the activations' dtype).
    ``cast_bytes``: what casting one element of a GEMM's operand to fp8 moves: 5 bytes with
    PyTorch's float8 training (a pass for its absolute maximum, 2 bytes read, and one casting
    it, 2 read and 1 written); 0 where the quantization is fused into the kernels that produce
    the operands (Transformer Engine's).
    """

    def __init__(
        self, gpu: AcceleratorSpec, *, matmul_dtype: str = "bf16", cast_bytes: float = 5.0
    ) -> None:
        self.gpu = gpu
        self.matmul_dtype = matmul_dtype
        self.cast_bytes = cast_bytes
        self.reference = gpu.measured or "h100"
        records = _records(self.reference)
        reference_peak = _reference_peaks(self.reference)
        self._gemm: dict[str, list[_GemmPoint]] = {}
        for row in records:
            if row["op"] not in {"gemm", "gemm_fp8"}:
                continue
            dtype = "fp8" if row["op"] == "gemm_fp8" else row["dtype"]
            peak = reference_peak[dtype if dtype != "fp16" else "bf16"] * 1e9  # per ms
            point = _GemmPoint(
                (math.log(row["m"]), math.log(row["k"]), math.log(row["n"])),
                row["flops"] / row["median_ms"] / peak,
            )
            self._gemm.setdefault("bf16" if dtype == "fp16" else dtype, []).append(point)
        hbm_per_ms = _reference_hbm(self.reference) * 1e6
        memory: dict[str, list[tuple[float, float]]] = {}
        for row in records:
            if row.get("pass") == "forward" and row["op"] not in {"sdpa", "gemm"}:
                memory.setdefault(row["op"], []).append(
                    (row["bytes"], row["bytes"] / row["median_ms"] / hbm_per_ms)
                )
        self._memory = {op: _curve(points) for op, points in memory.items()}
        self._adamw = _curve(
            [
                (row["bytes"], row["bytes"] / row["median_ms"] / hbm_per_ms)
                for row in records
                if row["op"] == "adamw" and row.get("impl") == "fused"
            ]
        )
        self._attention = _attention_efficiency(records, reference_peak["bf16"] * 1e9)

    # -- classes --------------------------------------------------------------------------

    def node_ms(self, node: GraphNode, *, in_block: bool = True) -> float:
        """The time one compute node takes on this GPU, in ms (0 for views and non-compute
        nodes). ``in_block`` says whether the node belongs to a repeated block (fp8 applies
        to the blocks' matmuls only, as float8 training converts them)."""
        if node.kind != "compute" or node.is_view or node.op.startswith(FREE_OPS):
            return 0.0
        nbytes = node.bytes_read + node.bytes_written
        if nbytes == 0 and node.flops == 0:
            return 0.0
        op = node.op
        if op.startswith(GEMM_OPS) and node.flops:
            dtype = (
                self.matmul_dtype
                if in_block and op.startswith(("aten.mm.", "aten.addmm."))
                else _dtype(node)
            )
            cast_ms = self.fp8_cast_ms(node) if dtype == "fp8" else 0.0
            return max(self.gemm_ms(node, dtype), self.memory_ms("copy", nbytes)) + cast_ms
        if any(part in op for part in ATTENTION_OPS) and node.flops:
            return self.attention_ms(node)
        return self.memory_ms(_memory_class(op), nbytes)

    def gemm_ms(self, node: GraphNode, dtype: str) -> float:
        """A matrix multiply at the efficiency measured for the nearest (m, k, n): ``m`` folds
        a batched multiply's batch in (its blocks fill the GPU as one taller matrix would)."""
        m, k, n = _mkn(node)
        table = self._gemm.get(dtype) or self._gemm["bf16"]
        eff = _nearest(table, (math.log(m), math.log(k), math.log(n)))
        peak = self.gpu.peak(dtype) * 1e9
        return max(KERNEL_FLOOR_MS, node.flops / (peak * eff))

    def grouped_gemm_ms(
        self, flops: float, *, rows: float, k: int, n: int, concurrent: int, dtype: str
    ) -> float:
        """A grouped GEMM (a layer's local experts): matmuls of ``rows`` rows each (token copies
        an expert got), ``k`` by ``n``, ``flops`` in all, ``concurrent`` of them at a time (all
        of them in one grouped kernel; Transformer Engine's runs each expert's cuBLAS GEMM on
        one of its 4 streams). Those in flight fill the GPU as one matmul of their rows together
        would, at the efficiency measured for that shape, less what each expert's last row tile
        (128 rows) leaves idle: few tokens an expert waste most of a tile, many fill them."""
        if flops <= 0 or rows <= 0:
            return 0.0
        table = self._gemm.get(dtype) or self._gemm["bf16"]
        total = max(1.0, concurrent * rows)
        eff = _nearest(table, (math.log(total), math.log(max(k, 1)), math.log(max(n, 1))))
        tile = rows / (math.ceil(rows / GROUPED_TILE_ROWS) * GROUPED_TILE_ROWS)
        return max(KERNEL_FLOOR_MS, flops / (self.gpu.peak(dtype) * 1e9 * eff * tile))

    def fp8_cast_ms(self, node: GraphNode) -> float:
        """Float8 training's casts of a matmul's two operands with dynamic scaling,
        memory-bound, :attr:`cast_bytes` an element; the fp8 matmul itself is
        :meth:`gemm_ms`."""
        if not self.cast_bytes:
            return 0.0
        m, k, n = _mkn(node)
        return self.memory_ms("copy", self.cast_bytes * (m * k + k * n))

    def attention_ms(self, node: GraphNode) -> float:
        """Fused attention at the efficiency measured for the nearest sequence length and
        head size, forward or backward (causal, as the decoders here use it)."""
        q = node.inputs[0].shape if node.inputs else (1, 1, 1, 64)
        seq, head_dim = q[-2], q[-1]
        backward = "backward" in node.op
        eff = self._attention(backward, seq, head_dim)
        return max(KERNEL_FLOOR_MS, node.flops / (self.gpu.peak("bf16") * 1e9 * eff))

    def memory_ms(self, op_class: str, nbytes: float) -> float:
        """A memory-bound kernel moving ``nbytes`` at the bandwidth measured for its class."""
        curve = self._memory.get(op_class) or self._memory["add"]
        return max(KERNEL_FLOOR_MS, nbytes / (self.gpu.hbm_gbps * 1e6 * curve(nbytes)))

    def optimizer_ms(self, params: int, *, bytes_per_param: int = 28) -> float:
        """One fused AdamW step over ``params`` fp32 master parameters (28 bytes each: parameter,
        gradient, two moments read, parameter and moments written), as measured."""
        if params <= 0:
            return 0.0
        nbytes = params * bytes_per_param
        return nbytes / (self.gpu.hbm_gbps * 1e6 * self._adamw(nbytes))


def _mkn(node: GraphNode) -> tuple[int, int, int]:
    """A matmul's (m, k, n) from its output and FLOPs; a batched one folds its batch into m."""
    out = node.outputs[0].shape
    n = max(1, out[-1])
    m = max(1, math.prod(out[:-1]))
    return m, max(1, round(node.flops / (2 * m * n))), n


def _dtype(node: GraphNode) -> str:
    dtype = node.outputs[0].dtype if node.outputs else "bfloat16"
    return {"bfloat16": "bf16", "float16": "bf16", "float32": "fp32"}.get(dtype, "bf16")


def _memory_class(op: str) -> str:
    for fragment, op_class in _MEMORY_CLASSES:
        if fragment in op:
            return op_class
    return "add"


def _nearest(table: Sequence[_GemmPoint], key: tuple[float, float, float], k: int = 4) -> float:
    """Inverse-distance mean of the efficiencies of the ``k`` nearest points (log space)."""
    scored = sorted(
        (sum((a - b) ** 2 for a, b in zip(point.log_mkn, key, strict=True)), point.efficiency)
        for point in table
    )[:k]
    weights = [1.0 / (math.sqrt(d) + 0.05) for d, _ in scored]
    return sum(w * e for w, (_, e) in zip(weights, scored, strict=True)) / sum(weights)


def _attention_efficiency(
    records: Sequence[dict[str, Any]], peak_per_ms: float
) -> "functools.partial[float]":
    """Efficiency of causal flash attention, forward and backward apart, per head size, as a
    curve over sequence length; FLOPs counted as the formula registry counts them (the full
    square, 4·b·h·s²·d forward, 2.5 times that backward)."""
    forward: dict[tuple[int, int, int], float] = {}
    both: dict[tuple[int, int, int], float] = {}
    for row in records:
        if row["op"] != "sdpa" or not row.get("causal"):
            continue
        key = (row["batch"] * row["heads"], row["seq"], row["head_dim"])
        (forward if row["pass"] == "forward" else both)[key] = row["median_ms"]
    curves: dict[tuple[bool, int], list[tuple[float, float]]] = {}
    for key, fwd_ms in forward.items():
        bh, seq, head_dim = key
        full = 4 * bh * seq * seq * head_dim
        curves.setdefault((False, head_dim), []).append((seq, full / fwd_ms / peak_per_ms))
        if key in both and both[key] > fwd_ms:
            bwd = 2.5 * full / (both[key] - fwd_ms) / peak_per_ms
            curves.setdefault((True, head_dim), []).append((seq, bwd))
    fitted = {key: _curve(points) for key, points in curves.items()}
    return functools.partial(_attention_lookup, fitted)


def _attention_lookup(
    fitted: dict[tuple[bool, int], _Curve], backward: bool, seq: int, head_dim: int
) -> float:
    dims = sorted({d for (b, d) in fitted if b == backward})
    nearest = min(dims, key=lambda d: abs(math.log(d) - math.log(max(head_dim, 1))))
    return fitted[(backward, nearest)](seq)


def _reference_peaks(name: str) -> dict[str, float]:
    return dict(_REFERENCE_GPUS[name].peak_tflops)


def _reference_hbm(name: str) -> float:
    return _REFERENCE_GPUS[name].hbm_gbps
