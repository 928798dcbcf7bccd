"""torchrun agents on this machine, as many "nodes" as asked, for the launcher tests."""

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun_agents(
    ddlsim_args: Sequence[str],
    *,
    nodes: int,
    nproc: int,
    env: Mapping[str, str],
    cwd: Path | None = None,
    timeout_s: float = 600,
) -> list[str]:
    """``python -m ddlsim ARGS`` under ``nodes`` torchrun agents of ``nproc`` ranks each, one
    c10d rendezvous, one thread per rank; every agent's stdout (each must exit 0)."""
    port = free_port()
    agents = [
        subprocess.Popen(
            [
                str(BIN / "torchrun"),
                "--nnodes",
                str(nodes),
                "--nproc-per-node",
                str(nproc),
                "--node-rank",
                str(node),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "-m",
                "ddlsim",
                *ddlsim_args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env, "OMP_NUM_THREADS": "1"},
            cwd=cwd,
        )
        for node in range(nodes)
    ]
    outputs = []
    try:
        for agent in agents:
            out, err = agent.communicate(timeout=timeout_s)
            assert agent.returncode == 0, err[-3000:]
            outputs.append(out)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    return outputs
