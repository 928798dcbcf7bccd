"""The linear layers a grid plan (``ParallelPlan.grid``) splits, and the check that the grid
divides them.

Shared by the executor (``executor/grid.py`` applies the split), the replay and the analytical
model (``simulator/grid.py``), which price each layer's collectives from its shape.
"""

import dataclasses
from collections.abc import Mapping

import torch
from torch import nn

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.models import build_config, build_model
from ddlsim.data.specs.model import ModelSpec
from ddlsim.plans.tp_plans import PLANS, matches, tp_family

# The styles of the family plans whose modules the grid splits; the others (vocabulary-split
# embedding and head) stay whole on every rank.
GRID_STYLES: tuple[str, ...] = ("colwise", "rowwise")
# Config keys of the family plans that the 1-D split needs divisible and the grid does not:
# the vocabulary stays whole.
_WHOLE_KEYS = ("vocab_size",)


@dataclasses.dataclass(frozen=True, slots=True)
class GridLayer:
    """One linear layer of the grid: its module path, style and global shape."""

    path: str
    style: str
    in_features: int
    out_features: int
    bias: bool

    def block(self, axes: Mapping[str, int]) -> tuple[int, int]:
        """The ``(out, in)`` features of the block one rank multiplies."""
        if self.style == "colwise":
            return self.out_features // axes["cols"], self.in_features // axes["rows"]
        return self.out_features // axes["rows"], self.in_features // axes["cols"]


def grid_families() -> list[str]:
    """The families whose plans the grid can take: no module split by heads other than the
    linear layers (T5's shared position bias is)."""
    return sorted(
        family
        for family, plan in PLANS.items()
        if all(
            style in GRID_STYLES or style.startswith("vocab_") for style in plan.modules.values()
        )
    )


def grid_layers(spec: ModelSpec, axes: Mapping[str, int]) -> list[GridLayer]:
    """The linear layers of ``spec`` a grid of ``axes`` (``rows``, ``cols``, ``depth``)
    splits, in model order; raises when it cannot.

    Reads the config and builds the model on the meta device (no memory, no process group).

    Raises:
        InvalidStrategyError: a family with no grid plan, a head count or width ``cols`` does
            not divide (the config key and value named), or a layer whose features or block
            the grid does not divide (the module and its shape named).
    """
    family = tp_family(spec)
    families = grid_families()
    if family not in families:
        raise InvalidStrategyError(
            f"{spec.label} ({spec.cls}) cannot be split over a grid; grid plans support the "
            f"families {', '.join(families)}"
        )
    plan = PLANS[family]
    config = build_config(spec)
    cols = axes["cols"]
    for key in plan.divisible:
        if key in _WHOLE_KEYS:
            continue
        value = getattr(config, key, None)
        if value is None and key == "n_inner":
            value = 4 * config.n_embd  # GPT-2's default MLP width
        if isinstance(value, int) and value % cols:
            raise InvalidStrategyError(
                f"config.{key}({value}) of {spec.label} is not divisible by the grid's "
                f"cols({cols}): each column of the grid computes whole heads and an equal "
                "slice of the MLP; pick cols that divide it"
            )
    with torch.device("meta"):
        model = build_model(spec)
    layers: list[GridLayer] = []
    for path, module in model.named_modules():
        if not path:
            continue
        for pattern, style in plan.modules.items():
            if matches(pattern, path):
                if style in GRID_STYLES:
                    layers.append(_layer(path, style, module))
                break
    for layer in layers:
        _check_layer(layer, axes, spec.label)
    return layers


def _layer(path: str, style: str, module: nn.Module) -> GridLayer:
    if isinstance(module, nn.Linear):
        return GridLayer(
            path, style, module.in_features, module.out_features, module.bias is not None
        )
    # transformers' Conv1D (GPT-2): weight [in, out], becomes an nn.Linear before the split.
    nx, nf = getattr(module, "nx", None), getattr(module, "nf", None)
    if isinstance(nx, int) and isinstance(nf, int):
        return GridLayer(path, style, nx, nf, getattr(module, "bias", None) is not None)
    raise InvalidStrategyError(
        f"{path} ({type(module).__name__}) is not a linear layer; the grid splits linear layers"
    )


def _check_layer(layer: GridLayer, axes: Mapping[str, int], label: str) -> None:
    out_axis, in_axis = ("cols", "rows") if layer.style == "colwise" else ("rows", "cols")
    for features, axis, name in (
        (layer.out_features, out_axis, "output"),
        (layer.in_features, in_axis, "input"),
    ):
        if features % axes[axis]:
            raise InvalidStrategyError(
                f"{label}: {layer.path} has {features} {name} features, not divisible by the "
                f"grid's {axis}({axes[axis]}); pick a grid whose {axis} divide it"
            )
    block_out, block_in = layer.block(axes)
    if (block_out * block_in) % axes["depth"]:
        raise InvalidStrategyError(
            f"{label}: the {block_out} x {block_in} block of {layer.path} does not split into "
            f"depth({axes['depth']}) equal shards; pick a depth that divides it"
        )
