"""Issue 22's first acceptance check, end to end: a service and its worker on a PostgreSQL
store whose URL holds a password; the password is on no process's command line, in no output
and in no API response. Runs where the test PostgreSQL server does (root, scripts/postgres.sh)."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

SECRET = "Zq9s3cretPW"
ROLE = "ddlsim_secret_probe"
DATABASE = "ddlsim_secret_probe"
TOKEN = "probe-token"


def _psql(sql: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", "postgres", "--", "psql", "-X", "-q", "-c", sql],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def secret_url() -> Iterator[str]:
    base = os.environ.get("DDLSIM_TEST_POSTGRES_URL")
    if not base or os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs the test PostgreSQL server and root (scripts/postgres.sh)")
    parts = urlsplit(base)
    _psql(f"DROP DATABASE IF EXISTS {DATABASE}")
    _psql(f"DROP ROLE IF EXISTS {ROLE}")
    made = _psql(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{SECRET}'")
    if made.returncode != 0:
        pytest.skip(f"cannot create a role: {made.stderr.strip()}")
    _psql(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
    try:
        yield f"postgresql+psycopg://{ROLE}:{SECRET}@{parts.hostname}:{parts.port}/{DATABASE}"
    finally:
        _psql(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        _psql(f"DROP ROLE IF EXISTS {ROLE}")


def _cmdlines() -> str:
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found.append(path.read_bytes().decode(errors="replace"))
        except OSError:
            continue
    return "\n".join(found)


def _get(address: str, path: str) -> str:
    request = urllib.request.Request(
        f"{address}{path}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read().decode()


def _post(address: str, path: str, body: dict[str, object]) -> str:
    request = urllib.request.Request(
        f"{address}{path}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.read().decode()


def test_the_store_password_leaks_nowhere(secret_url: str, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DDLSIM_DB": secret_url, "DDLSIM_API_TOKEN": TOKEN}
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "ddlsim.service.cli", "serve", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    address = f"http://127.0.0.1:{port}"
    responses = []
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                _get(address, "/healthz")
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.3)
        time.sleep(1.0)  # the worker is up too
        assert SECRET not in _cmdlines()
        # A job that fails (no such model file on the worker) and one that is refused.
        responses.append(
            _post(
                address,
                "/v1/profiling-runs",
                {"jobs": [{"kind": "collectives", "world_size": 2, "bandwidth": "fast"}]},
            )
        )
        task = json.loads(
            _post(
                address,
                "/v1/strategy-requests",
                {"model": "mlp", "batch_size": 8, "time_limit": 1, "budget": 2},
            )
        )
        responses.append(json.dumps(task))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            job = _get(address, f"/v1/jobs/{task['id']}")
            if json.loads(job)["status"] in {"done", "failed", "cancelled"}:
                break
            time.sleep(0.5)
        responses.append(job)
        for path in (
            "/v1/simulator/versions",
            "/v1/jobs",
            "/metrics",
            "/v1/models",
            "/v1/dashboard",
        ):
            responses.append(_get(address, path))
        assert SECRET not in _cmdlines()
    finally:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=60)
    for text in responses:
        assert SECRET not in text
    assert SECRET not in log.read_text()
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlsim.service.cli",
            "profile",
            "collectives",
            "--world-size",
            "2",
            "--bandwidth",
            "fast",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert cli.returncode != 0 and SECRET not in cli.stdout + cli.stderr
