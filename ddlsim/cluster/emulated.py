"""Launching ranks on an emulated cluster: one rank per host, under its namespace.

Ranks start one per host with the variables torchrun gives its workers (:mod:`.host`) under
``ip netns exec``, each in its own session so it can be stopped as a process group; gloo and
NCCL are bound to the host's interface and the rendezvous is rank 0's address.

Where namespaces cannot be made (not root, no ``ip``, ``ip netns add`` refused) the cluster falls
back to plain loopback (127.0.0.1, no shaping) with one ``LoopbackFallbackWarning``; every
result records which network it ran on.

Teardown always runs: on leaving the ``with`` block (success, error, a rank's crash), on SIGINT,
SIGTERM and SIGHUP (turned into exceptions while the cluster is entered, so ``finally`` blocks
run) and, as a last resort, at interpreter exit. If the launcher is killed with SIGKILL, ranks
still exit (a parent-death signal) and only the namespaces remain, for
``remove_stale_namespaces`` to delete.
"""

import atexit
import dataclasses
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from ddlsim.cluster import interrupt
from ddlsim.cluster.host import start_rank
from ddlsim.cluster.namespaces import (
    HOST_INTERFACE,
    NAMESPACE_PREFIX,
    build_network,
    delete_namespaces,
    host_address,
    host_namespace,
    netns_unavailable_reason,
    remove_stale_namespaces,
)
from ddlsim.cluster.placement import pinned_cores, read_placements
from ddlsim.cluster.processes import stop_processes
from ddlsim.cluster.rank_logs import (
    LineFollower,
    failure_message,
    rank_log,
    timeout_message,
)
from ddlsim.data.errors import DdlsimError, InvalidClusterError, InvalidOptionError
from ddlsim.data.specs.cluster import parse_bandwidth_gbps

Network = Literal["netns", "loopback"]

FORCE_LOOPBACK_ENV = "DDLSIM_FORCE_LOOPBACK"
MAX_WORLD_SIZE = 1024

_FIRST_PORT = 29500
_POLL_S = 0.05
# After a rank fails, how long the others get to fail too before all are stopped.
_SETTLE_S = 2.0


class ClusterRunError(DdlsimError, RuntimeError):
    """A rank exited non-zero or the launch ran past its timeout; all ranks were stopped."""


class LoopbackFallbackWarning(UserWarning):
    """Network namespaces are unavailable: ranks talk over 127.0.0.1 and no rate is enforced."""


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


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
                # Namespaces of runs killed outright would hold this run's addresses and links.
                remove_stale_namespaces()
                build_network(
                    prefix=self.prefix,
                    world_size=self.world_size,
                    bandwidth=self.bandwidth,
                    bandwidth_gbps=self.bandwidth_gbps,
                    namespaces=self.namespaces,
                )
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
            delete_namespaces(self.namespaces)
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

    def host_namespace(self, rank: int) -> str:
        """The name of rank ``rank``'s network namespace."""
        return host_namespace(self.prefix, rank)

    # -- launching -------------------------------------------------------------------------

    def address(self, rank: int) -> str:
        """Rank ``rank``'s address (127.0.0.1 on loopback)."""
        return "127.0.0.1" if self.network == "loopback" else host_address(rank)

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
        """Run ``python -m module *args`` as one rank per host and wait for all.

        Each host runs its rank with torchrun's worker variables (:mod:`.host`), the rendezvous
        on rank 0, in its own session, ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` set to
        the host's interface, ``OMP_NUM_THREADS=1`` and ``DDLSIM_PLACEMENT_PATH`` for
        ``report_placement``; ``env`` is added on top.

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
        cores = pinned_cores(self.world_size, pin=self.pin_cores)
        procs: list[subprocess.Popen[bytes]] = []
        start = time.monotonic()
        try:
            for rank in range(self.world_size):
                proc = start_rank(
                    rank=rank,
                    world_size=self.world_size,
                    module=module,
                    args=args,
                    env=env,
                    master_address=self.address(0),
                    master_port=port,
                    namespace=self.host_namespace(rank) if self.network == "netns" else None,
                    interface=self.interface,
                    launch_dir=launch_dir,
                    core=cores[rank],
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
        rank_cores, last_cores = read_placements(launch_dir, self.world_size)
        return LaunchResult(
            network=self.network,
            returncodes={rank: int(proc.returncode) for rank, proc in enumerate(procs)},
            rank_cores=rank_cores,
            last_cores=last_cores,
            output_paths=outputs,
            wall_s=wall_s,
        )

    def _wait(
        self,
        procs: list[subprocess.Popen[bytes]],
        launch_dir: Path,
        timeout_s: float,
        stdout_callback: Callable[[str], None] | None,
    ) -> None:
        deadline = time.monotonic() + timeout_s
        lines = LineFollower(rank_log(launch_dir, 0, "stdout"), stdout_callback)
        while True:
            interrupt.check()  # a cancelled task stops here; close() then ends the ranks
            lines.poll()
            codes = [proc.poll() for proc in procs]
            failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                # The ranks a crash leaves behind fail soon after it, each in its own
                # time: let them, so that every failure is known before the cause is named.
                settle = time.monotonic() + _SETTLE_S
                while any(code is None for code in codes) and time.monotonic() < settle:
                    time.sleep(_POLL_S)
                    codes = [proc.poll() for proc in procs]
                stop_processes(procs)
                failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
                raise ClusterRunError(
                    failure_message(
                        failed,
                        codes,
                        launch_dir,
                        world_size=self.world_size,
                        network=self.network,
                    )
                )
            if all(code == 0 for code in codes):
                lines.poll()
                return
            if time.monotonic() > deadline:
                running = [rank for rank, code in enumerate(codes) if code is None]
                stop_processes(procs)
                raise ClusterRunError(
                    timeout_message(
                        running, launch_dir, world_size=self.world_size, timeout_s=timeout_s
                    )
                )
            time.sleep(_POLL_S)
