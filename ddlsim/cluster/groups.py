"""Process groups: how a rank joins its job's group, takes its device and lays its ranks out as
a mesh. Every rank of the profiler and the executor joins through here, whichever launcher
started it (the emulated cluster, torchrun, srun, a Slurm job): the launcher sets the
rendezvous (``MASTER_ADDR``/``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``) or hands a store over
(:func:`ddlsim.cluster.external.launch_store`)."""

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddlsim.data.errors import InvalidOptionError


def join(
    backend: str,
    timeout_s: float,
    *,
    store: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> None:
    """Join the job's process group over ``backend``, each collective bounded by
    ``timeout_s``: through the launcher's environment, or over ``store`` as ``rank`` of
    ``world_size``. Nothing where this process has joined one already."""
    if dist.is_initialized():
        return
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        dist.init_process_group(backend, timeout=timeout)
        return
    if rank is None or world_size is None:
        raise InvalidOptionError("joining over a store needs this rank and the world size")
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timeout
    )


def rank_device(kind: str, rank: int, *, by_local_rank: bool = False) -> torch.device:
    """This rank's device: the CPU, or GPU ``rank`` of this machine (every emulated host is this
    machine; ranks beyond its GPU count share them round-robin, which only gloo allows); under
    an external launcher (``by_local_rank``), GPU ``LOCAL_RANK`` of its node."""
    if kind != "cuda":
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", "0")) if by_local_rank else rank
    device = torch.device("cuda", index % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def mesh(device_type: str, shape: Sequence[int], names: Sequence[str] | None = None) -> Any:
    """The group's ranks as a device mesh of ``shape`` (the last dimension fastest), its
    dimensions named where ``names`` are given: a strategy's ``(pp, dp, tp)``, a grid's
    ``(dp, depth, rows, cols)``."""
    from torch.distributed.device_mesh import init_device_mesh

    dims = tuple(names) if names is not None else None
    return init_device_mesh(device_type, tuple(shape), mesh_dim_names=dims)


def subgroup(ranks: Sequence[int], *, backend: str | None = None) -> Any:
    """A group of ``ranks``; every rank of the job takes part in making it, in the same order."""
    return dist.new_group(list(ranks), backend=backend)


@contextlib.contextmanager
def world_of_one() -> Iterator[None]:
    """A gloo process group of this process alone, left on exit (refused if one is already
    set up).

    Raises:
        InvalidOptionError: this process is in a process group already.
    """
    if dist.is_initialized():
        raise InvalidOptionError("a process group is already initialized in this process")
    with tempfile.TemporaryDirectory(prefix="ddlsim-group-") as tmp:
        dist.init_process_group(
            "gloo", init_method=f"file://{Path(tmp) / 'store'}", rank=0, world_size=1
        )
        try:
            yield
        finally:
            dist.destroy_process_group()
