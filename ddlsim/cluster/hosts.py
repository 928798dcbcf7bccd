"""Emulated hosts that reach a service of this machine: one network namespace (and host name)
per host, each wired to the root namespace by a veth pair, with a TCP relay on the root end
that forwards to a port on this machine's loopback (a database listening on 127.0.0.1 only).

What the queue's workers on several hosts need to be tested on one machine: each worker runs
in a host of its own, sees only its link, names itself after its host, and reaches the store
at ``EmulatedHosts.address(i)``. Addresses come from 198.19.0.0/16 (the upper half of the
benchmark range 198.18.0.0/15; emulated clusters use the lower). Deleting a namespace deletes
its veth pair, root end included; namespaces of a killed owner are found by
``remove_stale_namespaces`` as the emulated cluster's are.

>>> with EmulatedHosts(2, target_port=5432) as hosts:
...     worker = hosts.popen(0, ["ddlsim", "worker"], env=env)
"""

import contextlib
import os
import secrets
import select
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import IO

from ddlsim.cluster.namespaces import (
    NAMESPACE_PREFIX,
    ClusterSetupError,
    delete_namespaces,
    netns_unavailable_reason,
)
from ddlsim.cluster.processes import stop_processes
from ddlsim.data.errors import InvalidOptionError

MAX_HOSTS = 200
_CHUNK = 1 << 16


class _Relay:
    """Accept on ``(address, port)`` and copy bytes both ways to ``127.0.0.1:target_port``,
    one thread a connection, until closed."""

    def __init__(self, address: str, port: int, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server((address, port), reuse_port=False)
        self.listener.settimeout(0.2)
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True, name=f"relay-{address}")
        self.thread.start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
        except OSError:
            client.close()
            return
        pair = {client: upstream, upstream: client}
        with client, upstream:
            while not self.closed.is_set():
                ready, _, _ = select.select(list(pair), [], [], 0.5)
                for source in ready:
                    try:
                        data = source.recv(_CHUNK)
                        if data:
                            pair[source].sendall(data)
                    except OSError:
                        data = b""
                    if not data:
                        return

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
        self.thread.join(timeout=2)


class EmulatedHosts:
    """``count`` hosts, each a namespace named ``host{i}`` on its UTS side too, reaching
    ``127.0.0.1:target_port`` of this machine at :meth:`address` ``(i)``:``relay_port``.

    Raises:
        ClusterSetupError: namespaces cannot be made here (not root, no ``ip``).
        InvalidOptionError: a count out of range.
    """

    def __init__(self, count: int, *, target_port: int, relay_port: int | None = None) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_HOSTS:
            raise InvalidOptionError(f"count({count!r}) must be an integer in 1..{MAX_HOSTS}")
        self.count = count
        self.target_port = target_port
        self.relay_port = relay_port or target_port
        token = secrets.token_hex(2)
        self.prefix = f"{NAMESPACE_PREFIX}{os.getpid()}-{token}-"
        self._veth = f"dh{token}"
        self.namespaces: list[str] = []
        self._relays: list[_Relay] = []
        self._procs: list[subprocess.Popen[bytes]] = []

    def namespace(self, index: int) -> str:
        return f"{self.prefix}h{index}"

    @staticmethod
    def address(index: int) -> str:
        """Where host ``index`` reaches this machine's service (the root end of its link)."""
        return f"198.19.{index}.1"

    @staticmethod
    def host_name(index: int) -> str:
        return f"host{index}"

    def __enter__(self) -> "EmulatedHosts":
        reason = netns_unavailable_reason()
        if reason is not None:
            raise ClusterSetupError(f"emulated hosts need network namespaces: {reason}")
        try:
            for index in range(self.count):
                self._add_host(index)
        except BaseException:
            self._teardown()
            raise
        return self

    def _add_host(self, index: int) -> None:
        namespace = self.namespace(index)
        outside = f"{self._veth}{index}"
        self.namespaces.append(namespace)
        for command in (
            ["ip", "netns", "add", namespace],
            ["ip", "-n", namespace, "link", "set", "lo", "up"],
            [
                "ip",
                "link",
                "add",
                outside,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                namespace,
            ],
            ["ip", "addr", "add", f"{self.address(index)}/24", "dev", outside],
            ["ip", "link", "set", outside, "up"],
            ["ip", "-n", namespace, "addr", "add", f"198.19.{index}.2/24", "dev", "eth0"],
            ["ip", "-n", namespace, "link", "set", "eth0", "up"],
        ):
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise ClusterSetupError(f"{' '.join(command)} failed: {done.stderr.strip()}")
        self._relays.append(_Relay(self.address(index), self.relay_port, self.target_port))

    def popen(
        self,
        index: int,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdout: IO[bytes] | int | None = None,
        stderr: IO[bytes] | int | None = None,
    ) -> "subprocess.Popen[bytes]":
        """Start ``argv`` on host ``index`` (its namespace, its host name), in a process group
        of its own; it is stopped when the hosts are torn down."""
        wrapped = [
            *("ip", "netns", "exec", self.namespace(index)),
            *("unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', self.host_name(index)),
            *argv,
        ]
        proc = subprocess.Popen(
            wrapped,
            env=dict(env) if env is not None else None,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        self._procs.append(proc)
        return proc

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._teardown()

    def _teardown(self) -> None:
        stop_processes(self._procs)
        for relay in self._relays:
            with contextlib.suppress(OSError):
                relay.close()
        self._relays.clear()
        delete_namespaces(self.namespaces)
