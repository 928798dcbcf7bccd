"""Runs in a process group an external launcher made (torchrun, srun, a PyTorchJob): this
process is one of the ranks, under the same measurement protocol as :mod:`.run`'s launches."""

import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from ddlsim.cluster import ClusterRunError
from ddlsim.cluster.external import ExternalRank
from ddlsim.data.errors import DdlsimError, one_line
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.executor.run import RunOptions, RunResult, prepare_launch, results_of


def run_joined(
    spec: ModelSpec,
    strategy: Strategy,
    options: RunOptions,
    *,
    network: str,
    progress: Callable[[str], None] | None = None,
) -> RunResult | None:
    """Run this process as one rank of a process group that an external launcher set up
    (torchrun, srun, a PyTorchJob: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
    ``MASTER_PORT`` in the environment); rank 0's result, ``None`` on the other ranks.

    Every rank captures the graph and checks the strategy itself (the same on all: capture
    is deterministic), so nothing but the process group is shared.

    Raises:
        InvalidStrategyError, InvalidOptionError: before the process group is joined.
    """
    results = compare_joined(
        spec, [strategy], options, rounds=1, settle=0, network=network, progress=progress
    )
    return None if results is None else results[0]


def compare_joined(
    spec: ModelSpec,
    strategies: list[Strategy],
    options: RunOptions,
    *,
    rounds: int,
    settle: int,
    network: str,
    progress: Callable[[str], None] | None = None,
) -> list[RunResult] | None:
    """:func:`compare_training`'s launch with this process as one of its ranks (see
    :func:`run_joined`); rank 0's results, ``None`` on the other ranks. The process group may
    already be joined (strategies agreed on over it first); it is left when the launch ends."""
    say = progress or (lambda message: None)
    place = ExternalRank.from_environ()
    rank = place.rank
    graph, config = prepare_launch(
        spec,
        strategies,
        options,
        rounds=rounds,
        settle=settle,
        progress=say,
        ranks_here=place.local_world_size,
    )
    config["device_by_local_rank"] = True
    from ddlsim.executor.rank_main import run_rank

    with tempfile.TemporaryDirectory(prefix="ddlsim-rank-") as tmp:
        output = Path(tmp) / "result.json"
        began = time.perf_counter()
        say(f"rank {rank} of {options.world_size} joining the process group ({network})")
        # The rank's progress lines go to stderr: stdout is the command's own (its JSON).
        try:
            with contextlib.redirect_stdout(sys.stderr):
                run_rank(config, output)
        except (RuntimeError, dist.DistError) as exc:
            if isinstance(exc, DdlsimError):
                raise
            # A peer that crashed or hung ends this rank's collectives with torch's error.
            raise ClusterRunError(f"rank {rank}: {one_line(exc, limit=2000)}") from exc
        wall_s = time.perf_counter() - began
        if rank != 0:
            return None
        raw = json.loads(output.read_text(encoding="utf-8"))
    cores = {int(k): v for k, v in raw.get("rank_cores", {}).items()}
    return results_of(
        raw,
        spec=spec,
        graph=graph,
        strategies=strategies,
        options=options,
        network=network,
        rank_cores=cores,
        wall_s=wall_s,
    )
