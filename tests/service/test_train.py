"""``ddlsim simulator train|eval|bench`` and ``predict`` with a trained cost model, on a small
synthetic dataset (real graphs, known measured times)."""

import json
from pathlib import Path

import pytest
import yaml

from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.service.cli import main
from ddlsim.simulator.calibration import RISK_KINDS, Calibration
from ddlsim.simulator.cost_model import PREDICTORS
from ddlsim.simulator.dataset import save_dataset
from ddlsim.simulator.train import load_checkpoint
from ddlsim.workflows import dataset_plan, simulator_jobs
from tests.simulator.synthetic import synthetic_dataset, with_truth


@pytest.fixture(scope="module")
def dataset_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dataset") / "synthetic.json.gz"
    specs = [ZOO["mlp"], ZOO["gpt2-tiny"]]
    save_dataset(with_truth(synthetic_dataset(specs, plans=("gpt2-tiny",))), path)
    return path


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_train_chooses_a_predictor_and_writes_the_checkpoint(
    capsys: pytest.CaptureFixture[str], dataset_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "model.pt"
    args = ["simulator", "train", "--dataset", str(dataset_file), "--epochs", "40"]
    result = _json(capsys, *args, "--hidden", "16", "--layers", "2", "--out", str(out))
    assert result["predictor"] in PREDICTORS
    assert set(result["cross_validation"]) == set(PREDICTORS)
    assert result["families"] == ["gpt2", "reference"]
    assert result["runs"] == 32 and out.is_file()
    # the held-out rows calibrate every predictor's speed-ups; the search scores with them
    assert set(result["calibration"]) == set(RISK_KINDS)
    assert result["calibration"]["default"]["factor"] == 1.0
    _, meta = load_checkpoint(out)
    assert set(meta["calibration"]) == set(PREDICTORS)
    calibration = Calibration.from_json(meta["calibration"][result["predictor"]])
    assert sum(len(errors) for errors in calibration.errors.values()) > 10
    # kept by world size too: the search on 2 ranks scores with the 2-rank errors
    assert any(kind.endswith("@2") for kind in calibration.errors)
    search = ["search", "mlp", "--world-size", "2", "--bandwidth", "1gbit", "--budget", "30"]
    search += ["--space", "fusion", "--profile-iters", "2", "--simulator", str(out)]
    scored = _json(capsys, *search)
    assert scored["calibration"]["confidence"] == 0.8
    assert scored["baseline"]["scored_ms"] == scored["baseline"]["predicted_ms"]
    assert scored["best"]["scored_ms"] <= scored["baseline"]["scored_ms"]
    best = Strategy.from_dict(scored["best"]["strategy"])
    assert scored["best"]["scored_ms"] == pytest.approx(
        scored["best"]["predicted_ms"] * calibration.factor(best, 0.8, 2)
    )
    unscored = _json(capsys, *search, "--confidence", "off")
    assert unscored["calibration"] is None
    assert unscored["best"]["scored_ms"] == unscored["best"]["predicted_ms"]
    assert main([*search, "--confidence", "0.3"]) == 2
    assert "confidence(0.3) must be in [0.5, 0.99]" in capsys.readouterr().err
    # without --out it goes to the user's data directory, which predict then uses
    _json(capsys, *args, "--hidden", "16", "--layers", "2", "--predictor", "gnn")
    predict = ["predict", "mlp", "--world-size", "2", "--bandwidth", "1gbit"]
    predicted = _json(capsys, *predict, "--profile-iters", "2")
    assert predicted["predictor"] == "gnn"
    assert predicted["simulator_version"] == "gnn-3+replay-3"
    assert predicted["breakdown"]["replay_ms"] > 0
    parts = predicted["breakdown"]
    assert predicted["iteration_time_ms"] == pytest.approx(
        parts["compute_ms"] + parts["exposed_comm_ms"]
    )
    replayed = _json(capsys, *predict, "--simulator", "replay")
    assert replayed["iteration_time_ms"] == pytest.approx(parts["replay_ms"])
    # the cost model corrects parallel plans too: FSDP here
    fsdp = ["predict", "mlp", "--world-size", "2", "--strategy", '{"parallel": {"fsdp": true}}']
    corrected = _json(capsys, *fsdp)
    plain = _json(capsys, *fsdp, "--simulator", "replay")
    assert corrected["predictor"] == "gnn" and plain["predictor"] == "replay"
    assert corrected["breakdown"]["replay_ms"] == pytest.approx(plain["iteration_time_ms"])
    assert corrected["iteration_time_ms"] != pytest.approx(plain["iteration_time_ms"], rel=1e-6)
    # and prices compiled blocks fused
    strategy = '{"op_fusion": {"compiled": ["body.0", "body.1"]}}'
    fused = _json(capsys, "predict", "mlp", "--world-size", "2", "--strategy", strategy)
    assert [b["block"] for b in fused["fused_blocks"]] == ["body.0", "body.1"]
    assert all(b["compiled_ms"] > 0 and b["eager_ms"] > 0 for b in fused["fused_blocks"])
    assert plain["fused_blocks"] == []
    bench = _json(capsys, "simulator", "bench", "--strategies", "40", "--repeats", "1")
    assert bench["cost_model_evaluations_per_s"] > 0 and bench["replay_evaluations_per_s"] > 0
    assert bench["num_nodes"] > 100 and bench["dear"] is False
    dear = _json(capsys, "simulator", "bench", "--strategies", "40", "--repeats", "1", "--dear")
    assert dear["dear"] is True and dear["replay_evaluations_per_s"] > 0


def test_eval_reports_every_predictor_on_the_held_out_family(
    capsys: pytest.CaptureFixture[str], dataset_file: Path
) -> None:
    result = _json(
        capsys,
        "simulator",
        "eval",
        "--holdout",
        "gpt2",
        "--dataset",
        str(dataset_file),
        "--epochs",
        "30",
        "--hidden",
        "16",
        "--layers",
        "2",
        "--rows",
    )
    assert result["holdout"] == ["gpt2"] and result["test_runs"] == 20
    assert set(result["metrics"]) == set(PREDICTORS)
    for metrics in result["metrics"].values():
        assert metrics["mape"] >= 0 and -1 <= metrics["kendall_tau"] <= 1
    assert {row["family"] for row in result["rows"]} == {"gpt2"}
    assert result["default"] == result["metrics"][result["default_predictor"]]
    # by kind: DDP's and the executor's buckets, DeAR, FSDP, tensor parallel and pipelines
    assert set(result["by_kind"]) == {"buckets", "dear", "fsdp", "tensor", "pipeline"}
    assert set(result["by_kind"]["pipeline"]) == set(PREDICTORS)


def test_bad_input_is_one_line(
    capsys: pytest.CaptureFixture[str], dataset_file: Path, tmp_path: Path
) -> None:
    code = main(["simulator", "eval", "--holdout", "nope", "--dataset", str(dataset_file)])
    assert code == 2
    err = capsys.readouterr().err
    assert "family nope is not in the dataset; it has: gpt2, reference" in err
    assert "Traceback" not in err
    code = main(["simulator", "train", "--dataset", str(tmp_path / "missing.json.gz")])
    assert code == 2
    assert "cannot be read" in capsys.readouterr().err
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    code = main(["predict", "mlp", "--simulator", str(tmp_path / "bad.pt")])
    assert code == 2
    assert "cost model checkpoint" in capsys.readouterr().err


def test_dataset_plan_and_export(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dataset_plan, "models_of", lambda version: [ZOO["mlp"], ZOO["gpt2-tiny"]])
    plan = tmp_path / "plan.yaml"
    v2 = ("--version", "cpu-v2")
    out = _json(
        capsys, "simulator", "dataset", "plan", *v2, "--out", str(plan), "--per-group", "2"
    )
    assert out["models"] == 2 and out["by_kind"]["collectives"] == 4
    assert out["by_kind"]["run"] == 2 * 4 * 3 + 4  # groups x (defaults + 2) + repeats
    assert plan.read_text().startswith("# The simulator's dataset")
    # parallel plans: the mlp has no tensor-parallel plan (FSDP and pipelines it has)
    parallel = tmp_path / "parallel.yaml"
    out = _json(
        capsys,
        "simulator",
        "dataset",
        "plan",
        *v2,
        "--plans",
        "parallel",
        "--out",
        str(parallel),
    )
    jobs = yaml.safe_load(parallel.read_text())["jobs"]
    links = [j for j in jobs if j["kind"] == "collectives"]
    assert all("all_gather" in j["collectives"] for j in links)
    plans = {
        (j["model"]["name"], json.dumps(j["strategy"]["parallel"], sort_keys=True))
        for j in jobs
        if j["kind"] == "run"
    }
    mlp = {
        Strategy.from_dict({"parallel": json.loads(p)}).parallel for m, p in plans if m == "mlp"
    }
    assert all(p.tp == 1 for p in mlp) and any(p.fsdp for p in mlp)
    gpt2 = {
        Strategy.from_dict({"parallel": json.loads(p)}).parallel
        for m, p in plans
        if m == "gpt2-tiny"
    }
    assert any(p.tp > 1 for p in gpt2) and any(p.pp > 1 for p in gpt2)
    exported = _json(
        capsys, "simulator", "dataset", "export", "--out", str(tmp_path / "d.json.gz")
    )
    assert (exported["runs"], exported["kernels"], exported["links"]) == (0, 0, 0)


def test_dataset_plan_v3_runs_every_group_side_by_side(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = [ZOO["mlp"].with_inputs(batch_size=8), ZOO["gpt2-tiny"].with_inputs(batch_size=8)]
    monkeypatch.setattr(dataset_plan, "models_of", lambda version: models)
    plan = tmp_path / "v3.yaml"
    out = _json(capsys, "simulator", "dataset", "plan", "--out", str(plan))
    jobs = yaml.safe_load(plan.read_text())["jobs"]
    compares = [j for j in jobs if j["kind"] == "compare"]
    # one launch a (model, setting): DDP's defaults beside strategies of mixed kinds
    assert out["by_kind"]["compare"] == len(compares) == 2 * 4
    assert "run" not in out["by_kind"]
    assert {(j["world_size"], j["bandwidth"]) for j in compares} == {
        (2, "1gbit"),
        (4, "1gbit"),
        (2, "4gbit"),
        (4, "4gbit"),
    }
    # three in turn, fewer where they do not fit, more where a kind was missing at the setting
    assert all(len(j["strategies"]) >= 1 for j in compares)
    assert all(j["strategies"] and Strategy().to_dict() not in j["strategies"] for j in compares)
    kinds = {
        "parallel" if Strategy.from_dict(s).parallel != Strategy().parallel else "data"
        for j in compares
        for s in j["strategies"]
    }
    assert kinds == {"parallel", "data"}
    # the first round takes every model once
    assert [j["model"]["name"] for j in compares[:2]] == ["mlp", "gpt2-tiny"]
    assert all(j["rounds"] == 3 and j["ci_target"] == 0.01 for j in compares)
    links = [j for j in jobs if j["kind"] == "collectives"]
    assert all("reduce_scatter" in j["collectives"] for j in links)


def test_export_says_how_many_runs_the_version_left_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = {"kernels": 2, "fusion": 0, "links": 3, "runs": 0, "runs_left_out": 5}
    monkeypatch.setattr(simulator_jobs, "export_dataset", lambda *args, **kwargs: counts)
    out = str(tmp_path / "d.json.gz")
    assert main(["simulator", "dataset", "export", "--out", out, "--version", "cpu-v3"]) == 0
    captured = capsys.readouterr()
    assert "0 runs, 2 kernel profiles" in captured.out
    assert "5 of the store's runs left out" in captured.err
    assert "cpu-v3's (--all-models keeps every run)" in captured.err
