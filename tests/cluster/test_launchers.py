"""``ddlsim run --launcher env`` under torchrun (two "nodes" on this machine, c10d rendezvous)
and ``--launcher slurm`` on submitit's local executor: rank 0 reports, one run is stored, and the
losses are those of a single process of the same precision."""

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from ddlsim.cluster.external import ExternalRank
from ddlsim.cluster.launcher import SlurmLauncher
from ddlsim.cluster.slurm import SlurmSettings
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.data.store.tasks import TaskQueue
from ddlsim.data.zoo import ZOO
from ddlsim.executor.run import RunOptions
from ddlsim.service.worker import Worker
from ddlsim.workflows.requests import ExecuteRequest
from tests.executor.harness import assert_losses_match
from tests.executor.test_gpu_grade import RTOL, single_losses
from tests.torchrun import BIN, torchrun_agents

GPT2 = ZOO["gpt2-tiny"]
STRATEGIES: dict[str, dict[str, Any]] = {
    "ddp-defaults": {},
    "fsdp-bf16-full-recompute": {
        "parallel": {"fsdp": True, "recompute": "full"},
        "precision": "bf16",
    },
    "tp2-sequence-parallel": {"parallel": {"tp": 2, "sequence_parallel": True}},
    "distributed-optimizer": {"parallel": {"distributed_optimizer": True}},
}
RUN_ARGS = ["--iters", "5", "--seed", "0", "--json", "--measure-budget", "0"]


def torchrun_nodes(
    tmp_path: Path,
    strategies: list[dict[str, Any]],
    *,
    nproc: int,
    nodes: int = 2,
    timeout_s: int = 600,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """``ddlsim run gpt2-tiny --launcher env`` with ``strategies`` (side by side when more than
    one) on ``nodes`` torchrun agents of ``nproc`` ranks each, all on this machine; every
    agent's stdout."""
    chosen = [arg for raw in strategies for arg in ("--strategy", json.dumps(raw))]
    return torchrun_agents(
        ["run", "gpt2-tiny", "--launcher", "env", *chosen, *RUN_ARGS, *extra],
        nodes=nodes,
        nproc=nproc,
        env={"DDLSIM_DB": f"sqlite:///{tmp_path / 'store.db'}"},
        cwd=tmp_path,
        timeout_s=timeout_s,
    )


def stored_runs(db: Path) -> list[tuple[Any, ...]]:
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT model, world_size, network FROM ddlsim_measurements ORDER BY id")
        ).all()
    engine.dispose()
    return [tuple(row) for row in rows]


def _report(outputs: list[str]) -> Any:
    """Rank 0's JSON: exactly one agent printed one (c10d decides which node holds rank 0)."""
    printed = [out for out in outputs if out.strip()]
    assert len(printed) == 1, outputs
    return json.loads(printed[0])


def check_side_by_side_parity(
    tmp_path: Path, strategies: list[dict[str, Any]], *, nproc: int
) -> list[dict[str, Any]]:
    """``strategies`` side by side in one launch on two torchrun "nodes" of ``nproc`` ranks:
    each trains as a single process of its precision does, and each run is stored once; the
    reports, in the order given."""
    reports = _report(torchrun_nodes(tmp_path, strategies, nproc=nproc, extra=("--rounds", "1")))
    assert len(reports) == len(strategies)
    runs = stored_runs(tmp_path / "store.db")
    assert runs == [("gpt2-tiny", 2 * nproc, reports[0]["network"])] * len(strategies)
    for number, (raw, report) in enumerate(zip(strategies, reports, strict=True), start=1):
        strategy = Strategy.from_dict(raw)
        assert report["world_size"] == 2 * nproc
        assert report["launcher"] == "env"
        assert report["network"].startswith(f"env: 2 node(s) x {nproc} rank(s), gloo")
        assert report["env"]["side_by_side"] == len(strategies)
        assert Strategy.from_dict(report["strategy"]) == strategy, raw
        want = single_losses(
            GPT2, Strategy(precision=strategy.precision), len(report["losses"])
        ).losses
        assert_losses_match(report["losses"], want, rtol=RTOL[strategy.precision])
        assert report["id"] == number
    return reports


@pytest.mark.long
def test_torchrun_nodes_of_one_rank_match_a_single_process(tmp_path: Path) -> None:
    """Every strategy of ``STRATEGIES`` on two torchrun "nodes" of one rank each (two ranks a
    node: the GPU search pick's test below)."""
    check_side_by_side_parity(tmp_path, [STRATEGIES[n] for n in sorted(STRATEGIES)], nproc=1)


def _on_local_slurm(tmp_path: Path, args: list[str]) -> dict[str, Any]:
    """``ddlsim ARGS --launcher slurm`` on submitit's local executor (2 ranks); its JSON."""
    env = {**os.environ, "DDLSIM_DB": f"sqlite:///{tmp_path / 'store.db'}", "OMP_NUM_THREADS": "1"}
    command = [str(BIN / "ddlsim"), *args, "--launcher", "slurm", "--submitit-cluster", "local"]
    done = subprocess.run(
        [*command, "--gpus-per-node", "2", "--slurm-folder", str(tmp_path / "jobs")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["slurm_job_id"] and f"Slurm job {report['slurm_job_id']}" in done.stderr
    return report


@pytest.mark.long
def test_the_gpu_search_pick_runs_unchanged_under_torchrun(tmp_path: Path) -> None:
    """What ``search --cluster CLUSTER --json`` prints (two DGX H100 nodes of two GPUs each)
    is a strategy ``run`` takes as it is on two torchrun nodes of two ranks (its precision set
    to bf16; side by side with ``STRATEGIES``, each matching a single process): a search for a
    run on those GPUs (``--target cuda``) offers only what this executor runs; with fp8 it is
    refused before any rank starts."""
    searched = subprocess.run(
        [
            str(BIN / "ddlsim"),
            "search",
            "gpt2-tiny",
            "--cluster",
            json.dumps({"preset": "dgx-h100", "nodes": 2, "gpus_per_node": 2}),
            "--target",
            "cuda",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    strategy = json.loads(searched.stdout)["best"]["strategy"]
    picked = Strategy.from_dict(strategy)
    ranks = picked.parallel.resolve_dp(4) * picked.parallel.tp * picked.parallel.pp
    assert ranks == 4
    strategy["precision"] = "bf16"
    # ... side by side with every strategy of ``STRATEGIES``, on two nodes of two ranks each
    others = [STRATEGIES[name] for name in sorted(STRATEGIES)]
    others = [raw for raw in others if Strategy.from_dict(raw) != Strategy.from_dict(strategy)]
    check_side_by_side_parity(tmp_path, [strategy, *others], nproc=2)
    strategy["precision"] = "fp8"
    refused = subprocess.run(
        [
            str(BIN / "ddlsim"),
            "run",
            "gpt2-tiny",
            "--strategy",
            json.dumps(strategy),
            "--world-size",
            "4",
            *RUN_ARGS,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "DDLSIM_DB": f"sqlite:///{tmp_path / 'refused.db'}"},
    )
    assert refused.returncode != 0
    assert "precision 'fp8' needs a GPU with fp8" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_env_without_a_launcher_is_refused_naming_the_variables() -> None:
    with pytest.raises(InvalidOptionError, match="RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR"):
        ExternalRank.from_environ({})
    with pytest.raises(InvalidOptionError, match=r"RANK\(4\) must be in 0..WORLD_SIZE\(4\)"):
        ExternalRank.from_environ(
            {
                "RANK": "4",
                "WORLD_SIZE": "4",
                "LOCAL_RANK": "0",
                "MASTER_ADDR": "h",
                "MASTER_PORT": "1",
            }
        )
    place = ExternalRank.from_environ(
        {
            "RANK": "3",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "3",
            "LOCAL_WORLD_SIZE": "4",
            "MASTER_ADDR": "node0",
            "MASTER_PORT": "29500",
        }
    )
    assert place.nodes == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": 0}, r"nodes\(0\) must be an integer in 1..4096"),
        ({"cluster": "pbs"}, "submitit cluster 'pbs' is not supported; allowed: slurm, local"),
        ({"cluster": "local", "nodes": 2}, "local executor runs one node"),
        ({"time_min": 0}, r"time_min\(0\)"),
    ],
)
def test_bad_slurm_settings_are_named(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        SlurmSettings(**kwargs)


def test_the_cli_refuses_env_outside_a_launcher(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    done = subprocess.run(
        [str(BIN / "ddlsim"), "run", "gpt2-tiny", "--launcher", "env", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**env, "DDLSIM_DB": f"sqlite:///{tmp_path / 'db'}"},
    )
    assert done.returncode != 0
    assert "--launcher env joins a process group" in done.stderr
    assert "Traceback" not in done.stderr


SEARCH_ARGS = [
    "--world-size", "2", "--verify", "--iters", "3", "--measure-budget", "0", "--budget",
    "20", "--verify-rounds", "1", "--profile-iters", "2", "--json",
]  # fmt: skip


def _check_verified(report: dict[str, Any]) -> None:
    assert report["measured_baseline_ms"] > 0
    assert report["measured_best_ms"] > 0
    # the first three candidates and DDP's defaults, each once (fewer where they coincide)
    assert report["measurement"]["side_by_side"] == len(report["verified"]) in (1, 2, 3, 4)
    assert report["verified"], "the verifying runs are reported"


@pytest.mark.long
def test_search_verify_runs_on_a_torchrun_group(tmp_path: Path) -> None:
    outputs = torchrun_agents(
        ["search", "gpt2-tiny", "--launcher", "env", *SEARCH_ARGS],
        nodes=2,
        nproc=1,
        env={"DDLSIM_DB": f"sqlite:///{tmp_path / 'store.db'}"},
        cwd=tmp_path,
    )
    report = _report(outputs)
    _check_verified(report)
    networks = {row[2] for row in stored_runs(tmp_path / "store.db")}
    assert len(networks) == 1
    assert networks.pop().startswith("env: 2 node(s) x 1 rank(s), gloo rendezvous at ")
    assert report["measurement"]["side_by_side"] == len(stored_runs(tmp_path / "store.db"))


@pytest.mark.long
def test_search_verify_runs_as_a_slurm_job(tmp_path: Path) -> None:
    """``search --verify --launcher slurm`` on submitit's local executor: the verifying runs
    are one Slurm job of two ranks, each stored; DDP's defaults among them train as a single
    process does."""
    report = _on_local_slurm(tmp_path, ["search", "gpt2-tiny", *SEARCH_ARGS])
    _check_verified(report)
    runs = stored_runs(tmp_path / "store.db")
    assert {(model, world) for model, world, _ in runs} == {("gpt2-tiny", 2)}
    assert {network.split(":")[0] for _, _, network in runs} == {"slurm"}
    baseline = [r for r in report["verified"] if r["strategy"] == Strategy().to_dict()]
    assert len(baseline) == 1, report["verified"]
    with Store.open(f"sqlite:///{tmp_path / 'store.db'}") as store:
        losses = {m.id: m.losses for m in store.measurements()}[baseline[0]["measurement_id"]]
    assert losses
    assert_losses_match(losses, single_losses(GPT2, Strategy(), len(losses)).losses)


@pytest.mark.long
def test_a_worker_launches_its_tasks_through_the_launcher(tmp_path: Path) -> None:
    """``ddlsim worker --launcher slurm``: a queued execution runs as a Slurm job (submitit's
    local executor), sized to the task, and is stored with its prediction as any task is."""
    db = f"sqlite:///{tmp_path / 'store.db'}"
    options = RunOptions(world_size=2, iters=3, budget_s=0)
    with Store.open(db) as store:
        queued = TaskQueue(store).submit(
            "execution", ExecuteRequest(model=GPT2, options=options).to_json()
        )
    settings = SlurmSettings(cluster="local", gpus_per_node=1, folder=str(tmp_path / "jobs"))
    worker = Worker(db, poll_s=0.05, simulator="replay", launcher=SlurmLauncher(settings))
    assert worker.run(once=True) == 1
    with Store.open(db) as store:
        task = TaskQueue(store).get(queued.id)
        assert task.status == "done", task.error
        assert task.result is not None and task.result["prediction_id"]
    assert [network.split(":")[0] for _, _, network in stored_runs(tmp_path / "store.db")] == [
        "slurm"
    ]
