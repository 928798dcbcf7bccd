"""GPU clusters on paper through the REST API: the clusters a request may name, a layout's
prediction stored and read back, a search run as a job to its ranked layouts, bad input as a 4xx
naming the field, the value and what is allowed."""

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ddlsim.data.specs.gpu_cluster import preset
from ddlsim.data.store import Store
from ddlsim.service.api import Settings, create_app
from ddlsim.service.worker import Worker
from ddlsim.simulator.gpu.prediction import BREAKDOWN_KEYS

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GPT = {
    "source": "transformers",
    "class": "GPT2LMHeadModel",
    "config": {"n_embd": 256, "n_head": 8, "n_layer": 8, "n_positions": 512, "vocab_size": 1024},
    "inputs": {"batch_size": 32, "seq_len": 512},
}
LLAMA_70B = {
    "source": "transformers",
    "class": "LlamaForCausalLM",
    "config": {
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
    },
    "inputs": {"batch_size": 1, "seq_len": 8192},
}
LAYOUT = {"parallel": {"dp": 4, "tp": 2, "micro_batches": 2, "sequence_parallel": True}}


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'api.db'}"


@pytest.fixture
def client(db: str) -> Iterator[TestClient]:
    app = create_app(Settings(db=db, token=TOKEN, simulator="replay"))
    with TestClient(app) as test_client:
        yield test_client


def _predict(client: TestClient, **body: Any) -> Any:
    request = {"model": GPT, "cluster": "dgx-h100:1", "strategy": LAYOUT, **body}
    return client.post("/v1/cluster-predictions", json=request, headers=AUTH)


def test_the_clusters_are_the_presets_then_the_stored_profiles(db: str) -> None:
    measured = preset("dgx-h100", nodes=2).to_dict() | {"name": "lab", "nvlink_gbps": 300.0}
    with Store.open(db) as store:
        store.save_cluster_profile(name="lab", spec=measured, measured={})
    with TestClient(create_app(Settings(db=db, token=TOKEN, simulator="replay"))) as client:
        listed = client.get("/v1/clusters").json()["clusters"]
        lab = next(c for c in listed if c["name"] == "lab")
        assert lab["origin"] == "measured" and lab["nodes"] == 2 and lab["nvlink_gbps"] == 300.0
        assert lab["usage"] == "lab:NODES" and lab["gpu"] == "H100-SXM5-80GB"
        h100 = next(c for c in listed if c["name"] == "dgx-h100")
        assert h100["origin"] == "preset" and h100["gpus_per_node"] == 8
        assert h100["usage"] == "dgx-h100:NODES" and h100["spec"]["nic_gbits"] == 400.0
        assert listed[-1] == lab, "presets first"
        # a stored profile is named with a node count as a preset is
        answer = _predict(client, cluster="lab:1", strategy={"parallel": {"tp": 8}})
        assert answer.status_code == 201, answer.text
        assert answer.json()["cluster"]["nvlink_gbps"] == 300.0


def test_a_prediction_is_stored_and_read_back(client: TestClient) -> None:
    answer = _predict(client, global_batch=16)
    assert answer.status_code == 201, answer.text
    made = answer.json()
    assert made["world_size"] == 8 and made["global_batch"] == 16 and made["seq_len"] == 512
    assert made["layout"].startswith("dp4 tp2 pp1 mb2") and made["micro_batch_size"] == 2
    assert made["strategy"]["parallel"]["dp"] == 4 and made["strategy"]["precision"] == "bf16"
    assert made["iteration_s"] > 0 and made["fits"] and 0 < made["mfu"] < 1
    assert made["model_tflops_per_gpu"] <= made["tflops_per_gpu"]
    memory = made["memory"]
    assert set(memory["parts_gib"]) >= {"weights_and_optimizer", "activations"}
    assert memory["total_gib"] == pytest.approx(sum(memory["parts_gib"].values()), abs=0.05)
    breakdown = made["breakdown_ms"]
    assert list(breakdown)[: len(BREAKDOWN_KEYS)] == [k for k in BREAKDOWN_KEYS if k in breakdown]
    assert sum(breakdown.values()) == pytest.approx(1e3 * made["iteration_s"], rel=0.01)
    again = client.get(f"/v1/cluster-predictions/{made['id']}").json()
    assert again == made
    _predict(client)  # the model's own batch
    listed = client.get("/v1/cluster-predictions").json()["predictions"]
    assert [p["id"] for p in listed] == [made["id"] + 1, made["id"]]
    assert listed[0]["global_batch"] == 32
    assert (
        client.get("/v1/cluster-predictions", params={"limit": 1}).json()["predictions"][0]["id"]
        == made["id"] + 1
    )


def test_a_prediction_needs_the_token(client: TestClient) -> None:
    answer = client.post("/v1/cluster-predictions", json={"model": GPT, "cluster": "dgx-h100"})
    assert answer.status_code == 401


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"cluster": "dgx-z100:4"}, "body.cluster", ["'dgx-z100:4'", "dgx-h100", "none stored"]),
        ({"cluster": "dgx-h100:0"}, "body.cluster", ["node count '0'", "positive integer"]),
        ({"cluster": "./cluster.json"}, "body.cluster", ["NAME:NODES", "dgx-a100-80g"]),
        ({"cluster": {"preset": "dgx-h100", "nodes": 1 << 20}}, "body.cluster", ["131072"]),
        ({"cluster": {"nodes": 1}}, "body.cluster", ["misses", "preset"]),
        ({"cluster": {"world_size": 2}}, "body.cluster", ["emulated", "/v1/predictions"]),
        ({"strategy": {"parallel": {"dp": 3}}}, "body.strategy", ["dp(3)", "world_size(8)"]),
        (
            {"strategy": {"tensor_fusion": {"dear": True}}},
            "body.strategy",
            ["tensor_fusion.dear", "not priced on GPU clusters"],
        ),
        (
            {"strategy": {"parallel": {"dp": 8}, "precision": "fp32"}},
            "body.strategy",
            ["'fp32'", "fp16, bf16, fp8"],
        ),
        ({"global_batch": 6}, "body.global_batch", ["batch_size(6)", "dp(4)"]),
        ({"model": "mlp"}, "body.model", ["no tensor-parallel plan", "supported families"]),
        ({"model": "no-such-model"}, "body.model", ["'no-such-model'", "zoo"]),
        ({"model": {**GPT, "class": "Nope"}}, "body.model", ["'Nope'"]),
        ({"strategy": "{}"}, "body.strategy", []),
    ],
)
def test_bad_input_is_a_4xx_naming_the_value(
    client: TestClient, change: dict[str, Any], field: str, words: list[str]
) -> None:
    answer = _predict(client, **change)
    assert 400 <= answer.status_code < 500, answer.text
    payload = answer.json()
    assert payload["field"] == field, payload
    assert all(word in payload["error"] for word in words), payload["error"]
    assert "Traceback" not in answer.text


def test_a_missing_prediction_is_a_404(client: TestClient) -> None:
    answer = client.get("/v1/cluster-predictions/12345")
    assert answer.status_code == 404 and "12345" in answer.json()["error"]


def test_a_search_runs_as_a_job_to_its_ranked_layouts(client: TestClient, db: str) -> None:
    body = {"model": GPT, "cluster": "dgx-h100:2", "global_batch": 32, "top": 4}
    queued = client.post("/v1/cluster-searches", json=body, headers=AUTH)
    assert queued.status_code == 202, queued.text
    job = queued.json()
    assert job["kind"] == "cluster-search" and job["status"] == "queued" and job["result"] is None
    assert Worker(db, poll_s=0.05, simulator="replay").run(once=True) == 1
    done = client.get(f"/v1/cluster-searches/{job['id']}").json()
    assert done["status"] == "done", done["error"]
    result = done["result"]
    assert result["world_size"] == 16 and result["evaluated"] > 10
    layouts = result["layouts"]
    assert [layout["rank"] for layout in layouts] == [1, 2, 3, 4]
    times = [layout["iteration_s"] for layout in layouts if layout["replayed"]]
    assert times == sorted(times) and layouts[0]["replayed"]
    for layout in layouts:
        assert layout["fits"] and layout["breakdown_ms"] and layout["memory"]["total_gib"] > 0
        # each layout is a strategy a prediction (and `ddlsim run`) takes as it is
        assert (
            layout["strategy"]["parallel"]["dp"]
            * layout["strategy"]["parallel"].get("tp", 1)
            * layout["strategy"]["parallel"].get("pp", 1)
            == 16
        )
    best = layouts[0]
    again = _predict(client, cluster="dgx-h100:2", strategy=best["strategy"], global_batch=32)
    assert again.json()["iteration_s"] == pytest.approx(best["iteration_s"])
    listed = client.get("/v1/cluster-searches", params={"status": "done"}).json()["searches"]
    assert [s["id"] for s in listed] == [job["id"]]
    assert client.get("/v1/jobs").json()["jobs"][0]["kind"] == "cluster-search"


def test_a_search_keeps_to_its_search_space(client: TestClient, db: str) -> None:
    space = {"sharding": ["none"], "recompute": ["full"], "sequence_parallel": False}
    body = {"model": GPT, "cluster": "dgx-h100:2", "global_batch": 32, "search_space": space}
    job = client.post("/v1/cluster-searches", json=body, headers=AUTH).json()
    assert Worker(db, poll_s=0.05, simulator="replay").run(once=True) == 1
    done = client.get(f"/v1/cluster-searches/{job['id']}").json()
    assert done["status"] == "done", done["error"]
    for layout in done["result"]["layouts"]:
        parallel = layout["strategy"]["parallel"]
        assert parallel["recompute"] == "full" and not parallel.get("fsdp")
        assert not parallel.get("sequence_parallel") and not parallel.get("distributed_optimizer")


def test_a_bad_search_is_refused_before_it_is_queued(client: TestClient) -> None:
    for body, field in (
        ({"model": "mlp", "cluster": "dgx-h100:1"}, "body.model"),
        ({"model": GPT, "cluster": "dgx-h100:1", "precision": "fp32"}, "body.precision"),
        ({"model": GPT, "cluster": "nowhere:2"}, "body.cluster"),
        ({"model": GPT, "cluster": "dgx-h100:1", "top": 0}, "body.top"),
    ):
        answer = client.post("/v1/cluster-searches", json=body, headers=AUTH)
        assert answer.status_code == 422 and answer.json()["field"] == field, answer.text
    bad_space = {"model": GPT, "cluster": "dgx-h100:1", "search_space": {"cp": [3]}}
    answer = client.post("/v1/cluster-searches", json=bad_space, headers=AUTH)
    assert answer.status_code == 422 and answer.json()["field"].startswith("body.search_space")
    assert client.get("/v1/cluster-searches").json()["searches"] == []
    other = client.get("/v1/cluster-searches/1")
    assert other.status_code == 404


def test_the_published_runs_are_predicted_against_their_figures(client: TestClient) -> None:
    files = client.get("/v1/published").json()["files"]
    names = [f["name"] for f in files]
    assert "megatron_sc21.json" in names and all(f["rows"] > 0 for f in files)
    answer = client.get("/v1/published/megatron_sc21.json").json()
    rows = answer["rows"]
    assert len(rows) == next(f["rows"] for f in files if f["name"] == "megatron_sc21.json")
    for row in rows:
        assert row["error"] is None and row["metric"] == "tflops_per_gpu"
        assert row["ape"] == pytest.approx(abs(row["predicted"] / row["published"] - 1), abs=1e-3)
    assert answer["mape"] == pytest.approx(sum(r["ape"] for r in rows) / len(rows), abs=1e-4)
    # the second answer is the first (from memory: tests/workflows/test_published.py counts it)
    assert client.get("/v1/published/megatron_sc21.json").json() == answer
    missing = client.get("/v1/published/secrets.json")
    assert missing.status_code == 404 and "megatron_sc21.json" in missing.json()["error"]
    assert client.get("/v1/published/..%2F..%2Fpyproject.toml").status_code == 404


@pytest.mark.timing
def test_a_search_over_1024_gpus_finishes_as_a_job_within_a_minute(
    client: TestClient, db: str
) -> None:
    body = {"model": LLAMA_70B, "cluster": "dgx-h100:128", "global_batch": 1024, "seq_len": 8192}
    started = time.perf_counter()
    job = client.post("/v1/cluster-searches", json=body, headers=AUTH).json()
    Worker(db, poll_s=0.05, simulator="replay").run(once=True)
    done = client.get(f"/v1/cluster-searches/{job['id']}").json()
    elapsed = time.perf_counter() - started
    assert done["status"] == "done", done["error"]
    assert done["result"]["world_size"] == 1024 and len(done["result"]["layouts"]) == 10
    assert elapsed < 60, f"the search took {elapsed:.1f} s"
