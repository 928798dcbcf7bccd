"""The ranks' logs: where they go, rank 0's lines as they come, and why a launch failed.

Each rank's stdout and stderr go to ``rank{i}.stdout`` and ``rank{i}.stderr`` in the launch's
folder; :class:`LineFollower` hands rank 0's lines to a callback while it runs. When ranks fail,
the one whose peer vanished under it failed because of another: the message names the cause
first and shows its last stderr lines.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Literal

# What gloo and NCCL write when a rank's peer is gone (a failure caused by another rank's).
_PEER_LOST_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "remote process exited",
)
_STDERR_TAIL_LINES = 15


def rank_log(launch_dir: Path, rank: int, stream: Literal["stdout", "stderr"]) -> Path:
    """The file rank ``rank``'s ``stream`` goes to in the launch whose folder is ``launch_dir``."""
    return launch_dir / f"rank{rank}.{stream}"


def stderr_tail(path: Path, lines: int = _STDERR_TAIL_LINES) -> str:
    """The last ``lines`` lines the rank wrote to ``path``."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def failure_message(
    failed: list[int],
    codes: list[int | None],
    launch_dir: Path,
    *,
    world_size: int,
    network: str,
) -> str:
    """The message of a launch in which ranks ``failed`` exited non-zero (``codes``: each
    rank's exit status, ``None`` while it ran): every failed rank with its exit code, the
    cause first, then the cause's last stderr lines."""
    stderrs = {}
    for rank in failed:
        path = rank_log(launch_dir, rank, "stderr")
        stderrs[rank] = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    # The cause first: a rank whose peer vanished under it failed because of another.
    failed = sorted(failed, key=lambda r: (any(m in stderrs[r] for m in _PEER_LOST_MARKERS), r))
    parts = [f"rank {rank} exited with code {codes[rank]}" for rank in failed]
    first = failed[0]
    return (
        f"{'; '.join(parts)}; the other ranks of {world_size} were stopped "
        f"(network {network}); last stderr lines of rank {first}:\n"
        f"{stderr_tail(rank_log(launch_dir, first, 'stderr'))}"
    )


def timeout_message(
    running: list[int], launch_dir: Path, *, world_size: int, timeout_s: float
) -> str:
    """The message of a launch that ran past ``timeout_s`` with ranks ``running`` still up:
    which ranks, and the last stderr lines of the first of them."""
    return (
        f"launch of {world_size} ranks ran past timeout_s({timeout_s:g}); "
        f"ranks still running: {running}; last stderr lines of rank "
        f"{running[0]}:\n{stderr_tail(rank_log(launch_dir, running[0], 'stderr'))}"
    )


class LineFollower:
    """Hands complete new lines of a growing file to a callback."""

    def __init__(self, path: Path, callback: Callable[[str], None] | None) -> None:
        self._path = path
        self._callback = callback
        self._offset = 0
        self._partial = b""

    def poll(self) -> None:
        """Call the callback with each line completed since the last poll (none without one)."""
        if self._callback is None:
            return
        try:
            with open(self._path, "rb") as file:
                file.seek(self._offset)
                chunk = file.read()
        except OSError:
            return
        self._offset += len(chunk)
        *complete, self._partial = (self._partial + chunk).split(b"\n")
        for line in complete:
            self._callback(line.decode("utf-8", errors="replace"))
