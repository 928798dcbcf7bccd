"""The REST API: reads, authorised writes, bad input as 4xx naming the field, and jobs that a
worker runs to the end (a profiling run, a search, an execution), cancels or hands back."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import transformers
from fastapi.testclient import TestClient

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.store import Store
from ddlsim.data.store.tasks import TaskQueue
from ddlsim.data.zoo import ZOO
from ddlsim.executor.run import RunOptions
from ddlsim.service import worker as worker_module
from ddlsim.service.api import Settings, create_app
from ddlsim.service.worker import Worker
from ddlsim.workflows.requests import ExecuteRequest, SearchRequest

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MLP = {"model": "mlp", "batch_size": 16}


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'api.db'}"


@pytest.fixture
def client(db: str) -> Iterator[TestClient]:
    app = create_app(Settings(db=db, token=TOKEN, max_body_bytes=64 * 1024, simulator="replay"))
    with TestClient(app) as test_client:
        yield test_client


def _work(db: str) -> int:
    return Worker(db, poll_s=0.05, simulator="replay").run(once=True)


def test_reads_need_no_token(client: TestClient) -> None:
    assert client.get("/healthz").json()["status"] == "ok"
    names = [m["name"] for m in client.get("/v1/models").json()["models"]]
    assert names[: len(ZOO)] == list(ZOO)
    assert client.get("/v1/models/gpt2-tiny").json()["class"] == "GPT2LMHeadModel"
    versions = client.get("/v1/simulator/versions").json()
    assert versions["simulator"].startswith("replay") and versions["checkpoint"] is None
    assert client.get("/openapi.json").json()["info"]["title"] == "ddlsim"


def test_writes_need_the_token(client: TestClient) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
        response = client.post("/v1/predictions", json=MLP, headers=headers)
        assert response.status_code in (401, 403)
        assert response.json()["field"] == "header.authorization"
    assert client.post("/v1/jobs/1/cancel").status_code == 401


def test_bad_input_is_a_4xx_naming_the_field(client: TestClient) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model": "mlp", "world_size": 0}, "body.world_size"),
        ({"model": "mlp", "nonsense": 1}, "body.nonsense"),
        ({"model": 5}, "body.model"),
        ({"model": "no-such-model"}, "body.model"),
        ({"model": "/etc/passwd"}, "body.model"),
        ({"model": "mlp", "strategy": {"tensor_fusion": {"bucket_cap_mb": -1}}}, "body.strategy"),
        ({"model": {"source": "transformers", "class": "NoSuchModel"}}, "body.model"),
    ]
    for body, field in cases:
        response = client.post("/v1/predictions", json=body, headers=AUTH)
        assert 400 <= response.status_code < 500, (body, response.text)
        payload = response.json()
        assert payload["field"].startswith(field), (body, payload)
        assert payload["error"]
    response = client.post(
        "/v1/predictions",
        content=b"{not json",
        headers={**AUTH, "content-type": "application/json"},
    )
    assert response.status_code == 422
    big = client.post("/v1/predictions", content=b"x" * 70_000, headers=AUTH)
    assert big.status_code == 413 and big.json()["field"] == "body"
    huge = {"model": "mlp", "strategy": {"tensor_fusion": {"bucket_cap_mb": 1e308}}}
    for path in ("/v1/predictions", "/v1/graphs", "/v1/executions"):
        response = client.post(path, json=huge, headers=AUTH)
        assert response.status_code == 422 and response.json()["field"] == "body.strategy"
    nan = b'{"model": "mlp", "strategy": {"tensor_fusion": {"bucket_cap_mb": NaN}}}'
    response = client.post(
        "/v1/executions", content=nan, headers={**AUTH, "content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    runs: list[tuple[dict[str, Any], str]] = [
        # a strategy is an object: a string would be a path on the server
        ({"jobs": [{"kind": "run", "model": "mlp", "strategy": "/etc/hosts"}]}, "body.jobs.0"),
        ({"jobs": [{"kind": ["x"]}]}, "body"),
        (
            {
                "product": [
                    {
                        "kind": ["kernels"],
                        "model": ["mlp"],
                        "iters": list(range(1, 200)),
                        "warmup": list(range(200)),
                    }
                ]
            },
            "body",
        ),
    ]
    for body, field in runs:
        response = client.post("/v1/profiling-runs", json=body, headers=AUTH)
        assert 400 <= response.status_code < 500, (body, response.text)
        assert response.json()["field"].startswith(field), response.json()
    assert client.get("/v1/jobs/12345").status_code == 404
    assert client.get("/v1/graphs/nope").status_code == 404


def test_register_a_model_spec(client: TestClient) -> None:
    spec = {**ZOO["gpt2-tiny"].to_dict(), "name": "my-gpt2"}
    created = client.post("/v1/models", json={"spec": spec}, headers=AUTH)
    assert created.status_code == 201 and created.json()["name"] == "my-gpt2"
    assert client.get("/v1/models/my-gpt2").json()["config"] == spec["config"]
    assert "my-gpt2" in [m["name"] for m in client.get("/v1/models").json()["models"]]
    clash = client.post("/v1/models", json={"spec": ZOO["mlp"].to_dict()}, headers=AUTH)
    assert clash.status_code == 400 and clash.json()["field"] == "body.spec.name"
    bad = {**spec, "class": "os.system"}
    refused = client.post("/v1/models", json={"spec": bad}, headers=AUTH)
    assert refused.status_code == 422 and refused.json()["field"] == "body.spec"


def test_a_profiling_run_then_predictions_and_graphs(client: TestClient, db: str) -> None:
    missing = client.post("/v1/predictions", json=MLP, headers=AUTH)
    assert missing.status_code == 409 and "profile" in missing.json()["error"]
    run = client.post(
        "/v1/profiling-runs",
        json={"jobs": [{"kind": "kernels", "model": "mlp", "batch_size": 8, "iters": 2}]},
        headers=AUTH,
    )
    assert run.status_code == 202 and run.json()["status"] == "queued"
    assert _work(db) == 1
    done = client.get(f"/v1/profiling-runs/{run.json()['id']}").json()
    assert done["status"] == "done" and done["progress"] == 1.0, done
    assert len(done["result"]["done"]) == 1
    predicted = client.post("/v1/predictions", json=MLP, headers=AUTH)
    assert predicted.status_code == 200, predicted.text
    assert predicted.json()["iteration_time_ms"] > 0
    graph = client.post("/v1/graphs", json={**MLP, "world_size": 2}, headers=AUTH).json()
    assert graph["num_nodes"] > 10
    assert client.get(f"/v1/graphs/{graph['graph_hash']}").json() == graph


def test_a_strategy_request_runs_to_a_result(client: TestClient, db: str) -> None:
    body = {**MLP, "world_size": 2, "budget": 20, "space": "fusion"}
    for confidence in (0.3, 1.0, "high"):
        bad = client.post(
            "/v1/strategy-requests", json={**body, "confidence": confidence}, headers=AUTH
        )
        assert bad.status_code == 422 and bad.json()["field"] == "body.confidence", bad.text
    for settle in ({"verify": True, "verify_top": 0}, {"verify": True, "verify_top": 16}):
        bad = client.post("/v1/strategy-requests", json={**body, **settle}, headers=AUTH)
        assert bad.status_code == 422 and bad.json()["field"] == "body.verify_top", bad.text
    task = client.post("/v1/strategy-requests", json=body, headers=AUTH).json()
    assert task["kind"] == "search" and task["status"] == "queued"
    assert _work(db) == 1
    done = client.get(f"/v1/strategy-requests/{task['id']}").json()
    assert done["status"] == "done", done
    result = done["result"]
    assert result["best"]["scored_ms"] <= result["baseline"]["scored_ms"]
    assert result["baseline"]["scored_ms"] == result["baseline"]["predicted_ms"]
    assert 0 < result["evaluations"] <= 20 and result["top"]
    assert client.get(f"/v1/executions/{task['id']}").status_code == 404
    listed = client.get("/v1/strategy-requests").json()["jobs"]
    assert [t["id"] for t in listed] == [task["id"]]
    metrics = client.get("/metrics").text
    assert 'ddlsim_tasks{kind="search",status="done"} 1.0' in metrics
    assert "ddlsim_http_requests_total" in metrics


def test_jobs_are_queued_as_the_use_cases_requests(client: TestClient) -> None:
    search = client.post("/v1/strategy-requests", json=MLP, headers=AUTH).json()["request"]
    spec = ZOO["mlp"].with_inputs(batch_size=16)
    # the CLI's defaults: an unshaped link, a minute, verifying runs of 6 steps
    assert search == SearchRequest(model=spec, world_size=2).to_json()
    assert search["bandwidth"] is None and search["time_limit"] == 60.0
    execution = client.post("/v1/executions", json=MLP, headers=AUTH).json()["request"]
    assert execution == ExecuteRequest(model=spec, options=RunOptions(trace=True)).to_json()
    assert (execution["world_size"], execution["iters"], execution["bandwidth"]) == (1, 10, None)
    # the requests' own checks answer 422 naming the field
    for path, body, field in (
        ("/v1/executions", {**MLP, "seed": -1}, "body.seed"),
        ("/v1/strategy-requests", {**MLP, "verify_top": 0}, "body.verify_top"),
    ):
        refused = client.post(path, json=body, headers=AUTH)
        assert refused.status_code == 422 and refused.json()["field"] == field, refused.text


def test_an_execution_is_measured_and_predicted(client: TestClient, db: str) -> None:
    body = {**MLP, "world_size": 2, "bandwidth": None, "iters": 2, "warmup": 1}
    body["measure_budget_s"] = 0
    task = client.post("/v1/executions", json=body, headers=AUTH).json()
    assert _work(db) == 1
    done = client.get(f"/v1/executions/{task['id']}").json()
    assert done["status"] == "done", done
    result = done["result"]
    assert result["measured_ms"] > 0 and result["predicted_ms"] > 0
    trace, timeline = result["measured_trace"], result["predicted_timeline"]
    assert trace and {e["lane"] for e in trace} >= {0}
    assert all(e["end_ms"] >= e["start_ms"] >= 0 for e in trace)
    assert {e["lane"] for e in timeline} >= {"compute"}
    with Store.open(db) as store:
        assert [m.id for m in store.measurements()] == [result["measurement_id"]]
        assert [p.id for p in store.predictions()] == [result["prediction_id"]]


def test_an_execution_run_again_stores_its_measurement_once(
    client: TestClient, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker is stopped after the run, as it stores the measurement and ends the task (the
    moment a kill used to leave a measurement behind a task queued again): the re-run stores
    one measurement and one prediction, those its result names."""
    body = {**MLP, "world_size": 2, "bandwidth": None, "iters": 2, "warmup": 1}
    body["measure_budget_s"] = 0
    task = client.post("/v1/executions", json=body, headers=AUTH).json()
    real = TaskQueue.finish_in
    stopped: list[int] = []

    def stopped_there(queue: TaskQueue, session: Any, claimed: Any, result: Any) -> None:
        if not stopped:
            stopped.append(claimed.attempts)
            raise KeyboardInterrupt  # what SIGTERM raises in a task: the worker stops
        real(queue, session, claimed, result)

    monkeypatch.setattr(TaskQueue, "finish_in", stopped_there)
    assert _work(db) == 1 and stopped == [1]
    back = client.get(f"/v1/jobs/{task['id']}").json()
    assert back["status"] == "queued" and back["attempts"] == 1, back
    with Store.open(db) as store:
        assert store.measurements() == [] and store.predictions() == []
    assert _work(db) == 1
    done = client.get(f"/v1/executions/{task['id']}").json()
    assert done["status"] == "done" and done["attempts"] == 2, done
    with Store.open(db) as store:
        assert [m.id for m in store.measurements()] == [done["result"]["measurement_id"]]
        assert [p.id for p in store.predictions()] == [done["result"]["prediction_id"]]


def test_cancel_and_a_failing_job(client: TestClient, db: str) -> None:
    queued = client.post("/v1/strategy-requests", json=MLP, headers=AUTH).json()
    cancelled = client.post(f"/v1/jobs/{queued['id']}/cancel", headers=AUTH).json()
    assert cancelled["status"] == "cancelled"
    bad = {"jobs": [{"kind": "kernels", "model": {"source": "reference", "class": "MLP"}}]}
    refused = client.post("/v1/profiling-runs", json=bad, headers=AUTH)
    assert refused.status_code == 422 and refused.json()["field"].startswith("body.jobs.0.model")
    failing = {**MLP, "world_size": 3}  # 16 does not split over 3 ranks: refused at once
    refused = client.post("/v1/strategy-requests", json=failing, headers=AUTH)
    assert refused.status_code == 422 and "batch_size(16)" in refused.text
    # A task queued by an older server, whose request this one would refuse, fails with the
    # refusal as its error.
    with Store.open(db) as store:
        request = SearchRequest(model=ZOO["mlp"].with_inputs(batch_size=16), world_size=2)
        old = TaskQueue(store).submit("search", {**request.to_json(), "world_size": 3})
    assert _work(db) == 1
    failed = client.get(f"/v1/jobs/{old.id}").json()
    assert failed["status"] == "failed" and "batch_size(16)" in failed["error"], failed


def test_a_stopping_worker_hands_its_task_back(
    client: TestClient, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = Worker(db, poll_s=0.05)

    def stops(w: Worker, store: Store, request: dict[str, Any], report: Any, end: Any) -> None:
        w.stop.set()
        report(0.5, "half way")

    monkeypatch.setitem(worker_module.HANDLERS, "search", stops)
    task = client.post("/v1/strategy-requests", json=MLP, headers=AUTH).json()
    assert worker.run() == 1
    back = client.get(f"/v1/jobs/{task['id']}").json()
    assert back["status"] == "queued" and back["attempts"] == 1 and "stopped" in back["message"]


def _children(pid: int) -> list[str]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return found.stdout.split()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serve_starts_the_api_and_its_worker_and_ends_both(tmp_path: Path) -> None:
    port = _free_port()
    token_file = tmp_path / "token"
    env = {k: v for k, v in os.environ.items() if k != "DDLSIM_API_TOKEN"}
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "ddlsim.service.cli", "serve", "--port", str(port)),
            *("--db", f"sqlite:///{tmp_path / 's.db'}", "--token-file", str(token_file)),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    assert json.load(r)["status"] == "ok"
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline
                time.sleep(0.3)
        token = token_file.read_text().strip()
        assert len(token) >= 32 and (token_file.stat().st_mode & 0o777) == 0o600
        children = _children(server.pid)
        worker_pids = [int(p) for p in children if int(p) != server.pid]
        assert worker_pids, "the embedded worker runs"
        # The store's URL (a password in it, for PostgreSQL) is not on the worker's command
        # line, which every user can read; it reaches the worker in its environment.
        url = f"sqlite:///{tmp_path / 's.db'}"
        cmdline = Path(f"/proc/{worker_pids[0]}/cmdline").read_bytes().split(b"\0")
        assert b"worker" in cmdline and not any(str(tmp_path).encode() in a for a in cmdline)
        environ = Path(f"/proc/{worker_pids[0]}/environ").read_bytes().split(b"\0")
        assert f"DDLSIM_DB={url}".encode() in environ
        # a worker that dies is started again
        os.kill(worker_pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            again = [int(p) for p in _children(server.pid) if int(p) not in worker_pids]
            if again:
                worker_pids += again
                break
            assert time.monotonic() < deadline, "no new worker"
            time.sleep(0.5)
    finally:
        os.killpg(server.pid, signal.SIGINT)
        server.wait(timeout=60)
    assert token in (server.stdout.read() if server.stdout else "")
    time.sleep(0.5)
    for pid in worker_pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_the_worker_ends_when_serve_is_killed_outright(tmp_path: Path) -> None:
    port = _free_port()
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "ddlsim.service.cli", "serve", "--port", str(port)),
            *("--db", f"sqlite:///{tmp_path / 'k.db'}"),
        ],
        stdout=subprocess.DEVNULL,
        env={**os.environ, "DDLSIM_API_TOKEN": "t"},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        # The worker is the child that stays: serve's start may run a short-lived one too (a
        # library lookup), seen by one look and gone by the next.
        seen: list[str] = []
        while True:
            now = _children(server.pid)
            if len(now) == 1 and now == seen:
                break
            seen = now
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.3)
        worker = int(seen[0])
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        # reaped by init once it exits; a zombie counts as gone
        try:
            state = Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        assert time.monotonic() < deadline, "the worker outlived serve"
        time.sleep(0.3)


def test_what_the_worker_would_refuse_is_refused_at_submission(client: TestClient) -> None:
    """Bad link rates and world sizes answer 422 now, not minutes later from the worker."""
    for path, body in (
        ("/v1/executions", {**MLP, "bandwidth": "fast"}),
        ("/v1/strategy-requests", {**MLP, "bandwidth": "10 parsecs"}),
        ("/v1/predictions", {**MLP, "bandwidth": "-1gbit"}),
    ):
        refused = client.post(path, json=body, headers=AUTH)
        assert refused.status_code == 422, refused.text
        assert "bandwidth" in refused.text and "allowed" in refused.text
    verified = client.post(
        "/v1/strategy-requests", json={**MLP, "world_size": 2048, "verify": True}, headers=AUTH
    )
    assert verified.status_code == 422 and "at most 64" in verified.text
    unverified = client.post(
        "/v1/strategy-requests",
        json={**MLP, "batch_size": 2048, "world_size": 2048},
        headers=AUTH,
    )
    assert unverified.status_code == 202
    # What a fuzzed run found the worker refusing minutes later: batches that do not split
    # over the ranks, sequences longer than the model's positions.
    for path, body, named in (
        ("/v1/strategy-requests", {**MLP, "batch_size": 1}, "batch_size(1)"),
        ("/v1/executions", {**MLP, "batch_size": 3, "world_size": 2}, "batch_size(3)"),
        (
            "/v1/strategy-requests",
            {"model": "gpt2-tiny", "batch_size": 2, "seq_len": 4968},
            "seq_len(4968)",
        ),
    ):
        refused = client.post(path, json=body, headers=AUTH)
        assert refused.status_code == 422 and named in refused.text, refused.text
    for job in (
        {"kind": "collectives", "world_size": 1024, "bandwidth": "1gbit"},
        {"kind": "collectives", "world_size": 2, "bandwidth": "fast"},
    ):
        refused = client.post("/v1/profiling-runs", json={"jobs": [job]}, headers=AUTH)
        assert refused.status_code == 422 and "job 0 (collectives)" in refused.text, refused.text


def test_profiling_jobs_over_the_work_limits_or_the_runners_checks_answer_422(
    client: TestClient, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counts over ``DDLSIM_MAX_ITERS``, messages over ``DDLSIM_MAX_MESSAGE_BYTES``, inputs over
    the model limits and settings a runner would refuse: 422 naming the job and the setting,
    nothing queued; the same job within the limits is queued."""
    gpt2 = {"kind": "kernels", "model": "gpt2-tiny", "seq_len": 64}
    refused_jobs = (
        ({"kind": "kernels", "model": "mlp", "iters": 10**9}, "DDLSIM_MAX_ITERS"),
        ({"kind": "kernels", "model": "mlp", "warmup": -1}, "warmup(-1)"),
        ({"kind": "kernels", "model": "mlp", "iters": "many"}, "iters('many')"),
        ({"kind": "kernels", "model": "mlp", "device": "tpu"}, "device 'tpu'"),
        ({"kind": "kernels", "model": "mlp", "optimizer": "lion"}, "optimizer 'lion'"),
        ({**gpt2, "batch_size": 10**12}, "DDLSIM_MAX_"),
        ({"kind": "fusion", "model": "mlp", "blocks": [1, 2]}, "blocks"),
        (
            {"kind": "collectives", "world_size": 2, "sizes": ["64GiB"]},
            "DDLSIM_MAX_MESSAGE_BYTES",
        ),
        ({"kind": "collectives", "world_size": 2, "collectives": ["gossip"]}, "gossip"),
        ({"kind": "collectives", "world_size": 2, "repeats": 10**7}, "repeats"),
        ({"kind": "run", "model": "mlp", "world_size": 2, "seed": "x"}, "not of its type"),
        ({"kind": "run", "model": "mlp", "measure_budget_s": 10**6}, "measure_budget_s"),
        ({"kind": "run", "model": "mlp", "optimizer": "lion"}, "optimizer 'lion'"),
        ({"kind": "compare", "model": "mlp", "strategies": [{}], "rounds": 10**6}, "rounds"),
        ({"kind": "kernels", "model": "resnet-18", "image_size": 1}, "image_size(1)"),
        # what exhausted the machine's memory in a fuzzed run (its logits alone: 13 GB)
        (
            {"kind": "kernels", "model": "bert-tiny", "batch_size": 16384, "seq_len": 128},
            "DDLSIM_MAX_RUN_BYTES",
        ),
        (
            {"kind": "run", "model": "bert-tiny", "batch_size": 16384, "world_size": 2},
            "DDLSIM_MAX_RUN_BYTES",
        ),
        ({"kind": "run", "model": "mlp", "strategy": {"parallel": {"tp": "x"}}}, "tp"),
    )
    for job, named in refused_jobs:
        refused = client.post("/v1/profiling-runs", json={"jobs": [job]}, headers=AUTH)
        assert refused.status_code == 422, (job, refused.text)
        where = (f"job 0 ({job['kind']})", '"field":"body.jobs.0.')  # in its error or field
        assert any(w in refused.text for w in where) and named in refused.text, refused.text
    assert client.get("/v1/jobs").json()["jobs"] == []
    monkeypatch.setenv("DDLSIM_MAX_ITERS", str(10**9))
    raised = client.post("/v1/profiling-runs", json={"jobs": [refused_jobs[0][0]]}, headers=AUTH)
    assert raised.status_code == 202, raised.text


def test_specs_over_the_limits_are_refused_before_anything_is_built(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    huge = {
        "name": "huge",
        "source": "transformers",
        "class": "GPT2LMHeadModel",
        "config": {"n_layer": 1_000_000},
        "inputs": {"batch_size": 1, "seq_len": 8},
    }
    warm = {**huge, "name": "warm", "config": {"n_layer": 2}}
    assert client.post("/v1/models", json={"spec": warm}, headers=AUTH).status_code == 201

    build = transformers.GPT2LMHeadModel.__init__

    def small_only(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        # the config is checked on a one-layer build; the huge model itself is never built
        assert config.n_layer <= 2, "a model over the limits was built"
        build(self, config, *args, **kwargs)

    monkeypatch.setattr(transformers.GPT2LMHeadModel, "__init__", small_only)
    refused = client.post("/v1/models", json={"spec": huge}, headers=AUTH)
    assert refused.status_code == 422 and "DDLSIM_MAX_LAYERS" in refused.text, refused.text
    wide = {
        "name": "wide",
        "source": "reference",
        "class": "MLP",
        "config": {"in_features": 10**10},
        "inputs": {"batch_size": 1},
    }
    refused = client.post("/v1/models", json={"spec": wide}, headers=AUTH)
    assert refused.status_code == 422 and "DDLSIM_MAX_PARAMS" in refused.text, refused.text
    # A convolutional network is held to its pixels (a fuzzed search asked 1.5 TB of input).
    vast = {"model": "resnet-18", "batch_size": 8, "image_size": 180_939, "world_size": 2}
    refused = client.post("/v1/strategy-requests", json=vast, headers=AUTH)
    assert refused.status_code == 422 and "DDLSIM_MAX_ACTIVATION_BYTES" in refused.text
    # Runs must fit this machine: the rank's micro-batch profiled (a search), every rank run
    # (an execution); a prediction runs nothing.
    big = {"model": "bert-tiny", "batch_size": 32768, "world_size": 2}
    for path in ("/v1/strategy-requests", "/v1/executions"):
        refused = client.post(path, json=big, headers=AUTH)
        assert refused.status_code == 422 and "DDLSIM_MAX_RUN_BYTES" in refused.text, path
    monkeypatch.setenv("DDLSIM_MAX_RUN_BYTES", str(2**50))
    assert client.post("/v1/strategy-requests", json=big, headers=AUTH).status_code == 202
    monkeypatch.delenv("DDLSIM_MAX_RUN_BYTES")
    # The operator sets the limits: a zoo model at its inputs is over these.
    monkeypatch.setenv("DDLSIM_MAX_FLOPS", "1e6")
    refused = client.post("/v1/predictions", json=MLP, headers=AUTH)
    assert refused.status_code == 422 and "DDLSIM_MAX_FLOPS" in refused.text, refused.text
    monkeypatch.delenv("DDLSIM_MAX_FLOPS")
    monkeypatch.setenv("DDLSIM_MAX_PARAMS", "1000")
    refused = client.post("/v1/predictions", json=MLP, headers=AUTH)
    assert refused.status_code == 422 and "limit of 1,000" in refused.text


def test_reads_need_the_token_when_reads_are_protected(db: str) -> None:
    """A service bound beyond loopback (``serve --host 0.0.0.0``) guards its reads; its
    health probe stays open."""
    settings = Settings(db=db, token=TOKEN, simulator="replay", protect_reads=True)
    with TestClient(create_app(settings)) as guarded:
        assert guarded.get("/healthz").status_code == 200
        for path in ("/v1/jobs", "/v1/models", "/v1/simulator/versions", "/metrics"):
            refused = guarded.get(path)
            assert refused.status_code == 401, (path, refused.text)
            assert guarded.get(path, headers=AUTH).status_code == 200, path


def test_an_unexpected_error_is_a_500_with_a_request_id(
    db: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(db=db, token=TOKEN, simulator="replay")
    with TestClient(create_app(settings), raise_server_exceptions=False) as guarded:

        def boom(**_: Any) -> Any:
            raise RuntimeError("secret internals at /srv/ddlsim/x.py line 3")

        guarded.app.state.store.model_specs = boom  # type: ignore[attr-defined]
        response = guarded.get("/v1/models")
    assert response.status_code == 500
    body = response.json()
    assert body["request_id"] and response.headers["X-Request-ID"] == body["request_id"]
    assert "internals" not in response.text and "Traceback" not in response.text
    assert body["request_id"] in caplog.text and "secret internals" in caplog.text


KERNELS_FOREVER = {"jobs": [{"kind": "kernels", "model": "mlp", "batch_size": 4, "iters": 10**9}]}


def _run_in_thread(worker: Worker) -> Any:
    import threading

    thread = threading.Thread(target=lambda: worker.run(once=True), daemon=True)
    thread.start()
    return thread


def test_a_running_job_stops_soon_after_its_cancel(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernels job of 10^9 iterations, cancelled while it runs, ends cancelled within
    seconds: its profiling loop checks between iterations."""
    monkeypatch.setattr(worker_module, "HEARTBEAT_S", 0.5)
    with Store.open(db) as store:
        queue = worker_module.TaskQueue(store)
        task = queue.submit("profile", KERNELS_FOREVER)
        thread = _run_in_thread(Worker(db, poll_s=0.05, simulator="replay"))
        deadline = time.monotonic() + 60
        while queue.get(task.id).status != "running" and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2.0)
        queue.cancel(task.id)
        asked = time.monotonic()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert time.monotonic() - asked < 30
        assert queue.get(task.id).status == "cancelled"


def test_a_job_past_its_deadline_fails(client: TestClient, db: str) -> None:
    """A kernels job of 10^9 iterations and a search of 10^6 evaluations fail at the deadline
    (the search's pricing loop, which takes a failing candidate as infeasible, lets it
    through)."""
    search = {**MLP, "world_size": 2, "algo": "random", "budget": 10**6, "time_limit": 3600}
    searching = client.post("/v1/strategy-requests", json=search, headers=AUTH).json()
    with Store.open(db) as store:
        queue = worker_module.TaskQueue(store)
        profiling = queue.submit("profile", KERNELS_FOREVER)
        for task_id in (searching["id"], profiling.id):
            worker = Worker(db, poll_s=0.05, simulator="replay", deadline_s=3.0)
            thread = _run_in_thread(worker)
            thread.join(timeout=60)
            assert not thread.is_alive()
            ended = queue.get(task_id)
            assert ended.status == "failed" and "deadline of 3 s" in (ended.error or ""), ended


def test_captures_have_a_deadline_and_a_bounded_cache(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlsim.service.api import predictor

    monkeypatch.setattr(predictor, "GRAPHS", predictor._GraphCache())
    monkeypatch.setenv("DDLSIM_CAPTURE_DEADLINE_S", "0.000001")
    late = client.post("/v1/graphs", json={"model": "gpt2-tiny", "batch_size": 2}, headers=AUTH)
    assert late.status_code == 503 and "DDLSIM_CAPTURE_DEADLINE_S" in late.text, late.text
    # It goes on in the background and lands in the cache (under the limit of its request):
    # wait for it, so that it cannot land between the captures below.
    waited = time.monotonic() + 120
    while len(predictor.GRAPHS) == 0 and time.monotonic() < waited:
        time.sleep(0.05)
    assert len(predictor.GRAPHS) == 1
    monkeypatch.setenv("DDLSIM_CAPTURE_DEADLINE_S", "120")
    # One graph's worth of bytes: the second capture pushes the first out.
    monkeypatch.setenv("DDLSIM_GRAPH_CACHE_BYTES", "1")
    for batch in (3, 5):
        made = client.post("/v1/graphs", json={**MLP, "batch_size": batch}, headers=AUTH)
        assert made.status_code in (200, 201), made.text
    assert len(predictor.GRAPHS) == 1


def test_a_heartbeat_must_beat_twice_before_a_task_is_taken_as_lost(db: str) -> None:
    with pytest.raises(InvalidOptionError, match=r"heartbeat_s\(5\) and stale_s\(6\)"):
        Worker(db, heartbeat_s=5.0, stale_s=6.0)
    assert Worker(db, heartbeat_s=1.0, stale_s=6.0).heartbeat_s == 1.0
