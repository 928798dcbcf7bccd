"""The Docker files, read as data (no daemon here): the image serves by default, and the compose
file runs the service, a worker and PostgreSQL on one store."""

from pathlib import Path

import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def test_the_image_serves_by_default() -> None:
    lines = (DOCKER / "Dockerfile").read_text("utf-8").splitlines()
    assert 'ENTRYPOINT ["ddlsim"]' in lines
    assert [line for line in lines if line.startswith("CMD ")][-1] == (
        'CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]'
    )


def test_compose_runs_the_service_a_worker_and_postgres() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text("utf-8"))
    services = compose["services"]
    assert set(services) == {"postgres", "service", "worker", "proxy"}
    # No secret in the file: the database password and the token come from the environment.
    text = (DOCKER / "compose.yaml").read_text("utf-8")
    assert "POSTGRES_PASSWORD: ${DDLSIM_DB_PASSWORD:?" in text
    assert ":ddlsim@" not in text
    # Plain HTTP stays inside the compose network; the proxy serves TLS.
    assert "ports" not in services["service"] and services["proxy"]["ports"] == ["443:443"]
    assert "reverse_proxy service:8000" in (DOCKER / "Caddyfile").read_text("utf-8")
    assert services["service"]["command"][0] == "serve"
    assert "--no-worker" in services["service"]["command"]
    assert services["worker"]["command"] == ["worker"]
    urls = {services[name]["environment"]["DDLSIM_DB"] for name in ("service", "worker")}
    assert len(urls) == 1 and urls.pop().startswith("postgresql+psycopg://")
    for name in ("service", "worker"):
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert services[name]["build"]["dockerfile"] == "docker/Dockerfile"
