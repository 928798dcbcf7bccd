"""Load on the REST API: N concurrent clients for S seconds, mixing reads, predictions and
submissions, against a local server.

Starts ``ddlsim serve --no-worker`` on a store (``--db``; by default a fresh SQLite file into
which this script first takes the kernel profile of the model's micro-batch on one rank, so
that predictions need nothing else), warms it with one prediction of each strategy (the cost
model loads, each graph is captured once), then runs ``--clients`` threads, each on its own
keep-alive connection, until ``--seconds`` pass. Each request is drawn at random:
- a read (``--reads``, default half): the job list, one job, the model list, one model, the
  simulator's versions, the dashboard, health or metrics;
- a prediction (``--predictions``, default a third): DDP-style strategies with bucket caps
  drawn from seven values, priced each time, not answered from a cache;
- otherwise a submission: a search, an execution or a profiling run, queued (no worker runs
  here: the queue only grows, as under a burst).
A reply counts as an error unless it is 200 (202 for a submission); a failed connection too.
Prints, for each kind and in all, the requests, errors, throughput and the latency's median,
99th percentile and maximum; then checks that every accepted submission is in the queue. The
server runs in its own session and is ended by its process id. ``--concurrency N`` runs the
same load again, in the same launch, on a server computing at most N predictions at once
(``DDLSIM_PREDICT_CONCURRENCY``; the default is the machine's cores).

    .venv/bin/python benchmarks/api_load.py --clients 50 --seconds 60 --concurrency 40 \
        --out benchmarks/results/api-load-2026-11-27.json
"""

import argparse
import collections
import datetime
import http.client
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

TOKEN = "load-test"
CAPS_MB = (1, 2, 4, 8, 16, 25, 50)
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
READS = (
    "/v1/jobs?limit=20",
    "/v1/jobs/{job}",
    "/v1/models",
    "/v1/models/{model}",
    "/v1/simulator/versions",
    "/v1/dashboard",
    "/healthz",
    "/metrics",
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait(url: str, server: subprocess.Popen[bytes], seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2):
                return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start") from None
            time.sleep(0.3)


def profile_model(db: str, args: argparse.Namespace) -> None:
    """The kernel profile of one rank's micro-batch, taken into ``db`` (the predictions' input)."""
    from ddlsim.data.specs.strategy import Strategy
    from ddlsim.data.store import Store
    from ddlsim.data.zoo import ZOO
    from ddlsim.simulator.costs import rank_spec
    from ddlsim.workflows.profiles import kernel_profile_for

    spec = ZOO[args.model].with_inputs(batch_size=args.batch_size, seq_len=args.seq_len)
    with Store.open(db) as store:
        rank = rank_spec(spec, Strategy(), args.world_size)
        kernel_profile_for(store, rank, optimizer="adamw", iters=10)


class Client:
    """One client: a keep-alive connection and the requests it drew."""

    def __init__(self, port: int, body: dict[str, Any], seed: int, mix: tuple[float, float]):
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.port = port
        self.body = body
        self.rng = random.Random(seed)
        self.reads, self.predictions = mix
        self.done: list[tuple[str, float, int]] = []  # (kind, seconds, status)
        self.accepted: list[int] = []  # ids of the jobs it submitted

    def request(
        self, method: str, path: str, body: dict[str, Any] | None
    ) -> tuple[float, int, bytes]:
        started = time.perf_counter()
        try:
            payload = None if body is None else json.dumps(body)
            self.connection.request(method, path, payload, HEADERS)
            response = self.connection.getresponse()
            data = response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            status, data = 0, b""
            self.connection.close()
        return time.perf_counter() - started, status, data

    def one(self, known_jobs: list[int]) -> None:
        draw = self.rng.random()
        if draw < self.reads:
            template = self.rng.choice(READS)
            job = self.rng.choice(known_jobs) if known_jobs else 1
            path = template.format(job=job, model=self.body["model"])
            seconds, status, _ = self.request("GET", path, None)
            # a job before any was submitted is a 404, the only other answer a read may give
            ok = status == 200 or (status == 404 and "{job}" in template and not known_jobs)
            self.done.append(("read", seconds, 200 if ok else status))
        elif draw < self.reads + self.predictions:
            cap = self.rng.choice(CAPS_MB)
            request = {**self.body, "strategy": {"tensor_fusion": {"bucket_cap_mb": cap}}}
            seconds, status, _ = self.request("POST", "/v1/predictions", request)
            self.done.append(("prediction", seconds, status))
        else:
            path, body = self.submission()
            seconds, status, data = self.request("POST", path, body)
            self.done.append(("submission", seconds, 200 if status == 202 else status))
            if status == 202:
                self.accepted.append(int(json.loads(data)["id"]))

    def submission(self) -> tuple[str, dict[str, Any]]:
        kind = self.rng.choice(("search", "execution", "profiling"))
        if kind == "search":
            return "/v1/strategy-requests", {**self.body, "budget": 50}
        if kind == "execution":
            cap = self.rng.choice(CAPS_MB)
            strategy = {"tensor_fusion": {"bucket_cap_mb": cap}}
            return "/v1/executions", {**self.body, "strategy": strategy, "iters": 5}
        batch = self.rng.randrange(1, 64)
        job = {"kind": "kernels", "model": self.body["model"], "batch_size": batch, "iters": 5}
        if self.body.get("seq_len"):
            job["seq_len"] = self.body["seq_len"]
        return "/v1/profiling-runs", {"jobs": [job]}


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def summary(rows: list[tuple[str, float, int]], wall_s: float) -> dict[str, Any]:
    latencies = sorted(seconds for _, seconds, _ in rows)
    return {
        "requests": len(rows),
        "errors": sum(1 for _, _, status in rows if status != 200),
        "throughput_per_s": round(len(rows) / wall_s, 1),
        "p50_ms": round(1e3 * statistics.median(latencies), 1),
        "p99_ms": round(1e3 * percentile(latencies, 0.99), 1),
        "max_ms": round(1e3 * latencies[-1], 1),
    }


def run_load(args: argparse.Namespace, db: str, concurrency: int | None) -> dict[str, Any]:
    """One server (``DDLSIM_PREDICT_CONCURRENCY`` set to ``concurrency`` unless ``None``), its
    warm-up, then the clients until the time is up: the figures."""
    from ddlsim.data.store import Store
    from ddlsim.data.store.tasks import TaskQueue

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DDLSIM_API_TOKEN": TOKEN}
    if concurrency is not None:
        env["DDLSIM_PREDICT_CONCURRENCY"] = str(concurrency)
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "ddlsim.service.cli", "serve", "--no-worker"),
            *("--db", db, "--port", str(port)),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    body = {
        "model": args.model,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "world_size": args.world_size,
        "bandwidth": "1gbit",
    }
    try:
        _wait(url, server)
        warm = Client(port, body, 0, (0.0, 1.0))
        for _ in CAPS_MB:  # loads the cost model, captures each strategy's graph once
            warm.one([])
        if any(status != 200 for _, _, status in warm.done):
            raise SystemExit(f"the warm-up predictions failed: {warm.done}")
        clients = [
            Client(port, body, seed, (args.reads, args.predictions))
            for seed in range(1, args.clients + 1)
        ]
        known: list[int] = []
        deadline = time.monotonic() + args.seconds

        def drive(client: Client) -> None:
            while time.monotonic() < deadline:
                before = len(client.accepted)
                client.one(known)
                known.extend(client.accepted[before:])  # list.extend is atomic in CPython
            client.connection.close()

        started = time.perf_counter()
        threads = [threading.Thread(target=drive, args=(c,)) for c in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall_s = time.perf_counter() - started
    finally:
        os.killpg(server.pid, signal.SIGINT)
        server.wait(timeout=60)
    with Store.open(db) as store:
        in_queue = {task.id for task in TaskQueue(store).list(status="queued", limit=10**7)}
    rows = [row for client in clients for row in client.done]
    by_kind: dict[str, list[tuple[str, float, int]]] = collections.defaultdict(list)
    for row in rows:
        by_kind[row[0]].append(row)
    return {
        "predict_concurrency": concurrency or "default (the cores)",
        "all": summary(rows, wall_s),
        "by_kind": {
            kind: summary(kind_rows, wall_s) for kind, kind_rows in sorted(by_kind.items())
        },
        "submissions_accepted": len(known),
        "submissions_in_queue": len(set(known) & in_queue),
        "error_statuses": dict(collections.Counter(s for _, _, s in rows if s != 200)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", help="store URL (default: a fresh SQLite file, profiled here)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--reads", type=float, default=0.5, help="share of reads")
    parser.add_argument("--predictions", type=float, default=1 / 3, help="share of predictions")
    parser.add_argument("--model", default="gpt2-tiny")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="*",
        default=[],
        help="also run with DDLSIM_PREDICT_CONCURRENCY at each of these, after the default",
    )
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    if not 0 <= args.reads + args.predictions <= 1:
        raise SystemExit(f"--reads({args.reads}) + --predictions({args.predictions}) must be <= 1")
    db = args.db
    if db is None:
        db = f"sqlite:///{Path(tempfile.mkdtemp(prefix='ddlsim-api-load-')) / 'load.db'}"
        profile_model(db, args)
    runs = [run_load(args, db, concurrency) for concurrency in [None, *args.concurrency]]
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "command": " ".join(sys.argv),
        "setting": (
            f"{args.model} (batch {args.batch_size}, seq {args.seq_len}), {args.world_size} "
            f"ranks, 1gbit; {args.clients} clients for {args.seconds:.0f} s; reads "
            f"{args.reads:.2f}, predictions {args.predictions:.2f}, submissions "
            f"{1 - args.reads - args.predictions:.2f}"
        ),
        "runs": runs,
    }
    print(f"# {result['setting']}; {result['machine']}")
    print("| predictions at once | kind | requests | errors | throughput | p50 | p99 | max |")
    print("|---|---|---|---|---|---|---|---|")
    for run in runs:
        for kind, figures in [*run["by_kind"].items(), ("all", run["all"])]:
            print(
                f"| {run['predict_concurrency']} | {kind} | {figures['requests']} | "
                f"{figures['errors']} | {figures['throughput_per_s']} /s | "
                f"{figures['p50_ms']:.0f} ms | {figures['p99_ms']:.0f} ms | "
                f"{figures['max_ms']:.0f} ms |"
            )
        print(
            f"submissions accepted {run['submissions_accepted']}, in the queue "
            f"{run['submissions_in_queue']}; error statuses {run['error_statuses']}"
        )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
