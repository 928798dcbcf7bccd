"""The app loads at start what its first request would otherwise import: after startup the
first refusal of an oversized spec imports nothing, as later ones do not.

In a fresh interpreter: this test process has imported the heavy modules long before."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = (
    "transformers.modeling_utils",
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.models.llama.modeling_llama",
    "scipy",
)
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from fastapi.testclient import TestClient
    from ddlsim.service.api import Settings, create_app

    heavy = json.loads(sys.argv[2])
    app = create_app(Settings(db=sys.argv[1], token="t"))
    out = {"before": [m for m in heavy if m in sys.modules]}
    with TestClient(app) as client:
        out["after"] = [m for m in heavy if m in sys.modules]
        out["cost_model"] = app.state.predictor.loaded
        spec = {
            "source": "transformers",
            "class": "GPT2LMHeadModel",
            "config": {"n_layer": 100000, "n_embd": 64, "n_head": 4},
            "inputs": {"batch_size": 1, "seq_len": 16},
        }
        loaded = set(sys.modules)
        answer = client.post(
            "/v1/predictions", json={"model": spec}, headers={"Authorization": "Bearer t"}
        )
        out["status"] = answer.status_code
        out["error"] = answer.json()["error"]
        out["imported"] = sorted(set(sys.modules) - loaded)
    print(json.dumps(out))
    """
)


def test_startup_loads_what_the_first_refusal_needs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, f"sqlite:///{tmp_path / 'api.db'}", json.dumps(HEAVY)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["before"] == [], "the app's import leaves them to startup"
    assert out["after"] == list(HEAVY) and out["cost_model"]
    assert out["status"] == 422 and "layers" in out["error"]
    assert out["imported"] == [], "the first refusal imports nothing more"
