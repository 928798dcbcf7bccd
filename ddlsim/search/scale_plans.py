"""The layouts of a large job on a GPU cluster, and the search over them.

The space: tensor-parallel degrees inside a node that divide the model's split dimensions,
pipeline depths up to the layer count, data parallelism filling the rest, micro-batch sizes
dividing each replica's share of the global batch, the pipeline schedule (1F1B, interleaved
with 2 or 4 chunks where the micro-batches divide; uneven chunks where the layers do not),
recomputation (none, selective, selective_op, full), context parallelism (2, 4 or 8 ranks a
sequence, where each keeps at least :data:`MIN_CP_TOKENS` tokens), and where ranks hold the
same weights, their sharding: none, the distributed optimizer (ZeRO-1's memory, Megatron-LM's
overlapped reduce-scatter and gather) or FSDP. Sequence parallelism goes with every ``tp > 1``:
it costs no time in the model and saves activation memory, so a layout without it is never
better; so does async TP where the job allows it (``allow_async_tp``: it needs compiled blocks
and symmetric memory, or Transformer Engine's userbuffers). Precision, compilation and the
kernel library are the job's, not searched.

Every layout is priced in closed form (the schedule's bubble formula), those that do not fit
the GPU's memory are dropped, and the best are priced again with the schedule replayed, in
closed-form order, until no closed-form time left can beat the best replayed one (at least
:data:`TOP_REPLAYED`, at most :data:`MAX_REPLAYED`); the answer is the best replayed.
"""

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ddlsim.data.errors import DdlsimError, InvalidStrategyError
from ddlsim.data.specs._serde import check_keys
from ddlsim.data.specs.experts import DISPATCHERS
from ddlsim.data.specs.scale_plan import ScalePlan

TOP_REPLAYED = 8
MAX_REPLAYED = 64
MICRO_BATCH_SIZES = (1, 2, 4, 8)
RECOMPUTE_OPTIONS = ("none", "selective", "selective_op", "full")
CP_OPTIONS = (1, 2, 4, 8)
# Expert-parallel degrees a mixture of experts is searched over (those dividing its experts and
# a stage's ranks), and the dispatchers and overlaps the search may pick where a framework
# offers them (by default what this executor runs: all-to-all, no overlap).
EP_OPTIONS = (1, 2, 4, 8, 16, 32, 64)
# Context parallelism splits only sequences this long or longer into parts of at least this.
MIN_CP_TOKENS = 4096
SHARDINGS = ("none", "distributed_optimizer", "fsdp")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ScaleSpace:
    """What the layouts must respect: ``gpus`` in nodes of ``gpus_per_node``, the model's
    ``layers``, the ``tp`` degrees the model can be split, the global batch, the precision."""

    gpus: int
    gpus_per_node: int
    layers: int
    tp_options: tuple[int, ...]
    global_batch: int
    precision: str = "bf16"
    compile: bool = False
    allow_fsdp: bool = True
    allow_async_tp: bool = False
    seq_len: int = 0
    kernels: str = "pytorch"
    limits: "SpaceLimits | None" = None
    experts: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SpaceLimits:
    """What the job's framework offers, where it offers less than the whole space (Megatron-LM
    of 2021 had no sequence parallelism, selective recomputation or distributed optimizer;
    torchtitan shards with FSDP, not Megatron's optimizer): the recomputations, the shardings
    (``none``, ``distributed_optimizer``, ``fsdp``), the context-parallel degrees, whether
    sequence parallelism and the interleaved schedule exist.

    Raises:
        InvalidStrategyError: naming an unknown key or value.
    """

    recompute: tuple[str, ...] = RECOMPUTE_OPTIONS
    sharding: tuple[str, ...] = SHARDINGS
    cp: tuple[int, ...] = CP_OPTIONS
    sequence_parallel: bool = True
    interleaved: bool = True
    ep: tuple[int, ...] = EP_OPTIONS
    dispatcher: tuple[str, ...] = ("all_to_all",)
    ep_overlap: tuple[bool, ...] = (False,)

    def __post_init__(self) -> None:
        for name, allowed in (
            ("recompute", RECOMPUTE_OPTIONS),
            ("sharding", SHARDINGS),
            ("cp", CP_OPTIONS),
        ):
            values = getattr(self, name)
            if isinstance(values, (str, int)) or not values:
                raise InvalidStrategyError(
                    f"search space {name} must be a non-empty list of {list(allowed)}, got "
                    f"{values!r}"
                )
            for value in values:
                if value not in allowed:
                    raise InvalidStrategyError(
                        f"search space {name} {value!r} is not one of {list(allowed)}"
                    )
            object.__setattr__(self, name, tuple(values))
        experts: tuple[tuple[str, tuple[Any, ...]], ...] = (
            ("ep", EP_OPTIONS),
            ("dispatcher", DISPATCHERS),
            ("ep_overlap", (False, True)),
        )
        for name, choices in experts:
            allowed = choices
            values = getattr(self, name)
            if isinstance(values, (str, int, bool)) or not values:
                raise InvalidStrategyError(
                    f"search space {name} must be a non-empty list of {list(allowed)}, got "
                    f"{values!r}"
                )
            for value in values:
                if value not in allowed or type(value) is not type(allowed[0]):
                    raise InvalidStrategyError(
                        f"search space {name} {value!r} is not one of {list(allowed)}"
                    )
            object.__setattr__(self, name, tuple(values))
        if 1 not in self.cp:
            raise InvalidStrategyError(f"search space cp must include 1, got {list(self.cp)}")
        for name in ("sequence_parallel", "interleaved"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidStrategyError(
                    f"search space {name} must be true or false, got {getattr(self, name)!r}"
                )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "SpaceLimits":
        check_keys(raw, set(cls.__dataclass_fields__), "search space", InvalidStrategyError)
        return cls(**raw)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _cp_options(space: ScaleSpace, ranks: int) -> list[int]:
    return [
        cp
        for cp in (space.limits or SpaceLimits()).cp
        if ranks % cp == 0
        and (cp == 1 or (space.seq_len % (2 * cp) == 0 and space.seq_len // cp >= MIN_CP_TOKENS))
    ]


def _expert_options(space: ScaleSpace, ranks: int) -> list[dict[str, Any]]:
    """How a stage's ``ranks`` may split a mixture of experts (MoE layers folded apart from
    attention): every ``ep`` dividing the experts and the ranks, with each dispatcher and
    overlap the space allows; a dense model's one way, no split."""
    limits = space.limits or SpaceLimits()
    if not space.experts:
        return [{}]
    out: list[dict[str, Any]] = []
    for ep in limits.ep:
        if space.experts % ep or ranks % ep:
            continue
        if ep == 1:
            out.append({})
            continue
        out.extend(
            {"ep": ep, "dispatcher": dispatcher, "ep_overlap": overlap}
            for dispatcher in limits.dispatcher
            for overlap in limits.ep_overlap
        )
    return out


def layouts(space: ScaleSpace) -> Iterator[ScalePlan]:
    """Every layout of the space (see the module's docstring)."""
    limits = space.limits or SpaceLimits()
    shardings = [s for s in limits.sharding if space.allow_fsdp or s != "fsdp"]
    for tp in space.tp_options:
        if space.gpus % tp or tp > space.gpus_per_node:
            continue
        for pp in _divisors(space.gpus // tp):
            if pp > space.layers:
                continue
            for cp in _cp_options(space, space.gpus // (tp * pp)):
                dp = space.gpus // (tp * pp * cp)
                if space.global_batch % dp:
                    continue
                per_replica = space.global_batch // dp
                for mbs in MICRO_BATCH_SIZES:
                    if per_replica % mbs:
                        continue
                    m = per_replica // mbs
                    # Fewer micro-batches than stages: 1F1B runs as GPipe does (and the
                    # executor's 1F1B needs one a stage), so the layout is written as GPipe.
                    schedules: list[tuple[str, int]] = [("1f1b" if m >= pp else "gpipe", 1)]
                    if pp > 1 and limits.interleaved:
                        schedules += [
                            ("interleaved_1f1b", v)
                            for v in (2, 4)
                            if pp * v <= space.layers and m % pp == 0
                        ]
                    for schedule, chunks in schedules:
                        for recompute in limits.recompute:
                            for sharding in shardings if dp * cp > 1 else ["none"]:
                                for experts in _expert_options(space, tp * cp * dp):
                                    yield ScalePlan(
                                        dp=dp,
                                        tp=tp,
                                        pp=pp,
                                        cp=cp,
                                        micro_batches=m,
                                        pp_schedule=schedule,
                                        virtual_stages=chunks,
                                        recompute=recompute,
                                        sequence_parallel=tp > 1 and limits.sequence_parallel,
                                        fsdp=sharding == "fsdp",
                                        distributed_optimizer=sharding == "distributed_optimizer",
                                        async_tp=space.allow_async_tp and tp > 1,
                                        precision=space.precision,
                                        compile=space.compile,
                                        kernels=space.kernels,
                                        **experts,
                                    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Ranked:
    """A layout and its predicted iteration time (s) and memory (GiB)."""

    plan: ScalePlan
    iteration_s: float
    memory_gib: float
    replayed: bool


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ScaleSearchResult:
    best: Ranked | None
    ranked: list[Ranked]
    evaluated: int
    refused_memory: int
    failed: int
    seconds: float
    not_runnable: int = 0


Evaluate = Callable[[ScalePlan, bool], tuple[float, float, bool]]


def search_layouts(
    space: ScaleSpace,
    evaluate: Evaluate,
    *,
    progress: Callable[[int], None] | None = None,
    admit: Callable[[ScalePlan], bool] | None = None,
) -> ScaleSearchResult:
    """Price every layout (that ``admit`` admits: one that runs where the job will run) with
    ``evaluate(plan, replay) -> (iteration_s, memory_gib, fits)``, keep those that fit, replay
    the promising ones (see the module) and rank them."""
    started = time.perf_counter()
    fitting: list[Ranked] = []
    evaluated = refused = failed = not_runnable = 0
    for plan in layouts(space):
        if admit is not None and not admit(plan):
            not_runnable += 1
            continue
        try:
            seconds, memory, fits = evaluate(plan, False)
        except DdlsimError:
            failed += 1
            continue
        evaluated += 1
        if progress is not None:
            progress(evaluated)
        if not fits:
            refused += 1
            continue
        fitting.append(Ranked(plan=plan, iteration_s=seconds, memory_gib=memory, replayed=False))
    fitting.sort(key=lambda r: r.iteration_s)
    # The closed form leaves out what the replay finds (sends on the critical path, uneven
    # chunks), so it is about a lower bound: replay in its order until the next closed-form
    # time cannot beat the best replayed one.
    replayed: list[Ranked] = []
    best = float("inf")
    position = 0
    while position < len(fitting) and position < MAX_REPLAYED:
        candidate = fitting[position]
        if position >= TOP_REPLAYED and candidate.iteration_s >= best:
            break
        seconds, _, _ = evaluate(candidate.plan, True)
        replayed.append(dataclasses.replace(candidate, iteration_s=seconds, replayed=True))
        best = min(best, seconds)
        position += 1
    replayed.sort(key=lambda r: r.iteration_s)
    ranked = replayed + fitting[position:]
    return ScaleSearchResult(
        best=ranked[0] if ranked else None,
        ranked=ranked,
        evaluated=evaluated,
        refused_memory=refused,
        failed=failed,
        seconds=time.perf_counter() - started,
        not_runnable=not_runnable,
    )
