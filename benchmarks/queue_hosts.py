"""Queue across hosts: workers on emulated hosts (a network namespace and a host name each)
collect one profiling run together from one PostgreSQL store; optionally one is SIGKILLed
halfway through.

A fresh schema of the PostgreSQL server at ``--postgres`` (default
``$DDLSIM_TEST_POSTGRES_URL``, as ``scripts/postgres.sh`` sets it) gets a profiling run of
``--jobs`` kernels jobs (the zoo's small language models at several batch sizes, a few
iterations each), queued as the REST API queues it: a parent task and one task a job. Each host
runs ``ddlsim worker`` against the store through its own link (``EmulatedHosts``); with
``--kill-at F`` the first host's worker is killed with SIGKILL once a fraction F of the jobs
has ended, and the others take over its job when its heartbeat goes stale.

Then it prints, and checks:
- the run ended done, every job task done, after at most two claims;
- how many jobs each host's worker ran;
- nothing twice: one kernel profile a job (each of the host that ran it), one "done" mark a job;
- no namespace and no worker left.

    .venv/bin/python benchmarks/queue_hosts.py --jobs 24 --hosts 2
    .venv/bin/python benchmarks/queue_hosts.py --jobs 24 --hosts 2 --kill-at 0.5
"""

import argparse
import collections
import datetime
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from ddlsim.cluster.hosts import EmulatedHosts
from ddlsim.cluster.namespaces import stale_namespaces
from ddlsim.data.store import Store
from ddlsim.data.store.scratch import scratch_schema
from ddlsim.data.store.tasks import TaskQueue
from ddlsim.profiler.batch import gpus_needed, parse_batch_data

MODELS = ("gpt2-tiny", "opt-tiny", "falcon-tiny", "mistral-tiny", "albert-tiny", "electra-tiny")
BATCH_SIZES = (1, 2, 3, 4, 5, 6)
HEARTBEAT_S, STALE_S = 1.0, 5.0


def kernel_jobs(count: int) -> list[dict[str, Any]]:
    """``count`` distinct kernels jobs: small models at several batch sizes, few iterations."""
    jobs = [
        {"kind": "kernels", "model": model, "batch_size": batch, "iters": 3, "warmup": 1}
        for batch in BATCH_SIZES
        for model in MODELS
    ]
    if count > len(jobs):
        raise SystemExit(f"--jobs {count}: at most {len(jobs)} distinct jobs are defined")
    return jobs[:count]


def collect(
    base_url: str,
    *,
    jobs: int,
    hosts: int,
    kill_at: float | None,
    timeout_s: float = 1800.0,
    log_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the collection (see the module's docstring); what it measured and found."""
    entries = kernel_jobs(jobs)
    parsed = parse_batch_data({"jobs": entries})
    with scratch_schema(base_url, prefix="ddlsim_hosts") as url, Store.open(url) as store:
        queue = TaskQueue(store)
        children = [
            ("profile-job", {"jobs": [{"kind": j.kind, **j.settings}]}, gpus_needed(j))
            for j in parsed
        ]
        parent = queue.submit_run("profile", {"jobs": entries}, children)
        port = make_url(url).port or 5432
        began = time.monotonic()
        killed: str | None = None
        with EmulatedHosts(hosts, target_port=port) as network:
            workers = []
            for index in range(hosts):
                host_url = make_url(url).set(host=network.address(index))
                env = {
                    **os.environ,
                    # The password travels in the environment, never on a command line.
                    "DDLSIM_DB": host_url.render_as_string(hide_password=False),
                    "OMP_NUM_THREADS": "1",
                }
                log = (log_dir / f"worker-{index}.log").open("wb") if log_dir else None
                argv = [
                    sys.executable, "-m", "ddlsim", "worker", "--name",
                    network.host_name(index), "--poll", "0.2", "--heartbeat", str(HEARTBEAT_S),
                    "--stale", str(STALE_S),
                ]  # fmt: skip
                workers.append(network.popen(index, argv, env=env, stdout=log, stderr=log))
            while True:
                record = queue.get(parent.id)
                if record.status in ("done", "failed", "cancelled"):
                    break
                if time.monotonic() - began > timeout_s:
                    raise SystemExit(f"the run did not end within {timeout_s:.0f} s")
                ended = sum(c.status == "done" for c in queue.children(parent.id))
                if kill_at is not None and killed is None and ended >= kill_at * jobs:
                    os.killpg(workers[0].pid, signal.SIGKILL)
                    killed = network.host_name(0)
                    workers[0].wait()
                time.sleep(0.2)
            wall_s = time.monotonic() - began
        children_done = queue.children(parent.id)
        kernel_profiles = store.kernel_profiles()
        with store.transaction() as session:
            marks = session.execute(text("SELECT key, status FROM ddlsim_jobs ORDER BY key")).all()
        final = queue.get(parent.id)
    by_worker = collections.Counter(c.worker for c in children_done)
    per_graph = collections.Counter(p.graph_hash for p in kernel_profiles)
    return {
        "jobs": jobs,
        "hosts": hosts,
        "killed": killed,
        "kill_at": kill_at,
        "wall_s": round(wall_s, 1),
        "run_status": final.status,
        "job_statuses": dict(collections.Counter(c.status for c in children_done)),
        "claims": dict(collections.Counter(c.attempts for c in children_done)),
        "jobs_by_worker": dict(sorted(by_worker.items(), key=lambda kv: str(kv[0]))),
        "kernel_profiles": len(kernel_profiles),
        "profiles_by_host": dict(collections.Counter(p.host for p in kernel_profiles)),
        "graphs_profiled_twice": sum(1 for n in per_graph.values() if n > 1),
        "done_marks": sum(1 for _, status in marks if status == "done"),
        "distinct_job_keys": len({key for key, _ in marks}),
        "namespaces_left": len(stale_namespaces()),
    }


def check(result: dict[str, Any]) -> list[str]:
    """What the run must hold to; the broken ones, named."""
    jobs = result["jobs"]
    problems = []
    if result["run_status"] != "done" or result["job_statuses"] != {"done": jobs}:
        problems.append(f"run {result['run_status']}, jobs {result['job_statuses']}")
    if set(result["claims"]) - {1, 2}:
        problems.append(f"a job claimed more than twice: {result['claims']}")
    if result["kernel_profiles"] != jobs or result["graphs_profiled_twice"]:
        problems.append(
            f"{result['kernel_profiles']} kernel profiles for {jobs} jobs, "
            f"{result['graphs_profiled_twice']} graphs twice"
        )
    if result["done_marks"] != jobs or result["distinct_job_keys"] != jobs:
        problems.append(f"{result['done_marks']} done marks for {jobs} jobs")
    if result["namespaces_left"]:
        problems.append(f"{result['namespaces_left']} namespaces left")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", default=os.environ.get("DDLSIM_TEST_POSTGRES_URL"))
    parser.add_argument("--jobs", type=int, default=24)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--kill-at", type=float, help="SIGKILL host 0's worker at this fraction")
    parser.add_argument("--out", type=Path, help="write the result JSON here")
    args = parser.parse_args()
    if not args.postgres:
        raise SystemExit("--postgres (or $DDLSIM_TEST_POSTGRES_URL) is needed")
    result = collect(args.postgres, jobs=args.jobs, hosts=args.hosts, kill_at=args.kill_at)
    result["problems"] = check(result)
    result["machine"] = f"{platform.node()} ({os.cpu_count()} cores)"
    result["date"] = datetime.date.today().isoformat()
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if result["problems"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
