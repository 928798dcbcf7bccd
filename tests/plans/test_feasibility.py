"""One feasibility answer: ten strategies that no target can run, refused with the same message
by the command line (``run`` and ``predict --cluster``), the REST service (an execution and a
cluster prediction), the search space, the executor (before any rank starts) and the GPU path;
and what only prices on paper, refused where it would run."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor import run as executor_run
from ddlsim.executor.run import RunOptions, run_training
from ddlsim.plans.feasibility import (
    Target,
    check,
    cluster_target,
    paper_only,
    refusals,
)
from ddlsim.search.plans import candidate_plans, space_refusal
from ddlsim.service.api import Settings, create_app
from ddlsim.service.cli import main

LLAMA = ZOO["llama-tiny"]  # 2 blocks, 4 heads, 2 key/value heads, batch 4, 128 tokens
RANKS = 4
CLUSTER = {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": RANKS}
TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

INFEASIBLE: dict[str, dict[str, Any]] = {
    "ranks-tp-3": {"parallel": {"tp": 3}},
    "ranks-dp-2": {"parallel": {"dp": 2}},
    "ranks-tp-8": {"parallel": {"tp": 8}},
    "ranks-cp": {"parallel": {"dp": 1, "tp": 4, "cp": 2}},
    "kv-heads": {"parallel": {"tp": 4}},
    "stages-1f1b": {"parallel": {"pp": 4, "micro_batches": 4}},
    "stages-interleaved": {
        "parallel": {
            "pp": 2,
            "micro_batches": 2,
            "pp_schedule": "interleaved_1f1b",
            "virtual_stages": 2,
        }
    },
    "batch-accumulation": {"parallel": {"micro_batches": 3}},
    "batch-dp": {"parallel": {"dp": 4, "micro_batches": 2}},
    "batch-tp": {"parallel": {"tp": 2, "micro_batches": 4}},
}
SHOULD_NAME = {
    "ranks-tp-3": "dp(auto=1) * tp(3) * pp(1) != world_size(4)",
    "ranks-dp-2": "dp(2) * tp(1) * pp(1) != world_size(4)",
    "ranks-tp-8": "tp(8)",
    "ranks-cp": "cp(2) != world_size(4)",
    "kv-heads": "num_key_value_heads(2) of llama-tiny is not divisible by tp(4)",
    "stages-1f1b": "needs 4 stages but llama-tiny has 2 blocks",
    "stages-interleaved": "needs 4 stages but llama-tiny has 2 blocks",
    "batch-accumulation": "batch_size(4) is not divisible by dp(4) * micro_batches(3)",
    "batch-dp": "batch_size(4) is not divisible by dp(4) * micro_batches(2)",
    "batch-tp": "batch_size(4) is not divisible by dp(2) * micro_batches(4)",
}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(Settings(db=f"sqlite:///{tmp_path / 'api.db'}", token=TOKEN))
    with TestClient(app) as test_client:
        yield test_client


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The command's one-line refusal (exit 2, no traceback)."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("name", sorted(INFEASIBLE))
def test_every_entry_refuses_with_one_message(
    name: str,
    capsys: pytest.CaptureFixture[str],
    client: TestClient,
    monkeypatch: pytest.MonkeyPatch,
    private_store: str,
) -> None:
    raw = INFEASIBLE[name]
    strategy = Strategy.from_dict(raw)
    cpu = refusals(LLAMA, strategy, Target(world_size=RANKS, where="cpu"))
    gpu = cluster_target(GpuClusterSpec.from_dict(CLUSTER), global_batch=4, seq_len=128)
    assert cpu and cpu == refusals(LLAMA, strategy, gpu)
    message = cpu[0]
    assert SHOULD_NAME[name] in message
    # the command line: a run, and a GPU cluster's price
    text = json.dumps(raw)
    assert message in _cli(capsys, "run", "llama-tiny", "--strategy", text, "--world-size", "4")
    on_gpus = ("--cluster", json.dumps(CLUSTER), "--strategy", text)
    assert message in _cli(capsys, "predict", "llama-tiny", *on_gpus)
    # the REST service: an execution and a cluster prediction
    for path, body in (
        ("/v1/executions", {"model": "llama-tiny", "world_size": RANKS, "strategy": raw}),
        ("/v1/cluster-predictions", {"model": "llama-tiny", "cluster": CLUSTER, "strategy": raw}),
    ):
        answer = client.post(path, json=body, headers=AUTH)
        assert answer.status_code == 422, answer.text
        assert message in answer.json()["error"], (path, answer.json())
    # the search space: not offered, and why
    assert space_refusal(LLAMA, strategy, RANKS) == message
    assert strategy.parallel not in candidate_plans(
        LLAMA, RANKS, lambda spec, s: space_refusal(spec, s, RANKS) is None
    )

    # the executor: refused before a rank starts
    def no_ranks(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a rank started")

    monkeypatch.setattr(executor_run, "EmulatedCluster", no_ranks)
    with pytest.raises(InvalidStrategyError) as refused:
        run_training(LLAMA, strategy, RunOptions(world_size=RANKS))
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"parallel": {"dp": 2, "tp": 2, "async_tp": True, "sequence_parallel": True}}, "async"),
        ({"parallel": {"dp": 2, "cp": 2}}, "parallel.cp"),
        ({"parallel": {"dp": 2, "tp": 2, "zero": 1}}, "parallel.zero"),
        ({"parallel": {"dp": 2, "tp": 2, "distributed_optimizer": True}}, "distributed_optimizer"),
        ({"kernels": "transformer_engine", "precision": "bf16"}, "kernels 'transformer_engine'"),
    ],
)
def test_paper_plans_price_on_gpus_and_are_refused_where_they_would_run(
    raw: dict[str, Any], named: str
) -> None:
    strategy = Strategy.from_dict({"precision": "bf16", **raw})  # GPUs price 16-bit GEMMs
    reason = paper_only(strategy)
    assert reason is not None and named in reason
    gpus = GpuClusterSpec.from_dict(CLUSTER)
    assert refusals(LLAMA, strategy, cluster_target(gpus, global_batch=4, seq_len=128)) == []
    for where in ("cpu", "cuda"):
        found = refusals(LLAMA, strategy, cluster_target(gpus, where=where, global_batch=4))
        assert found == [reason]
    with pytest.raises(InvalidStrategyError, match="price"):
        check(LLAMA, strategy, Target(world_size=RANKS))


def test_fp8_needs_a_device_that_has_it() -> None:
    fp8 = Strategy(precision="fp8")
    a100 = GpuClusterSpec.from_dict({"preset": "dgx-a100-80g", "nodes": 1, "gpus_per_node": 4})
    (message,) = refusals(LLAMA, fp8, cluster_target(a100))
    assert message.startswith("precision 'fp8' needs a GPU with fp8") and "A100" in message
    assert refusals(LLAMA, fp8, cluster_target(GpuClusterSpec.from_dict(CLUSTER))) == []
    (on_cpu,) = refusals(LLAMA, fp8, Target(world_size=RANKS))
    assert on_cpu.endswith("cpu has none")
