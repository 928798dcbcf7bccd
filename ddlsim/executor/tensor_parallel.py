"""Tensor parallelism (Megatron-style) with PyTorch's DTensor; sequence parallelism on top of it in
``executor/sequence_parallel.py``.

Every transformer block is split over ``ctx.mesh["tp"]`` as torchtitan splits it: the attention
input projections and the first MLP projections are column-parallel (each rank computes whole
heads and a slice of the intermediate size), the attention output and second MLP projections are
row-parallel (their partial outputs are all-reduced); the token embedding is split by vocabulary
rows and the LM head by vocabulary columns, its logits all-gathered so that the model's own loss
runs unchanged. Norms, position embeddings and task heads other than the LM head stay
replicated: their inputs and gradients are identical on every tensor-parallel rank, so their
gradients are too and need no communication.

Attention modules keep computing with the per-rank head count: the attributes that hold it (and
the widths derived from it) are divided by ``tp``, as torchtitan does for its own attention; under
a plan derived from module structure (``data/tp_generic.py``) each attention module also gets
its own copy of the config with local head counts. A derived plan's fused projections laid out
as ``[q | k | v]`` or ``[gate | up]`` parts get their output rows reordered first, as GPT-2's
``c_attn``, so that each rank's column shard holds its slice of every part.

When ``dp > 1`` the same model is replicated over ``ctx.mesh["dp"]``: after backward, the local
shard of every gradient is averaged over the data-parallel group, in one flat all-reduce.

The model surgery around the split (GPT-2's below, a derived plan's fused parts, row-parallel
outputs and head-shared gradients) lives in ``executor/tp_surgery.py``.

GPT-2 needs two preparations before its plan applies. Its projections are transformers'
``Conv1D`` (``x @ W + b`` with ``W: [in, out]``); ``ColwiseParallel``/``RowwiseParallel`` know
only ``nn.Linear`` (``W: [out, in]``), so each ``Conv1D`` becomes an ``nn.Linear`` holding the
transposed weight (same function, same initial values). And ``c_attn`` is a fused query/key/value
projection whose output is ``[q | k | v]``: a plain column split would give rank 0 all of ``q``
and half of ``k``, so its output rows are first reordered to ``[q_0 k_0 v_0 | q_1 k_1 v_1 ...]``
(rank ``r``'s heads of each), as Megatron interleaves its fused QKV; the attention's
``split_size`` then becomes the local width. AdamW and SGD are elementwise, so the reordering
does not change the optimizer's arithmetic.

Per-layer placements (``parallel.layers``, ``parallel.vocab``) place each repeated block of the
model on its own: a ``tp`` block is split as above; a ``replicate`` block keeps its weights whole
and computes the whole micro-batch on every tensor-parallel rank (no communication: its inputs
and output gradients are the same on every rank, so are its gradients); a ``batch`` block keeps
its weights whole and computes ``1 / tp`` of the micro-batch's samples on each rank. Its batched
inputs (hidden states, masks: tensors of two or more dimensions whose first is the micro-batch)
are redistributed from Replicate to Shard(0) as it starts (a local slice; its gradient is
all-gathered in backward), its hidden states from Shard(0) to Replicate after it unless the next
block is ``batch`` too (an all-gather; a slice in backward), and its weights' gradients, partial
sums over the samples of each rank, are summed over the tensor-parallel group after backward.
``vocab: replicate`` keeps the token embedding and LM head whole.
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.strategy import ParallelPlan, layout_summary
from ddlsim.executor.context import (
    RankContext,
    SynchronousTrainer,
    average_over_group,
    split_batch,
)
from ddlsim.executor.sequence_parallel import apply_sequence_parallel
from ddlsim.executor.tp_surgery import (
    PREPARE,
    conv1d_to_linear,
    head_shared_parameters,
    interleaved_qkv_rows,
    interleaved_rows,
    own_storage,
    reorder_fused,
    sum_head_shared_gradients,
)
from ddlsim.plans.tp_plans import (
    TensorParallelPlan,
    block_of,
    block_paths,
    check_tensor_parallel,
    localize_attention,
    matches,
    tp_plan,
)

# Style names, as ``applied()`` reports them, and the DTensor style each one stands for.
_STYLES: dict[str, Callable[[], ParallelStyle]] = {
    # Output features split: each rank computes whole heads / a slice of the intermediate size.
    "colwise": ColwiseParallel,
    # Input features split; partial outputs all-reduced into the replicated activation.
    "rowwise": RowwiseParallel,
    # Embedding rows (vocabulary) split; lookups outside a rank's rows give zeros, all-reduced.
    "vocab_embedding": lambda: RowwiseParallel(input_layouts=Replicate()),
    # Vocabulary columns of the LM head split, logits all-gathered for the model's own loss.
    "vocab_head": lambda: ColwiseParallel(output_layouts=Replicate()),
    # An embedding whose columns are heads (T5's relative position bias): local heads only.
    "head_embedding": ColwiseParallel,
    # Sequence parallelism: partial outputs reduce-scattered into sequence shards.
    "rowwise_sequence": lambda: RowwiseParallel(output_layouts=Shard(1)),
}


def _tied_groups(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Parameters shared by several modules: ``(module, attribute)`` per use, per parameter."""
    uses: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            uses.setdefault(id(param), []).append((module, name))
    return [group for group in uses.values() if len(group) > 1]


def _retie(groups: list[list[tuple[nn.Module, str]]]) -> None:
    """Make every use of a tied parameter point at its one distributed version again.

    ``parallelize_module`` distributes each module's parameters separately, which would give a
    tied embedding and LM head two independent copies; both are split along the vocabulary
    (``Shard(0)``), so one ``DTensor`` serves both. A plan must therefore split alike every
    module whose forward uses a tied parameter (an unused alias, such as BERT's
    ``cls.predictions.bias``, may stay unsplit: it only gets the shared ``DTensor``).
    """
    for group in groups:
        params = [getattr(module, name) for module, name in group]
        shared = [p for p in params if isinstance(p, DTensor)]
        if not shared:
            continue
        keep = shared[0]
        for other in shared[1:]:
            if other.placements != keep.placements:
                raise InvalidStrategyError(
                    f"tied parameters are split differently ({keep.placements} vs "
                    f"{other.placements}); the tensor-parallel plan must split them alike"
                )
        for module, name in group:
            setattr(module, name, keep)


def apply_tensor_parallel(
    model: nn.Module,
    plan: TensorParallelPlan,
    mesh: Any,
    tp: int,
    parallel: ParallelPlan | None = None,
) -> dict[str, str]:
    """Split ``model`` in place over the 1-D ``mesh``; the style applied to each module path.

    With ``parallel``'s per-layer placements only the ``tp`` blocks (and the vocabulary
    modules when ``vocab`` is ``split``) are split; ``batch`` blocks get their hooks from
    :func:`split_batch_blocks`.
    """
    parallel = parallel or ParallelPlan(tp=tp)
    blocks = block_paths(plan, (path for path, _ in model.named_modules() if path))

    def split(path: str) -> bool:
        index = block_of(blocks, path)
        return index is None or parallel.layout_of(index) == "tp"

    prepare = None if plan.derived else PREPARE.get(plan.family)
    if prepare is not None:
        prepare(model, tp, split)
    reorder_fused(model, plan, tp, split)
    tied = _tied_groups(model)
    styles: dict[str, str] = {}
    for path, module in model.named_modules():
        if not path or not split(path):
            continue
        for pattern, style in plan.modules.items():
            if matches(pattern, path):
                if not (parallel.vocab == "replicate" and style.startswith("vocab_")):
                    styles[path] = style
                break
        if matches(plan.attention, path):
            localize_attention(module, plan, tp)
    if parallel.sequence_parallel:
        styles = {
            path: "rowwise_sequence" if style == "rowwise" else style
            for path, style in styles.items()
        }
    parallelize_module(model, mesh, {path: _STYLES[style]() for path, style in styles.items()})
    if plan.derived:
        # A row-parallel output is a view of its DTensor's local shard, which autograd forbids
        # modifying in place; the blocks of some families add into it (Falcon's
        # ``mlp_output += attention_output``): give it storage of its own.
        for path, style in styles.items():
            if style.startswith("rowwise"):
                model.get_submodule(path).register_forward_hook(own_storage)
    sum_head_shared_gradients(model, plan, mesh, split)
    _retie(tied)
    _keep_gradients_split(model)
    return styles


def _keep_gradients_split(model: nn.Module) -> None:
    """Give every split parameter's gradient the parameter's own placements as it lands.

    DTensor's sharding propagation may leave a gradient whole although its parameter is split:
    a vocabulary-split embedding's backward (Replicate token ids, Replicate output gradient)
    can come out ``Replicate``, depending on what the process propagated before (llama and
    mistral, the first plan a process builds). Each rank would then average and step the whole
    table over its data-parallel group, twice the bytes of its shard. Slicing a replicated
    gradient to the parameter's shard is local (no communication) and what every plan expects.
    """

    def reshard(param: torch.Tensor) -> None:
        grad = param.grad
        if (
            isinstance(param, DTensor)
            and isinstance(grad, DTensor)
            and grad.placements != param.placements
        ):
            param.grad = grad.redistribute(param.device_mesh, param.placements)

    for param in model.parameters():
        if isinstance(param, DTensor) and param.requires_grad:
            param.register_post_accumulate_grad_hook(reshard)


def _split_samples(x: torch.Tensor, mesh: Any) -> torch.Tensor:
    """This rank's ``1 / tp`` of the samples (Replicate -> Shard(0)); the gradient is
    all-gathered in backward."""
    if not x.requires_grad:
        return x.chunk(mesh.size())[mesh.get_local_rank()]
    whole = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
    return whole.redistribute(mesh, [Shard(0)]).to_local()


def _gather_samples(x: torch.Tensor, mesh: Any) -> torch.Tensor:
    """Every rank's samples (Shard(0) -> Replicate, an all-gather); a slice in backward."""
    part = DTensor.from_local(x, mesh, [Shard(0)], run_check=False)
    return part.redistribute(mesh, [Replicate()]).to_local()


def split_batch_blocks(
    model: nn.Module, plan: TensorParallelPlan, parallel: ParallelPlan, mesh: Any, batch: int
) -> list[nn.Parameter]:
    """Hook every ``batch`` block so that it computes this rank's share of the ``batch``
    samples of a micro-batch; the parameters whose gradients must be summed over ``mesh``."""
    blocks = block_paths(plan, (path for path, _ in model.named_modules() if path))
    params: list[nn.Parameter] = []

    def split_inputs(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        def cut(x: Any) -> Any:
            batched = isinstance(x, torch.Tensor) and x.dim() >= 2 and x.shape[0] == batch
            return _split_samples(x, mesh) if batched else x

        return tuple(cut(x) for x in args), {key: cut(x) for key, x in kwargs.items()}

    def gather_output(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if isinstance(output, torch.Tensor):
            return _gather_samples(output, mesh)
        first = _gather_samples(output[0], mesh)
        return type(output)((first, *output[1:]))

    for index, path in enumerate(blocks):
        if parallel.layout_of(index) != "batch":
            continue
        block = model.get_submodule(path)
        block.register_forward_pre_hook(split_inputs, with_kwargs=True)
        last = index + 1 == len(blocks) or parallel.layout_of(index + 1) != "batch"
        if last:
            block.register_forward_hook(gather_output, with_kwargs=True)
        params.extend(block.parameters())
    return params


def _refuse_fsdp_of_head_shared(
    model: nn.Module, plan: TensorParallelPlan, parallel: ParallelPlan
) -> None:
    """FSDP would replace the parameters whose gradients are summed over the heads' ranks as
    they arrive (:func:`head_shared_parameters`), losing the sum: refuse, naming one."""
    blocks = block_paths(plan, (path for path, _ in model.named_modules() if path))

    def split(path: str) -> bool:
        index = block_of(blocks, path)
        return index is None or parallel.layout_of(index) == "tp"

    shared = {id(p) for p in head_shared_parameters(model, plan, split)}
    names = [name for name, param in model.named_parameters() if id(param) in shared]
    if names:
        raise InvalidStrategyError(
            f"parallel.fsdp with tp: {names[0]} (and {len(names) - 1} more) is kept whole by "
            "its split attention and its gradient summed over the tensor-parallel ranks, which "
            "FSDP's sharding would bypass; run tp without fsdp"
        )


class TensorParallelTrainer(SynchronousTrainer):
    """The model split over ``ctx.mesh["tp"]``, replicated over ``ctx.mesh["dp"]``.

    Each rank trains on its data-parallel share of the global batch in
    ``parallel.micro_batches`` micro-batches (gradients accumulate). All tensor-parallel ranks
    compute the same loss, so ``step`` returns the local mean loss divided by ``dp * tp``.
    """

    def __init__(self, ctx: RankContext, model: nn.Module) -> None:
        check_tensor_parallel(ctx.spec, ctx.tp)
        self.ctx = ctx
        self.plan = tp_plan(ctx.spec)
        self.model = model
        parallel = ctx.strategy.parallel
        self.parallel = parallel
        self.styles = apply_tensor_parallel(model, self.plan, ctx.mesh["tp"], ctx.tp, parallel)
        self.dp_group = ctx.mesh["dp"].get_group() if ctx.dp > 1 else None
        self.batches = split_batch(ctx.dp_slice(), parallel.micro_batches)
        micro_batch = len(next(iter(self.batches[0].values())))
        self.batch_params = split_batch_blocks(
            model, self.plan, parallel, ctx.mesh["tp"], micro_batch
        )
        self.sequence_params = (
            apply_sequence_parallel(model, self.plan, ctx.mesh["tp"])
            if parallel.sequence_parallel
            else []
        )
        self.tp_group = ctx.mesh["tp"].get_group()
        if parallel.fsdp:
            _refuse_fsdp_of_head_shared(model, self.plan, parallel)
            # 2-D: each block's tensor-parallel shards sharded again over dp (FSDP2 over
            # DTensor parameters), as torchtitan composes them; FSDP reduce-scatters the
            # gradients over dp, so no all-reduce of them is left to do.
            policy = ctx.precision.fsdp_policy()
            for path in block_paths(self.plan, (p for p, _ in model.named_modules() if p)):
                fully_shard(model.get_submodule(path), mesh=ctx.mesh["dp"], mp_policy=policy)
            fully_shard(model, mesh=ctx.mesh["dp"], mp_policy=policy)
            self.dp_group = None
        self.optimizer = ctx.make_optimizer(model.parameters())

    def step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.ctx.device)
        for index, batch in enumerate(self.batches):
            if isinstance(self.model, FSDPModule):
                # Gradients of all but the last micro-batch accumulate unsharded, unsynchronized.
                self.model.set_requires_gradient_sync(index == len(self.batches) - 1)
            loss = self.ctx.loss(self.model, batch) / len(self.batches)
            self.ctx.backward(loss)
            total += loss.detach()
        # Each rank's gradients of these cover its samples (batch blocks) or its sequence
        # shard (sequence parallelism): the whole gradient is their sum.
        partial = [p.grad for p in self.batch_params + self.sequence_params if p.grad is not None]
        if partial:
            average_over_group(partial, self.tp_group, 1)
        if self.dp_group is not None:
            self._average_gradients_over_dp()
        self.ctx.step(self.optimizer)
        return total / (self.ctx.dp * self.ctx.tp)

    def _average_gradients_over_dp(self) -> None:
        """Average every gradient's local shard over the data-parallel group (one all-reduce)."""
        # ``to_local`` aliases the DTensor's storage, so writing the average back updates it.
        grads = [
            p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            for p in self.model.parameters()
            if p.grad is not None
        ]
        average_over_group(grads, self.dp_group, self.ctx.dp)

    def applied(self) -> dict[str, Any]:
        return {
            "plan": "tp",
            "fsdp": self.parallel.fsdp,
            "family": self.plan.family,
            "derived": self.plan.derived,
            "tp": self.ctx.tp,
            "dp": self.ctx.dp,
            "parallelized": sorted(self.styles),
            "layers": layout_summary(self.parallel.layers),
            "vocab": self.parallel.vocab,
            "sequence_parallel": self.parallel.sequence_parallel,
            "styles": dict(sorted(self.styles.items())),
            "collectives": self._collectives(),
        }

    def _collectives(self) -> list[str]:
        """The collectives the plan issues, ``kind:mesh dimension``, in a fixed order."""
        styles = set(self.styles.values())
        out = []
        # Row-parallel outputs are partial sums; column-parallel inputs get partial gradients.
        split = {"rowwise", "vocab_embedding", "colwise", "head_embedding"}
        if styles & split or "batch" in self.parallel.layers:
            out.append("all_reduce:tp")
        if "rowwise_sequence" in styles:
            out += ["reduce_scatter:tp", "all_gather:tp"]
        if "vocab_head" in styles or "batch" in self.parallel.layers:
            out.append("all_gather:tp")
        if self.dp_group is not None:
            out.append("all_reduce:dp")
        if self.parallel.fsdp:
            out += ["all_gather:dp", "reduce_scatter:dp"]
        return list(dict.fromkeys(out))


__all__ = [
    "PREPARE",
    "TensorParallelTrainer",
    "apply_tensor_parallel",
    "conv1d_to_linear",
    "interleaved_qkv_rows",
    "interleaved_rows",
    "split_batch_blocks",
]
