"""One host of a launch: its ``torchrun`` command line, environment and process.

Each host runs ``torchrun --nnodes N --node-rank i --nproc-per-node 1`` with the rendezvous on
rank 0, under ``ip netns exec`` in its namespace (on loopback, directly), in its own session so
that it can be stopped as a process group. gloo and NCCL are bound to the host's interface; its
stdout and stderr go to the launch's rank logs.
"""

import functools
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddlsim.profiler.cluster.environment import rank_environment
from ddlsim.profiler.cluster.placement import PLACEMENT_ENV, placement_path
from ddlsim.profiler.cluster.processes import die_with_parent
from ddlsim.profiler.cluster.rank_logs import rank_log


def start_rank(
    *,
    rank: int,
    world_size: int,
    module: str,
    args: Sequence[str],
    env: Mapping[str, str] | None,
    master_address: str,
    master_port: int,
    namespace: str | None,
    interface: str,
    launch_dir: Path,
    core: int | None,
) -> subprocess.Popen[bytes]:
    """Start host ``rank``'s torchrun running ``python -m module *args``; do not wait.

    Args:
        env: added on top of this process's environment as ranks get it (no secrets:
            :func:`~.environment.rank_environment`), under the variables the launch sets
            (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` = ``interface``,
            ``OMP_NUM_THREADS=1``, ``DDLSIM_PLACEMENT_PATH``).
        namespace: the host's network namespace, or ``None`` on loopback.
        core: the core to pin the host to, or ``None`` to leave it free.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    cmd += ["--nnodes", str(world_size), "--node-rank", str(rank)]
    cmd += ["--nproc-per-node", "1", "--max-restarts", "0"]
    cmd += ["--master-addr", master_address, "--master-port", str(master_port)]
    cmd += ["-m", module, *args]
    if namespace is not None:
        cmd = ["ip", "netns", "exec", namespace, *cmd]
    rank_env = rank_environment(env)
    rank_env.update(
        {
            "GLOO_SOCKET_IFNAME": interface,
            "NCCL_SOCKET_IFNAME": interface,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            PLACEMENT_ENV: str(placement_path(launch_dir, rank)),
        }
    )
    if namespace is not None:
        # Emulated hosts share one machine: keep NCCL off its same-host paths (GPU peer
        # access, shared memory, InfiniBand) so that its traffic crosses the shaped link.
        rank_env.update({"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"})
        rank_env.update({"NCCL_IB_DISABLE": "1"})
    with (
        open(rank_log(launch_dir, rank, "stdout"), "wb") as stdout,
        open(rank_log(launch_dir, rank, "stderr"), "wb") as stderr,
    ):
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=rank_env,
            start_new_session=True,
            # Affinity and the parent-death signal can only be set between fork and exec;
            # ranks are started from one thread.
            preexec_fn=functools.partial(_prepare_rank, core),  # noqa: PLW1509
        )


def _prepare_rank(core: int | None) -> None:
    """In the forked child before exec: pin to ``core`` and die when the launcher dies."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    die_with_parent(signal.SIGTERM)
