"""Whether a strategy can run: one answer for the command line, the REST service, the search
spaces, the executor (before any rank starts) and the GPU-cluster simulator.

:func:`refusals` takes the model, the strategy and a :class:`Target`: how many ranks, and
where the strategy is asked to run: ``cpu`` (executor ranks on CPUs, gloo), ``cuda``
(executor ranks on GPUs, NCCL) or ``paper`` (priced by the GPU-cluster simulator, not run).
The rules of every target come first, in this order, each message naming the field and the
value: the ranks (``dp * tp * pp * cp`` against the world size; the experts' ``ep * etp``
dividing a stage's ranks), the batch (equal micro-batches on every rank), the tensor-parallel
split (heads, key/value heads, widths, vocabulary), the experts' split (``ep`` dividing the
experts, ``etp`` an expert's width), the pipeline's stages (a block each), the context-parallel
split of the sequence, fp8 on a device that has it. Then the target's own: what this executor
runs (:mod:`.runnable`), or what the GPU path prices (Megatron's and torchtitan's layouts of a
family with a tensor-parallel plan). A plan that prices on paper but does not run
(:func:`paper_only`) is refused for ``cpu`` and ``cuda`` with the reason.
"""

import dataclasses
import functools
from collections.abc import Callable

from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.models import spec_experts
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.plans.runnable import check_paper_only, check_plan_shape, check_runnable, meta_model
from ddlsim.plans.stages import block_stack, stage_count
from ddlsim.plans.tp_plans import PLANS, check_tensor_parallel, tp_family

WHERE: tuple[str, ...] = ("cpu", "cuda", "paper")
FP8_DEVICES = "compute capability 8.9 or later: L40S, H100, H200, B200"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """Where a strategy is asked to run: ``world_size`` ranks, ``where`` (one of ``WHERE``) on
    ``device`` (``cpu`` or a GPU's name), which has fp8 or not; the global batch and sequence
    length (``None``: the model spec's inputs).

    Raises:
        InvalidOptionError: an unknown ``where`` or a world size below 1.
    """

    world_size: int
    where: str = "cpu"
    device: str = "cpu"
    fp8: bool = False
    global_batch: int | None = None
    seq_len: int | None = None

    def __post_init__(self) -> None:
        if self.where not in WHERE:
            raise InvalidOptionError(
                f"target {self.where!r} is unknown; allowed: {', '.join(WHERE)}"
            )
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int):
            raise InvalidOptionError(f"world_size({self.world_size!r}) must be an integer")
        if self.world_size < 1:
            raise InvalidOptionError(f"world_size({self.world_size}) must be >= 1")


def run_target(world_size: int, device: str) -> Target:
    """Executor ranks on ``device`` (``cpu`` or ``cuda``) as a request names them, before the
    machine that runs them is known (a GPU's fp8 is checked there: the executor's own target)."""
    return Target(world_size=world_size, where=device, device=device, fp8=device == "cuda")


def cluster_target(
    cluster: GpuClusterSpec,
    *,
    where: str = "paper",
    global_batch: int | None = None,
    seq_len: int | None = None,
) -> Target:
    """A GPU cluster's GPUs: priced on paper, or (``where`` ``cuda``) run by the executor."""
    return Target(
        world_size=cluster.world_size,
        where=where,
        device=cluster.gpu.name,
        fp8="fp8" in cluster.gpu.peak_tflops,
        global_batch=global_batch,
        seq_len=seq_len,
    )


def refusals(model: ModelSpec, strategy: Strategy, target: Target) -> list[str]:
    """Why ``strategy`` cannot run ``model`` on ``target``: the broken rules' messages, those
    of every target first (a rule that needs an earlier one to hold is not asked when it
    does not); empty when it can run."""
    found: list[str] = []
    for rule in (_ranks_and_batch, _tensor_parallel, _experts, _stages, _sequence, _precision):
        message = _refused(functools.partial(rule, model, strategy, target))
        if message is not None:
            found.append(message)
    if found:
        return found
    if target.where == "paper":
        message = _refused(lambda: check_priced(model, strategy, target.world_size))
    else:
        message = _refused(lambda: check_runnable(model, strategy, target.world_size))
    return [] if message is None else [message]


def check(model: ModelSpec, strategy: Strategy, target: Target) -> None:
    """Raises:
    InvalidStrategyError: the first of :func:`refusals`.
    """
    found = refusals(model, strategy, target)
    if found:
        raise InvalidStrategyError(found[0])


def model_supports(model: ModelSpec, strategy: Strategy) -> bool:
    """Whether the model has what the strategy's plan needs (a tensor-parallel plan for its
    family, a stack of blocks to pipeline), whatever the world size and batch: the search
    spaces' and the datasets' first cut, before :func:`refusals` at a world size."""
    return _refused(lambda: check_plan_shape(model, strategy, rank_batch=None)) is None


def paper_only(strategy: Strategy) -> str | None:
    """Why ``strategy`` prices on GPU clusters but does not run in this executor, or ``None``."""
    return _refused(lambda: check_paper_only(strategy))


def check_priced(model: ModelSpec, strategy: Strategy, world_size: int) -> ScalePlan:
    """The GPU path's plan of ``strategy`` on ``world_size`` GPUs.

    Raises:
        InvalidStrategyError: a setting of the CPU loop only, a precision or schedule the GPU
            path does not price, or a family without a tensor-parallel plan.
    """
    plan = ScalePlan.from_strategy(strategy, world_size)
    check_priceable(model)
    return plan


def check_priceable(model: ModelSpec) -> None:
    """Raises:
    InvalidStrategyError: when ``model``'s family has no tensor-parallel plan (the GPU path
        splits it per layer), naming the families that have one.
    """
    if tp_family(model) is None:
        raise InvalidStrategyError(
            f"{model.label} ({model.cls}) has no tensor-parallel plan, so it cannot be priced "
            f"on a GPU cluster; supported families: {', '.join(sorted(PLANS))}"
        )


def check_ranks(plan: ParallelPlan, world_size: int) -> int:
    """The data-parallel degree.

    Raises:
        InvalidStrategyError: ``dp * tp * pp * cp != world_size``.
    """
    return plan.resolve_dp(world_size)


def check_batch(batch: int, dp: int, micro_batches: int) -> int:
    """The sequences (samples) of one micro-batch.

    Raises:
        InvalidStrategyError: ``batch`` does not split into ``dp * micro_batches`` equal parts.
    """
    if batch % (dp * micro_batches):
        raise InvalidStrategyError(
            f"batch_size({batch}) is not divisible by dp({dp}) * "
            f"micro_batches({micro_batches}): every rank needs equal micro-batches"
        )
    return batch // (dp * micro_batches)


def check_sequence(cp: int, seq_len: int) -> None:
    """Raises:
    InvalidStrategyError: context parallelism cannot split ``seq_len`` into ``2 cp`` equal
        chunks (the load-balanced causal split).
    """
    if cp > 1 and seq_len % (2 * cp):
        raise InvalidStrategyError(
            f"seq_len({seq_len}) must be a multiple of 2 * cp({cp}): context parallelism "
            "splits each sequence into 2 * cp equal chunks"
        )


def check_fp8(precision: str, *, has_fp8: bool, device: str) -> None:
    """Raises:
    InvalidStrategyError: fp8 on a device without fp8, naming it.
    """
    if precision == "fp8" and not has_fp8:
        raise InvalidStrategyError(
            f"precision 'fp8' needs a GPU with fp8 ({FP8_DEVICES}); {device} has none"
        )


def check_stage_count(
    label: str, *, pp: int, schedule: str, stages: int, blocks: int, where: str
) -> None:
    """Raises:
    InvalidStrategyError: fewer ``blocks`` (in the stack ``where``) than the ``stages`` of a
        pipeline of ``pp`` ranks.
    """
    if blocks < stages:
        raise InvalidStrategyError(
            f"parallel.pp({pp}) with schedule {schedule} needs {stages} stages but "
            f"{label} has {blocks} blocks in {where}; each stage needs one"
        )


def _ranks_and_batch(model: ModelSpec, strategy: Strategy, target: Target) -> None:
    plan = strategy.parallel
    dp = check_ranks(plan, target.world_size)
    batch = target.global_batch or model.inputs.batch_size
    check_batch(batch, dp, plan.micro_batches)


def _tensor_parallel(model: ModelSpec, strategy: Strategy, target: Target) -> None:
    plan = strategy.parallel
    if plan.tp > 1 and not plan.grid:
        check_tensor_parallel(model, plan.tp)


def _experts(model: ModelSpec, strategy: Strategy, target: Target) -> None:
    plan = strategy.parallel
    if plan.ep > 1 or plan.etp > 1:
        check_experts_split(model, plan.ep, plan.etp)


def check_experts_split(model: ModelSpec, ep: int, etp: int) -> None:
    """Raises:
    InvalidStrategyError: expert parallelism on a model without routed experts, ``ep`` not
        dividing the experts, ``etp`` not dividing an expert's hidden width.
    """
    shape = spec_experts(model)
    if shape is None:
        raise InvalidStrategyError(
            f"parallel.ep({ep}) and etp({etp}) split routed experts; {model.label} "
            f"({model.cls}) has none (a dense model): use ep 1 and etp 1"
        )
    if shape.experts % ep:
        raise InvalidStrategyError(
            f"parallel.ep({ep}) does not divide the {shape.experts} experts of {model.label}: "
            "each expert-parallel rank holds an equal share"
        )
    if shape.intermediate % etp:
        raise InvalidStrategyError(
            f"parallel.etp({etp}) does not divide an expert's hidden width "
            f"({shape.intermediate}) of {model.label}"
        )


def _stages(model: ModelSpec, strategy: Strategy, target: Target) -> None:
    plan = strategy.parallel
    if plan.pp < 2:
        return
    stack = block_stack(meta_model(model))
    if stack is not None:  # no stack at all: the target's own rules say why
        check_stage_count(
            model.label,
            pp=plan.pp,
            schedule=plan.pp_schedule,
            stages=stage_count(plan),
            blocks=len(stack.blocks),
            where=stack.path,
        )


def _sequence(model: ModelSpec, strategy: Strategy, target: Target) -> None:
    seq_len = target.seq_len or model.inputs.seq_len
    if seq_len is not None:
        check_sequence(strategy.parallel.cp, seq_len)


def _precision(model: ModelSpec, strategy: Strategy, target: Target) -> None:
    check_fp8(strategy.precision, has_fp8=target.fp8, device=target.device)


def _refused(rule: Callable[[], object]) -> str | None:
    try:
        rule()
    except InvalidStrategyError as exc:
        return str(exc)
    return None
