"""Tensor parallelism over a 3-D grid of ranks (AxoNN's), with data parallelism beside it.

The ``tp = rows * cols * depth`` tensor-parallel ranks form a grid on a named device mesh
``(dp, depth, rows, cols)``. Every linear layer the family's plan splits (``plans.tp_plans``:
the attention's projections and the MLP's) multiplies a weight block: a column-parallel layer
(``colwise``: query/key/value, the MLP's first projections) holds the block of output features
``cols`` splits and input features ``rows`` splits; a row-parallel layer (``rowwise``: the
attention's output, the MLP's last projection) the transpose, output features over ``rows`` and
input features over ``cols``. Each block is further cut into ``depth`` flat shards, and the
``depth`` slices of the grid compute their own share of the samples (so depth acts as data
parallelism whose weights are sharded, as in ZeRO-3).

A layer's collectives, per micro-batch:

* forward: the block is all-gathered over ``depth``; a column-parallel layer takes its ``rows``
  slice of the input features (local), multiplies, all-reduces the partial outputs over
  ``rows`` (its output features stay split over ``cols``: whole heads, as Megatron's); a
  row-parallel layer multiplies its ``cols`` slice, all-reduces over ``cols`` and all-gathers
  its output features over ``rows`` so that the residual stream and the norms see whole
  features;
* backward: the input gradient's partial sums are all-reduced over ``cols`` (column-parallel,
  then all-gathered over ``rows``) or ``rows`` (row-parallel); the weight gradient is
  reduce-scattered over ``depth`` to the shard each rank holds.

With ``grid_overlap`` (AxoNN's overlap) the input gradient's all-reduce is issued
asynchronously and the weight gradient computed while it runs, and the weight gradient's
reduce-scatter is left in flight while backward goes on to the earlier layers, waited for once
the micro-batch's backward ends. Without it every collective blocks where it is issued.

``[1, tp, 1]`` is Megatron's split (all-reduces over ``cols`` only), ``[tp, 1, 1]`` its
transpose, ``[1, 1, tp]`` data parallelism over sharded weights. The token embedding, the LM
head, norms and biases stay whole on every rank of a depth slice; their gradients, and the
weight shards' after the reduce-scatter, are averaged over the samples' ranks (``dp * depth``
and ``dp``). Attention modules compute with ``1 / cols`` of the heads (the attributes that
count heads are divided, as the 1-D plan does); GPT-2 is prepared as for the 1-D plan (its
``Conv1D`` become ``nn.Linear``, its fused query/key/value rows interleaved by ``cols``).
"""

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from ddlsim.cluster import groups
from ddlsim.data.specs.strategy import GRID_AXES
from ddlsim.executor.context import (
    RankContext,
    SynchronousTrainer,
    average_over_group,
    split_batch,
)
from ddlsim.executor.tensor_parallel import PREPARE
from ddlsim.plans.grid import GRID_STYLES, grid_layers
from ddlsim.plans.tp_plans import PLANS, TensorParallelPlan, divide_heads, matches, tp_family


@dataclasses.dataclass(frozen=True, slots=True)
class GridAxes:
    """This rank's place on the grid: each axis' size, index and process group (``None`` for
    an axis of size 1, which needs no communication)."""

    rows: int
    cols: int
    depth: int
    row: int
    col: int
    depth_index: int
    row_group: Any
    col_group: Any
    depth_group: Any

    @classmethod
    def from_mesh(cls, mesh: Any) -> "GridAxes":
        """From a mesh with dimensions named ``rows``, ``cols``, ``depth``."""

        def group(name: str) -> Any:
            return mesh[name].get_group() if mesh[name].size() > 1 else None

        return cls(
            rows=mesh["rows"].size(),
            cols=mesh["cols"].size(),
            depth=mesh["depth"].size(),
            row=mesh["rows"].get_local_rank(),
            col=mesh["cols"].get_local_rank(),
            depth_index=mesh["depth"].get_local_rank(),
            row_group=group("rows"),
            col_group=group("cols"),
            depth_group=group("depth"),
        )


class _Pending:
    """Weight-gradient reduce-scatters in flight: waited for, then accumulated into their
    shards' ``.grad`` (divided by ``depth``: the mean over the depth slices' samples)."""

    def __init__(self) -> None:
        self._items: list[tuple[Any, torch.Tensor, nn.Parameter, int]] = []

    def add(self, work: Any, shard_grad: torch.Tensor, param: nn.Parameter, depth: int) -> None:
        """Queue ``shard_grad`` for ``param``; accumulated at once when nothing is in flight
        (``work`` is ``None``)."""
        if work is None:
            _accumulate(shard_grad, param, depth)
        else:
            self._items.append((work, shard_grad, param, depth))

    def settle(self) -> None:
        for work, grad, param, depth in self._items:
            work.wait()
            _accumulate(grad, param, depth)
        self._items.clear()


def _accumulate(grad: torch.Tensor, param: nn.Parameter, depth: int) -> None:
    if depth > 1:
        grad = grad.div_(depth)
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)


class GridLinear(nn.Module):
    """An ``nn.Linear`` whose weight block lives on the grid (see the module docstring).

    ``weight_shard`` is this rank's flat ``1 / depth`` of the block; ``bias`` the block's
    output features (column-parallel: the ``cols`` slice; row-parallel: the ``rows`` slice).

    Shapes:
        input: ``[..., in_features]`` (column-parallel) or ``[..., in_features / cols]``
        (row-parallel); output: ``[..., out_features / cols]`` or ``[..., out_features]``.
    """

    def __init__(
        self,
        linear: nn.Linear,
        style: str,
        axes: GridAxes,
        *,
        overlap: bool,
        pending: _Pending,
    ) -> None:
        super().__init__()
        self.style = style
        self.axes = axes
        self.overlap = overlap
        self.pending = pending
        out_split, in_split = (
            (axes.cols, axes.rows) if style == "colwise" else (axes.rows, axes.cols)
        )
        out_index, in_index = (axes.col, axes.row) if style == "colwise" else (axes.row, axes.col)
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.block_out = linear.out_features // out_split
        self.block_in = linear.in_features // in_split
        with torch.no_grad():
            block = linear.weight.detach()[
                out_index * self.block_out : (out_index + 1) * self.block_out,
                in_index * self.block_in : (in_index + 1) * self.block_in,
            ]
            shard = block.reshape(-1).chunk(axes.depth)[axes.depth_index].clone()
            self.weight_shard = nn.Parameter(shard)
            if linear.bias is not None:
                part = linear.bias.detach()[
                    out_index * self.block_out : (out_index + 1) * self.block_out
                ]
                self.bias: nn.Parameter | None = nn.Parameter(part.clone())
            else:
                self.bias = None

    def gathered_weight(self) -> torch.Tensor:
        """The whole block ``[block_out, block_in]`` (all-gathered over ``depth``)."""
        shard = self.weight_shard.detach()
        if self.axes.depth_group is None:
            return shard.view(self.block_out, self.block_in)
        whole = shard.new_empty(shard.numel() * self.axes.depth)
        dist.all_gather_into_tensor(whole, shard.contiguous(), group=self.axes.depth_group)
        return whole.view(self.block_out, self.block_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _GridLinearFunction.apply(x, self.weight_shard, self.bias, self)
        return out


def _gather_last(x: torch.Tensor, group: Any, size: int) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def _all_reduce(x: torch.Tensor, group: Any, *, async_op: bool = False) -> Any:
    if group is None:
        return None
    return dist.all_reduce(x, group=group, async_op=async_op)


class _GridLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        shard: torch.Tensor,
        bias: torch.Tensor | None,
        layer: GridLinear,
    ) -> torch.Tensor:
        axes = layer.axes
        weight = layer.gathered_weight()
        if layer.style == "colwise":
            if axes.rows > 1:
                x = x.narrow(-1, axes.row * layer.block_in, layer.block_in)
            y = F.linear(x, weight)
            _all_reduce(y, axes.row_group)
            if bias is not None:
                y = y + bias
        else:
            y = F.linear(x, weight)
            _all_reduce(y, axes.col_group)
            if bias is not None:
                y = y + bias
            if axes.rows > 1:
                y = _gather_last(y, axes.row_group, axes.rows)
        ctx.save_for_backward(x, weight)
        ctx.layer = layer
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        layer: GridLinear = ctx.layer
        axes = layer.axes
        if layer.style == "rowwise" and axes.rows > 1:
            grad = grad.narrow(-1, axes.row * layer.block_out, layer.block_out)
        grad = grad.contiguous()
        grad_x = grad @ weight
        # The input gradient's partial sums (over the output features this rank does not hold).
        group = axes.col_group if layer.style == "colwise" else axes.row_group
        work = _all_reduce(grad_x, group, async_op=layer.overlap)
        grad_2d = grad.reshape(-1, grad.shape[-1])
        grad_w = (grad_2d.t() @ x.reshape(-1, x.shape[-1])).reshape(-1)
        grad_b = grad_2d.sum(0) if ctx.has_bias else None
        if axes.depth_group is None:
            layer.pending.add(None, grad_w, layer.weight_shard, 1)
        else:
            shard = grad_w.new_empty(grad_w.numel() // axes.depth)
            rs = dist.reduce_scatter_tensor(
                shard, grad_w, group=axes.depth_group, async_op=layer.overlap
            )
            layer.pending.add(rs if layer.overlap else None, shard, layer.weight_shard, axes.depth)
        if work is not None and layer.overlap:
            work.wait()
        if layer.style == "colwise" and axes.rows > 1:
            grad_x = _gather_last(grad_x, axes.row_group, axes.rows)
        return grad_x, None, grad_b, None


def apply_grid(
    model: nn.Module, plan: TensorParallelPlan, axes: GridAxes, *, overlap: bool
) -> tuple[dict[str, str], _Pending]:
    """Split ``model``'s linear layers over the grid in place; the style of each path and the
    queue of its weight-gradient reduce-scatters."""
    prepare = PREPARE.get(plan.family)
    if prepare is not None:
        prepare(model, axes.cols, lambda path: True)
    pending = _Pending()
    styles: dict[str, str] = {}
    for path, module in list(model.named_modules()):
        if not path:
            continue
        if matches(plan.attention, path):
            divide_heads(module, axes.cols)
        for pattern, style in plan.modules.items():
            if matches(pattern, path):
                if style in GRID_STYLES and isinstance(module, nn.Linear):
                    parent_path, _, name = path.rpartition(".")
                    grid_linear = GridLinear(module, style, axes, overlap=overlap, pending=pending)
                    setattr(model.get_submodule(parent_path), name, grid_linear)
                    styles[path] = style
                break
    return styles, pending


class GridTrainer(SynchronousTrainer):
    """The model's linear layers split over a ``(depth, rows, cols)`` grid, the grid
    replicated over ``dp``.

    Each rank trains on its depth slice of its data-parallel share of the global batch, in
    ``parallel.micro_batches`` micro-batches. The ``rows * cols`` ranks of a depth slice
    compute the same loss, so ``step`` returns the local mean loss divided by ``dp * tp``.
    """

    def __init__(self, ctx: RankContext, model: nn.Module) -> None:
        parallel = ctx.strategy.parallel
        grid_layers(ctx.spec, parallel.grid_axes)
        family = tp_family(ctx.spec)
        assert family is not None  # grid_layers refused the others
        self.ctx = ctx
        self.plan = PLANS[family]
        self.model = model
        self.parallel = parallel
        sizes = parallel.grid_axes
        mesh = groups.mesh(
            ctx.device.type,
            (ctx.dp, sizes["depth"], sizes["rows"], sizes["cols"]),
            ("dp", "depth", "rows", "cols"),
        )
        self.axes = GridAxes.from_mesh(mesh)
        self.styles, self.pending = apply_grid(
            model, self.plan, self.axes, overlap=parallel.grid_overlap
        )
        shards = {id(m.weight_shard) for m in model.modules() if isinstance(m, GridLinear)}
        trained = [p for p in model.parameters() if p.requires_grad]
        self.shards = [p for p in trained if id(p) in shards]
        self.others = [p for p in trained if id(p) not in shards]
        self.samples = ctx.dp * self.axes.depth
        self.sample_group = (
            mesh["dp", "depth"]._flatten("dp_depth").get_group() if self.samples > 1 else None
        )
        self.dp_group = mesh["dp"].get_group() if ctx.dp > 1 else None
        share = split_batch(ctx.dp_slice(), self.axes.depth)[self.axes.depth_index]
        self.batches = split_batch(share, parallel.micro_batches)
        self.optimizer = ctx.make_optimizer(trained)

    def step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.ctx.device)
        for batch in self.batches:
            loss = self.ctx.loss(self.model, batch) / len(self.batches)
            self.ctx.backward(loss)
            self.pending.settle()
            total += loss.detach()
        if self.sample_group is not None:
            grads = [p.grad for p in self.others if p.grad is not None]
            average_over_group(grads, self.sample_group, self.samples)
        if self.dp_group is not None:
            grads = [p.grad for p in self.shards if p.grad is not None]
            average_over_group(grads, self.dp_group, self.ctx.dp)
        self.ctx.step(self.optimizer)
        return total / (self.ctx.dp * self.ctx.tp)

    def applied(self) -> dict[str, Any]:
        return {
            "plan": "grid",
            "family": self.plan.family,
            "grid": {axis: getattr(self.axes, axis) for axis in GRID_AXES},
            "tp": self.ctx.tp,
            "dp": self.ctx.dp,
            "overlap": self.parallel.grid_overlap,
            "parallelized": sorted(self.styles),
            "styles": dict(sorted(self.styles.items())),
            "collectives": self._collectives(),
        }

    def _collectives(self) -> list[str]:
        """The collectives the grid issues, ``kind:axis``, in a fixed order."""
        axes = self.axes
        out = []
        if axes.depth > 1:
            out += ["all_gather:depth", "reduce_scatter:depth"]
        if axes.rows > 1:
            out += ["all_reduce:rows", "all_gather:rows"]
        if axes.cols > 1:
            out.append("all_reduce:cols")
        if self.sample_group is not None:
            out.append("all_reduce:dp_depth")
        if self.dp_group is not None:
            out.append("all_reduce:dp")
        return out


__all__ = ["GridAxes", "GridLinear", "GridTrainer", "apply_grid"]
