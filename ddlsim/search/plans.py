"""The parallel plans a search may choose for one model on ``world_size`` ranks, and their names.

A plan is a :class:`ParallelPlan`: ``dp x tp x pp``, FSDP, micro-batches (gradient accumulation,
or a pipeline's) and the pipeline schedule. :func:`candidate_plans` lists those the executor can
run for the model and whose global batch splits evenly; :attr:`ParallelPlan.label` names one
briefly (the Optuna samplers choose plans by these names, and pruned plans are reported by
them).
"""

from collections.abc import Callable
from typing import get_args

from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import ParallelPlan, PipelineSchedule, Strategy
from ddlsim.plans.feasibility import Target, refusals

# Gradient accumulation and pipeline micro-batches the space offers (as many as the batch splits
# into); pipelines also take micro-batches of pp, 2 pp and 4 pp.
ACCUMULATION = (1, 2, 4)
PIPELINE_FACTORS = (1, 2, 4)
TP_MICRO_BATCHES = (1, 2)
# Schedules of pipelines with a tensor-parallel stage (one stage a rank).
STAGED_SCHEDULES: tuple[PipelineSchedule, ...] = ("gpipe", "1f1b", "eager_1f1b")

Supports = Callable[[ModelSpec, Strategy], bool]
"""Whether the executor can run a strategy's plan for a model (``model_supports``)."""


def space_refusal(spec: ModelSpec, strategy: Strategy, world_size: int) -> str | None:
    """Why a search on ``world_size`` CPU ranks does not offer ``strategy`` (the one
    feasibility answer, :func:`ddlsim.plans.feasibility.refusals`), or ``None``."""
    found = refusals(spec, strategy, Target(world_size=world_size, where="cpu"))
    return found[0] if found else None


def candidate_plans(spec: ModelSpec, world_size: int, supports: Supports) -> list[ParallelPlan]:
    """Every parallel plan of the space that the model supports on ``world_size`` ranks and whose
    global batch splits evenly: data parallelism with gradient accumulation, FSDP (its default
    group per block) with and without it, tensor parallelism over each divisor of the world
    size, pipelines over each divisor with GPipe, 1F1B and interleaved 1F1B, and, where a stage
    has two ranks or more, pipelines whose first stage is tensor-parallel over its ranks
    (``parallel.stages``), and every grid (``parallel.grid``: rows x cols x depth whose product
    divides the world size, the rest data-parallel; overlap on). DDP's plan comes first."""
    batch = spec.inputs.batch_size
    plans: list[ParallelPlan] = []

    def add(plan: ParallelPlan) -> None:
        if not plan.fits(batch, world_size):
            return
        strategy = Strategy(parallel=plan)
        if supports(spec, strategy) and space_refusal(spec, strategy, world_size) is None:
            plans.append(plan)

    for fsdp in (False, True):
        for m in ACCUMULATION:
            add(ParallelPlan(fsdp=fsdp, micro_batches=m))
    divisors = [d for d in range(2, world_size + 1) if world_size % d == 0]
    for tp in divisors:
        for m in TP_MICRO_BATCHES:
            add(ParallelPlan(tp=tp, micro_batches=m))
    for pp in divisors:
        for schedule in get_args(PipelineSchedule):
            for factor in PIPELINE_FACTORS:
                add(ParallelPlan(pp=pp, micro_batches=pp * factor, pp_schedule=schedule))
    # A tensor-parallel first stage over the ranks that run it, the others batch-split.
    for pp in divisors:
        if world_size // pp < 2:
            continue
        stages = ("tp",) + ("batch",) * (pp - 1)
        for staged in STAGED_SCHEDULES:
            for factor in PIPELINE_FACTORS:
                add(
                    ParallelPlan(
                        pp=pp, micro_batches=pp * factor, pp_schedule=staged, stages=stages
                    )
                )
    for grid in grid_shapes(world_size):
        add(ParallelPlan(grid=grid))
    return list(dict.fromkeys(plans))


def grid_shapes(world_size: int) -> list[tuple[int, int, int]]:
    """Every ``(rows, cols, depth)`` whose product exceeds 1 and divides ``world_size``."""
    divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
    return [
        (rows, cols, depth)
        for rows in divisors
        for cols in divisors
        for depth in divisors
        if rows * cols * depth > 1 and world_size % (rows * cols * depth) == 0
    ]
