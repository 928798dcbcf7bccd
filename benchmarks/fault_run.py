"""Fault run: the worker SIGKILLed at random points while queued jobs of every kind run.

Queues ``--jobs`` jobs of each kind, taking turns, as the REST API queues them, into a fresh
store: profiling runs (a kernels job of gpt2-tiny each, at a batch size of its own, and a
collectives job on an emulated 1 Gbit/s cluster in every fifth), searches (every fifth verified
by real runs) and executions (every other one on an emulated 1 Gbit/s cluster, the rest on
loopback).
One worker process runs them at a time; each is killed with SIGKILL after a random time
(uniform between ``--min-s`` and ``--max-s``) and a new one started, ``--kills`` times; a few
jobs of each kind are cancelled at random moments meanwhile. A last worker runs what is left
until every job has ended, and is stopped by its process id (SIGTERM). Workers beat every
second, and a silent task counts as lost after six.

Then it checks, and prints, what a deployment must hold to:
- every job ended done, failed or cancelled (none lost), after at most two attempts;
- nothing stored twice: the measurements are exactly those the done executions and verified
  searches name (one each, and each verified strategy once), the predictions exactly those of
  the done executions; no graph has two kernel profiles and no collective two fits;
- no network namespace and no rank, launcher or worker process remains.

    .venv/bin/python benchmarks/fault_run.py --jobs 20 --kills 30 \
        --out benchmarks/results/fault-run-2026-11-27.json
"""

import argparse
import collections
import datetime
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ddlsim.cluster.namespaces import NAMESPACE_PREFIX
from ddlsim.data.store import Store
from ddlsim.data.store.tasks import TaskQueue
from ddlsim.data.zoo import ZOO
from ddlsim.executor.run import RunOptions
from ddlsim.profiler.batch import parse_batch_data
from ddlsim.workflows.profile import check_job
from ddlsim.workflows.requests import ExecuteRequest, MeasureSettings, SearchRequest

HEARTBEAT_S, STALE_S = 1.0, 6.0
ENDED = frozenset({"done", "failed", "cancelled"})
# What a process left behind by a killed worker would show on its command line.
LEFTOVER_MARKS = ("ddlsim.executor.rank_main", "torch.distributed.run", "ddlsim.service.cli")
MLP = ZOO["mlp"].with_inputs(batch_size=16)
MEASURE = MeasureSettings(iters=2, warmup=1, budget_s=0.0)


def submit_jobs(queue: TaskQueue, count: int) -> dict[int, str]:
    """Queue ``count`` jobs of each kind as the REST API queues them (the use cases' request
    JSON; a batch checked job by job), the kinds taking turns so that kills land on every kind
    all through the run; their ids and kinds, in the order queued."""
    kinds: dict[int, str] = {}
    for index in range(count):
        for kind, request in (profiling(index), searching(index), executing(index)):
            kinds[queue.submit(kind, request).id] = kind
    return kinds


def profiling(index: int) -> tuple[str, dict[str, Any]]:
    # A batch size of its own: each job profiles a graph no search or execution uses.
    kernels = {"kind": "kernels", "model": "gpt2-tiny", "seq_len": 64, "iters": 10}
    jobs: list[dict[str, Any]] = [{**kernels, "batch_size": 2 + index}]
    if index % 5 == 0:  # the same job each time: stored once, then skipped as done
        jobs.append(
            {
                **{"kind": "collectives", "world_size": 2, "bandwidth": "1gbit"},
                **{"sizes": ["64KiB", "1MiB"], "warmup": 1, "repeats": 3, "cpu_repeats": 1},
            }
        )
    batch = {"jobs": jobs}
    for job in parse_batch_data(batch):
        check_job(job)
    return "profile", batch


def searching(index: int) -> tuple[str, dict[str, Any]]:
    request = SearchRequest(
        model=MLP,
        world_size=2,
        bandwidth="1gbit",
        budget=12,
        space="fusion",
        seed=index,
        verify=index % 5 == 0,
        verify_rounds=1,
        measure=MEASURE,
    )
    return "search", request.to_json()


def executing(index: int) -> tuple[str, dict[str, Any]]:
    options = RunOptions(
        world_size=2,
        bandwidth="1gbit" if index % 2 else None,
        iters=MEASURE.iters,
        warmup=MEASURE.warmup,
        budget_s=MEASURE.budget_s,
        seed=index,
    )
    return "execution", ExecuteRequest(model=MLP, options=options, predict=True).to_json()


def start_worker(db: str, log: Path) -> subprocess.Popen[bytes]:
    command = [
        *(sys.executable, "-m", "ddlsim.service.cli", "worker", "--db", db),
        *("--simulator", "replay", "--poll", "0.2"),
        *("--heartbeat", str(HEARTBEAT_S), "--stale", str(STALE_S)),
    ]
    with log.open("ab") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def statuses(queue: TaskQueue) -> dict[int, Any]:
    return {task.id: task for task in queue.list(limit=10_000)}


def leftovers() -> dict[str, list[str]]:
    """Namespaces of ddlsim runs and ddlsim processes other than this one."""
    found = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True)
    listing = found.stdout
    namespaces = [
        line.split()[0] for line in listing.splitlines() if line.startswith(NAMESPACE_PREFIX)
    ]
    processes = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(mark in cmdline for mark in LEFTOVER_MARKS):
            processes.append(f"{entry.name}: {cmdline[:160]}")
    return {"namespaces": namespaces, "processes": processes}


def check_rows(store: Store, tasks: dict[int, Any], kinds: dict[int, str]) -> dict[str, Any]:
    """Whether the store holds each done job's rows once and nothing else."""
    done = {i: t for i, t in tasks.items() if t.status == "done"}
    named_measurements = [
        t.result["measurement_id"] for i, t in done.items() if kinds[i] == "execution"
    ]
    named_predictions = [
        t.result["prediction_id"] for i, t in done.items() if kinds[i] == "execution"
    ]
    verified_runs = sum(
        len(t.result.get("verified", [])) for i, t in done.items() if kinds[i] == "search"
    )
    measurements = store.measurements()
    predictions = store.predictions()
    kernel_graphs = collections.Counter(p.graph_hash for p in store.kernel_profiles())
    fits = collections.Counter(
        (p.collective, p.world_size, p.bandwidth) for p in store.collective_profiles()
    )
    execution_ids = set(named_measurements)
    return {
        "measurements": len(measurements),
        "measurements_expected": len(named_measurements) + verified_runs,
        "execution_measurements_stored": len(execution_ids & {m.id for m in measurements}),
        "execution_measurements_named": len(named_measurements),
        "predictions": len(predictions),
        "predictions_expected": len(named_predictions),
        "graphs_with_two_kernel_profiles": sum(1 for n in kernel_graphs.values() if n > 1),
        "collectives_fitted_twice": sum(1 for n in fits.values() if n > 1),
        "ok": (
            len(measurements) == len(named_measurements) + verified_runs
            and len(execution_ids) == len(named_measurements)
            and execution_ids <= {m.id for m in measurements}
            and sorted(p.id or 0 for p in predictions) == sorted(named_predictions)
            and all(n == 1 for n in kernel_graphs.values())
            and all(n == 1 for n in fits.values())
        ),
    }


def main() -> None:
    """Long: the benchmark's run in the order it happens (server, workers, kills, checks, report),
    read top to bottom."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=20, help="jobs of each kind")
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--min-s", type=float, default=2.0)
    parser.add_argument("--max-s", type=float, default=20.0)
    parser.add_argument("--cancels", type=int, default=2, help="jobs of each kind cancelled")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db", help="store URL (default: a fresh SQLite file)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="ddlsim-fault-run-"))
    db = args.db or f"sqlite:///{work / 'fault.db'}"
    log = work / "workers.log"
    started = time.monotonic()
    store = Store.open(db)
    queue = TaskQueue(store)
    kinds = submit_jobs(queue, args.jobs)
    by_kind: dict[str, list[int]] = collections.defaultdict(list)
    for task_id, kind in kinds.items():
        by_kind[kind].append(task_id)
    to_cancel = [i for ids in by_kind.values() for i in rng.sample(ids, args.cancels)]
    rng.shuffle(to_cancel)
    kills: list[dict[str, Any]] = []
    cancels: list[dict[str, Any]] = []
    print(f"# {len(kinds)} jobs queued; store {work}; workers' output in {log}", flush=True)
    worker = start_worker(db, log)
    try:
        while len(kills) < args.kills:
            wait_s = rng.uniform(args.min_s, args.max_s)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if to_cancel and rng.random() < 0.02:
                    task_id = to_cancel.pop()
                    before = queue.get(task_id).status
                    queue.cancel(task_id)
                    cancels.append({"task": task_id, "kind": kinds[task_id], "was": before})
                time.sleep(0.1)
            now = statuses(queue).values()
            if not any(t.status in ("queued", "running") for t in now):
                break  # nothing left to interrupt
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait()
            mine = f":{worker.pid}"
            hit = next(
                (t for t in now if t.status == "running" and (t.worker or "").endswith(mine)), None
            )
            kills.append(
                {
                    "after_s": round(wait_s, 1),
                    "task": hit.id if hit else None,
                    "kind": kinds[hit.id] if hit else None,
                    "attempt": hit.attempts if hit else None,
                    "doing": (hit.message or "")[:120] if hit else "idle",
                }
            )
            print(f"kill {len(kills)}: {kills[-1]}", flush=True)
            worker = start_worker(db, log)
        for task_id in to_cancel:  # the cancels the kills did not reach
            cancels.append(
                {"task": task_id, "kind": kinds[task_id], "was": queue.get(task_id).status}
            )
            queue.cancel(task_id)
        while any(t.status not in ENDED for t in statuses(queue).values()):
            if worker.poll() is not None:
                raise SystemExit(f"the last worker exited ({worker.returncode}); see {log}")
            time.sleep(1.0)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=120)
    wall_s = time.monotonic() - started
    time.sleep(2.0)  # ranks of the last killed worker end by their parent-death signal
    tasks = statuses(queue)
    left = leftovers()
    rows = check_rows(store, tasks, kinds)
    store.close()
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for task_id, task in tasks.items():
        table[kinds[task_id]][task.status] += 1
    attempts = collections.Counter(t.attempts for t in tasks.values())
    lost = [i for i, t in tasks.items() if t.status not in ENDED]
    failed_errors = collections.Counter(
        (t.error or "")[:90] for t in tasks.values() if t.status == "failed"
    )
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "command": " ".join(sys.argv),
        "jobs": len(kinds),
        "kills": kills,
        "cancels": cancels,
        "by_kind": {kind: dict(counts) for kind, counts in sorted(table.items())},
        "attempts": {str(k): v for k, v in sorted(attempts.items())},
        "failed_errors": dict(failed_errors),
        "lost": lost,
        "rows": rows,
        "leftovers": left,
        "wall_s": round(wall_s, 1),
        "ok": not lost
        and rows["ok"]
        and not left["namespaces"]
        and not left["processes"]
        and max(attempts) <= 2,
    }
    print(f"# {result['machine']}; {len(kills)} kills, {len(cancels)} cancels, {wall_s:.0f} s")
    print("| kind | done | failed | cancelled | lost |")
    print("|---|---|---|---|---|")
    for kind, counts in sorted(table.items()):
        lost_here = sum(1 for i in lost if kinds[i] == kind)
        print(
            f"| {kind} | {counts['done']} | {counts['failed']} | {counts['cancelled']} | "
            f"{lost_here} |"
        )
    print(f"rows: {rows}")
    print(f"attempts: {dict(attempts)}; failed: {dict(failed_errors)}")
    print(f"left behind: {left}")
    print(f"ok: {result['ok']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
