"""Reduce-scatter and all-gather on flat buffers: the backend's own, or a ring over send/recv.

gloo's ``reduce_scatter_tensor`` runs a whole all-reduce and keeps a shard, moving twice the bytes
a reduce-scatter needs (BENCHMARKS.md: half the link's bus bandwidth). A ring reduce-scatter
moves ``(n - 1) / n`` of the buffer per rank, as NCCL's does. A ring has ``n - 1`` dependent
steps, so it cannot be one asynchronous call: ``CommThread`` runs queued collectives in order on
a process group of their own, off the training thread, and hands back futures to wait on.
"""

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Literal

import torch
import torch.distributed as dist

Implementation = Literal["native", "ring"]


def _exchange(
    send: torch.Tensor,
    recv: torch.Tensor,
    right: int,
    left: int,
    group: dist.ProcessGroup,
) -> None:
    """Send ``send`` to ``right`` while receiving ``recv`` from ``left``.

    The receive is posted first: with the send first, gloo moves the two directions one after
    the other (2 ranks at 1 Gbit/s: a 16 MiB all-gather took 140 ms instead of 75).
    """
    ops = [
        dist.P2POp(dist.irecv, recv, left, group),
        dist.P2POp(dist.isend, send, right, group),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def ring_reduce_scatter(buffer: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Sum ``buffer`` over the group's ranks and return this rank's shard (a new tensor).

    Shapes:
        buffer: ``[n * shard]`` (flat, length a multiple of the group size); returns ``[shard]``.
    """
    n = dist.get_world_size(group)
    me = dist.get_rank(group)
    chunks = buffer.chunk(n)
    if n == 1:
        return chunks[0].clone()
    right = dist.get_global_rank(group, (me + 1) % n)
    left = dist.get_global_rank(group, (me - 1) % n)
    incoming = torch.empty_like(chunks[0])
    # Step s: send the partial sum of chunk (me - s - 1), receive chunk (me - s - 2) and add it
    # to this rank's own part of that chunk. The sums are out of place, so ``buffer`` is left as
    # it was without a copy of it (a copy made the ranks start apart: a 16 MiB reduce-scatter on
    # 2 ranks then took 75 or 155 ms by turns). After n - 1 steps the partial sum of chunk
    # ``me`` is the sum over all ranks.
    partial = chunks[(me - 1) % n]
    for s in range(n - 1):
        _exchange(partial, incoming, right, left, group)
        partial = chunks[(me - s - 2) % n] + incoming
    return partial


def ring_all_gather(shard: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Concatenate every rank's ``shard`` in rank order (the inverse of the reduce-scatter).

    Shapes:
        shard: ``[shard]``; returns ``[n * shard]``.
    """
    n = dist.get_world_size(group)
    me = dist.get_rank(group)
    out = torch.empty(n * shard.numel(), dtype=shard.dtype, device=shard.device)
    chunks = out.chunk(n)
    chunks[me].copy_(shard)
    if n == 1:
        return out
    right = dist.get_global_rank(group, (me + 1) % n)
    left = dist.get_global_rank(group, (me - 1) % n)
    # Step s: pass on the chunk received last (first our own), receive the one from further left.
    for s in range(n - 1):
        _exchange(chunks[(me - s) % n], chunks[(me - s - 1) % n], right, left, group)
    return out


def native_reduce_scatter(buffer: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    n = dist.get_world_size(group)
    shard = torch.empty(buffer.numel() // n, dtype=buffer.dtype, device=buffer.device)
    dist.reduce_scatter_tensor(shard, buffer, group=group)
    return shard


def native_all_gather(shard: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    n = dist.get_world_size(group)
    out = torch.empty(n * shard.numel(), dtype=shard.dtype, device=shard.device)
    dist.all_gather_into_tensor(out, shard, group=group)
    return out


def default_implementation(backend: str) -> Implementation:
    """The ring where the backend's reduce-scatter is an all-reduce in disguise (gloo)."""
    return "ring" if backend == "gloo" else "native"


class CommThread:
    """Runs collectives one after another on a thread and process group of their own.

    ``submit`` returns at once with a future of the collective's result. The group is created
    collectively (every rank of ``ranks`` must construct a ``CommThread`` in the same order);
    ``close`` drains the queue and stops the thread.
    """

    def __init__(
        self, ranks: list[int], backend: str = "gloo", device: torch.device | None = None
    ) -> None:
        group = dist.new_group(ranks, backend=backend)
        if group is None:  # pragma: no cover - every caller is a member
            raise RuntimeError("this rank is not in the communication group")
        self.group: dist.ProcessGroup = group
        self.device = device
        self._jobs: queue.SimpleQueue[
            tuple[Callable[[], torch.Tensor], Future[torch.Tensor]] | None
        ] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="ddlsim-comm", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], torch.Tensor]) -> "Future[torch.Tensor]":
        future: Future[torch.Tensor] = Future()
        self._jobs.put((job, future))
        return future

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()

    def _loop(self) -> None:
        # Collectives run with one intra-op thread too: the ring's additions are small.
        if self.device is not None and self.device.type == "cuda":
            # The current GPU is per thread: this one's must be its rank's.
            torch.cuda.set_device(self.device)
        while (item := self._jobs.get()) is not None:
            job, future = item
            try:
                future.set_result(job())
            except BaseException as exc:  # handed to the waiting training thread
                future.set_exception(exc)
