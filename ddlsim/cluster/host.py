"""One emulated host of a launch: its rank's command line, environment and process.

Each host runs its one rank directly (``python -m MODULE``) with the variables torchrun gives a
worker (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), so a rank joins its group the same way here as under
torchrun, srun or a PyTorchJob (``--launcher env``); rank 0 hosts the rendezvous store at its
address. No torchrun agent stands between the launcher and the rank: with one rank a host and no
restarts it has nothing to do, and each agent cost a host about 2 s of CPU to start and end and
woke every 0.1 s on the core its rank is pinned to. The rank runs under ``ip netns exec`` in its
namespace (on loopback, directly), in its own session so that it can be stopped as a process
group; gloo and NCCL are bound to the host's interface; its stdout and stderr go to the launch's
rank logs.
"""

import functools
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddlsim.cluster.environment import rank_environment
from ddlsim.cluster.placement import PLACEMENT_ENV, placement_path
from ddlsim.cluster.processes import die_with_parent
from ddlsim.cluster.rank_logs import rank_log


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
    """Start host ``rank``'s rank, ``python -m module *args``; do not wait.

    Args:
        env: added on top of this process's environment as ranks get it (no secrets:
            :func:`~.environment.rank_environment`), under the variables the launch sets
            (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` = ``interface``,
            ``OMP_NUM_THREADS=1``, ``DDLSIM_PLACEMENT_PATH`` and torchrun's worker variables).
        master_address, master_port: rank 0's address and the port of its store.
        namespace: the host's network namespace, or ``None`` on loopback.
        core: the core to pin the host to, or ``None`` to leave it free.
    """
    cmd = [sys.executable, "-m", module, *args]
    if namespace is not None:
        cmd = ["ip", "netns", "exec", namespace, *cmd]
    rank_env = rank_environment(env)
    # A launcher that itself runs under torchrun passes its agent's variables down; this rank
    # has no agent (TORCHELASTIC_USE_AGENT_STORE would send rank 0 to a store nobody hosts).
    for name in [name for name in rank_env if name.startswith("TORCHELASTIC_")]:
        del rank_env[name]
    rank_env.update(
        {
            "GLOO_SOCKET_IFNAME": interface,
            "NCCL_SOCKET_IFNAME": interface,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            PLACEMENT_ENV: str(placement_path(launch_dir, rank)),
            # What torchrun sets for a worker of ``--nnodes N --node-rank i
            # --nproc-per-node 1``.
            "RANK": str(rank),
            "GROUP_RANK": str(rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": master_address,
            "MASTER_PORT": str(master_port),
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
