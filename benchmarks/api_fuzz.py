"""Schemathesis over every operation of the API, with a worker running what it queues.

Generates ``--cases`` requests for each operation of the OpenAPI schema (valid and invalid
bodies, parameters and paths; with the token, so that writes get past it; half the bodies
pointed at a zoo model, so that they get past the model's lookup to the other checks and, when
accepted, to the worker) against ``ddlsim serve --no-worker`` on a fresh SQLite store, while a
worker process (``ddlsim worker``, each task held to ``--task-deadline`` seconds) runs the
searches, executions and profiling runs the accepted submissions queue. Once every operation
has had its cases, the worker is given ``--drain`` seconds to finish the queue; what is still
queued then is cancelled, and the worker stopped by its process id (SIGTERM).

Prints, for each operation, the cases sent and the answers of 5xx (the goal: none), and for the
queued jobs how they ended: done, failed with a message of ddlsim's (a refusal the worker could
only make at run time, or the deadline), failed with an unexpected exception (the goal: none;
something the submission check should have refused), cancelled; and whether the worker
survived every task.

    .venv/bin/python benchmarks/api_fuzz.py --cases 200 \
        --out benchmarks/results/api-fuzz-2026-11-27.json
"""

import argparse
import collections
import datetime
import json
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.core.result import Ok

from ddlsim.data.store import Store
from ddlsim.data.store.tasks import TaskQueue
from ddlsim.profiler.batch import KINDS

TOKEN = "fuzz-token"
STEERED = 0.5  # the share of generated bodies pointed at a zoo model (see steer)
MODELS = ("mlp", "gpt2-tiny", "bert-tiny", "resnet-18")
# The worker writes an exception it did not expect as "TypeName: message" (service.worker).
# ddlsim's own errors are written as their message alone.
UNEXPECTED = re.compile(r"^[A-Z]\w*(Error|Exception|Warning): ")


def fuzz(url: str, cases: int) -> dict[str, dict[str, Any]]:
    """``cases`` generated requests to each operation of the server at ``url``; per operation,
    the cases and the 5xx."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", wait_for_schema=120.0)
    figures: dict[str, dict[str, Any]] = {}
    for result in schema.get_all_operations():
        if not isinstance(result, Ok):
            raise SystemExit(f"the schema has an invalid operation: {result}")
        operation = result.ok()
        figures[operation.label] = seen = fuzz_operation(operation, cases, url)
        print(
            f"{operation.label}: {seen['cases']} cases, {seen['5xx']} 5xx, "
            f"{seen['statuses']} ({seen['seconds']} s)",
            flush=True,
        )
    return figures


def steer(body: dict[str, Any], rng: random.Random) -> None:
    """Point a generated body at a zoo model (and a batch's jobs at real kinds, with only
    their kind's keys), its other values left as generated: it gets past the model's lookup
    and the batch's key check to every other check, and, accepted, to the worker."""
    if "model" in body or "batch_size" in body:
        body["model"] = rng.choice(MODELS)
    for section in ("jobs", "product"):
        entries = body.get(section)
        if not isinstance(entries, list):
            continue
        if not entries and section == "jobs":
            entries.append({})
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict):
                continue
            kind = rng.choice(sorted(KINDS))
            kept = {k: v for k, v in entry.items() if k in KINDS[kind]}
            if section == "product":
                kept = {k: v if isinstance(v, list) else [v] for k, v in kept.items()}
                kept |= {"kind": [kind], "model": [rng.choice(MODELS)]}
            else:
                kept |= {"kind": kind, "model": rng.choice(MODELS)}
                if kind == "collectives":
                    kept.setdefault("world_size", 2)
            entries[index] = kept


def fuzz_operation(operation: Any, cases: int, url: str) -> dict[str, Any]:
    rng = random.Random(0)
    statuses: collections.Counter[int] = collections.Counter()
    examples: list[dict[str, str]] = []
    started = time.monotonic()

    @given(case=operation.as_strategy())
    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def send(case: schemathesis.Case) -> None:
        if isinstance(case.body, dict) and rng.random() < STEERED:
            steer(case.body, rng)
        response = case.call(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"})
        statuses[response.status_code] += 1
        if response.status_code >= 500 and len(examples) < 3:
            examples.append({"body": str(case.body)[:300], "answer": response.text[:300]})

    send()
    return {
        "cases": sum(statuses.values()),
        "5xx": sum(n for status, n in statuses.items() if status >= 500),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "examples": examples,
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> None:
    """Long: the benchmark's steps in the order they run (server, worker, the fuzzing, the
    report)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", type=int, default=200, help="cases per operation")
    parser.add_argument("--task-deadline", type=float, default=5.0)
    parser.add_argument("--drain", type=float, default=2400.0, help="seconds for the queue")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ddlsim-api-fuzz-"))
    db = f"sqlite:///{work / 'fuzz.db'}"
    log = work / "worker.log"
    Store.open(db).close()  # migrated before the server and the worker open it
    env = {**os.environ, "DDLSIM_TASK_DEADLINE_S": str(args.task_deadline)}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "ddlsim.service.cli", "serve", "--no-worker"),
            *("--db", db, "--port", str(port), "--simulator", "replay"),
        ],
        env={**env, "DDLSIM_API_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "ddlsim.service.cli", "worker", "--db", db),
                *("--simulator", "replay", "--poll", "0.2"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    started = time.monotonic()
    worker_died: int | None = None
    try:
        try:
            operations = fuzz(f"http://127.0.0.1:{port}", args.cases)
        finally:
            os.killpg(server.pid, signal.SIGINT)
            server.wait(timeout=60)
        fuzz_s = time.monotonic() - started
        with Store.open(db) as store:
            queue = TaskQueue(store)
            deadline = time.monotonic() + args.drain
            while time.monotonic() < deadline and worker.poll() is None:
                if not queue.list(status="queued", limit=1) and not queue.list(
                    status="running", limit=1
                ):
                    break
                time.sleep(2.0)
            worker_died = worker.poll()
            left = queue.list(status="queued", limit=100_000)
            for task in left:
                queue.cancel(task.id)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=120)
    with Store.open(db) as store:
        tasks = TaskQueue(store).list(limit=100_000)
    outcomes: collections.Counter[str] = collections.Counter()
    unexpected: list[str] = []
    refusals: collections.Counter[str] = collections.Counter()
    for task in tasks:
        if task.status != "failed":
            outcomes[task.status] += 1
            continue
        error = task.error or ""
        if UNEXPECTED.match(error):
            outcomes["failed, unexpected"] += 1
            unexpected.append(f"task {task.id} ({task.kind}): {error[:200]}")
        else:
            outcomes["failed, ddlsim's message"] += 1
            refusals[re.sub(r"\btask \d+", "task N", error)[:90]] += 1
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "command": " ".join(sys.argv),
        "operations": operations,
        "cases": sum(o["cases"] for o in operations.values()),
        "5xx": sum(o["5xx"] for o in operations.values()),
        "fewest_cases": min(o["cases"] for o in operations.values()),
        "fuzz_s": round(fuzz_s, 1),
        "jobs": len(tasks),
        "job_outcomes": dict(outcomes),
        "cancelled_unrun": len(left),
        "unexpected_failures": unexpected,
        "refusals_at_run_time": dict(refusals.most_common(15)),
        "worker_exited_early": worker_died,
    }
    print(
        f"# {len(operations)} operations, {result['cases']} cases (fewest {result['fewest_cases']}"
        f" an operation), {result['5xx']} 5xx, {result['fuzz_s']} s; {result['machine']}"
    )
    print(f"jobs queued and run: {len(tasks)}: {dict(outcomes)}; left unrun: {len(left)}")
    print(f"unexpected failures: {unexpected or 'none'}")
    print(f"run-time refusals: {dict(refusals.most_common(15))}")
    print(f"worker exited early: {worker_died}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
