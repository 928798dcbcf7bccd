"""Fused projections whose row layout is known, for plans derived from module structure
(:mod:`ddlsim.plans.tp_generic`).

A fused projection computes several things at once (``[q | k | v]``, ``[gate | up]``); split by
output columns as it stands, a rank would get whole queries but no keys, or keys of other heads.
Whether it can be split depends on what its module's forward does with the output, which its
structure does not tell: the layouts below were read in transformers. Falcon's
``query_key_value`` holds its rows per head (``[q k v]`` for each) or per key/value group, which
a plain column split keeps whole; Phi-3's ``qkv_proj`` and ``gate_up_proj`` hold ``[q | k | v]``
and ``[gate | up]`` parts, whose rows the executor reorders rank by rank before the split. Any
other fused projection is refused by name.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

from torch import nn

from ddlsim.data.errors import InvalidStrategyError


@dataclasses.dataclass(frozen=True, slots=True)
class Heads:
    """An attention's head counts (``heads`` queries, ``kv_heads`` keys and values, each
    ``head_dim`` wide) and the config keys that hold them (``None``: read from shapes)."""

    heads: int
    kv_heads: int
    head_dim: int
    heads_key: str
    kv_key: str | None


# A fused projection's row layout: ``None`` when a plain column split keeps each rank's heads
# whole, else the widths of the ``[part | part | ...]`` blocks its rows hold. Raises
# InvalidStrategyError (the reason) when the module's configuration has no splittable layout.
FusedLayout = Callable[[Any, Heads, nn.Linear], tuple[int, ...] | None]


def _falcon_qkv(config: Any, heads: Heads, linear: nn.Linear) -> tuple[int, ...] | None:
    q, kv = heads.heads * heads.head_dim, heads.kv_heads * heads.head_dim
    if getattr(config, "new_decoder_architecture", False):
        # [q.. k v] per key/value group: a column split keeps whole groups
        _check_rows(linear, q + 2 * kv, f"[q({q}) | k({kv}) | v({kv})] in key/value groups")
        return None
    if not getattr(config, "multi_query", True):
        _check_rows(linear, 3 * q, f"[q k v] per head of {heads.heads}")
        return None
    raise InvalidStrategyError(
        "it is multi-query ([q of every head | one k | one v]): its single key/value head "
        "cannot be split"
    )


def _check_rows(linear: nn.Linear, rows: int, layout: str) -> None:
    if linear.out_features != rows:
        raise InvalidStrategyError(f"its {linear.out_features} outputs are not {layout}")


def _qkv_parts(config: Any, heads: Heads, linear: nn.Linear) -> tuple[int, ...] | None:
    q, kv = heads.heads * heads.head_dim, heads.kv_heads * heads.head_dim
    if linear.out_features != q + 2 * kv:
        raise InvalidStrategyError(
            f"its {linear.out_features} outputs are not [q({q}) | k({kv}) | v({kv})]"
        )
    return q, kv, kv


# The fused projections whose row layout is known, by the class of the module that holds them
# and their name: what each module's forward does with the fused output (read in transformers).
FUSED_LAYOUTS: dict[tuple[str, str], FusedLayout] = {
    ("FalconAttention", "query_key_value"): _falcon_qkv,
    ("Phi3Attention", "qkv_proj"): _qkv_parts,  # sliced at config.num_attention_heads * d
}
# Fused MLP inputs of equal parts (``[gate | up]``) and how many parts, by holder class and name.
FUSED_MLP_PARTS: dict[tuple[str, str], int] = {
    ("Phi3MLP", "gate_up_proj"): 2,  # chunk(2, dim=-1)
}


def fused_qkv_parts(
    holder: nn.Module, path: str, name: str, linear: nn.Linear, heads: Heads
) -> tuple[int, ...] | None:
    """How to split the fused q/k/v projection ``linear`` (``name`` in ``holder``, at
    ``path``): ``None`` for a plain column split, else the widths of its parts to reorder.

    Raises:
        InvalidStrategyError: naming the module, when its layout is not known or cannot split.
    """
    layout = FUSED_LAYOUTS.get((type(holder).__name__, name))
    where = f"{path}.{name} ({type(holder).__name__}.{name}, {linear.out_features} outputs)"
    if layout is None:
        raise InvalidStrategyError(
            f"{where} is a fused projection whose row layout (how its heads interleave) is not "
            "known: a column split would hand ranks mismatched rows; the known layouts: "
            f"{', '.join(f'{c}.{n}' for c, n in FUSED_LAYOUTS)}"
        )
    try:
        return layout(getattr(holder, "config", None), heads, linear)
    except InvalidStrategyError as exc:
        raise InvalidStrategyError(f"{where} cannot be split: {exc}") from None
