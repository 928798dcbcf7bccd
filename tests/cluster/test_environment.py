import pytest

from ddlsim.cluster.environment import rank_environment


def test_ranks_get_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDLSIM_DB", "postgresql://u:s3cret@db/x")
    monkeypatch.setenv("DDLSIM_API_TOKEN", "t0ken")
    monkeypatch.setenv("PGPASSWORD", "s3cret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cret")
    monkeypatch.setenv("TORCH_HOME", "/tmp/torch")
    monkeypatch.setenv("PYTHONPATH", "postgresql://u:s3cret@db/x")
    monkeypatch.setenv("SOMETHING_ELSE", "x")
    env = rank_environment({"OMP_NUM_THREADS": "1"})
    assert "s3cret" not in " ".join(env.values()) and "t0ken" not in " ".join(env.values())
    assert env["TORCH_HOME"] == "/tmp/torch" and env["OMP_NUM_THREADS"] == "1"
    assert "PATH" in env and "SOMETHING_ELSE" not in env
