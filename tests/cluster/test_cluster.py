"""The emulated cluster: ranks run, and nothing outlives a run (success, crash, signal)."""

import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from ddlsim.cluster import (
    FORCE_LOOPBACK_ENV,
    ClusterRunError,
    EmulatedCluster,
    LoopbackFallbackWarning,
    netns_unavailable_reason,
    remove_stale_namespaces,
)
from ddlsim.cluster.rank_logs import failure_message
from ddlsim.data.errors import DdlsimError, InvalidClusterError, InvalidOptionError

RANK_MODULE = "ddlsim.profiler.collective_rank"
NETNS_REASON = netns_unavailable_reason()
needs_netns = pytest.mark.skipif(
    NETNS_REASON is not None, reason=f"network namespaces unavailable: {NETNS_REASON}"
)


def _worker_args(output: Path, *extra: str) -> list[str]:
    """A tiny benchmark: two small all-reduces, one repeat."""
    return [
        *("--output", str(output), "--collectives", "all_reduce", "--sizes", "4096,8192"),
        *("--warmup", "0", "--repeats", "1", *extra),
    ]


def _namespaces() -> set[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in listing.stdout.splitlines() if line.strip()}


def _root_links() -> set[str]:
    listing = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, check=True
    )
    return {line.split(":")[1].strip() for line in listing.stdout.splitlines()}


def _processes_mentioning(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker`` (a run's unique output path)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


def _eventually(check: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def test_bad_arguments_raise_before_anything_starts() -> None:
    with pytest.raises(InvalidClusterError, match="world_size"):
        EmulatedCluster(0, "1gbit")
    with pytest.raises(InvalidClusterError, match="'fast'"):
        EmulatedCluster(2, "fast")
    with pytest.raises(InvalidOptionError, match="with"):
        EmulatedCluster(2, "1gbit").launch(RANK_MODULE, [], timeout_s=1)
    assert issubclass(ClusterRunError, DdlsimError) and issubclass(ClusterRunError, RuntimeError)


@needs_netns
def test_successful_run_leaves_no_namespace_or_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A launcher that runs under torchrun itself: its agent's variables reach no rank (with
    # this one, rank 0 would wait for a store that no agent hosts).
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    links_before = _root_links()
    output = tmp_path / "out.json"
    with EmulatedCluster(2, "1gbit") as cluster:
        prefix = cluster.prefix
        assert cluster.network == "netns"
        assert {n for n in _namespaces() if n.startswith(prefix)} == {
            f"{prefix}sw",
            f"{prefix}h0",
            f"{prefix}h1",
        }
        result = cluster.launch(
            RANK_MODULE, _worker_args(output), timeout_s=120, output_paths=[output]
        )
    assert result.network == "netns"
    assert result.returncodes == {0: 0, 1: 0}
    assert set(result.rank_cores) == {0, 1} and set(result.last_cores) == {0, 1}
    assert all(result.last_cores[r] in result.rank_cores[r] for r in (0, 1))
    assert output.exists() and result.output_paths == (output,)
    assert not {n for n in _namespaces() if n.startswith(prefix)}
    assert _root_links() - links_before == set()


@needs_netns
def test_rank_crash_names_the_rank_and_cleans_up(tmp_path: Path) -> None:
    output = tmp_path / "out.json"
    args = _worker_args(output, "--test-crash-rank", "1", "--test-crash-code", "3")
    with (
        pytest.raises(ClusterRunError, match=r"rank 1 exited with code 3;"),
        EmulatedCluster(2, "1gbit") as cluster,
    ):
        prefix = cluster.prefix
        cluster.launch(RANK_MODULE, args, timeout_s=120, output_paths=[output])
    assert not {n for n in _namespaces() if n.startswith(prefix)}
    assert _eventually(lambda: not _processes_mentioning(str(output)), 5)


def test_failure_names_the_rank_that_caused_it_first(tmp_path: Path) -> None:
    """Rank 0 failed because rank 1's connection closed under it: rank 1 is the cause, named
    first, and its stderr is the one shown."""
    (tmp_path / "rank0.stderr").write_text(
        "RuntimeError: ... Connection closed by peer [198.18.0.2]:684\n"
    )
    (tmp_path / "rank1.stderr").write_text("Traceback ...\nrank 1: test crash\n")
    (tmp_path / "rank2.stderr").write_text("")
    message = failure_message([0, 1], [1, 3, None], tmp_path, world_size=3, network="netns")
    assert message.startswith(
        "rank 1 exited with code 3; rank 0 exited with code 1; the other ranks of 3 were stopped"
    )
    assert message.endswith("last stderr lines of rank 1:\nTraceback ...\nrank 1: test crash")


_PARENT = """
import sys
from ddlsim.cluster import EmulatedCluster
with EmulatedCluster(2, "1gbit") as cluster:
    print(cluster.prefix, flush=True)
    cluster.launch("ddlsim.profiler.collective_rank", sys.argv[1:], timeout_s=300)
"""


@needs_netns
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_killed_parent_tears_down(tmp_path: Path, sig: signal.Signals) -> None:
    output = tmp_path / "out.json"
    marker = str(output)
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, *_worker_args(output, "--test-sleep-s", "120")],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert parent.stdout is not None
        prefix = parent.stdout.readline().strip()
        assert prefix.startswith("ddlsim-")

        def both_workers_run() -> bool:
            """Both ranks exist."""
            return len([p for p in _processes_mentioning(marker) if _is_worker(p)]) == 2

        assert _eventually(both_workers_run, 60)
        os.kill(parent.pid, sig)
        assert parent.wait(timeout=30) != 0
        assert _eventually(lambda: not _processes_mentioning(marker), 10)
        assert not {n for n in _namespaces() if n.startswith(prefix)}
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()


def _is_worker(pid: int) -> bool:
    """Whether ``pid`` is a rank (``python -m MODULE``), not the parent that started it (whose
    command line holds the rank's arguments too)."""
    worker_cmd = b"\0-m\0" + RANK_MODULE.encode() + b"\0"
    try:
        return worker_cmd in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_loopback_fallback_warns_once_and_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FORCE_LOOPBACK_ENV, "1")
    output = tmp_path / "out.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with EmulatedCluster(2, "1gbit") as cluster:
            assert cluster.network == "loopback" and cluster.namespaces == []
            result = cluster.launch(
                RANK_MODULE, _worker_args(output), timeout_s=120, output_paths=[output]
            )
    fallbacks = [w for w in caught if issubclass(w.category, LoopbackFallbackWarning)]
    assert len(fallbacks) == 1
    assert "1gbit" in str(fallbacks[0].message)
    assert result.network == "loopback"
    assert result.returncodes == {0: 0, 1: 0}
    assert set(result.rank_cores) == {0, 1}


def test_timeout_stops_every_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FORCE_LOOPBACK_ENV, "1")
    output = tmp_path / "out.json"
    with (
        pytest.warns(LoopbackFallbackWarning),
        pytest.raises(ClusterRunError, match=r"ran past timeout_s\(3\)"),
        EmulatedCluster(2, None) as cluster,
    ):
        cluster.launch(RANK_MODULE, _worker_args(output, "--test-sleep-s", "120"), timeout_s=3)
    assert _eventually(lambda: not _processes_mentioning(str(output)), 5)


@needs_netns
def test_a_launch_and_a_worker_sweep_stale_namespaces(tmp_path: Path) -> None:
    """Namespaces of a run killed outright go before the next cluster's and at worker start."""
    from ddlsim.service.worker import Worker

    dead = subprocess.Popen(["true"])
    dead.wait()
    for sweeper in ("cluster", "worker"):
        stale = f"ddlsim-{dead.pid}-cafe-sw"
        subprocess.run(["ip", "netns", "add", stale], check=True)
        try:
            if sweeper == "cluster":
                with EmulatedCluster(2, "1gbit"):
                    assert stale not in _namespaces()
            else:
                Worker(f"sqlite:///{tmp_path / 'w.db'}", poll_s=0.01).run(once=True)
                assert stale not in _namespaces()
        finally:
            subprocess.run(["ip", "netns", "del", stale], check=False, capture_output=True)


@needs_netns
def test_stale_namespaces_of_dead_runs_are_removed() -> None:
    """A launcher killed with SIGKILL leaves its namespaces; they can be found and removed."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"ddlsim-{dead.pid}-beef-sw"
    live = f"ddlsim-{os.getpid()}-beef-sw"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        removed = remove_stale_namespaces()
        assert stale in removed and live not in removed
        assert live in _namespaces() and stale not in _namespaces()
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
