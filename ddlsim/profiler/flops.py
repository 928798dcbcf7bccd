"""FLOP formulas that ``torch.utils.flop_counter`` lacks, added to its own registry.

On CPU, ``scaled_dot_product_attention`` runs ``_scaled_dot_product_flash_attention_for_cpu``,
for which torch registers no formula: attention would count zero FLOPs. The formulas here are
torch's own SDPA ones, registered for the CPU kernels, so ``FlopCounterMode`` and the graph
capture both count attention (and still agree with each other). The experts' grouped matmul outside
bf16 (:mod:`ddlsim.data.moe`) runs transformers' own per-expert op, counted as the matmuls it
does.
"""

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import flop_counter

_aten = torch.ops.aten


def _cpu_flash_forward(
    query_shape: torch.Size,
    key_shape: torch.Size,
    value_shape: torch.Size,
    *args: object,
    out_shape: object = None,
    **kwargs: object,
) -> int:
    return int(flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape))


def _cpu_flash_backward(
    grad_out_shape: torch.Size,
    query_shape: torch.Size,
    key_shape: torch.Size,
    value_shape: torch.Size,
    *args: object,
    out_shape: object = None,
    **kwargs: object,
) -> int:
    return int(
        flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)
    )


def _grouped_forward(
    input_shape: torch.Size,
    weight_shape: torch.Size,
    *args: object,
    out_shape: object = None,
    **kwargs: object,
) -> int:
    """Each token's row through its expert's ``[in, out]`` matrix: ``2 S in out``."""
    return 2 * int(input_shape[0]) * int(input_shape[1]) * int(weight_shape[2])


def _grouped_backward(
    input_shape: torch.Size,
    weight_shape: torch.Size,
    *args: object,
    out_shape: object = None,
    **kwargs: object,
) -> int:
    """The input's gradient and the weights': twice the forward."""
    return 2 * _grouped_forward(input_shape, weight_shape)


def _aten_grouped_mm(
    a_shape: torch.Size,
    b_shape: torch.Size,
    *args: object,
    out_shape: object = None,
    **kwargs: object,
) -> int:
    """torch's grouped GEMM (the experts' matmuls in bf16; torch registers no formula): a
    ``[S, in]`` input through ``[G, in, out]`` weights (``2 S in out``), the weights' gradient
    ``[in, S]`` by ``[S, out]`` into ``[G, in, out]`` (``2 in S out``), or ``G`` batched
    ``[m, k]`` by ``[k, n]`` (``2 G m k n``)."""
    a, b = [int(x) for x in a_shape], [int(x) for x in b_shape]
    if len(a) == 2 and len(b) == 3:
        return 2 * a[0] * a[1] * b[2]
    if len(a) == 2 and len(b) == 2:
        return 2 * a[0] * a[1] * b[1]
    if len(a) == 3 and len(b) == 3:
        return 2 * a[0] * a[1] * a[2] * b[2]
    return 2 * a[-2] * a[-1] * b[-1]  # [G, m, k] by [k, n] rows of a 2-D operand


# The experts' grouped matmul (ddlsim.data.moe) outside bf16: transformers' per-expert loop op.
_MISSING_CUSTOM = {
    ("transformers", "grouped_mm_fallback"): _grouped_forward,
    ("transformers", "grouped_mm_fallback_backward"): _grouped_backward,
}

_MISSING: dict[str, Callable[..., int]] = {
    "_scaled_dot_product_flash_attention_for_cpu": _cpu_flash_forward,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _cpu_flash_backward,
    "_grouped_mm": _aten_grouped_mm,
}


def register_missing_flop_formulas() -> None:
    """Register the formulas above unless torch (or an earlier call) already has them."""
    packets: list[tuple[Any, Callable[..., int]]] = [
        (getattr(_aten, name, None), formula) for name, formula in _MISSING.items()
    ]
    for (namespace, name), formula in _MISSING_CUSTOM.items():
        packets.append((getattr(getattr(torch.ops, namespace), name, None), formula))
    for packet, formula in packets:
        if packet is None or packet in flop_counter.flop_registry:
            continue
        flop_counter.register_flop_formula(packet)(formula)
