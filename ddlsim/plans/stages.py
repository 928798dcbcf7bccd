"""Where a pipeline cuts a model: its one stack of repeated blocks, and FLOP-balanced stages.

Shared by the executor, which cuts the real model, and the simulator, which replays the same
stages from the graph.
"""

import dataclasses
from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from ddlsim.data.specs.strategy import ParallelPlan

# The schedules that run one stage a rank.
ONE_STAGE_A_RANK: tuple[str, ...] = ("gpipe", "1f1b", "eager_1f1b")


def warmup_forwards(schedule: str, stage: int, stages: int, micro_batches: int) -> int:
    """Forwards stage ``stage`` of ``stages`` (one stage a rank) runs before its first backward.

    ``gpipe``: all of them. ``1f1b``: ``stages - stage``, as ``torch.distributed.pipelining``'s
    ``Schedule1F1B`` runs it (its first stage's last warm-up send goes out with its first
    backward). ``eager_1f1b`` (Alpa's eager 1F1B): ``2 * (stages - stage) - 1``, so that a stage
    has the next micro-batches' activations computed, and their sends to the next stage (and
    any resharding on the way) in flight, while it runs its backwards; more activations are
    held in exchange. Each is capped at ``micro_batches``.

    Raises:
        ValueError: a schedule without one stage a rank (``interleaved_1f1b``) or unknown.
    """
    if schedule == "gpipe":
        warmup = micro_batches
    elif schedule == "1f1b":
        warmup = stages - stage
    elif schedule == "eager_1f1b":
        warmup = 2 * (stages - stage) - 1
    else:
        allowed = ", ".join(ONE_STAGE_A_RANK)
        raise ValueError(f"{schedule!r} has no one-stage-a-rank order; allowed: {allowed}")
    return min(warmup, micro_batches)


def stage_order(
    schedule: str, stage: int, stages: int, micro_batches: int
) -> list[tuple[str, int]]:
    """The (``"F"``/``"B"``, micro-batch) order of a stage that has a rank to itself: its warm-up
    forwards (:func:`warmup_forwards`), then a backward and a forward in turn, then the
    backwards left.

    Raises:
        ValueError: as :func:`warmup_forwards`.
    """
    warmup = warmup_forwards(schedule, stage, stages, micro_batches)
    order = [("F", m) for m in range(warmup)]
    forward = warmup
    for backward in range(micro_batches):
        order.append(("B", backward))
        if forward < micro_batches:
            order.append(("F", forward))
            forward += 1
    return order


def stage_count(plan: "ParallelPlan") -> int:
    """Stages in the pipeline: one per rank, ``plan.chunks`` per rank when interleaved."""
    return plan.pp * plan.chunks


@dataclasses.dataclass(frozen=True, slots=True)
class BlockStack:
    """The container the stages are cut from: its path and the paths of its blocks."""

    path: str
    blocks: tuple[str, ...]


def block_stack(model: nn.Module) -> BlockStack | None:
    """The model's one stack of repeated blocks, or ``None`` when it has none or several.

    The outermost ``nn.ModuleList`` when there is exactly one; without any, the longest
    outermost ``nn.Sequential`` (reference models).
    """
    lists = _outermost(model, nn.ModuleList)
    if len(lists) > 1:
        return None
    if lists:
        name, module = lists[0]
    else:
        sequences = _outermost(model, nn.Sequential)
        if not sequences:
            return None
        name, module = max(sequences, key=lambda item: len(list(item[1].children())))
    count = len(list(module.children()))
    return BlockStack(name, tuple(f"{name}.{index}" for index in range(count)))


def _outermost(model: nn.Module, kind: type[nn.Module]) -> list[tuple[str, nn.Module]]:
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if not name or not isinstance(module, kind):
            continue
        if any(name.startswith(f"{outer}.") for outer, _ in found):
            continue
        found.append((name, module))
    return found


def balanced_cuts(costs: list[float], parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` ranges of ``costs``, ``parts`` of them, each non-empty,
    minimizing the largest sum (ties: the earliest cut)."""
    n = len(costs)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} blocks into {parts} non-empty stages")
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    inf = float("inf")
    # best[k][i]: the smallest largest-part sum cutting the first i blocks into k parts.
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    ranges: list[tuple[int, int]] = []
    end = n
    for k in range(parts, 0, -1):
        start = cut[k][end]
        ranges.append((start, end))
        end = start
    return ranges[::-1]


def default_groups(model: nn.Module) -> list[list[str]]:
    """FSDP's default groups: one per element of every outermost ``nn.ModuleList``, as
    torchtitan shards transformer blocks."""
    groups: list[list[str]] = []
    outer: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and not any(name.startswith(f"{o}.") for o in outer):
            outer.append(name)
            groups.extend([f"{name}.{index}"] for index in range(len(module)))
    return groups


def tied_parameters(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """Parameters registered under more than one module (an input embedding tied to the LM
    head): each one's first name (as the graph names it) and the modules that hold it."""
    first: dict[int, str] = {}
    owners: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        first.setdefault(id(param), name)
        owners.setdefault(id(param), []).append(name.rpartition(".")[0])
    return {first[key]: tuple(mods) for key, mods in owners.items() if len(mods) > 1}
