"""Workers on several hosts share one queue: a profiling run's jobs spread over them, a worker
killed outright loses nothing, and a task that needs CUDA waits for a worker that offers it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.queue_hosts import check, collect
from ddlsim.cluster import netns_unavailable_reason
from ddlsim.data.store import Store
from ddlsim.data.store.tasks import TaskQueue
from ddlsim.profiler.batch import gpus_needed, parse_batch_data
from tests.data.conftest import _postgres_base_url


def test_two_hosts_collect_one_run_and_survive_a_killed_worker(tmp_path: Path) -> None:
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.skip(f"emulated hosts need network namespaces: {reason}")
    result = collect(_postgres_base_url(), jobs=6, hosts=2, kill_at=0.3, log_dir=tmp_path)
    assert check(result) == [], result
    assert result["killed"] == "host0"
    assert set(result["profiles_by_host"]) <= {"host0", "host1"}
    assert result["jobs_by_worker"].get("host1", 0) >= 1


def test_a_cuda_job_waits_for_a_cuda_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    jobs = parse_batch_data(
        {
            "jobs": [
                {"kind": "kernels", "model": "mlp", "batch_size": 4, "iters": 2, "warmup": 1},
                {"kind": "kernels", "model": "mlp", "batch_size": 8, "device": "cuda"},
            ]
        }
    )
    with Store.open(url) as store:
        queue = TaskQueue(store)
        parent = queue.submit_run(
            "profile",
            {},
            [
                ("profile-job", {"jobs": [{"kind": j.kind, **j.settings}]}, gpus_needed(j))
                for j in jobs
            ],
        )
    done = subprocess.run(
        [sys.executable, "-m", "ddlsim", "worker", "--once", "--devices", "cpu", "--poll", "0.1"],
        env={**os.environ, "DDLSIM_DB": url},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    with Store.open(url) as store:
        queue = TaskQueue(store)
        cpu_job, cuda_job = queue.children(parent.id)
        assert cpu_job.status == "done" and cpu_job.worker is not None
        assert cuda_job.status == "queued" and cuda_job.attempts == 0, "never claimed"
        assert cuda_job.message == (
            "waits for a worker with 1 CUDA GPU(s) (ddlsim worker --devices cuda:1)"
        )
        run = queue.get(parent.id)
        assert run.status == "running" and run.progress == 0.5


def test_a_bad_device_offer_is_named() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ddlsim", "worker", "--once", "--devices", "gpu:2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "--devices 'gpu:2' is not a device offer; allowed: cpu, or cuda:N" in done.stderr
    assert "Traceback" not in done.stderr
