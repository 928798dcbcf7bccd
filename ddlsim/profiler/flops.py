"""FLOP formulas that ``torch.utils.flop_counter`` lacks, added to its own registry.

On CPU, ``scaled_dot_product_attention`` runs ``_scaled_dot_product_flash_attention_for_cpu``,
for which torch registers no formula: attention would count zero FLOPs. The formulas here are
torch's own SDPA ones, registered for the CPU kernels, so ``FlopCounterMode`` and the graph
capture both count attention (and still agree with each other).
"""

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


_MISSING = {
    "_scaled_dot_product_flash_attention_for_cpu": _cpu_flash_forward,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _cpu_flash_backward,
}


def register_missing_flop_formulas() -> None:
    """Register the formulas above unless torch (or an earlier call) already has them."""
    for name, formula in _MISSING.items():
        packet = getattr(_aten, name, None)
        if packet is None or packet in flop_counter.flop_registry:
            continue
        flop_counter.register_flop_formula(packet)(formula)  # type: ignore[arg-type]
