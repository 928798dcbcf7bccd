"""Data-parallel trainers: native DDP, the executor's own gradient buckets, and DeAR.

``DDPTrainer`` is PyTorch's ``DistributedDataParallel`` with the strategy's caps; a comm hook
records the buckets it really launched. ``BucketTrainer`` implements any partition of the
gradients: a post-accumulate-grad hook per parameter counts a bucket's gradients as they
arrive, and the last one flattens the bucket and launches its collective asynchronously, while
backward goes on. Without DeAR that collective is an all-reduce, waited for before the optimizer
step. With DeAR it is a reduce-scatter; after backward the all-gathers are queued in forward
order, and each bucket's is waited for, and its parameters updated, in a forward pre-hook of
the first module that uses them in the next iteration.
"""

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddlsim.cluster.ring import (
    CommThread,
    default_implementation,
    native_all_gather,
    native_reduce_scatter,
    ring_all_gather,
    ring_reduce_scatter,
)
from ddlsim.data.specs.strategy import DEFAULT_BUCKET_CAP_MB, DEFAULT_FIRST_BUCKET_CAP_MB, Bucket
from ddlsim.executor.context import RankContext, SynchronousTrainer, split_batch

Collective = Callable[[torch.Tensor, dist.ProcessGroup], torch.Tensor]


def _micro_batches(ctx: RankContext) -> list[dict[str, torch.Tensor]]:
    return split_batch(ctx.dp_slice(), ctx.strategy.parallel.micro_batches)


def ddp_backward(
    ctx: RankContext,
    model: DistributedDataParallel,
    batches: Sequence[Mapping[str, Any]],
    *,
    scale: float = 1.0,
) -> torch.Tensor:
    """Forward and backward of every micro-batch under DDP, gradients synchronised on the last
    only (``no_sync`` before it); each loss times ``scale`` for its backward. Returns the
    micro-batches' mean loss (unscaled), detached."""
    total = torch.zeros((), device=ctx.device)
    for index, batch in enumerate(batches):
        last = index == len(batches) - 1
        with model.no_sync() if not last else contextlib.nullcontext():
            loss = ctx.loss(model, batch) / len(batches)
            ctx.backward(loss * scale if scale != 1.0 else loss)
        total += loss.detach()
    return total


def ddp_options(ctx: RankContext) -> dict[str, Any]:
    """``DistributedDataParallel``'s arguments for ``ctx``: the data-parallel group, and the
    strategy's bucket caps unless they are DDP's own defaults (passed as a user who passes
    nothing gets them)."""
    plan = ctx.strategy.tensor_fusion
    caps: list[float] | None
    if plan.bucket_caps_mb is not None:
        caps = list(plan.bucket_caps_mb)
    elif (plan.first_bucket_cap_mb, plan.bucket_cap_mb) == (
        DEFAULT_FIRST_BUCKET_CAP_MB,
        DEFAULT_BUCKET_CAP_MB,
    ):
        caps = None
    else:
        caps = [plan.first_bucket_cap_mb, plan.bucket_cap_mb]
    group = ctx.mesh["dp"].get_group() if ctx.mesh is not None else None
    kwargs: dict[str, Any] = {"process_group": group}
    if caps is not None:
        kwargs["bucket_cap_mb_list"] = caps
    return kwargs


class DDPTrainer(SynchronousTrainer):
    """``DistributedDataParallel`` with the strategy's bucket caps (the reference)."""

    def __init__(self, ctx: RankContext, model: nn.Module) -> None:
        self.ctx = ctx
        self.batches = _micro_batches(ctx)
        self.model = DistributedDataParallel(model, **ddp_options(ctx))
        self.names = {id(p): n for n, p in model.named_parameters()}
        # ZeRO-1: the optimizer's states sharded over the data-parallel ranks.
        zero = ctx.strategy.parallel.zero == 1
        self.optimizer = ctx.make_optimizer(
            self.model.parameters(), shard_over=self.model.process_group if zero else None
        )
        self.launched: list[dict[str, Any]] = []
        self._recording: list[dict[str, Any]] = []
        self.model.register_comm_hook(None, self._hook)

    def _hook(self, state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        self._recording.append(
            {
                "index": bucket.index(),
                "params": [self.names[id(p)] for p in bucket.parameters()],
                "bytes": bucket.buffer().numel() * bucket.buffer().element_size(),
            }
        )
        group = self.model.process_group
        buffer = bucket.buffer().div_(dist.get_world_size(group))
        work = dist.all_reduce(buffer, group=group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    def step(self) -> torch.Tensor:
        self._recording = []
        self.optimizer.zero_grad(set_to_none=True)
        total = ddp_backward(self.ctx, self.model, self.batches)
        self.ctx.step(self.optimizer)
        self.launched = self._recording
        return total / self.ctx.dp

    def applied(self) -> dict[str, Any]:
        return {
            "plan": "zero1" if self.ctx.strategy.parallel.zero == 1 else "ddp",
            "fusion": "ddp",
            "buckets": self.launched,
            "collectives": ["all_reduce"],
        }


class BucketTrainer:
    """Any gradient partition, launched from post-accumulate-grad hooks; optionally DeAR.

    Args:
        buckets: the partition, in the order the strategy assigned it (launch order expected
            from the captured graph); parameter names as ``named_parameters`` gives them.
    """

    def __init__(self, ctx: RankContext, model: nn.Module, buckets: Sequence[Bucket]) -> None:
        plan = ctx.strategy.tensor_fusion
        self.ctx = ctx
        self.model = model
        self.batches = _micro_batches(ctx)
        self.dear = plan.dear
        self.group = ctx.mesh["dp"].get_group() if ctx.mesh is not None else None
        self.dp = ctx.dp
        params = dict(model.named_parameters())
        self.buckets = [[params[name] for name in bucket.params] for bucket in buckets]
        self.bucket_names = [list(bucket.params) for bucket in buckets]
        self.bucket_of = {id(p): i for i, group in enumerate(self.buckets) for p in group}
        self._pending = [0] * len(self.buckets)
        self._launch_order: list[int] = []
        self.launched: list[int] = []
        self._accumulating = False
        self._all_reduce_works: list[tuple[int, torch.Tensor, Any]] = []
        for param in params.values():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._on_grad)
        if self.dear:
            implementation = plan.reduce_scatter
            if implementation == "auto":
                implementation = default_implementation(dist.get_backend(self.group))
            self.rs_impl = implementation
            ranks = dist.get_process_group_ranks(self.group) if self.group else [0]
            backend = dist.get_backend(self.group)
            self.comm = CommThread(ranks, backend=backend, device=ctx.device)
            # gloo's point-to-point ops take host tensors only: the ring then runs on copies.
            self.via_host = backend == "gloo" and ctx.device.type == "cuda"
            # One optimizer per bucket: DeAR updates a bucket when its all-gather lands.
            self.optimizers = [ctx.make_optimizer(group) for group in self.buckets]
            self._gathers: dict[int, Future[torch.Tensor]] = {}
            self._scatters: dict[int, Future[torch.Tensor]] = {}
            self._padded: dict[int, int] = {}
            self._install_forward_hooks()
        else:
            self.optimizer = ctx.make_optimizer(model.parameters())

    # -- backward side ------------------------------------------------------------------

    def _on_grad(self, param: torch.Tensor) -> None:
        if self._accumulating:
            return
        index = self.bucket_of[id(param)]
        self._pending[index] -= 1
        if self._pending[index] == 0:
            self._launch(index)

    def _flat(self, index: int) -> torch.Tensor:
        grads = [
            p.grad.reshape(-1)
            if p.grad is not None
            else torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
            for p in self.buckets[index]
        ]
        return torch.cat(grads)

    def _launch(self, index: int) -> None:
        self._launch_order.append(index)
        flat = self._flat(index)
        if not self.dear:
            work = dist.all_reduce(flat, group=self.group, async_op=True)
            self._all_reduce_works.append((index, flat, work))
            return
        padding = (-flat.numel()) % self.dp
        if padding:
            flat = torch.cat([flat, flat.new_zeros(padding)])
        self._padded[index] = padding
        scatter: Collective = (
            ring_reduce_scatter if self.rs_impl == "ring" else native_reduce_scatter
        )
        if self.via_host:
            scatter = _via_host(scatter)
        group = self.comm.group
        self._scatters[index] = self.comm.submit(lambda: scatter(flat, group))

    def _unflatten_into_grads(self, index: int, flat: torch.Tensor) -> None:
        offset = 0
        for param in self.buckets[index]:
            numel = param.numel()
            param.grad = flat[offset : offset + numel].view_as(param).div_(self.dp).clone()
            offset += numel

    # -- forward side (DeAR) ------------------------------------------------------------

    def _install_forward_hooks(self) -> None:
        """A forward pre-hook on each module with parameters in a bucket: it applies those
        buckets' all-gathers before the module runs.

        Inside a compiled block the hook goes on the block instead (outside the compiled code,
        ``executor.plan._compile_blocks``), for all the block's buckets: a hook inside would be
        traced into the block's graph, breaking it at every wait, and a block whose graph was
        traced with another model's hooks would update parameters that the compiled backward
        has saved. Parameters in no bucket (frozen: no gradient reaches them) have no hook.
        """
        compiled = list(self.ctx.strategy.op_fusion.compiled)
        hooked: dict[str, set[int]] = {}
        for name, module in self.model.named_modules():
            own = {
                self.bucket_of[id(p)]
                for p in module.parameters(recurse=False)
                if id(p) in self.bucket_of
            }
            if own:
                hooked.setdefault(_enclosing_block(name, compiled), set()).update(own)
        for name, indices in hooked.items():
            module = self.model.get_submodule(name)
            module.register_forward_pre_hook(self._make_pre_hook(sorted(indices)))

    def _make_pre_hook(self, indices: list[int]) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            for index in indices:
                self._update_bucket(index)

        return hook

    def _update_bucket(self, index: int) -> None:
        future = self._gathers.pop(index, None)
        if future is None:
            return
        flat = future.result()
        padding = self._padded[index]
        if padding:
            flat = flat[: flat.numel() - padding]
        self._unflatten_into_grads(index, flat)
        self.optimizers[index].step()
        self.optimizers[index].zero_grad(set_to_none=True)

    def _queue_gathers(self) -> None:
        # A bucket no module used in this forward still holds last iteration's gather.
        for index in list(self._gathers):
            self._update_bucket(index)
        gather: Collective = ring_all_gather if self.rs_impl == "ring" else native_all_gather
        if self.via_host:
            gather = _via_host(gather)
        group = self.comm.group
        # The next forward needs the buckets of the first layers first: the reverse of launch.
        for index in reversed(self._launch_order):
            scatter = self._scatters.pop(index)
            self._gathers[index] = self.comm.submit(
                functools.partial(_gather_after, gather, scatter, group)
            )

    # -- iteration ----------------------------------------------------------------------

    def step(self) -> torch.Tensor:
        if not self.dear:
            self.optimizer.zero_grad(set_to_none=True)
        self._launch_order = []
        self._pending = [len(group) for group in self.buckets]
        total = torch.zeros((), device=self.ctx.device)
        for index, batch in enumerate(self.batches):
            self._accumulating = index < len(self.batches) - 1
            loss = self.ctx.loss(self.model, batch) / len(self.batches)
            self.ctx.backward(loss)
            total += loss.detach()
        self._accumulating = False
        # Buckets whose gradients did not all arrive (unused parameters) go last, with zeros.
        for index, pending in enumerate(self._pending):
            if pending > 0:
                self._launch(index)
        self.launched = list(self._launch_order)
        if self.dear:
            self._queue_gathers()
        else:
            for index, flat, work in self._all_reduce_works:
                work.wait()
                self._unflatten_into_grads(index, flat)
            self._all_reduce_works = []
            self.ctx.step(self.optimizer)
        return total / self.dp

    def drain(self) -> None:
        if self.dear:
            for index in list(self._gathers):
                self._update_bucket(index)

    def finish(self) -> None:
        self.drain()
        if self.dear:
            self.comm.close()

    def applied(self) -> dict[str, Any]:
        buckets = [
            {
                "index": order,
                "params": self.bucket_names[index],
                "bytes": sum(p.numel() * p.element_size() for p in self.buckets[index]),
            }
            for order, index in enumerate(self.launched)
        ]
        out: dict[str, Any] = {"plan": "ddp", "fusion": "hooks", "buckets": buckets}
        if self.dear:
            out["collectives"] = [f"reduce_scatter:{self.rs_impl}", f"all_gather:{self.rs_impl}"]
            if self.via_host:
                out["staged_on_host"] = True
        else:
            out["collectives"] = ["all_reduce"]
        return out


def _enclosing_block(name: str, compiled: Sequence[str]) -> str:
    """``name``'s compiled block (itself or its outermost compiled ancestor), else ``name``."""
    blocks = [block for block in compiled if name == block or name.startswith(block + ".")]
    return min(blocks, key=len) if blocks else name


def _via_host(collective: Collective) -> Collective:
    """``collective`` on a host copy of its input, the result copied back to the input's
    device (run on the communication thread, so the copies stay off the training thread)."""

    def run(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        return collective(tensor.cpu(), group).to(tensor.device)

    return run


def _gather_after(
    gather: Callable[[torch.Tensor, dist.ProcessGroup], torch.Tensor],
    scatter: "Future[torch.Tensor]",
    group: dist.ProcessGroup,
) -> torch.Tensor:
    """All-gather a bucket's reduced shard once its reduce-scatter has finished."""
    return gather(scatter.result(), group)
