"""The simulator's figures on the shipped datasets cannot move unseen: the replay alone and the
shipped checkpoint predict every run of ``ddlsim/data/datasets/`` (and their sessions), and
each plan kind's figures at each world size must stay within a small margin of those recorded in
``accuracy_figures.json`` beside this file.

When a change moves them on purpose, record them again in a commit of its own that says why:
``.venv/bin/python benchmarks/accuracy_figures.py --write --reason "..."``.
"""

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from ddlsim.simulator.cost_model import CostModel, ReplayCostModel, load_cost_model
from ddlsim.simulator.dataset import Dataset, load_dataset
from ddlsim.simulator.default import shipped_checkpoint
from ddlsim.simulator.figures import accuracy_figures, compare_figures

DATASETS = Path(__file__).resolve().parents[2] / "ddlsim" / "data" / "datasets"
RECORDED = json.loads((Path(__file__).with_name("accuracy_figures.json")).read_text())


@pytest.fixture(scope="module")
def cost_models() -> dict[str, CostModel]:
    return {"replay": ReplayCostModel(), "shipped": load_cost_model(str(shipped_checkpoint()))}


@pytest.fixture(scope="module")
def cpu_v3() -> Dataset:
    return load_dataset(DATASETS / "cpu-v3.json.gz")


def _moved(name: str, figures: dict[str, Any]) -> list[str]:
    recorded = RECORDED["datasets"][name]
    return [
        f"{model}: {line}"
        for model, rows in figures.items()
        for line in compare_figures(recorded[model], rows)
    ]


def test_every_shipped_dataset_is_recorded() -> None:
    shipped = sorted(p.name for p in DATASETS.glob("*.json.gz"))
    assert sorted(RECORDED["datasets"]) == shipped
    assert RECORDED["reason"] and RECORDED["recorded"]


@pytest.mark.long
def test_cpu_v3_figures_hold(cpu_v3: Dataset, cost_models: dict[str, CostModel]) -> None:
    moved = _moved("cpu-v3.json.gz", accuracy_figures(cpu_v3, cost_models))
    assert not moved, "the figures moved beyond their margins:\n" + "\n".join(moved)


def test_cpu_v2_figures_hold(cost_models: dict[str, CostModel]) -> None:
    figures = accuracy_figures(load_dataset(DATASETS / "cpu-v2.json.gz"), cost_models)
    moved = _moved("cpu-v2.json.gz", figures)
    assert not moved, "the figures moved beyond their margins:\n" + "\n".join(moved)


def _without_collective_cpu(dataset: Dataset) -> Dataset:
    """``dataset`` with one replay term taken out: the compute a collective takes from its
    rank while in flight."""
    links = tuple(
        dataclasses.replace(link, cpu_alpha_us=0.0, cpu_us_per_byte=0.0) for link in dataset.links
    )
    sessions = {name: _without_collective_cpu(s) for name, s in dataset.sessions.items()}
    return dataclasses.replace(dataset, links=links, sessions=sessions)


def test_a_worsened_replay_term_fails_the_guard(cpu_v3: Dataset) -> None:
    """The guard can fail: the replay without the collectives' CPU work moves several kinds
    beyond their margins, and the lines name the kind, the figure and both values."""
    figures = accuracy_figures(_without_collective_cpu(cpu_v3), {"replay": ReplayCostModel()})
    moved = _moved("cpu-v3.json.gz", figures)
    assert any(line.startswith("replay: dear|4 median_error") for line in moved), moved
    worse = [line for line in moved if "(worse by more than" in line]
    assert len(worse) >= 5, moved
