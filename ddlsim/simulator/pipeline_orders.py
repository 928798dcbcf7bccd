"""The order each pipeline rank runs its micro-batches' forwards and backwards in, as the
executor runs them: one stage a rank (GPipe, 1F1B, eager 1F1B: :func:`plans.stages.stage_order`)
or several (interleaved 1F1B, as ``torch.distributed.pipelining`` runs it). The replay
(:mod:`.pipeline`) schedules the stages' work in these orders."""

from ddlsim.plans.stages import ONE_STAGE_A_RANK, stage_order
from ddlsim.simulator.timeline import UnsupportedPlanError


def schedule_order(
    schedule: str, stage: int, stages: int, micro_batches: int
) -> list[tuple[str, int]]:
    """The (``"F"``/``"B"``, micro-batch) order of one stage that has a rank to itself, as the
    executor runs it (:func:`plans.stages.stage_order`).

    Raises:
        UnsupportedPlanError: a schedule that runs several stages a rank (interleaved 1F1B:
            :func:`interleaved_order`) or an unknown one.
    """
    if schedule not in ONE_STAGE_A_RANK:
        raise UnsupportedPlanError(
            f"pp_schedule {schedule!r} runs several stages a rank; schedule_order covers "
            f"{', '.join(ONE_STAGE_A_RANK)}"
        )
    return stage_order(schedule, stage, stages, micro_batches)


def interleaved_order(
    rank: int, ranks: int, local_stages: int, micro_batches: int
) -> list[tuple[str, int, int]]:
    """The (``"F"``/``"B"``, stage, micro-batch) order of one rank under interleaved 1F1B, as
    ``torch.distributed.pipelining`` runs it: rank ``r`` holds stages ``r``, ``r + ranks``, ...;
    micro-batches go through a rank's stages in rounds of ``ranks``; a rank runs
    ``(local_stages - 1) * round + 2 * (ranks - 1 - rank)`` forwards first (capped at all of
    them), then alternates a forward and a backward, then runs the backwards left. Backwards
    visit the rank's stages last to first.

    Raises:
        UnsupportedPlanError: micro-batches that do not split into whole rounds (torch refuses
            them too).
    """
    rounds = max(1, micro_batches // ranks)
    if micro_batches % rounds:
        raise UnsupportedPlanError(
            f"interleaved 1F1B needs micro_batches({micro_batches}) to be a multiple of its "
            f"rounds ({rounds})"
        )
    per_round = micro_batches // rounds
    forwards_total = local_stages * micro_batches
    warmup = min((local_stages - 1) * per_round + 2 * (ranks - 1 - rank), forwards_total)

    def forward_stage(step: int) -> int:
        return ((step // per_round) % local_stages) * ranks + rank

    def backward_stage(step: int) -> int:
        local = local_stages - 1 - ((step - warmup) // per_round) % local_stages
        return local * ranks + rank

    next_micro_batch: dict[tuple[str, int], int] = {}

    def action(kind: str, stage: int) -> tuple[str, int, int]:
        m = next_micro_batch.get((kind, stage), 0)
        next_micro_batch[(kind, stage)] = m + 1
        return (kind, stage, m)

    order = [action("F", forward_stage(step)) for step in range(warmup)]
    for step in range(warmup, forwards_total):
        order.append(action("F", forward_stage(step)))
        order.append(action("B", backward_stage(step)))
    for step in range(forwards_total, forwards_total + warmup):
        order.append(action("B", backward_stage(step)))
    return order


def rank_orders(
    schedule: str, ranks: int, stages: int, micro_batches: int
) -> list[list[tuple[str, int, int]]]:
    """Each rank's (kind, stage, micro-batch) order; ``stages`` is ``ranks`` except under
    interleaved 1F1B (``ranks * local stages``).

    Raises:
        UnsupportedPlanError: an unknown schedule, or stages that do not spread evenly.
    """
    if schedule == "interleaved_1f1b":
        if stages % ranks:
            raise UnsupportedPlanError(
                f"{stages} stages do not spread evenly over {ranks} pipeline ranks"
            )
        return [interleaved_order(r, ranks, stages // ranks, micro_batches) for r in range(ranks)]
    if schedule not in ONE_STAGE_A_RANK:
        raise UnsupportedPlanError(
            f"the replay schedules {', '.join(ONE_STAGE_A_RANK)} and interleaved_1f1b; not "
            f"{schedule!r}"
        )
    if stages != ranks:
        raise UnsupportedPlanError(f"{schedule} runs one stage a rank; got {stages} on {ranks}")
    return [
        [(kind, r, m) for kind, m in schedule_order(schedule, r, stages, micro_batches)]
        for r in range(ranks)
    ]
