"""Training the simulator and exporting the dataset as REST jobs, end to end: queued by the
service, run by a worker, their results and files where the job says."""

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from ddlsim.data.store import Store, add_collective_profile
from ddlsim.data.zoo import ZOO
from ddlsim.service.api import Settings, create_app
from ddlsim.service.worker import Worker
from ddlsim.simulator.cost_model import load_cost_model
from ddlsim.simulator.dataset import save_dataset
from ddlsim.simulator.train import load_checkpoint
from ddlsim.workflows import simulator_jobs
from tests.data.records import collective_profile
from tests.simulator.synthetic import synthetic_dataset, with_truth

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def db(tmp_path: Path, private_store: str) -> str:
    return f"sqlite:///{tmp_path / 'api.db'}"


@pytest.fixture
def client(db: str) -> Iterator[TestClient]:
    app = create_app(Settings(db=db, token=TOKEN, simulator="replay"))
    with TestClient(app) as test_client:
        yield test_client


def _run_queue(db: str) -> None:
    assert Worker(db, poll_s=0.05, simulator="replay").run(once=True) >= 1


def test_a_training_job_writes_a_checkpoint_predictions_can_use(
    client: TestClient, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small synthetic dataset in the shipped one's place: the job's path, in seconds.
    small = tmp_path / "synthetic.json.gz"
    save_dataset(with_truth(synthetic_dataset([ZOO["mlp"], ZOO["gpt2-tiny"]])), small)
    monkeypatch.setattr(simulator_jobs, "shipped_dataset", lambda: small)
    body = {"source": "shipped", "epochs": 2, "hidden": 8, "layers": 1, "predictor": "gnn"}
    queued = client.post("/v1/simulator-trainings", json=body, headers=AUTH)
    assert queued.status_code == 202, queued.text
    job = queued.json()
    assert job["kind"] == "simulator-training" and job["status"] == "queued"
    _run_queue(db)
    done = client.get(f"/v1/simulator-trainings/{job['id']}").json()
    assert done["status"] == "done", done
    result = done["result"]
    assert result["predictor"] == "gnn" and result["runs"] > 0 and result["epochs"] == 2
    assert result["dataset"] == str(small)
    out = Path(result["out"])
    assert out.is_file() and out.parent == tmp_path / "ddlsim-data" / "jobs"
    network, meta = load_checkpoint(out)
    assert meta["predictor"] == "gnn" and isinstance(network, torch.nn.Module)
    served = load_cost_model(str(out))  # what ``ddlsim serve --simulator PATH`` loads
    assert served.name == "gnn" and served.learned
    listed = client.get("/v1/simulator-trainings").json()["jobs"]
    assert [j["id"] for j in listed] == [job["id"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"epochs": 0}, "body.epochs"),
        ({"source": "/etc/passwd"}, "body.source"),
        ({"out": "/tmp/x.pt"}, "body.out"),
    ],
)
def test_a_training_names_no_path_and_no_bad_value(
    client: TestClient, body: dict[str, object], field: str
) -> None:
    refused = client.post("/v1/simulator-trainings", json=body, headers=AUTH)
    assert refused.status_code == 422
    assert refused.json()["field"] == field, refused.json()


def test_a_dataset_export_job_writes_the_stores_dataset(client: TestClient, db: str) -> None:
    with Store.open(db) as store, store.transaction() as session:
        add_collective_profile(session, profile=collective_profile())
    bad = client.post("/v1/dataset-exports", json={"version": "cpu-v9"}, headers=AUTH)
    assert bad.status_code == 422 and "cpu-v9" in bad.json()["error"]
    queued = client.post(
        "/v1/dataset-exports", json={"version": "cpu-v3", "all_models": True}, headers=AUTH
    ).json()
    early = client.get(f"/v1/dataset-exports/{queued['id']}/file")
    assert early.status_code == 404 and "status queued" in early.json()["error"]
    _run_queue(db)
    done = client.get(f"/v1/dataset-exports/{queued['id']}").json()
    assert done["status"] == "done", done
    assert done["result"]["links"] == 1 and done["result"]["runs"] == 0
    file = client.get(f"/v1/dataset-exports/{queued['id']}/file")
    assert file.status_code == 200
    exported = json.loads(gzip.decompress(file.content))
    assert exported["meta"]["version"] == "cpu-v3" and len(exported["links"]) == 1
