import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.store import Store
from ddlsim.service.cli import main
from tests.batch_files import BatchRun


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_models_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "models", "--json")
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["bert-base"]["family"] == "bert"
    assert rows["bert-base"]["parameters"] == pytest.approx(109.5e6, rel=0.01)
    assert rows["vit-base"]["inputs"] == {"batch_size": 8, "image_size": 224}


def test_models_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "models")
    assert code == 0
    assert "gpt2-small" in out and "GPT2LMHeadModel" in out


def test_graph_json_and_out_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    code, out, err = run(
        capsys, "graph", "gpt2-tiny", "--seq-len", "32", "--json", "--out", str(path)
    )
    assert code == 0, err
    summary = json.loads(out)
    for key in (
        "num_nodes",
        "num_edges",
        "num_params",
        "forward_flops",
        "backward_flops",
        "grad_bytes",
        "graph_hash",
    ):
        assert key in summary
    assert summary["inputs"] == {"batch_size": 4, "seq_len": 32}
    graph = IterationGraph.from_json(path.read_text())
    assert graph.graph_hash == summary["graph_hash"]
    assert graph.summary()["num_nodes"] == summary["num_nodes"]


def test_graph_summary_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "graph", "mlp", "--batch-size", "8")
    assert code == 0
    assert "batch_size=8" in out and "top modules" in out and "graph hash" in out


def test_graph_strategy_inline(capsys: pytest.CaptureFixture[str]) -> None:
    strategy = json.dumps({"tensor_fusion": {"dear": True, "bucket_caps_mb": [100]}})
    code, out, _ = run(capsys, "graph", "mlp", "--strategy", strategy, "--json")
    assert code == 0
    summary = json.loads(out)
    assert summary["nodes_by_kind"]["comm"] == 2  # one reduce-scatter, one all-gather
    assert summary["num_buckets"] == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["graph", "nosuch"], "'nosuch' is not in the zoo"),
        (
            ["graph", '{"class": "NoSuchModel", "inputs": {"batch_size": 1, "seq_len": 4}}'],
            "'NoSuchModel' is not a transformers model class",
        ),
        (
            [
                "graph",
                '{"class": "BertForMaskedLM", "config": {"hidden_sz": 8}, '
                '"inputs": {"batch_size": 1, "seq_len": 4}}',
            ],
            "config key 'hidden_sz' is not a BertConfig field",
        ),
        (["graph", "bert-tiny", "--seq-len", "4096"], r"inputs.seq_len\(4096\) > config"),
        (["graph", "vit-tiny", "--image-size", "30"], "not a multiple of config.patch_size"),
        (["graph", "mlp", "--strategy", '{"parallel": {"tpp": 2}}'], "unknown key 'tpp'"),
        (["graph", "mlp", "--strategy", "nofile.json"], "neither inline JSON nor an existing"),
        (["graph", "{broken"], "not valid JSON"),
        (["graph", sys.executable], "is not UTF-8 text"),
        (["graph", "vgg-mini", "--seq-len", "64"], r"inputs.seq_len\(64\) does not apply"),
        (
            ["graph", '{"class": "CLIPModel", "inputs": {"batch_size": 1, "seq_len": 4}}'],
            "composite configs",
        ),
        (
            ["graph", "mlp", "--strategy", '{"op_fusion": {"compiled": ["nope"]}}'],
            "not a module of MLP",
        ),
        (
            ["spec", "--strategy", '{"parallel": {"tp": 3}}', "--cluster", '{"world_size": 4}'],
            r"tp\(3\) \* pp\(1\) != world_size\(4\)",
        ),
        (["spec", "--cluster", '{"world_size": 4, "backend": "nccl"}'], "needs device.type"),
        (["spec", "--cluster", '{"nodes": 4}'], "neither an emulated cluster"),
        (["spec"], "give at least one of"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ddlsim: error: ")
    assert re.search(message, lines[0])


def test_multi_line_errors_print_as_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("class: [unclosed\ninputs: {batch_size: 1}\n")
    code, _, err = run(capsys, "graph", str(path))
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "not valid YAML" in err


def test_spec_normalizes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "spec",
        "--model",
        "bert-tiny",
        "--strategy",
        '{"parallel": {"tp": 2}}',
        "--cluster",
        '{"world_size": 8, "nodes": 2}',
        "--json",
    )
    assert code == 0
    checked = json.loads(out)
    assert checked["data_parallel"] == 4
    assert checked["cluster"]["devices_per_node"] == 4
    assert checked["strategy"]["tensor_fusion"]["bucket_cap_mb"] == 25.0
    assert checked["model"]["class"] == "BertForMaskedLM"
    # A GPU cluster is a cluster spec too.
    code, out, _ = run(capsys, "spec", "--cluster", "dgx-h100:2", "--strategy", "{}", "--json")
    assert code == 0
    assert json.loads(out)["data_parallel"] == 16


def test_argument_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "graph", "mlp", "--batch-size", "0")
    assert code == 2
    assert "'0' must be >= 1" in err


def test_console_script_never_shows_a_traceback() -> None:
    bad = (
        '{"class": "BertForMaskedLM", "config": {"num_hidden_layers": "two"}, '
        '"inputs": {"batch_size": 1, "seq_len": 4}}'
    )
    result = subprocess.run(
        [sys.executable, "-m", "ddlsim.service.cli", "graph", bad],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "num_hidden_layers" in result.stderr


def test_hash_is_the_same_in_another_process(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "graph", "vgg-mini", "--json")
    assert code == 0
    result = subprocess.run(
        [sys.executable, "-m", "ddlsim.service.cli", "graph", "vgg-mini", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(result.stdout)["graph_hash"] == json.loads(out)["graph_hash"]


def test_profile_kernels_stores_the_profile(
    capsys: pytest.CaptureFixture[str], private_store: str
) -> None:
    code, out, err = run(
        capsys, "profile", "kernels", "mlp", "--iters", "2", "--warmup", "1", "--json"
    )
    assert code == 0, err
    summary = json.loads(out)
    for key in ("iteration_time_ms", "attributed_ms", "coverage", "num_nodes_timed"):
        assert summary[key] > 0
    with Store.open(private_store) as store:
        (stored,) = store.kernel_profiles(graph_hash=summary["graph_hash"])
        assert stored.attributed_ms == pytest.approx(summary["attributed_ms"])
        assert store.load_graph(graph_hash=summary["graph_hash"]).model.label == "mlp"


def test_profile_batch_is_resumable(profile_batch: BatchRun) -> None:
    batch = (
        "product:\n"
        "  - {kind: [kernels], model: [mlp], batch_size: [2, 4], iters: [1], warmup: [0]}\n"
        "jobs:\n"
        "  - {kind: kernels, model: nosuch, iters: 1}\n"
    )
    code, first = profile_batch(batch)
    assert code == 1  # one job failed
    assert len(first["done"]) == 2
    assert "'nosuch' is not in the zoo" in first["failed"][0]["error"]
    code, second = profile_batch(batch)
    assert sorted(second["skipped"]) == sorted(first["done"])
    assert second["done"] == []


def test_bad_store_url_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "profile", "kernels", "mlp", "--db", "mysql://u:secret@h/db")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "secret" not in err


def test_profile_collectives_json(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, private_store: str
) -> None:
    monkeypatch.setenv("DDLSIM_FORCE_LOOPBACK", "1")  # fast; shaping is tested in profiler/
    code, out, err = run(
        capsys,
        "profile",
        "collectives",
        "--world-size",
        "2",
        "--sizes",
        "64KiB,1MiB",
        "--collectives",
        "all_reduce",
        "all_gather",
        "--repeats",
        "2",
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["network"] == "loopback"
    assert [f["collective"] for f in result["fits"]] == ["all_reduce", "all_gather"]
    for fit in result["fits"]:
        assert set(fit) >= {
            "collective",
            "backend",
            "world_size",
            "bandwidth",
            "alpha_us",
            "busbw_gbps",
            "r2",
        }
    assert {s["size_bytes"] for s in result["samples"]} == {64 * 1024, 1024 * 1024}
    with Store.open(private_store) as store:
        stored = store.collective_profiles(collective="all_reduce", world_size=2)
    assert len(stored) == 1 and stored[0].network == "loopback"


def test_profile_collectives_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys, "profile", "collectives", "--world-size", "2", "--collectives", "all_to_none"
    )
    assert code == 2
    assert "all_to_none" in err and len(err.strip().splitlines()) == 1
