"""``ParallelPlan``: how a job's ranks split it (data x tensor x pipeline parallelism, FSDP
or the distributed optimizer, micro-batches and the schedule, per-layer placements, grids,
recomputation, sequence parallelism), validated on construction; part of a ``Strategy``."""

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs._serde import expect_choice, expect_int
from ddlsim.data.specs.experts import check_experts, expert_data_parallel, expert_features

PipelineSchedule = Literal["gpipe", "1f1b", "eager_1f1b", "interleaved_1f1b"]
PIPELINE_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "eager_1f1b", "interleaved_1f1b")
# Per-layer placements over the tensor-parallel ranks (``ParallelPlan.layers``), in SBP terms:
# ``tp`` splits the block's weights (S(0) column-parallel, S(1) row-parallel, partial sums
# all-reduced to B at its boundary); ``replicate`` keeps them whole (B) and every tensor-parallel
# rank computes the block on the whole micro-batch; ``batch`` keeps them whole (B), splits the
# block's activations by sample (S(0)) and all-reduces the weights' partial gradients (P -> B).
LAYER_LAYOUTS: tuple[str, ...] = ("tp", "replicate", "batch")
# The token embedding and the tied LM head: split by vocabulary, or whole on every rank.
VOCAB_LAYOUTS: tuple[str, ...] = ("split", "replicate")
# Pipeline stages on their own layouts (``ParallelPlan.stages``): the ``dp`` ranks that run a
# stage split its micro-batches by sample (``batch``, plain pipeline x data parallelism) or run
# it tensor-parallel on the samples of all of them together (``tp``).
STAGE_LAYOUTS: tuple[str, ...] = ("batch", "tp")
# The axes of a grid plan's tensor-parallel ranks (``ParallelPlan.grid``), in that order.
GRID_AXES: tuple[str, ...] = ("rows", "cols", "depth")
# Activation recomputation per block: "full" recomputes the whole block before its backward;
# "selective" is Megatron-LM's (Korthikanti et al.): only the attention core (scores, softmax,
# their product with the values) is recomputed, every projection's output kept;
# "selective_op" is torchtitan's op-level policy: the outputs of every other matmul and of the
# attention kernels are kept, everything else recomputed.
RECOMPUTE: tuple[str, ...] = ("none", "selective", "selective_op", "full")
# Training precision: fp32 throughout, or autocast (mixed precision with fp32 weights; FSDP
# keeps its shards in fp32 and computes in the 16-bit type); fp8 linears need a GPU with fp8.
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8")
# Chunks of the model per pipeline rank under the interleaved schedule when none are given.
DEFAULT_VIRTUAL_STAGES = 2
# How context-parallel ranks exchange keys and values: ``ring`` passes each rank's K/V block to
# the next rank while it computes attention on the one it holds (Megatron's p2p ring attention,
# overlapped); ``all_gather`` gathers the whole sequence's K/V before attention (Llama 3's).
CP_COMM: tuple[str, ...] = ("ring", "all_gather")
# ZeRO stages without FSDP: 1 shards the optimizer states and fp32 master weights over dp
# (gradients all-reduced), 2 also the gradients (reduce-scattered); FSDP is stage 3.
ZERO_STAGES: tuple[int, ...] = (0, 1, 2)


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class ParallelPlan:
    """``dp * tp * pp * cp`` ranks; ``dp=None`` takes whatever the world size leaves.

    ``cp`` splits every sequence over that many ranks (context parallelism; ``cp_comm`` says how
    they exchange keys and values); ``zero`` shards optimizer states (1) and gradients (2) over
    the data-parallel ranks without sharding the weights; ``distributed_optimizer`` is
    Megatron-LM's (fp32 master weights and Adam's states sharded, gradients reduce-scattered
    into a whole fp32 buffer).

    ``fsdp`` shards parameters over the data-parallel ranks (FSDP2 ``fully_shard``), one call per
    entry of ``fsdp_groups`` (module paths) or per top-level block when it is ``None``.
    ``micro_batches`` splits each rank's batch (pipeline micro-batches, or gradient accumulation
    when ``pp == 1``).

    With ``tp > 1``, ``layers`` places each repeated block of the model (in model order, one
    entry a block) on the tensor-parallel ranks with one of ``LAYER_LAYOUTS``; empty means every
    block ``tp``. ``vocab`` places the token embedding and LM head (``VOCAB_LAYOUTS``).

    With ``pp > 1``, ``stages`` gives each pipeline stage its layout over the ``dp`` ranks that
    run it (``STAGE_LAYOUTS``; empty means every stage ``batch``): ``tp`` stages first, then
    ``batch`` ones, one stage a rank. Activations leaving the last ``tp`` stage are resharded
    from the stage's ranks (each holding all samples) to the next stage's (each its share).

    ``grid`` (``[rows, cols, depth]``) splits every linear layer of the blocks over a 3-D grid
    of the ``tp = rows * cols * depth`` tensor-parallel ranks, AxoNN's way
    (``executor/grid.py``); ``[1, tp, 1]`` is Megatron's 1-D split. ``grid_overlap`` issues the
    grid's backward collectives asynchronously, overlapped with the layer's weight gradient and
    the earlier layers' backward.
    """

    dp: int | None = None
    tp: int = 1
    pp: int = 1
    fsdp: bool = False
    fsdp_groups: tuple[tuple[str, ...], ...] | None = None
    micro_batches: int = 1
    pp_schedule: PipelineSchedule = "1f1b"
    layers: tuple[str, ...] = ()
    vocab: str = "split"
    stages: tuple[str, ...] = ()
    grid: tuple[int, ...] = ()
    grid_overlap: bool = True
    recompute: str = "none"
    sequence_parallel: bool = False
    virtual_stages: int | None = None
    distributed_optimizer: bool = False
    async_tp: bool = False
    cp: int = 1
    cp_comm: str = "ring"
    zero: int = 0
    ep: int = 1
    etp: int = 1
    dispatcher: str = "all_to_all"
    capacity_factor: float | None = None
    ep_overlap: bool = False

    def __post_init__(self) -> None:
        if self.dp is not None:
            expect_int(self.dp, "parallel.dp", InvalidStrategyError)
        expect_int(self.tp, "parallel.tp", InvalidStrategyError)
        expect_int(self.pp, "parallel.pp", InvalidStrategyError)
        expect_int(self.cp, "parallel.cp", InvalidStrategyError)
        expect_int(self.micro_batches, "parallel.micro_batches", InvalidStrategyError)
        if not isinstance(self.fsdp, bool):
            raise InvalidStrategyError(f"parallel.fsdp must be true or false, got {self.fsdp!r}")
        expect_choice(
            self.pp_schedule, PIPELINE_SCHEDULES, "parallel.pp_schedule", InvalidStrategyError
        )
        if self.fsdp_groups is not None:
            if not self.fsdp:
                raise InvalidStrategyError(
                    "parallel.fsdp_groups is set but parallel.fsdp is false"
                )
            object.__setattr__(
                self, "fsdp_groups", string_groups(self.fsdp_groups, "parallel.fsdp_groups")
            )
        self._check_grid()
        self._check_layouts()
        self._check_stages()
        self._check_gpu_grade()
        check_experts(self)
        if self.pp > 1 and self.micro_batches < self.pp and self.pp_schedule != "gpipe":
            raise InvalidStrategyError(
                f"parallel.micro_batches({self.micro_batches}) < pp({self.pp}): the "
                f"{self.pp_schedule} schedule needs at least one micro-batch per stage"
            )

    def _check_gpu_grade(self) -> None:
        expect_choice(self.recompute, RECOMPUTE, "parallel.recompute", InvalidStrategyError)
        for name in ("sequence_parallel", "distributed_optimizer", "async_tp"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidStrategyError(
                    f"parallel.{name} must be true or false, got {getattr(self, name)!r}"
                )
        for name in ("sequence_parallel", "async_tp"):
            if getattr(self, name) and self.tp == 1:
                raise InvalidStrategyError(f"parallel.{name} needs tp > 1, got tp(1)")
            if getattr(self, name) and (self.grid or self.per_layer or self.stages):
                raise InvalidStrategyError(
                    f"parallel.{name} applies to Megatron's 1-D split of every block; it does "
                    "not combine with parallel.grid, layers, vocab or stages"
                )
        if self.distributed_optimizer and self.fsdp:
            raise InvalidStrategyError(
                "parallel.distributed_optimizer and parallel.fsdp both shard the optimizer "
                "states over dp; give one (FSDP also shards the parameters)"
            )
        expect_choice(self.cp_comm, CP_COMM, "parallel.cp_comm", InvalidStrategyError)
        if self.zero not in ZERO_STAGES or isinstance(self.zero, bool):
            raise InvalidStrategyError(
                f"parallel.zero must be one of {', '.join(map(str, ZERO_STAGES))} (FSDP is "
                f"stage 3: parallel.fsdp), got {self.zero!r}"
            )
        if self.zero and (self.fsdp or self.distributed_optimizer):
            other = "fsdp" if self.fsdp else "distributed_optimizer"
            raise InvalidStrategyError(
                f"parallel.zero({self.zero}) and parallel.{other} both shard the optimizer "
                "states over dp; give one"
            )
        if self.cp > 1 and (self.grid or self.per_layer or self.stages):
            raise InvalidStrategyError(
                f"parallel.cp({self.cp}) applies to Megatron's 1-D layouts; it does not "
                "combine with parallel.grid, layers, vocab or stages"
            )
        if self.virtual_stages is not None:
            expect_int(self.virtual_stages, "parallel.virtual_stages", InvalidStrategyError)
            if self.virtual_stages > 1 and self.pp_schedule != "interleaved_1f1b":
                raise InvalidStrategyError(
                    f"parallel.virtual_stages({self.virtual_stages}) > 1 needs pp_schedule "
                    f"'interleaved_1f1b', got {self.pp_schedule!r}"
                )
            if self.virtual_stages == 1 and self.pp_schedule == "interleaved_1f1b":
                raise InvalidStrategyError(
                    "pp_schedule 'interleaved_1f1b' needs parallel.virtual_stages >= 2 (model "
                    "chunks per rank), got 1"
                )

    @property
    def chunks(self) -> int:
        """Model chunks (virtual stages) per pipeline rank."""
        if self.virtual_stages is not None:
            return self.virtual_stages
        return DEFAULT_VIRTUAL_STAGES if self.pp_schedule == "interleaved_1f1b" else 1

    def _check_layouts(self) -> None:
        if isinstance(self.layers, str) or not isinstance(self.layers, Sequence):
            raise InvalidStrategyError(
                f"parallel.layers must be a list with one of {', '.join(LAYER_LAYOUTS)} per "
                f"block, got {self.layers!r}"
            )
        object.__setattr__(self, "layers", tuple(self.layers))
        for index, layout in enumerate(self.layers):
            expect_choice(layout, LAYER_LAYOUTS, f"parallel.layers[{index}]", InvalidStrategyError)
        expect_choice(self.vocab, VOCAB_LAYOUTS, "parallel.vocab", InvalidStrategyError)
        if self.tp == 1 and (self.layers or self.vocab != "split"):
            raise InvalidStrategyError(
                "parallel.layers and parallel.vocab place layers on tensor-parallel ranks; "
                f"they need tp > 1, got tp({self.tp})"
            )
        if self.layers and (self.pp > 1 or self.fsdp):
            raise InvalidStrategyError(
                "parallel.layers combines with data parallelism only; this plan has "
                f"pp({self.pp}), fsdp({self.fsdp})"
            )

    def _check_grid(self) -> None:
        if not isinstance(self.grid_overlap, bool):
            raise InvalidStrategyError(
                f"parallel.grid_overlap must be true or false, got {self.grid_overlap!r}"
            )
        if isinstance(self.grid, str) or not isinstance(self.grid, Sequence):
            raise InvalidStrategyError(
                f"parallel.grid must be a list [rows, cols, depth], got {self.grid!r}"
            )
        object.__setattr__(self, "grid", tuple(self.grid))
        if not self.grid:
            return
        if len(self.grid) != len(GRID_AXES):
            raise InvalidStrategyError(
                f"parallel.grid must be a list [rows, cols, depth] of 3 sizes, got "
                f"{list(self.grid)}"
            )
        for axis, size in zip(GRID_AXES, self.grid, strict=True):
            expect_int(size, f"parallel.grid {axis}", InvalidStrategyError)
        product = self.grid[0] * self.grid[1] * self.grid[2]
        if self.tp == 1 and product > 1:
            object.__setattr__(self, "tp", product)
        elif self.tp != product:
            raise InvalidStrategyError(
                f"parallel.grid rows({self.grid[0]}) * cols({self.grid[1]}) * "
                f"depth({self.grid[2]}) = {product} != tp({self.tp}): the grid holds the "
                "tensor-parallel ranks"
            )
        if product == 1:
            raise InvalidStrategyError(
                "parallel.grid [1, 1, 1] splits nothing; leave grid out for plain data parallelism"
            )
        if self.pp > 1 or self.fsdp or self.layers or self.vocab != "split" or self.stages:
            raise InvalidStrategyError(
                "parallel.grid combines with data parallelism only (no pp, fsdp, layers, vocab "
                f"or stages); this plan has pp({self.pp}), fsdp({self.fsdp}), "
                f"layers({len(self.layers)}), vocab({self.vocab}), stages({len(self.stages)})"
            )

    def _check_stages(self) -> None:
        if isinstance(self.stages, str) or not isinstance(self.stages, Sequence):
            raise InvalidStrategyError(
                f"parallel.stages must be a list with one of {', '.join(STAGE_LAYOUTS)} per "
                f"stage, got {self.stages!r}"
            )
        object.__setattr__(self, "stages", tuple(self.stages))
        if not self.stages:
            return
        for index, layout in enumerate(self.stages):
            expect_choice(layout, STAGE_LAYOUTS, f"parallel.stages[{index}]", InvalidStrategyError)
        if self.pp == 1 or len(self.stages) != self.pp:
            raise InvalidStrategyError(
                f"parallel.stages gives {len(self.stages)} layouts for pp({self.pp}) stages: "
                "give one a stage of a pipeline"
            )
        if self.pp_schedule == "interleaved_1f1b" or self.tp > 1 or self.fsdp:
            raise InvalidStrategyError(
                "parallel.stages needs one stage a rank (gpipe, 1f1b or eager_1f1b), tp 1 and no "
                "fsdp; got "
                f"{self.pp_schedule}, tp({self.tp}), fsdp({self.fsdp})"
            )
        first_batch = self.stages.index("batch") if "batch" in self.stages else len(self.stages)
        if "tp" in self.stages[first_batch:] or first_batch == len(self.stages):
            raise InvalidStrategyError(
                f"parallel.stages {list(self.stages)}: the tp stages must come first and the "
                "last stage must be batch (its ranks compute the loss of their own samples)"
            )

    @property
    def grid_axes(self) -> dict[str, int]:
        """The grid's sizes by axis name (``rows``, ``cols``, ``depth``); all 1 without one."""
        return dict(zip(GRID_AXES, self.grid or (1, 1, 1), strict=True))

    @property
    def samples_split(self) -> int:
        """How many parts a data-parallel rank's micro-batch is cut into by sample: a grid's
        depth (each depth slice computes its own samples), else 1."""
        return self.grid[2] if self.grid else 1

    @property
    def per_layer(self) -> bool:
        """Whether the plan places layers itself (``layers`` given, or ``vocab`` not split)."""
        return bool(self.layers) or self.vocab != "split"

    def layout_of(self, block: int) -> str:
        """The layout of the ``block``-th repeated block (``tp`` when ``layers`` is empty)."""
        return self.layers[block] if self.layers else "tp"

    def resolve_dp(self, world_size: int) -> int:
        """The data-parallel degree on ``world_size`` ranks.

        Raises:
            InvalidStrategyError: when ``dp * tp * pp != world_size``.
        """
        model_parallel = self.tp * self.pp * self.cp
        dp = self.dp if self.dp is not None else world_size // model_parallel
        if dp * model_parallel != world_size or dp < 1:
            shown = self.dp if self.dp is not None else f"auto={dp}"
            cp = f" * cp({self.cp})" if self.cp > 1 else ""
            raise InvalidStrategyError(
                f"dp({shown}) * tp({self.tp}) * pp({self.pp}){cp} != world_size({world_size})"
            )
        expert_data_parallel(self, dp)
        return dp

    def rank_batch_size(self, batch_size: int, world_size: int) -> int:
        """The micro-batch one data-parallel rank runs at a time: the global ``batch_size``
        over ``dp * micro_batches``.

        Raises:
            InvalidStrategyError: ``dp * tp * pp != world_size``, or a batch that does not
                split into ``dp * micro_batches`` equal parts.
        """
        dp = self.resolve_dp(world_size)
        if batch_size % (dp * self.micro_batches):
            raise InvalidStrategyError(
                f"batch_size({batch_size}) is not divisible by dp({dp}) * "
                f"micro_batches({self.micro_batches}): every rank needs equal micro-batches"
            )
        rank_batch = batch_size // (dp * self.micro_batches)
        if rank_batch % self.samples_split:
            raise InvalidStrategyError(
                f"a micro-batch of {rank_batch} samples (batch_size({batch_size}) / dp({dp}) / "
                f"micro_batches({self.micro_batches})) does not split over the grid's "
                f"depth({self.samples_split}): each depth slice needs an equal share"
            )
        return rank_batch

    def fits(self, batch_size: int, world_size: int) -> bool:
        """Whether the plan runs ``batch_size`` on ``world_size`` ranks
        (:meth:`rank_batch_size` would not raise)."""
        try:
            self.rank_batch_size(batch_size, world_size)
        except InvalidStrategyError:
            return False
        return True

    @property
    def label(self) -> str:
        """A short name of the plan (``tp2 m2``, ``pp4 1f1b m8``, ``fsdp``; ``ddp`` for plain
        data parallelism)."""
        return " ".join(self.features(fsdp="fsdp", micro_batches="m{}")) or "ddp"

    def features(self, *, fsdp: str, micro_batches: str) -> list[str]:
        """What sets the plan apart from plain data parallelism, in the order its names show
        it: tensor and pipeline degrees, the pipeline's schedule, FSDP (spelt ``fsdp``), the
        micro-batches (``micro_batches`` formatted with their count)."""
        parts = [
            f"{key}{getattr(self, key)}" for key in ("tp", "pp", "cp") if getattr(self, key) > 1
        ]
        if self.cp > 1 and self.cp_comm != "ring":
            parts.append(f"cp {self.cp_comm}")
        parts += expert_features(self)
        if self.grid:
            parts.append("grid " + "x".join(str(n) for n in self.grid))
            if not self.grid_overlap:
                parts.append("no overlap")
        if self.per_layer:
            parts.append(f"layers {layout_summary(self.layers)} vocab {self.vocab}")
        if self.stages:
            parts.append(f"stages {','.join(self.stages)}")
        if self.pp > 1:
            parts.append(self.pp_schedule)
        if self.virtual_stages is not None and self.virtual_stages != DEFAULT_VIRTUAL_STAGES:
            parts.append(f"v{self.virtual_stages}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.async_tp:
            parts.append("async-tp")
        if self.fsdp:
            parts.append(fsdp)
        if self.distributed_optimizer:
            parts.append("dist-opt")
        if self.zero:
            parts.append(f"zero{self.zero}")
        if self.recompute != "none":
            parts.append(f"recompute {self.recompute}")
        if self.micro_batches > 1:
            parts.append(micro_batches.format(self.micro_batches))
        return parts


def layout_summary(layers: Sequence[str]) -> str:
    """Per-layer layouts in runs (``tp*4,batch*8``); ``tp`` when there are none."""
    runs: list[list[Any]] = []
    for layout in layers or ("tp",):
        if runs and runs[-1][0] == layout:
            runs[-1][1] += 1
        else:
            runs.append([layout, 1])
    return ",".join(f"{layout}*{count}" if count > 1 else layout for layout, count in runs)


def string_groups(groups: Any, where: str) -> tuple[tuple[str, ...], ...]:
    if isinstance(groups, str) or not isinstance(groups, Sequence):
        raise InvalidStrategyError(f"{where} must be a list of lists of names, got {groups!r}")
    out = []
    for index, group in enumerate(groups):
        if isinstance(group, str) or not isinstance(group, Sequence):
            raise InvalidStrategyError(f"{where}[{index}] must be a list of names, got {group!r}")
        for name in group:
            if not isinstance(name, str):
                raise InvalidStrategyError(f"{where}[{index}] holds a non-string {name!r}")
        out.append(tuple(group))
    return tuple(out)
