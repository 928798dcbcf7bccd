"""``ddlsim serve`` (the REST API, with a worker process by default) and ``ddlsim worker``.

The bearer token for mutating requests comes from ``$DDLSIM_API_TOKEN``, else from the token
file (``--token-file``, default ``api-token`` in the user's data directory), which the first
start creates with a random token and prints.
"""

import argparse
import os
import secrets
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import platformdirs
import uvicorn

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.store import DB_ENV_VAR, default_url, mask_url
from ddlsim.data.store.tasks import STALE_S
from ddlsim.service.api import Settings, create_app
from ddlsim.service.output import add_launcher_arguments
from ddlsim.service.worker import HEARTBEAT_S, cmd_worker

TOKEN_ENV = "DDLSIM_API_TOKEN"
WORKER_STOP_S = 30.0
RESTART_PAUSE_S = 5.0


def default_token_file() -> Path:
    return Path(platformdirs.user_data_dir("ddlsim")) / "api-token"


def load_token(path: Path) -> tuple[str, bool]:
    """The API token from ``$DDLSIM_API_TOKEN`` or ``path``, creating the file (mode 0600)
    with a new random token when neither has one. The flag says whether it was created now."""
    from_env = os.environ.get(TOKEN_ENV, "").strip()
    if from_env:
        return from_env, False
    if path.is_file():
        token = path.read_text("utf-8").strip()
        if token:
            return token, False
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(token + "\n")
    return token, True


def cmd_serve(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise InvalidOptionError(f"port({args.port}) must be between 1 and 65535")
    url = args.db or default_url()
    token_file = Path(args.token_file) if args.token_file else default_token_file()
    token, created = load_token(token_file)
    # Beyond loopback, jobs' requests, results and errors are readable by whoever reaches the
    # port: reads need the token too.
    protect = args.host not in LOOPBACK_HOSTS and not args.open_reads
    app = create_app(
        Settings(db=url, token=token, simulator=args.simulator, protect_reads=protect)
    )
    worker = None if args.no_worker else _Supervisor(url, args.simulator)
    address = f"http://{args.host}:{args.port}"
    print(f"ddlsim serving {mask_url(url)} on {address}", flush=True)
    print(f"  dashboard {address}/  API docs {address}/docs", flush=True)
    if created:
        print(f"  API token (new, saved in {token_file}): {token}", flush=True)
    elif not os.environ.get(TOKEN_ENV):
        print(f"  API token in {token_file}", flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        if worker is not None:
            worker.stop()
    return 0


class _Supervisor:
    """Keeps one worker process running beside the server: one that exits is started again
    (after a pause); :meth:`stop` ends it by its id."""

    def __init__(self, url: str, simulator: str | None) -> None:
        self.url = url
        self.simulator = simulator
        self.stopping = threading.Event()
        self.process = _start_worker(url, simulator)
        self.thread = threading.Thread(target=self._watch, name="ddlsim-worker-watch", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while True:
            code = self.process.wait()
            if self.stopping.wait(RESTART_PAUSE_S if code != 0 else 0.0) or self.stopping.is_set():
                return
            print(f"ddlsim serve: the worker exited ({code}); starting another", flush=True)
            self.process = _start_worker(self.url, self.simulator)

    def stop(self) -> None:
        self.stopping.set()
        _stop(self.process)
        self.thread.join(timeout=WORKER_STOP_S)


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def _start_worker(url: str, simulator: str | None) -> subprocess.Popen[bytes]:
    """The worker, in a session of its own (so that its executor ranks end with it). The store's
    URL, which may hold a password, goes in its environment (``$DDLSIM_DB``), never on its
    command line, which any user can read (``ps``, ``/proc/PID/cmdline``)."""
    command = [sys.executable, "-m", "ddlsim.service.cli", "worker", "--parent", str(os.getpid())]
    if simulator:
        command += ["--simulator", simulator]
    env = {**os.environ, DB_ENV_VAR: url}
    return subprocess.Popen(command, start_new_session=True, env=env)


def _stop(worker: subprocess.Popen[bytes]) -> None:
    """End the worker by its id: SIGTERM (its task goes back in the queue), then SIGKILL."""
    if worker.poll() is not None:
        return
    os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(timeout=WORKER_STOP_S)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def register(sub: Any) -> None:
    serve = sub.add_parser("serve", help="the REST API and dashboard, with a worker process")
    serve.add_argument("--db", help="store URL (default: $DDLSIM_DB or the user data dir)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--open-reads",
        action="store_true",
        help="beyond loopback, let reads through without the token (only behind a proxy "
        "that authenticates its users)",
    )
    serve.add_argument(
        "--no-worker", action="store_true", help="start no worker (run `ddlsim worker` apart)"
    )
    serve.add_argument("--token-file", help=f"the API token's file (unless ${TOKEN_ENV} is set)")
    serve.add_argument("--simulator", help="replay, or a cost-model checkpoint")
    serve.add_argument("--log-level", default="warning", help="uvicorn's log level")
    serve.set_defaults(handler=cmd_serve)

    worker = sub.add_parser("worker", help="run the queued jobs of a store, one at a time")
    worker.add_argument("--db", help="store URL (default: $DDLSIM_DB or the user data dir)")
    worker.add_argument("--poll", type=float, default=1.0, help="seconds between queue checks")
    worker.add_argument("--once", action="store_true", help="stop when the queue is empty")
    worker.add_argument("--simulator", help="replay, or a cost-model checkpoint")
    worker.add_argument(
        "--heartbeat",
        type=float,
        default=HEARTBEAT_S,
        help=f"seconds between a running task's heartbeats (default {HEARTBEAT_S:g})",
    )
    worker.add_argument(
        "--stale",
        type=float,
        default=STALE_S,
        help="seconds without a heartbeat after which a running task's worker is taken as "
        f"dead and the task queued again (default {STALE_S:g}; every worker of a store alike)",
    )
    worker.add_argument(
        "--devices",
        default="cpu",
        help="what this worker offers: cpu (CPU tasks only; default) or cuda:N (N GPUs on "
        "this host; CPU tasks too); a task that needs more waits for another worker",
    )
    worker.add_argument(
        "--cluster",
        help="the named cluster profile this worker's host belongs to: tasks for that "
        "cluster go to its workers only",
    )
    worker.add_argument("--name", help="the worker's name in the queue (default: HOST:PID)")
    add_launcher_arguments(worker, what="a task's runs (each sized to the task)", joins=False)
    worker.add_argument("--parent", type=int, help=argparse.SUPPRESS)  # serve's pid
    worker.set_defaults(handler=cmd_worker)
