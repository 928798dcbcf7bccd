"""Published runs read and predicted one way for the benchmark and the service: every shipped
file predicted, a bad row kept with its error, the answer computed once a process."""

import json
from importlib import resources
from typing import Any

import pytest

from benchmarks import published as benchmark
from ddlsim.workflows import published
from ddlsim.workflows.published import (
    RowError,
    describe_published,
    predict_published,
    predict_rows,
    published_files,
    rows_of,
)

GPT = {
    "source": "transformers",
    "class": "GPT2LMHeadModel",
    "config": {"n_embd": 256, "n_head": 8, "n_layer": 8, "n_positions": 512, "vocab_size": 1024},
    "inputs": {"batch_size": 8, "seq_len": 512},
}
ROW = {
    "name": "small",
    "source": "a test",
    "model": GPT,
    "cluster": "dgx-h100:1",
    "strategy": {"parallel": {"dp": 8}},
    "global_batch": 8,
    "seq_len": 512,
    "published": {"iteration_s": 0.01},
}


def test_the_benchmark_reads_rows_with_the_shared_functions() -> None:
    assert benchmark.parse_row is published.parse_row
    assert benchmark.predict_row is published.predict_row
    assert benchmark.RowError is RowError


def test_every_shipped_file_is_listed_with_its_rows() -> None:
    names = published_files()
    folder = resources.files("ddlsim.data") / "published"
    assert names == sorted(p.name for p in folder.iterdir() if p.name.endswith(".json"))
    for name in names:
        described = describe_published(name)
        raw = json.loads((folder / name).read_text("utf-8"))
        assert described["rows"] == len(raw["rows"]) and described["name"] == name
    with pytest.raises(RowError, match=r"'README\.md' is not shipped; allowed: "):
        describe_published("README.md")


def test_a_row_that_cannot_be_predicted_is_kept_with_its_error() -> None:
    bad: dict[str, Any] = {**ROW, "name": "bad", "strategy": {"parallel": {"dp": 3}}}
    answer = predict_rows({"about": "two rows", "rows": [ROW, bad, 5]}, "test.json")
    good, refused, junk = answer["rows"]
    assert good["name"] == "small" and good["metric"] == "iteration_s" and good["fits"]
    assert good["ape"] == pytest.approx(abs(good["predicted"] / 0.01 - 1), abs=0.02)
    assert good["source"] == "a test"
    assert refused == {"name": "bad", "error": refused["error"]} and "dp(3)" in refused["error"]
    assert junk == {"name": "row 2", "error": "row 2 is not an object"}
    assert answer["mape"] == good["ape"] and answer["about"] == "two rows"
    with pytest.raises(RowError, match=r"x\.json: expected a non-empty list of rows"):
        rows_of({"rows": []}, "x.json")


def test_a_file_is_predicted_once_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    name = "torchtitan_a100.json"
    first = predict_published(name)
    assert first["rows"] and all("error" not in row for row in first["rows"])

    def fail(raw: Any, where: str) -> dict[str, Any]:
        raise AssertionError("predicted again")

    monkeypatch.setattr(published, "predict_rows", fail)
    assert predict_published(name) is first


@pytest.mark.long
def test_every_published_layout_is_predicted_and_fits_its_gpus() -> None:
    """The layouts the published runs trained with fit in the prediction: a planner that refuses
    what people run is not trusted. No row is refused."""
    for name in published_files():
        answer = predict_published(name)
        for row in answer["rows"]:
            assert "error" not in row, (name, row)
            assert row["fits"], (name, row["name"], row["memory_gib"])
