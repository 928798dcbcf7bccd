"""``ddlsim search``: finds a strategy no slower than DDP's defaults, keeps to its budget,
verifies with the executor, and refuses bad input in one line."""

import json
from pathlib import Path

import optuna
import pytest

from data.specs.strategy import Strategy
from service.cli import main

BASE = ["search", "mlp", "--world-size", "2", "--bandwidth", "1gbit", "--batch-size", "16"]
BASE += ["--profile-iters", "2", "--simulator", "replay"]


def _search(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*BASE, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("algo", ["backtrack", "random"])
def test_search_finds_no_worse_than_the_baseline(
    capsys: pytest.CaptureFixture[str], algo: str
) -> None:
    out = _search(capsys, "--algo", algo, "--budget", "60")
    assert out["algo"] == algo and out["predictor"] == "replay"
    assert 1 < out["evaluations"] <= 60
    assert out["best"]["predicted_ms"] <= out["baseline"]["predicted_ms"]
    assert out["baseline"]["strategy"] == Strategy().to_dict()
    top = [t["predicted_ms"] for t in out["top"]]
    assert top == sorted(top) and len(top) == 5
    Strategy.from_dict(out["best"]["strategy"])  # a valid strategy
    curve = out["convergence"]
    assert curve == sorted(curve, reverse=True) and curve[-1] == pytest.approx(min(top))


def test_verify_runs_the_best_and_the_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    out = _search(capsys, "--budget", "20", "--verify", "--iters", "2", "--warmup", "1")
    assert out["measured_best_ms"] > 0 and out["measured_baseline_ms"] > 0
    assert out["speedup"] == pytest.approx(out["measured_baseline_ms"] / out["measured_best_ms"])


def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "mlp", "--world-size", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "world_size(1)" in err[0]
    assert main([*BASE, "--time-limit", "0"]) == 2
    assert "time_limit(0.0)" in capsys.readouterr().err


@pytest.mark.parametrize("algo", ["tpe", "cmaes"])
def test_optuna_samplers_share_a_study_in_a_database(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, algo: str
) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    args = ["--algo", algo, "--budget", "15", "--storage", storage, "--study-name", "s"]
    first = _search(capsys, *args)
    assert first["best"]["predicted_ms"] <= first["baseline"]["predicted_ms"]
    assert 1 < first["evaluations"] <= 15
    second = _search(capsys, *args, "--workers", "2")
    assert second["best"]["predicted_ms"] <= second["baseline"]["predicted_ms"]
    # both searches' trials are in the one study
    study = optuna.load_study(study_name="s", storage=storage)
    assert len(study.trials) >= 20
    assert study.best_value <= first["best"]["predicted_ms"] + 1e-9


def test_a_bad_storage_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--algo", "tpe", "--storage", "nosuchdb://x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nosuchdb://x" in err[0]
