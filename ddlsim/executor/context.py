"""What every parallel plan's trainer gets (``RankContext``) and must provide (``Trainer``).

``SynchronousTrainer`` is the base of the trainers whose ``step`` leaves nothing in flight, and
``average_over_group`` the gradient average that the trainers which average by hand share.

Ranks are laid out as torchtitan and Megatron-LM lay them out: ``rank = ((pp_rank * dp +
dp_rank) * cp + cp_rank) * tp + tp_rank``, tensor parallelism innermost (its ranks are
neighbours), then context parallelism, pipeline stages outermost.
Every rank builds the same model from the same seed and the same global batch; a trainer takes
its share of that batch (``dp_slice``) so that the losses can be compared with single-process
training on the whole batch.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.models import build_model, training_loss
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.executor.precision import Precision


@dataclasses.dataclass(kw_only=True)
class RankContext:
    """One rank's place in the run.

    ``mesh`` is a ``DeviceMesh`` of shape ``(pp, dp, tp)`` with dimension names
    ``("pp", "dp", "tp")`` (``(pp, dp, cp, tp)`` with context parallelism), or ``None`` for
    single-process training. ``global_batch`` is the
    whole global batch (identical on every rank). ``make_optimizer`` builds the run's optimizer
    over the given parameters (the same kind and settings for every plan).
    """

    rank: int
    world_size: int
    dp: int
    tp: int
    pp: int
    spec: ModelSpec
    strategy: Strategy
    seed: int
    device: torch.device
    global_batch: Mapping[str, torch.Tensor]
    mesh: Any
    optimizer: str = "adamw"
    dropout: bool = False
    frozen: tuple[str, ...] = ()
    cp: int = 1
    _precision: Precision | None = dataclasses.field(default=None, repr=False)

    @property
    def precision(self) -> Precision:
        """The strategy's precision on this rank (autocast, gradient scaler, FSDP policy)."""
        if self._precision is None:
            # FSDP casts through its own policy; a single process (the reference) autocasts.
            sharded = self.strategy.parallel.fsdp and self.world_size > 1
            self._precision = Precision(self.strategy.precision, self.device, sharded=sharded)
        return self._precision

    def loss(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The model's training loss on ``batch`` in the strategy's precision."""
        with self.precision.autocast():
            return local_loss(model, batch)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled first with fp16."""
        self.precision.backward(loss)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``; with fp16 unscaled and skipped on an overflow."""
        self.precision.step(optimizer)

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def cp_rank(self) -> int:
        return (self.rank // self.tp) % self.cp

    @property
    def dp_rank(self) -> int:
        return (self.rank // (self.tp * self.cp)) % self.dp

    @property
    def pp_rank(self) -> int:
        return self.rank // (self.tp * self.cp * self.dp)

    def dp_slice(self) -> dict[str, torch.Tensor]:
        """This data-parallel rank's equal share of the global batch (split along dim 0).

        Raises:
            InvalidStrategyError: when the batch size is not a multiple of ``dp``.
        """
        return split_batch(self.global_batch, self.dp)[self.dp_rank]

    def make_optimizer(self, params: Any, *, shard_over: Any = None) -> torch.optim.Optimizer:
        """The run's optimizer over ``params``; with ``shard_over`` (a process group) its states
        sharded over the group's ranks, ZeRO-1 (``ZeroRedundancyOptimizer``: each rank steps
        its share of the parameters and broadcasts them)."""
        if shard_over is None:
            return make_optimizer(self.optimizer, params)
        from torch.distributed.optim import ZeroRedundancyOptimizer

        cls, settings = optimizer_settings(self.optimizer)
        return ZeroRedundancyOptimizer(
            params, optimizer_class=cls, process_group=shard_over, **settings
        )

    def build_model(self) -> nn.Module:
        """The whole model on this rank's device, identical on every rank (seeded).

        Without ``dropout`` every dropout probability is zero, so that a run's losses can be
        compared with single-process training (dropout draws differ when the batch is split).
        The ``frozen`` parameters (those the captured iteration gives no gradient) stop
        requiring one, as a user would freeze them: every plan then agrees that they are not
        trained (DDP's reducer would otherwise wait for their gradients and fail).
        """
        model = build_model(self.spec, seed=self.seed)
        if not self.dropout:
            disable_dropout(model)
        params = dict(model.named_parameters())
        for name in self.frozen:
            params[name].requires_grad_(False)
        return model.to(self.device)


class Trainer(Protocol):
    """A model wrapped by one parallel plan, on one rank.

    ``step`` runs one whole training iteration (forward, backward, gradient communication,
    optimizer step) and returns this rank's share of the global-batch loss, detached, such that
    the sum over all ranks is the loss of the whole global batch (a data-parallel rank returns
    its mean loss divided by ``dp``; tensor-parallel ranks divide by ``dp * tp`` as they all
    compute the same loss; pipeline stages other than the last return zero). When ``step``
    returns, every gradient collective this iteration needs before its optimizer step has
    completed; work a strategy overlaps with the next iteration (DeAR's all-gathers) may still be
    in flight: ``drain`` completes it (the next ``step`` then starts with none), and ``finish``
    completes it and releases what the trainer holds (no ``step`` after it).

    ``applied`` describes what really ran: at least ``{"plan": ...}``; data-parallel trainers add
    ``buckets`` (launch order, parameter names and bytes) and ``collectives``.
    """

    def step(self) -> torch.Tensor: ...

    def drain(self) -> None: ...

    def finish(self) -> None: ...

    def applied(self) -> dict[str, Any]: ...


class SynchronousTrainer:
    """A ``Trainer`` whose ``step`` completes all of its communication before it returns.

    Such a trainer has no work to drain and holds nothing to release: ``drain`` and ``finish``
    do nothing. Subclasses provide ``step`` and ``applied``.
    """

    def drain(self) -> None:
        return None

    def finish(self) -> None:
        return None


@torch.no_grad()
def average_over_group(grads: Sequence[torch.Tensor], group: Any, size: int) -> None:
    """Replace every tensor in ``grads`` by its mean over the ``size`` ranks of ``group``.

    One all-reduce over a flat copy (so the collective count does not grow with the number of
    tensors); the mean is written back in place. Every rank of ``group`` must pass tensors of
    the same shapes in the same order. Nothing is communicated when ``grads`` is empty.
    """
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat.div_(size)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


OPTIMIZERS = ("adamw", "sgd")


def optimizer_settings(name: str) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The run's optimizer class and settings: AdamW (lr 1e-3, no fused or foreach kernels)
    or SGD with momentum.

    Raises:
        ValueError: another name.
    """
    if name == "adamw":
        return torch.optim.AdamW, {"lr": 1e-3, "foreach": False}
    if name == "sgd":
        return torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "foreach": False}
    raise ValueError(f"optimizer {name!r} is not supported; allowed: {', '.join(OPTIMIZERS)}")


def make_optimizer(name: str, params: Any) -> torch.optim.Optimizer:
    """The run's optimizer (:func:`optimizer_settings`).

    Elementwise optimizers, so that one optimizer per parameter group (DeAR updates bucket by
    bucket) computes exactly what a single optimizer over all parameters does.
    """
    cls, settings = optimizer_settings(name)
    return cls(params, **settings)


def split_batch(batch: Mapping[str, torch.Tensor], parts: int) -> list[dict[str, torch.Tensor]]:
    """``parts`` equal slices of ``batch`` along dim 0 (every field the same way)."""
    sizes = {int(t.shape[0]) for t in batch.values()}
    (size,) = sizes
    if size % parts:
        raise InvalidStrategyError(
            f"batch_size({size}) is not divisible by {parts}: each rank needs an equal share"
        )
    step = size // parts
    return [{k: t[i * step : (i + 1) * step] for k, t in batch.items()} for i in range(parts)]


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability in ``model`` (modules and config) to zero, in place."""
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        # Attention implementations read their dropout from a float attribute or the config.
        for name in ("attention_dropout", "dropout", "attn_dropout"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)
        # Hugging Face configs keep their settings in ``__dict__``; reference configs have none.
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "__dict__"):
            for key, value in vars(config).items():
                if isinstance(value, float) and ("dropout" in key or key.endswith("pdrop")):
                    setattr(config, key, 0.0)


def local_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The model's training loss on ``batch`` (see :func:`data.models.training_loss`)."""
    return training_loss(model, batch)
