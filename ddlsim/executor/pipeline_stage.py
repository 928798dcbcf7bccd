"""One pipeline stage made of a whole model: the model's own forward over the stage's blocks only.

A later stage's first block takes the received activation in place of its hidden-state input;
a stage's last block ends the forward there (:class:`StageModule`). A ``tp`` stage before a
``batch`` stage hands the next stage this rank's share of the samples. :func:`probe_blocks`
measures every block's forward FLOPs and output, which the cuts and the stages' buffers use.
:mod:`.pipeline` runs the stages under the plan's schedule.
"""

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ddlsim.executor.context import local_loss
from ddlsim.plans.stages import BlockStack


class _TakeShare(torch.autograd.Function):
    """A ``tp`` stage's output resharded for the next (``batch``) stage: forward, this rank's
    ``1 / n`` of the samples (a local slice of the replicated activation, sent on by the
    pipeline); backward, the shares' gradients all-gathered over the stage's ``n`` ranks and
    divided by ``n`` (each share's gradient is of its own ranks' mean loss)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, n: int, index: int) -> torch.Tensor:
        ctx.group, ctx.n = group, n
        return x.chunk(n)[index].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        whole = torch.empty((grad.shape[0] * ctx.n, *grad.shape[1:]), dtype=grad.dtype)
        dist.all_gather_into_tensor(whole, grad.contiguous(), group=ctx.group)
        return whole / ctx.n, None, None, None


class _StageEnd(Exception):  # noqa: N818 (control flow, not an error)
    """Raised after a stage's last block to stop the model's forward there."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__("stage boundary")
        self.hidden = hidden


def _hidden(output: Any) -> torch.Tensor:
    """The hidden state a block passes on: the tensor, or the first element of a tuple."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, tuple | list) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"a block returned {type(output).__name__}, not a hidden-state tensor")


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose gradient is made contiguous: a stage sends the gradient of its received
    activation back with gloo, which refuses strided tensors (ConvNeXt's permuted layers)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class _Enter(nn.Module):
    """A stage's first block: its hidden-state input replaced by the received activation."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block
        self.received: torch.Tensor | None = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.received is not None:
            received = _ContiguousGrad.apply(self.received)
            if args:
                args = (received, *args[1:])
            else:
                kwargs["hidden_states"] = received
        return self.block(*args, **kwargs)


class _Exit(nn.Module):
    """A stage's last block: stops the model's forward with its hidden state."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # sent to the next stage with gloo, which refuses strided tensors
        raise _StageEnd(_hidden(self.block(*args, **kwargs)).contiguous())


def inner_block(block: nn.Module) -> nn.Module:
    """The model's block a stage runs: itself, or the one its first or last wrapper holds."""
    return block.block if isinstance(block, (_Enter, _Exit)) else block


class StageModule(nn.Module):
    """One pipeline stage: the model's forward over this stage's blocks only.

    ``forward`` takes a micro-batch index (first stage) or the previous stage's activation and
    returns the activation after the stage's last block, or the micro-batch's loss (last stage).
    """

    def __init__(
        self,
        model: nn.Module,
        stack: BlockStack,
        *,
        span: tuple[int, int],
        index: int,
        stages: int,
        batches: list[dict[str, torch.Tensor]],
    ) -> None:
        super().__init__()
        self.index, self.first, self.last = index, index == 0, index == stages - 1
        self.span = span
        self.block_paths = stack.blocks[span[0] : span[1]]
        container = model.get_submodule(stack.path)
        blocks: list[nn.Module] = list(container.children())[span[0] : span[1]]
        self.enter: _Enter | None = None
        if not self.first:
            self.enter = _Enter(blocks[0])
            blocks[0] = self.enter
        if not self.last:
            blocks[-1] = _Exit(blocks[-1])
        kind = nn.Sequential if isinstance(container, nn.Sequential) else nn.ModuleList
        self.blocks = kind(*blocks) if kind is nn.Sequential else nn.ModuleList(blocks)
        parent, _, attribute = stack.path.rpartition(".")
        # Not registered as submodules: every stage on a rank shares the model's other modules.
        self._model = [model]
        self._parent = model.get_submodule(parent) if parent else model
        self._attribute = attribute
        self._batches = batches
        self.order: list[int] = []
        # A tp stage before a batch stage: (its group, its ranks, this rank's index among them).
        self.share: tuple[Any, int, int] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = int(x.reshape(-1)[0]) if self.first else len(self.order)
        self.order.append(index)
        if self.enter is not None:
            self.enter.received = x
        setattr(self._parent, self._attribute, self.blocks)
        try:
            loss = local_loss(self._model[0], self._batches[index])
        except _StageEnd as boundary:
            if self.share is not None:
                return _TakeShare.apply(boundary.hidden, *self.share)
            return boundary.hidden
        finally:
            if self.enter is not None:
                self.enter.received = None
        if not self.last:
            raise RuntimeError(f"stage {self.index} ran past its last block")
        return loss


def probe_blocks(
    model: nn.Module, stack: BlockStack, batch: Mapping[str, torch.Tensor]
) -> tuple[list[float], list[torch.Tensor]]:
    """Forward FLOPs of every block and the hidden state after it, from one forward pass."""
    blocks = list(model.get_submodule(stack.path).children())
    flops: list[float] = []
    outputs: list[torch.Tensor] = []
    counters: list[FlopCounterMode] = []

    def before(module: nn.Module, args: Any) -> None:
        counters.append(FlopCounterMode(display=False))
        counters[-1].__enter__()

    def after(module: nn.Module, args: Any, output: Any) -> None:
        counter = counters.pop()
        counter.__exit__(None, None, None)
        flops.append(float(counter.get_total_flops()))
        # the shapes the stages send and receive: contiguous, as sent (see _Exit)
        outputs.append(_hidden(output).detach().contiguous())

    handles = []
    for block in blocks:
        handles.append(block.register_forward_pre_hook(before))
        handles.append(block.register_forward_hook(after))
    was_training = model.training
    model.eval()  # batch-norm running statistics stay as they are
    try:
        with torch.no_grad():
            local_loss(model, batch)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return flops, outputs
