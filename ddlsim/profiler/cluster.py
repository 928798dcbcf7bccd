"""An emulated cluster on one machine: one network namespace per rank, links shaped with ``tbf``.

Topology: every rank is a host with its own network namespace and one interface (``eth0``), a
veth whose peer sits in a "switch" namespace, enslaved to a bridge. Each veth is rate-limited on
both ends (the host end shapes what the rank uploads, the switch end what it downloads), so a
rank's link behaves like a full-duplex NIC of the given rate. Addresses come from 198.18.0.0/15,
the range set aside for network benchmarks; no traffic leaves the run's namespaces. Everything
(veths, bridge) is created inside the run's namespaces, so deleting them removes all of it and
the root namespace is never touched.

Ranks start as one ``torchrun`` per host (``--nnodes N --node-rank i``) under ``ip netns exec``,
each in its own session so it can be stopped as a process group; gloo and NCCL are bound to the
host's interface and the rendezvous is rank 0's address.

Where namespaces cannot be made (not root, no ``ip``, ``ip netns add`` refused) the cluster falls
back to plain loopback (127.0.0.1, no shaping) with one ``LoopbackFallbackWarning``; every
result records which network it ran on.

Teardown always runs: on leaving the ``with`` block (success, error, a rank's crash), on SIGINT,
SIGTERM and SIGHUP (turned into exceptions while the cluster is entered, so ``finally`` blocks
run) and, as a last resort, at interpreter exit. torchrun starts its worker in a session of its
own, so stopping a rank signals every descendant's process group, not only torchrun's. Ranks
also get a parent-death signal: if the launcher is killed with SIGKILL (no teardown possible)
they still exit, and only the namespaces remain, for ``remove_stale_namespaces`` to delete.
"""

import atexit
import contextlib
import ctypes
import dataclasses
import functools
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from ddlsim.data.errors import DdlsimError, InvalidClusterError, InvalidOptionError
from ddlsim.data.specs.cluster import parse_bandwidth_gbps

Network = Literal["netns", "loopback"]

NAMESPACE_PREFIX = "ddlsim-"
FORCE_LOOPBACK_ENV = "DDLSIM_FORCE_LOOPBACK"
PLACEMENT_ENV = "DDLSIM_PLACEMENT_PATH"
HOST_INTERFACE = "eth0"
MAX_WORLD_SIZE = 1024

# Burst: 1 ms of line rate, at least 32 KiB. Measured with a 200 MB TCP stream between two
# hosts: 1gbit → 0.957 Gb/s (a 32 KiB burst gives 0.86), 100mbit → 0.096, 10gbit → 9.6; the
# ceiling is TCP payload over Ethernet frames (1448 / 1514 bytes). A larger burst only lets the
# first ~burst bytes of each message through unshaped.
_BURST_S = 1e-3
_MIN_BURST_BYTES = 32 * 1024
_TBF_LATENCY = "100ms"
_FIRST_PORT = 29500
_STOP_GRACE_S = 3.0
_POLL_S = 0.05
# After a rank fails, how long the others get to fail too before all are stopped.
_SETTLE_S = 2.0
# What gloo and NCCL write when a rank's peer is gone (a failure caused by another rank's).
_PEER_LOST_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "remote process exited",
)
_STDERR_TAIL_LINES = 15
_PR_SET_PDEATHSIG = 1
_WORKER_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)")


class ClusterRunError(DdlsimError, RuntimeError):
    """A rank exited non-zero or the launch ran past its timeout; all ranks were stopped."""


class ClusterSetupError(DdlsimError, RuntimeError):
    """Namespaces could be made but the links could not be wired or shaped."""


class LoopbackFallbackWarning(UserWarning):
    """Network namespaces are unavailable: ranks talk over 127.0.0.1 and no rate is enforced."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RankPlacement:
    """Where a rank ran: the cores it was allowed on and the core it last ran on."""

    rank: int
    allowed_cores: tuple[int, ...]
    last_core: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LaunchResult:
    """One launch: the network it ran on, each rank's exit status and core placement.

    ``rank_cores`` and ``last_cores`` hold the ranks that called ``report_placement``.
    """

    network: Network
    returncodes: dict[int, int]
    rank_cores: dict[int, list[int]]
    last_cores: dict[int, int]
    output_paths: tuple[Path, ...]
    wall_s: float


def report_placement() -> RankPlacement:
    """Called by a rank: read its placement and, under a launch, write it for the launcher.

    The core it last ran on is field 39 of ``/proc/self/stat``; call this late in the run.
    """
    rank = int(os.environ.get("RANK", "0"))
    with open("/proc/self/stat", encoding="ascii") as stat:
        # The command name (field 2) may hold spaces; count fields after its closing paren.
        fields = stat.read().rsplit(")", 1)[1].split()
    placement = RankPlacement(
        rank=rank,
        allowed_cores=tuple(sorted(os.sched_getaffinity(0))),
        last_core=int(fields[39 - 3]),
    )
    path = os.environ.get(PLACEMENT_ENV)
    if path:
        Path(path).write_text(json.dumps(dataclasses.asdict(placement)), encoding="utf-8")
    return placement


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=False)


def _alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _descendants(root_pids: Sequence[int]) -> list[int]:
    """Every live descendant of ``root_pids`` (torchrun starts its workers in new sessions)."""
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
        if not any(_alive(pid) for pid in tree):
            break
        time.sleep(_POLL_S)
    survivors = [pid for pid in tree if _alive(pid)]
    if survivors:
        _signal_groups(survivors, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _host_address(rank: int) -> str:
    """Rank ``rank``'s address in 198.18.0.0/16 (a /16 of the benchmark range 198.18.0.0/15)."""
    host = rank + 1
    return f"198.18.{host // 256}.{host % 256}"


def _tail(path: Path, lines: int = _STDERR_TAIL_LINES) -> str:
    """The last ``lines`` lines the rank wrote, without torchrun's failure summary (a framed
    block that only repeats the exit code, which the message states already)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    kept = text.splitlines()
    frames = [i for i, line in enumerate(kept) if _FRAME.fullmatch(line)]
    if len(frames) >= 2 and any("FAILED" in line for line in kept[frames[-2] : frames[-1]]):
        kept = kept[: frames[-2]]
    # torchrun's own traceback (ending in ChildFailedError) says nothing about the cause either.
    failed_at = [i for i, line in enumerate(kept) if "ChildFailedError" in line]
    if failed_at:
        starts = [i for i in range(failed_at[-1]) if kept[i].startswith("Traceback")]
        if starts:
            kept = kept[: starts[-1]]
    return "\n".join(kept[-lines:])


_FRAME = re.compile(r"=+")


def _worker_exit_code(stderr: str) -> int | None:
    """The worker's own exit code from torchrun's failure summary, when it printed one."""
    codes = _WORKER_EXIT.findall(stderr)
    return int(codes[-1]) if codes else None


class EmulatedCluster:
    """``world_size`` hosts on one machine, each link shaped to ``bandwidth``; a context manager.

    Args:
        world_size: number of hosts (one rank each), 1 to ``MAX_WORLD_SIZE``.
        bandwidth: a rate as ``tc`` writes it (``"1gbit"``, ``"100mbit"``, ``"10gbit"``) applied
            to each host's upload and download, or ``None``/``"none"`` for unshaped links.
        force_loopback: skip namespaces and use 127.0.0.1; ``None`` reads
            ``DDLSIM_FORCE_LOOPBACK`` (``1``/``true``/``yes``).
        pin_cores: pin rank ``i`` to the ``i % n``-th of the cores this process may use. Off by
            default: on a shared 2-core machine pinned ranks could not move off a core another
            job keeps busy, and small-message times got noisier.

    Not thread safe: enter it and launch from one thread (signal handlers are only installed
    from the main thread). Attributes ``network``, ``run_id`` and ``namespaces`` are set on
    entering.

    Raises:
        InvalidClusterError: when ``world_size`` is out of range or ``bandwidth`` is not a rate.
    """

    def __init__(
        self,
        world_size: int,
        bandwidth: str | None = "1gbit",
        *,
        force_loopback: bool | None = None,
        pin_cores: bool = False,
    ) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int):
            raise InvalidClusterError(f"world_size must be an integer, got {world_size!r}")
        if not 1 <= world_size <= MAX_WORLD_SIZE:
            raise InvalidClusterError(
                f"world_size({world_size}) is out of range; allowed: 1 to {MAX_WORLD_SIZE}"
            )
        if bandwidth is not None and not isinstance(bandwidth, str):
            raise InvalidClusterError(
                f"bandwidth must be a rate string or None, got {bandwidth!r}"
            )
        text = "none" if bandwidth is None else bandwidth.strip().lower()
        self.bandwidth_gbps = parse_bandwidth_gbps(text)
        self.bandwidth = "none" if self.bandwidth_gbps is None else text
        self.world_size = world_size
        if force_loopback is None:
            force_loopback = os.environ.get(FORCE_LOOPBACK_ENV, "").strip().lower() in {
                "1",
                "true",
                "yes",
            }
        self.force_loopback = force_loopback
        self.pin_cores = pin_cores
        self.run_id = f"{os.getpid()}-{secrets.token_hex(2)}"
        self.network: Network = "loopback"
        self.namespaces: list[str] = []
        self._entered = False
        self._torn_down = False
        self._run_dir: Path | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._launches = 0
        self._previous_handlers: dict[int, Any] = {}
        self._closing = False
        self._held_signal: int | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def prefix(self) -> str:
        """The common prefix of this run's namespace names."""
        return f"{NAMESPACE_PREFIX}{self.run_id}-"

    def __enter__(self) -> "EmulatedCluster":
        if self._entered:
            raise InvalidOptionError("an EmulatedCluster can be entered once")
        self._entered = True
        self._install_signal_handlers()
        atexit.register(self.close)
        try:
            self._run_dir = Path(tempfile.mkdtemp(prefix=f"ddlsim-{self.run_id}-"))
            reason = self._netns_unavailable()
            if reason is None:
                self._build_netns()
                self.network = "netns"
            else:
                warnings.warn(
                    f"network namespaces unavailable ({reason}); ranks use loopback 127.0.0.1 "
                    f"and bandwidth {self.bandwidth!r} is not enforced",
                    LoopbackFallbackWarning,
                    stacklevel=2,
                )
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every rank, delete the namespaces (and with them veths and bridge). Idempotent."""
        if self._torn_down or not self._entered:
            return
        # A signal during teardown must not cut it short: it is held and re-sent afterwards.
        self._closing = True
        try:
            stop_processes(self._procs)
            self._procs.clear()
            self._delete_namespaces()
            if self._run_dir is not None:
                shutil.rmtree(self._run_dir, ignore_errors=True)
        finally:
            self._torn_down = True
            atexit.unregister(self.close)
            self._restore_signal_handlers()
            if self._held_signal is not None:
                os.kill(os.getpid(), self._held_signal)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP ``SystemExit(128 + signal)``:
        either way ``finally`` blocks and ``__exit__`` run and tear the cluster down."""
        if self._closing:
            self._held_signal = signum
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers.clear()

    # -- network ---------------------------------------------------------------------------

    def _netns_unavailable(self) -> str | None:
        """Why namespaces cannot be used here, or ``None`` when they can."""
        if self.force_loopback:
            return f"{FORCE_LOOPBACK_ENV} or force_loopback asked for loopback"
        return netns_unavailable_reason()

    def _switch_namespace(self) -> str:
        return f"{self.prefix}sw"

    def host_namespace(self, rank: int) -> str:
        return f"{self.prefix}h{rank}"

    def _build_netns(self) -> None:
        switch = self._switch_namespace()
        # Each namespace is listed before it exists, so that a signal arriving in between
        # still gets it deleted.
        self.namespaces.append(switch)
        self._check(["ip", "netns", "add", switch])
        self._check(["ip", "-n", switch, "link", "set", "lo", "up"])
        self._check(["ip", "-n", switch, "link", "add", "br0", "type", "bridge"])
        self._check(["ip", "-n", switch, "link", "set", "br0", "up"])
        for rank in range(self.world_size):
            host = self.host_namespace(rank)
            port = f"h{rank}"
            self.namespaces.append(host)
            self._check(["ip", "netns", "add", host])
            self._check(["ip", "-n", host, "link", "set", "lo", "up"])
            # Both ends are created inside the run's namespaces: nothing lands in the root one.
            self._check(
                [
                    *("ip", "link", "add", HOST_INTERFACE, "netns", host, "type", "veth"),
                    *("peer", "name", port, "netns", switch),
                ]
            )
            self._check(["ip", "-n", switch, "link", "set", port, "master", "br0"])
            self._check(["ip", "-n", switch, "link", "set", port, "up"])
            address = f"{_host_address(rank)}/16"
            self._check(["ip", "-n", host, "addr", "add", address, "dev", HOST_INTERFACE])
            self._check(["ip", "-n", host, "link", "set", HOST_INTERFACE, "up"])
            if self.bandwidth_gbps is not None:
                self._shape(host, HOST_INTERFACE)
                self._shape(switch, port)

    def _shape(self, namespace: str, device: str) -> None:
        rate_bytes_per_s = (self.bandwidth_gbps or 0.0) * 1e9 / 8
        burst = max(int(rate_bytes_per_s * _BURST_S), _MIN_BURST_BYTES)
        self._check(
            [
                *("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf"),
                *("rate", self.bandwidth, "burst", str(burst), "latency", _TBF_LATENCY),
            ]
        )

    @staticmethod
    def _check(cmd: Sequence[str]) -> None:
        result = _run(cmd)
        if result.returncode != 0:
            raise ClusterSetupError(
                f"{' '.join(cmd)!r} failed with exit code {result.returncode}: "
                f"{result.stderr.strip()}"
            )

    def _delete_namespaces(self) -> None:
        # Hosts first (deleting one deletes its veth and the peer on the bridge), switch last.
        for namespace in reversed(self.namespaces):
            # Anything still inside (a process that escaped its group) is killed first.
            pids = _run(["ip", "netns", "pids", namespace]).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _run(["ip", "netns", "del", namespace])
        self.namespaces.clear()

    # -- launching -------------------------------------------------------------------------

    def address(self, rank: int) -> str:
        """Rank ``rank``'s address (127.0.0.1 on loopback)."""
        return "127.0.0.1" if self.network == "loopback" else _host_address(rank)

    @property
    def interface(self) -> str:
        """The interface ranks bind to (``GLOO_SOCKET_IFNAME``)."""
        return "lo" if self.network == "loopback" else HOST_INTERFACE

    def launch(
        self,
        module: str,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        timeout_s: float,
        output_paths: Sequence[str | Path] = (),
        stdout_callback: Callable[[str], None] | None = None,
    ) -> LaunchResult:
        """Run ``python -m module *args`` as one rank per host under torchrun and wait for all.

        Each host runs ``torchrun --nnodes N --node-rank i --nproc-per-node 1`` with the
        rendezvous on rank 0, in its own session, with ``GLOO_SOCKET_IFNAME`` and
        ``NCCL_SOCKET_IFNAME`` set to the host's interface, ``OMP_NUM_THREADS=1`` and
        ``DDLSIM_PLACEMENT_PATH`` for ``report_placement``. ``env`` is added on top.

        Args:
            output_paths: files the ranks write; removed before the start, required after.
            stdout_callback: called with each line rank 0 prints, while it runs.

        Raises:
            ClusterRunError: a rank exited non-zero, the timeout passed or an output is
                missing; every rank has been stopped by then.
            InvalidOptionError: outside the ``with`` block or with a non-positive timeout.
        """
        if not self._entered or self._torn_down or self._run_dir is None:
            raise InvalidOptionError("launch needs an entered EmulatedCluster (use 'with')")
        if not timeout_s > 0:
            raise InvalidOptionError(f"timeout_s({timeout_s}) must be > 0")
        outputs = tuple(Path(p) for p in output_paths)
        for path in outputs:
            path.unlink(missing_ok=True)
        launch_dir = self._run_dir / f"launch{self._launches}"
        launch_dir.mkdir()
        port = (
            _free_loopback_port() if self.network == "loopback" else _FIRST_PORT + self._launches
        )
        self._launches += 1
        cores = sorted(os.sched_getaffinity(0))
        procs: list[subprocess.Popen[bytes]] = []
        start = time.monotonic()
        try:
            for rank in range(self.world_size):
                core = cores[rank % len(cores)] if self.pin_cores else None
                proc = self._start_rank(
                    rank,
                    module=module,
                    args=args,
                    env=env,
                    port=port,
                    launch_dir=launch_dir,
                    core=core,
                )
                procs.append(proc)
                self._procs.append(procs[-1])
            self._wait(procs, launch_dir, timeout_s, stdout_callback)
        finally:
            stop_processes(procs)
            for proc in procs:
                if proc in self._procs:
                    self._procs.remove(proc)
        wall_s = time.monotonic() - start
        missing = [str(p) for p in outputs if not p.exists()]
        if missing:
            raise ClusterRunError(
                f"all {self.world_size} ranks exited 0 but did not write {', '.join(missing)}"
            )
        rank_cores: dict[int, list[int]] = {}
        last_cores: dict[int, int] = {}
        for rank in range(self.world_size):
            placement_path = launch_dir / f"placement{rank}.json"
            if placement_path.exists():
                raw = json.loads(placement_path.read_text(encoding="utf-8"))
                rank_cores[rank] = list(raw["allowed_cores"])
                last_cores[rank] = int(raw["last_core"])
        return LaunchResult(
            network=self.network,
            returncodes={rank: int(proc.returncode) for rank, proc in enumerate(procs)},
            rank_cores=rank_cores,
            last_cores=last_cores,
            output_paths=outputs,
            wall_s=wall_s,
        )

    def _start_rank(
        self,
        rank: int,
        *,
        module: str,
        args: Sequence[str],
        env: Mapping[str, str] | None,
        port: int,
        launch_dir: Path,
        core: int | None,
    ) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "torch.distributed.run"]
        cmd += ["--nnodes", str(self.world_size), "--node-rank", str(rank)]
        cmd += ["--nproc-per-node", "1", "--max-restarts", "0"]
        cmd += ["--master-addr", self.address(0), "--master-port", str(port)]
        cmd += ["-m", module, *args]
        if self.network == "netns":
            cmd = ["ip", "netns", "exec", self.host_namespace(rank), *cmd]
        rank_env = dict(os.environ)
        rank_env.update(env or {})
        rank_env.update(
            {
                "GLOO_SOCKET_IFNAME": self.interface,
                "NCCL_SOCKET_IFNAME": self.interface,
                "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1",
                PLACEMENT_ENV: str(launch_dir / f"placement{rank}.json"),
            }
        )
        if self.network == "netns":
            # Emulated hosts share one machine: keep NCCL off its same-host paths (GPU peer
            # access, shared memory, InfiniBand) so that its traffic crosses the shaped link.
            rank_env.update({"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"})
            rank_env.update({"NCCL_IB_DISABLE": "1"})
        with (
            open(launch_dir / f"rank{rank}.stdout", "wb") as stdout,
            open(launch_dir / f"rank{rank}.stderr", "wb") as stderr,
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

    def _wait(
        self,
        procs: list[subprocess.Popen[bytes]],
        launch_dir: Path,
        timeout_s: float,
        stdout_callback: Callable[[str], None] | None,
    ) -> None:
        deadline = time.monotonic() + timeout_s
        lines = _LineFollower(launch_dir / "rank0.stdout", stdout_callback)
        while True:
            lines.poll()
            codes = [proc.poll() for proc in procs]
            failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                # The ranks a crash leaves behind fail soon after it, each torchrun in its own
                # time: let them, so that every failure is known before the cause is named.
                settle = time.monotonic() + _SETTLE_S
                while any(code is None for code in codes) and time.monotonic() < settle:
                    time.sleep(_POLL_S)
                    codes = [proc.poll() for proc in procs]
                stop_processes(procs)
                failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
                raise ClusterRunError(self._failure_message(failed, codes, launch_dir))
            if all(code == 0 for code in codes):
                lines.poll()
                return
            if time.monotonic() > deadline:
                running = [rank for rank, code in enumerate(codes) if code is None]
                stop_processes(procs)
                raise ClusterRunError(
                    f"launch of {self.world_size} ranks ran past timeout_s({timeout_s:g}); "
                    f"ranks still running: {running}; last stderr lines of rank "
                    f"{running[0]}:\n{_tail(launch_dir / f'rank{running[0]}.stderr')}"
                )
            time.sleep(_POLL_S)

    def _failure_message(
        self, failed: list[int], codes: list[int | None], launch_dir: Path
    ) -> str:
        stderrs = {}
        for rank in failed:
            path = launch_dir / f"rank{rank}.stderr"
            stderrs[rank] = (
                path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
            )
        # The cause first: a rank whose peer vanished under it failed because of another.
        failed = sorted(
            failed, key=lambda r: (any(m in stderrs[r] for m in _PEER_LOST_MARKERS), r)
        )
        parts = []
        for rank in failed:
            worker = _worker_exit_code(stderrs[rank])
            detail = f" (worker exit code {worker})" if worker is not None else ""
            parts.append(f"rank {rank} exited with code {codes[rank]}{detail}")
        first = failed[0]
        return (
            f"{'; '.join(parts)}; the other ranks of {self.world_size} were stopped "
            f"(network {self.network}); last stderr lines of rank {first}:\n"
            f"{_tail(launch_dir / f'rank{first}.stderr')}"
        )


def _prepare_rank(core: int | None) -> None:
    """In the forked child before exec: pin to ``core`` and die when the launcher dies."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    die_with_parent(signal.SIGTERM)


class _LineFollower:
    """Hands complete new lines of a growing file to a callback."""

    def __init__(self, path: Path, callback: Callable[[str], None] | None) -> None:
        self._path = path
        self._callback = callback
        self._offset = 0
        self._partial = b""

    def poll(self) -> None:
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


def netns_unavailable_reason() -> str | None:
    """Why this process cannot make network namespaces, or ``None`` when it can (probes by
    adding and deleting one)."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "the ip or tc command is missing"
    probe = f"{NAMESPACE_PREFIX}{os.getpid()}-{secrets.token_hex(2)}-sw"
    result = _run(["ip", "netns", "add", probe])
    if result.returncode != 0:
        return f"'ip netns add' failed: {result.stderr.strip()}"
    _run(["ip", "netns", "del", probe])
    return None


def stale_namespaces() -> list[str]:
    """Namespaces left by runs whose process is gone (killed with SIGKILL, so no teardown ran)."""
    pattern = re.compile(rf"^{re.escape(NAMESPACE_PREFIX)}(\d+)-[0-9a-f]{{4}}-(sw|h\d+)$")
    listing = _run(["ip", "netns", "list"]).stdout if shutil.which("ip") else ""
    stale = []
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        match = pattern.match(name)
        if match and not _alive(int(match.group(1))):
            stale.append(name)
    return stale


def remove_stale_namespaces() -> list[str]:
    """Delete the namespaces ``stale_namespaces`` lists (and any process still inside them),
    and the temporary run folders of the same dead runs. Returns the namespaces deleted."""
    removed = []
    for namespace in stale_namespaces():
        for pid in _run(["ip", "netns", "pids", namespace]).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        if _run(["ip", "netns", "del", namespace]).returncode == 0:
            removed.append(namespace)
    run_dir = re.compile(rf"^{re.escape(NAMESPACE_PREFIX)}(\d+)-[0-9a-f]{{4}}-\w+$")
    for path in Path(tempfile.gettempdir()).glob(f"{NAMESPACE_PREFIX}*"):
        match = run_dir.match(path.name)
        if match and path.is_dir() and not _alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
    return removed
