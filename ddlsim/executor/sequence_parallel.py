"""Sequence parallelism over a tensor-parallel model (Korthikanti et al., as torchtitan applies
it with DTensor): between the blocks' split modules, activations hold ``1 / tp`` of the
sequence; the norms compute on those shards, the attention and MLP inputs are all-gathered as
they start and the row-parallel outputs reduce-scattered (``executor/tensor_parallel.py`` splits
the modules; this hooks the model around them)."""

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle, SequenceParallel, parallelize_module

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.plans.tp_plans import TensorParallelPlan, block_paths, matches


def _as_sequence_shards(x: torch.Tensor, mesh: Any) -> torch.Tensor:
    """This rank's ``1 / tp`` of the sequence (Replicate -> Shard(1), a local slice); its
    gradient is all-gathered in backward."""
    whole = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
    return whole.redistribute(mesh, [Shard(1)]).to_local()


def _gathered_sequence(x: torch.Tensor, mesh: Any) -> DTensor:
    """The whole sequence from every rank's shard (an all-gather), left a ``DTensor`` so that
    the split modules it feeds give their partial input gradients back as partial sums, which
    backward reduce-scatters into shards."""
    part = (
        x if isinstance(x, DTensor) else DTensor.from_local(x, mesh, [Shard(1)], run_check=False)
    )
    return part.redistribute(mesh, [Replicate()])


def apply_sequence_parallel(
    model: nn.Module, plan: TensorParallelPlan, mesh: Any
) -> list[nn.Parameter]:
    """Make a tensor-parallel ``model`` (split by :func:`apply_tensor_parallel` with
    ``sequence_parallel``) run its blocks on sequence shards; the parameters whose gradients
    are partial sums over the shards and are not DTensors (to be summed over ``mesh`` after
    backward; none for the families with a plan, whose norms become replicated DTensors).

    The first block's input is sliced into shards; the norms compute on shards
    (``SequenceParallel``); each module matching the sequence plan's ``inputs`` all-gathers its
    hidden states as it starts; the final norm's output is all-gathered for the head. The
    embedding's output stays whole (an all-reduce, not Megatron-LM's reduce-scatter): the model
    builds its masks and positions from it.
    """
    sequence = plan.sequence
    assert sequence is not None  # check_sequence_parallel refused the others
    paths = [path for path, _ in model.named_modules() if path]
    blocks = block_paths(plan, paths)
    norms: dict[str, ParallelStyle] = {
        path: SequenceParallel(use_local_output=True)
        for path in paths
        if matches(sequence.norms, path)
    }
    norms.update(
        {path: SequenceParallel() for path in paths if matches(sequence.final_norm, path)}
    )
    parallelize_module(model, mesh, norms)

    def shard_input(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return _map_hidden(args, kwargs, lambda x: _as_sequence_shards(x, mesh))

    def gather_input(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return _map_hidden(args, kwargs, lambda x: _gathered_sequence(x, mesh))

    def gather_output(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return _gathered_sequence(output, mesh).to_local()

    model.get_submodule(blocks[0]).register_forward_pre_hook(shard_input, with_kwargs=True)
    on_shards = list(blocks)
    for path in paths:
        if matches(sequence.inputs, path):
            model.get_submodule(path).register_forward_pre_hook(gather_input, with_kwargs=True)
        elif matches(sequence.final_norm, path):
            model.get_submodule(path).register_forward_hook(gather_output)
            on_shards.append(path)
    # Attention modules' whole parameters get their gradients summed as they arrive
    # (``tp_surgery.sum_head_shared_gradients``).
    summed = {
        id(param)
        for path in paths
        if matches(plan.attention, path)
        for param in model.get_submodule(path).parameters()
    }
    partial = []
    for path in on_shards:
        for param in model.get_submodule(path).parameters():
            if param.requires_grad and not isinstance(param, DTensor) and id(param) not in summed:
                partial.append(param)
    return partial


def _map_hidden(
    args: tuple, kwargs: dict, change: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[tuple, dict]:
    """Apply ``change`` to a module's hidden states: its first positional argument, else its
    ``hidden_states`` keyword."""
    if args and isinstance(args[0], torch.Tensor):
        return (change(args[0]), *args[1:]), kwargs
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return args, {**kwargs, "hidden_states": change(kwargs["hidden_states"])}
    raise InvalidStrategyError(
        "sequence parallelism found no hidden states to split or gather (neither a first "
        "positional argument nor a hidden_states keyword)"
    )
