"""The emulated cluster's network: one namespace per rank and a switch, links shaped with ``tbf``.

Topology: every rank is a host with its own network namespace and one interface (``eth0``), a
veth whose peer sits in a "switch" namespace, enslaved to a bridge. Each veth is rate-limited on
both ends (the host end shapes what the rank uploads, the switch end what it downloads), so a
rank's link behaves like a full-duplex NIC of the given rate. Addresses come from 198.18.0.0/15,
the range set aside for network benchmarks; no traffic leaves the run's namespaces. Everything
(veths, bridge) is created inside the run's namespaces, so deleting them removes all of it and
the root namespace is never touched.

A launcher killed with SIGKILL leaves its namespaces behind: ``remove_stale_namespaces`` finds
them by the dead process id in their name and deletes them.
"""

import os
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ddlsim.cluster.processes import kill_pids, process_alive
from ddlsim.data.errors import DdlsimError
from ddlsim.data.specs.cluster import burst_bytes

NAMESPACE_PREFIX = "ddlsim-"
HOST_INTERFACE = "eth0"

_TBF_LATENCY = "100ms"


class ClusterSetupError(DdlsimError, RuntimeError):
    """Namespaces could be made but the links could not be wired or shaped."""


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=False)


def _check(cmd: Sequence[str]) -> None:
    result = _run(cmd)
    if result.returncode != 0:
        raise ClusterSetupError(
            f"{' '.join(cmd)!r} failed with exit code {result.returncode}: {result.stderr.strip()}"
        )


def host_address(rank: int) -> str:
    """Rank ``rank``'s address in 198.18.0.0/16 (a /16 of the benchmark range 198.18.0.0/15)."""
    host = rank + 1
    return f"198.18.{host // 256}.{host % 256}"


def switch_namespace(prefix: str) -> str:
    """The name of the namespace holding the bridge of the run whose names start ``prefix``."""
    return f"{prefix}sw"


def host_namespace(prefix: str, rank: int) -> str:
    """The name of rank ``rank``'s namespace in the run whose names start ``prefix``."""
    return f"{prefix}h{rank}"


def build_network(
    *,
    prefix: str,
    world_size: int,
    bandwidth: str,
    bandwidth_gbps: float | None,
    namespaces: list[str],
) -> None:
    """Make the switch and ``world_size`` hosts, wire each host to the bridge and shape both
    ends of its link to ``bandwidth`` (a ``tc`` rate; no shaping when ``bandwidth_gbps`` is
    ``None``).

    Each namespace is appended to ``namespaces`` before it is made, so that whoever deletes
    them after a failure or a signal, half way through, finds every one.

    Raises:
        ClusterSetupError: an ``ip`` or ``tc`` command failed.
    """
    switch = switch_namespace(prefix)
    namespaces.append(switch)
    _check(["ip", "netns", "add", switch])
    _check(["ip", "-n", switch, "link", "set", "lo", "up"])
    _check(["ip", "-n", switch, "link", "add", "br0", "type", "bridge"])
    _check(["ip", "-n", switch, "link", "set", "br0", "up"])
    for rank in range(world_size):
        host = host_namespace(prefix, rank)
        port = f"h{rank}"
        namespaces.append(host)
        _check(["ip", "netns", "add", host])
        _check(["ip", "-n", host, "link", "set", "lo", "up"])
        # Both ends are created inside the run's namespaces: nothing lands in the root one.
        _check(
            [
                *("ip", "link", "add", HOST_INTERFACE, "netns", host, "type", "veth"),
                *("peer", "name", port, "netns", switch),
            ]
        )
        _check(["ip", "-n", switch, "link", "set", port, "master", "br0"])
        _check(["ip", "-n", switch, "link", "set", port, "up"])
        address = f"{host_address(rank)}/16"
        _check(["ip", "-n", host, "addr", "add", address, "dev", HOST_INTERFACE])
        _check(["ip", "-n", host, "link", "set", HOST_INTERFACE, "up"])
        if bandwidth_gbps is not None:
            _shape(host, HOST_INTERFACE, bandwidth, bandwidth_gbps)
            _shape(switch, port, bandwidth, bandwidth_gbps)


def _shape(namespace: str, device: str, bandwidth: str, bandwidth_gbps: float) -> None:
    burst = burst_bytes(bandwidth_gbps)
    _check(
        [
            *("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf"),
            *("rate", bandwidth, "burst", str(burst), "latency", _TBF_LATENCY),
        ]
    )


def delete_namespaces(namespaces: list[str]) -> None:
    """Delete ``namespaces`` (and with them veths and bridge), the last made first, killing any
    process still inside; empties the list."""
    # Hosts first (deleting one deletes its veth and the peer on the bridge), switch last.
    for namespace in reversed(namespaces):
        # Anything still inside (a process that escaped its group) is killed first.
        kill_pids(_run(["ip", "netns", "pids", namespace]).stdout.split())
        _run(["ip", "netns", "del", namespace])
    namespaces.clear()


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
        if match and not process_alive(int(match.group(1))):
            stale.append(name)
    return stale


def remove_stale_namespaces() -> list[str]:
    """Delete the namespaces ``stale_namespaces`` lists (and any process still inside them),
    and the temporary run folders of the same dead runs. Returns the namespaces deleted."""
    removed = []
    for namespace in stale_namespaces():
        kill_pids(_run(["ip", "netns", "pids", namespace]).stdout.split())
        if _run(["ip", "netns", "del", namespace]).returncode == 0:
            removed.append(namespace)
    run_dir = re.compile(rf"^{re.escape(NAMESPACE_PREFIX)}(\d+)-[0-9a-f]{{4}}-\w+$")
    for path in Path(tempfile.gettempdir()).glob(f"{NAMESPACE_PREFIX}*"):
        match = run_dir.match(path.name)
        if match and path.is_dir() and not process_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
    return removed
