"""The ring reduce-scatter and all-gather compute what the backend's collectives compute."""

import functools

import torch
import torch.distributed as dist

from ddlsim.cluster.ring import CommThread, ring_all_gather, ring_reduce_scatter
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.context import RankContext
from tests.executor.harness import run_ranks


def _check(ctx: RankContext, numel: int) -> tuple[bool, bool, bool]:
    world = dist.group.WORLD
    assert world is not None
    gen = torch.Generator().manual_seed(ctx.rank)
    buffer = torch.randn(numel, generator=gen)
    want_sum = buffer.clone()
    dist.all_reduce(want_sum)
    shard = ring_reduce_scatter(buffer, world)
    n = ctx.world_size
    scattered_ok = torch.allclose(shard, want_sum.chunk(n)[ctx.rank], atol=1e-6)
    gathered = ring_all_gather(shard, world)
    gathered_ok = torch.allclose(gathered, want_sum, atol=1e-6)
    # The same on the communication thread, its own group, as DeAR runs them.
    comm = CommThread(list(range(n)))
    future = comm.submit(
        lambda: ring_all_gather(ring_reduce_scatter(buffer, comm.group), comm.group)
    )
    threaded_ok = torch.allclose(future.result(), want_sum, atol=1e-6)
    comm.close()
    return scattered_ok, gathered_ok, threaded_ok


def test_ring_matches_all_reduce_on_three_ranks() -> None:
    results = run_ranks(3, functools.partial(_check, numel=3 * 1001), ZOO["mlp"], Strategy())
    assert results == [(True, True, True)] * 3
