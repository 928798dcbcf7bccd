"""The processes of a launch: stopping a process tree, and a parent-death signal for ranks.

A rank's own children (``torch.compile``'s workers, a launcher's agent and its workers) may
run in sessions of their own, so stopping a rank signals every descendant's process group, not
only the rank's. Ranks also get a parent-death signal: if the launcher is killed with SIGKILL
(no teardown possible) they still exit.
"""

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import time
from collections.abc import Sequence

_STOP_GRACE_S = 3.0
_POLL_S = 0.05
_PR_SET_PDEATHSIG = 1


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _descendants(root_pids: Sequence[int]) -> list[int]:
    """Every live descendant of ``root_pids`` (some start in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    stack = list(root_pids)
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _signal_groups(pids: Sequence[int], sig: int) -> None:
    """Send ``sig`` to each pid's process group (never our own) and to the pid itself."""
    own_group = os.getpgrp()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(pid)
            if group != own_group:
                os.killpg(group, sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_pids(pids: Sequence[str]) -> None:
    """SIGKILL each pid given as text (as ``ip netns pids`` lists them); gone or malformed
    ones are skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def stop_processes(
    procs: Sequence[subprocess.Popen[bytes]], grace_s: float = _STOP_GRACE_S
) -> None:
    """Stop launched processes and everything they started: SIGTERM, then SIGKILL after
    ``grace_s``. Each process and each descendant is signalled through its process group."""
    roots = [p.pid for p in procs if p.poll() is None]
    tree = roots + _descendants(roots)
    if not tree:
        return
    _signal_groups(tree, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for proc in procs:
            proc.poll()
        if not any(process_alive(pid) for pid in tree):
            break
        time.sleep(_POLL_S)
    survivors = [pid for pid in tree if process_alive(pid)]
    if survivors:
        _signal_groups(survivors, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
