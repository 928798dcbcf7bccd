"""Bucket partitions of the gradients in the order they become ready, as cut positions.

A contiguous partition of ``n`` gradients is the tuple of indices its buckets start at, the
first excepted (``()``: one bucket; ``(1, ..., n - 1)``: every gradient alone). Backtracking and
random search move through partitions in this form and turn each into a :class:`Strategy`.
"""

import dataclasses
import itertools
from collections.abc import Sequence

from ddlsim.data.specs.strategy import Strategy, TensorFusionPlan

Cuts = tuple[int, ...]


def strategy_of(
    order: Sequence[str], cuts: Cuts, dear: bool, base: Strategy | None = None
) -> Strategy:
    """Buckets of the gradients in ready ``order`` cut before each index in ``cuts``; the
    parallel plan and compiled blocks of ``base`` (DDP's by default)."""
    bounds = [0, *cuts, len(order)]
    buckets = tuple(tuple(order[a:b]) for a, b in itertools.pairwise(bounds))
    return dataclasses.replace(
        base or Strategy(), tensor_fusion=TensorFusionPlan(buckets=buckets, dear=dear)
    )


def cuts_of(order: Sequence[str], strategy: Strategy, sizes: Sequence[int]) -> Cuts:
    """Where ``strategy``'s buckets cut the ready ``order`` (buckets that are not contiguous
    runs of it are read as the runs they start)."""
    position = {name: i for i, name in enumerate(order)}
    buckets = strategy.tensor_fusion.assign(list(zip(order, sizes, strict=True)))
    starts = sorted({min(position[p] for p in b.params) for b in buckets})
    return tuple(s for s in starts if s > 0)


def even_cuts(sizes: Sequence[int], buckets: int) -> Cuts:
    """Cuts into ``buckets`` runs of about equal bytes."""
    total = sum(sizes) or 1
    cuts: list[int] = []
    running = 0
    for index, size in enumerate(sizes[:-1], start=1):
        running += size
        if running * buckets >= total * (len(cuts) + 1):
            cuts.append(index)
    return tuple(cuts[: buckets - 1])
