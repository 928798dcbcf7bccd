import json

import pytest

from ddlsim.service.cli import main

GPT = {
    "source": "transformers",
    "class": "GPT2LMHeadModel",
    "config": {"n_embd": 256, "n_head": 8, "n_layer": 8, "n_positions": 512, "vocab_size": 1024},
    "inputs": {"batch_size": 32, "seq_len": 512},
}
GPT3 = {
    "source": "transformers",
    "class": "GPT2LMHeadModel",
    "config": {
        "n_embd": 12288,
        "n_head": 96,
        "n_layer": 96,
        "n_positions": 2048,
        "vocab_size": 51200,
    },
    "inputs": {"batch_size": 1024, "seq_len": 2048},
}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_predict_on_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    plan = {"parallel": {"dp": 4, "tp": 2, "micro_batches": 2}, "precision": "bf16"}
    code, out, _ = run(
        capsys,
        "predict",
        json.dumps(GPT),
        "--cluster",
        "dgx-h100:1",
        "--plan",
        json.dumps(plan),
        "--json",
    )
    assert code == 0
    payload = json.loads(out)
    assert payload["cluster"]["name"] == "dgx-h100" and payload["micro_batch_size"] == 4
    assert payload["iteration_s"] > 0 and payload["fits"]
    code, out, _ = run(
        capsys, "predict", json.dumps(GPT), "--cluster", "dgx-h100:1", "--plan", json.dumps(plan)
    )
    assert code == 0 and "tokens/s per GPU" in out


def test_layout_that_does_not_fit_is_refused_with_the_estimate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = {"parallel": {"dp": 1024, "recompute": "full"}, "precision": "bf16"}
    code, _, err = run(
        capsys,
        "predict",
        json.dumps(GPT3),
        "--cluster",
        "dgx-a100-80g:128",
        "--plan",
        json.dumps(plan),
    )
    assert code == 2
    assert "does not fit A100-SXM4-80GB's 80 GiB" in err
    assert "weights_and_optimizer" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--cluster", "dgx-z100:2", "--plan", "{}"), "not a preset"),
        (("--cluster", "dgx-h100:1"), "--cluster needs --strategy"),
        (
            ("--cluster", "dgx-h100:1", "--plan", '{"parallel": {"dp": 3}}'),
            "!= world_size(8)",
        ),
    ],
)
def test_bad_cluster_input_is_named(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    code, _, err = run(capsys, "predict", json.dumps(GPT), *argv)
    assert code == 2 and message in err and "Traceback" not in err


def test_search_on_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "search", json.dumps(GPT), "--cluster", "dgx-h100:1", "--json")
    assert code == 0
    payload = json.loads(out)
    assert payload["best"]["replayed"] and payload["evaluated"] > 10
    times = [row["iteration_s"] for row in payload["top"] if row["replayed"]]
    assert times == sorted(times)
    code, _, err = run(capsys, "search", json.dumps(GPT))
    assert code == 2 and "needs --world-size, or --cluster" in err


def test_search_on_a_cluster_within_a_search_space(capsys: pytest.CaptureFixture[str]) -> None:
    space = json.dumps({"sharding": ["none"], "recompute": ["none", "full"]})
    code, out, _ = run(
        capsys,
        "search",
        json.dumps(GPT),
        "--cluster",
        "dgx-h100:1",
        "--kernels",
        "transformer_engine",
        "--search-space",
        space,
        "--json",
    )
    assert code == 0
    for row in json.loads(out)["top"]:
        strategy = row["strategy"]
        assert strategy["kernels"] == "transformer_engine"
        assert strategy["parallel"].get("recompute", "none") in {"none", "full"}
        assert not strategy["parallel"].get("fsdp") and not strategy["parallel"].get(
            "distributed_optimizer"
        )
        # Transformer Engine's userbuffers overlap tensor parallelism
        assert strategy["parallel"].get("async_tp", False) == (strategy["parallel"]["tp"] > 1)
    code, _, err = run(
        capsys,
        "search",
        json.dumps(GPT),
        "--cluster",
        "dgx-h100:1",
        "--search-space",
        '{"cp": [3]}',
    )
    assert code == 2 and "search space cp 3 is not one of [1, 2, 4, 8]" in err
