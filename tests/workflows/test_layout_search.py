"""A GPU cluster's layouts searched by the search registry's algorithms (the CPU loop's own),
and a search for a run offering only what the executor runs there."""

import json
from pathlib import Path

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.plans.feasibility import cluster_target, paper_only, refusals
from ddlsim.search import SearchBudget
from ddlsim.service.cli import main
from ddlsim.workflows.layout_search import LayoutJob, layout_problem, search_layouts_with
from ddlsim.workflows.scale import search_at_scale

GPT2 = ZOO["gpt2-tiny"]
NODES = GpuClusterSpec.from_dict({"preset": "dgx-h100", "nodes": 4, "gpus_per_node": 2})
JOB = LayoutJob(model=GPT2, cluster=NODES, global_batch=64, seq_len=64)
BUDGET = SearchBudget(evaluations=25, time_limit_s=120, top=5, seed=0)


@pytest.mark.parametrize("algo", ["backtrack", "tpe", "random"])
def test_registry_algorithms_search_layouts(algo: str) -> None:
    found = search_layouts_with(algo, JOB, BUDGET)
    assert found["algo"] == algo and 0 < found["evaluated"] <= BUDGET.evaluations
    times = [row["iteration_s"] for row in found["top"]]
    assert found["best"] == found["top"][0] and times == sorted(times)
    # every answer is a layout of the cluster that fits its GPUs' memory
    for row in found["top"]:
        plan = Strategy.from_dict(row["strategy"]).parallel
        assert plan.resolve_dp(NODES.world_size) * plan.tp * plan.pp * plan.cp == 8
        assert row["memory_gib"] <= NODES.gpu.memory_gib


def test_the_registry_search_finds_what_the_bound_search_finds_when_it_sees_everything() -> None:
    """Backtracking with a budget over every layout prices each with the schedule replayed:
    its pick is no slower than the bound-and-replay search's."""
    problem, _, _ = layout_problem(JOB)
    every = SearchBudget(evaluations=len(problem.space.plans) + 1, time_limit_s=600, top=3)
    found = search_layouts_with("backtrack", JOB, every)
    bound = search_at_scale(GPT2, NODES, global_batch=64, seq_len=64)
    assert bound.best is not None
    assert found["best"]["iteration_s"] <= bound.best.iteration_s * (1 + 1e-9)


def test_a_search_for_a_run_offers_only_what_runs_there() -> None:
    """On paper the space holds the distributed optimizer beside tp/pp and context
    parallelism; for a run on the cluster's GPUs none of it, and every pick, the default
    search's and the registry's, passes the executor's check for those GPUs."""
    problem, _, _ = layout_problem(JOB)
    on_paper = [Strategy(parallel=plan) for plan in problem.space.plans]
    assert any(paper_only(strategy) for strategy in on_paper)
    runs = LayoutJob(model=GPT2, cluster=NODES, global_batch=64, seq_len=64, target="cuda")
    problem, _, left_out = layout_problem(runs)
    assert left_out > 0 and problem.space.plans
    job_model = GPT2.with_inputs(batch_size=64, seq_len=64)
    gpus = cluster_target(NODES, where="cuda", global_batch=64, seq_len=64)
    default = search_at_scale(GPT2, NODES, global_batch=64, seq_len=64, target="cuda")
    assert default.best is not None and default.not_runnable == left_out
    picks = [default.best.plan.to_strategy()]
    for algo in ("backtrack", "tpe"):
        best = search_layouts_with(algo, runs, BUDGET)["best"]
        picks.append(Strategy.from_dict(best["strategy"]))
    for pick in picks:
        assert refusals(job_model, pick, gpus) == [], pick.to_dict()


def test_the_command_line_searches_a_cluster_with_any_algorithm(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``ddlsim search MODEL --cluster dgx-h100:4 --algo tpe``: two searches sharing one
    Optuna study (a journal file) answer alike; an algorithm that measures live runs is
    refused by name."""
    journal = f"journal:///{tmp_path / 'study.log'}"
    args = ["search", "gpt2-tiny", "--cluster", "dgx-h100:4", "--batch-size", "64"]
    args += ["--budget", "15", "--json", "--storage", journal, "--study-name", "gpt2-h100"]
    answers = []
    for _ in range(2):
        assert main([*args, "--algo", "tpe"]) == 0
        answers.append(json.loads(capsys.readouterr().out))
    assert all(a["algo"] == "tpe" and a["best"] for a in answers)
    assert answers[0]["cluster"]["nodes"] == 4
    with pytest.raises(InvalidOptionError, match="--algo autotune does not search"):
        search_layouts_with("autotune", JOB, BUDGET)
