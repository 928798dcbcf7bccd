"""``ddlsim serve`` in a child process, for tests that talk to it over HTTP."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator


@contextlib.contextmanager
def serving(*args: str, token: str, stop_timeout_s: float) -> Iterator[str]:
    """``ddlsim serve ARGS`` on a free local port, with ``token`` as its API token.

    Yields its address (``http://127.0.0.1:PORT``) once ``/healthz`` answers; fails when the
    process exits first or does not answer within 60 s. On exit the server's session gets
    SIGINT and is waited for (``stop_timeout_s``).
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "ddlsim.service.cli", "serve", *args, "--port", str(port)],
        env={**os.environ, "DDLSIM_API_TOKEN": token},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{address}/healthz", timeout=2):
                    break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.3)
        yield address
    finally:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=stop_timeout_s)
