"""Load on ``POST /v1/predictions``: N concurrent clients for S seconds against a local server.

Starts ``ddlsim serve --no-worker`` on the given store (it needs the model's kernel profile at
the rank's micro-batch: a copy of the shipped dataset's store has gpt2-tiny's), warms it with
one prediction (the cost model loads), then runs ``--clients`` threads, each on its own
keep-alive connection, posting predictions of DDP-style strategies with bucket caps drawn from
seven values (so every request is priced, not answered from a cache) until ``--seconds`` pass.
Prints the requests, the errors (any status but 200, any failed connection), the throughput
and the latency's median, 99th percentile and maximum. The server runs in its own session and
is ended by its process id.

    .venv/bin/python benchmarks/api_load.py --db sqlite:///bench.db --clients 50 --seconds 60
"""

import argparse
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
import threading
import time
import urllib.request

TOKEN = "load-test"
CAPS_MB = (1, 2, 4, 8, 16, 25, 50)


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


HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def one(connection: http.client.HTTPConnection, body: dict, cap_mb: float) -> tuple[float, int]:
    """One prediction: (seconds, HTTP status, 0 for a failed connection)."""
    request = {**body, "strategy": {"tensor_fusion": {"bucket_cap_mb": cap_mb}}}
    started = time.perf_counter()
    try:
        connection.request("POST", "/v1/predictions", json.dumps(request), HEADERS)
        response = connection.getresponse()
        response.read()
        status = response.status
    except (OSError, http.client.HTTPException):
        status = 0
        connection.close()
    return time.perf_counter() - started, status


def client(
    port: int, body: dict, deadline: float, seed: int, out: list[tuple[float, int]]
) -> None:
    rng = random.Random(seed)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    while time.monotonic() < deadline:
        out.append(one(connection, body, rng.choice(CAPS_MB)))
    connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--model", default="gpt2-tiny")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "ddlsim.service.cli", "serve", "--no-worker"),
            *("--db", args.db, "--port", str(port)),
        ],
        env={**os.environ, "DDLSIM_API_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait(url, server)
        body = {
            "model": args.model,
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "world_size": args.world_size,
            "bandwidth": "1gbit",
        }
        warm = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        for cap in CAPS_MB:  # loads the cost model, captures each strategy's graph once
            _, status = one(warm, body, cap)
            if status != 200:
                raise SystemExit(f"the warm-up prediction failed with HTTP {status}")
        warm.close()
        results: list[tuple[float, int]] = []
        deadline = time.monotonic() + args.seconds
        started = time.perf_counter()
        threads = [
            threading.Thread(target=client, args=(port, body, deadline, seed, results))
            for seed in range(1, args.clients + 1)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
    finally:
        os.killpg(server.pid, signal.SIGINT)
        server.wait(timeout=60)
    latencies = sorted(seconds for seconds, _ in results)
    errors = sum(1 for _, status in results if status != 200)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    print(
        f"# {args.model} (batch {args.batch_size}), {args.world_size} ranks, 1gbit; "
        f"{args.clients} clients for {args.seconds:.0f} s; {platform.machine()}, "
        f"{os.cpu_count()} cores"
    )
    print("| requests | errors | throughput | p50 | p99 | max |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {len(results)} | {errors} | {len(results) / wall:.1f} /s | "
        f"{1e3 * statistics.median(latencies):.0f} ms | {1e3 * p99:.0f} ms | "
        f"{1e3 * latencies[-1]:.0f} ms |"
    )


if __name__ == "__main__":
    main()
