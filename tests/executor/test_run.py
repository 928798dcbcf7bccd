"""``ddlsim run``: real ranks, stored results, clear failures, nothing left behind."""

import dataclasses
import json
import os
import statistics
import subprocess
from pathlib import Path

import pytest

from ddlsim.cluster import NAMESPACE_PREFIX, ClusterRunError
from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import ZOO
from ddlsim.executor.run import (
    MAX_SIDE_BY_SIDE,
    RunOptions,
    RunResult,
    compare_training,
    run_training,
)
from ddlsim.profiler.capture import capture_graph
from ddlsim.service.cli import main
from ddlsim.simulator.dataset import export_dataset, load_dataset
from tests.batch_files import BatchRun
from tests.executor.harness import assert_losses_match, reference_losses

MLP = ZOO["mlp"].with_inputs(batch_size=16)
MLP_JSON = json.dumps(MLP.to_dict())


OWNER_ENV = "DDLSIM_TEST_OWNER"


@pytest.fixture(autouse=True)
def _mark_our_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks inherit the environment: the mark tells this test's processes from those that
    another test worker runs at the same time, even after an orphan is re-parented."""
    monkeypatch.setenv(OWNER_ENV, str(os.getpid()))


def _netns() -> list[str]:
    """This process's namespaces (their names carry the launcher's pid)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    names = (line.split()[0] for line in out.stdout.splitlines() if line.strip())
    return sorted(name for name in names if name.startswith(f"{NAMESPACE_PREFIX}{os.getpid()}-"))


def _ddlsim_ranks() -> list[str]:
    """Live rank processes started by this test process."""
    out = subprocess.run(
        ["pgrep", "-f", "ddlsim.executor.rank_main"], check=False, capture_output=True, text=True
    )
    mark = f"{OWNER_ENV}={os.getpid()}".encode()
    ours = []
    for pid in out.stdout.split():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if mark in environ.split(b"\0"):
            ours.append(pid)
    return ours


def test_run_prints_and_stores_a_measurement(capsys: pytest.CaptureFixture[str]) -> None:
    strategy = json.dumps({"tensor_fusion": {"bucket_cap_mb": 0.1, "dear": True}})
    code = main(
        [
            "run",
            MLP_JSON,
            "--strategy",
            strategy,
            "--world-size",
            "2",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--measure-budget",
            "0",
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["network"] == "loopback"
    times = out["iteration_time_ms"]
    assert len(times["samples"]) == 3
    assert times["p10"] <= times["median"] <= times["p90"]
    assert len(out["losses"]) == 4
    assert len(out["peak_memory_bytes"]) == 2 and min(out["peak_memory_bytes"]) > 0
    assert out["applied"]["collectives"] == ["reduce_scatter:ring", "all_gather:ring"]
    # the median carries its interval, and the protocol says why it stopped
    low, high = times["ci95_ms"]
    assert low <= times["median"] <= high
    assert times["stopped_by"] == "minimum"
    # each rank pinned to a core of its own, recorded with the run
    cores = sorted(os.sched_getaffinity(0))
    env = out["env"]
    placed = [env["rank_cores"][str(rank)] for rank in (0, 1)]
    assert all(len(c) == 1 for c in placed)
    if len(cores) >= 2:
        assert placed[0] != placed[1]
    assert env["pinned"] is True
    assert sorted(r for ranks in env["ranks_per_core"].values() for r in ranks) == [0, 1]
    with Store.open() as store:
        (stored,) = store.measurements()
    assert stored.losses == out["losses"]
    assert stored.iteration_time_ms == times["samples"]
    assert stored.applied == out["applied"]


def test_world_size_one_is_plain_training() -> None:
    result = run_training(MLP, Strategy(), RunOptions(world_size=1, iters=2, warmup=0, budget_s=0))
    assert result.applied["plan"] == "single"
    assert len(result.losses) == 2 and result.losses[1] < result.losses[0]


@pytest.mark.parametrize(
    ("strategy", "world_size", "message"),
    [
        ({"parallel": {"tp": 3}}, 2, r"dp\(auto=0\) \* tp\(3\) \* pp\(1\) != world_size\(2\)"),
        ({"parallel": {"dp": 3}}, 2, r"dp\(3\) \* tp\(1\) \* pp\(1\) != world_size\(2\)"),
        ({"tensor_fusion": {"buckets": [["head.weight"]]}}, 2, "miss"),
        ({"tensor_fusion": {"buckets": [["nope"]]}}, 2, "'nope', which is not a gradient"),
        ({"op_fusion": {"compiled": ["body.9"]}}, 2, r"op_fusion.compiled\[0\] 'body.9'"),
        ({"parallel": {"micro_batches": 3}}, 2, r"batch_size\(16\) is not divisible"),
    ],
)
def test_bad_strategies_are_refused_before_any_rank_starts(
    strategy: dict, world_size: int, message: str
) -> None:
    with pytest.raises(InvalidStrategyError, match=message):
        run_training(
            MLP,
            Strategy.from_dict(strategy),
            RunOptions(world_size=world_size, iters=1, budget_s=0),
        )
    assert _ddlsim_ranks() == []


def test_bad_strategy_on_the_command_line_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "mlp", "--strategy", '{"parallel": {"pp": 3}}', "--world-size", "2"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pp(3)" in err[0]
    with Store.open() as store:
        assert store.measurements() == []


def test_a_crashed_rank_ends_the_run_naming_it() -> None:
    before = _netns()
    with pytest.raises(
        ClusterRunError,
        match=r"(?s)rank 1 exited with code 3;.*on purpose",
    ):
        run_training(
            MLP,
            Strategy(),
            RunOptions(world_size=2, iters=2, timeout_s=120, budget_s=0),
            extra_args=("--test-crash-rank", "1"),
        )
    assert _ddlsim_ranks() == []
    assert _netns() == before


def test_a_hung_rank_ends_the_run_within_the_timeout() -> None:
    with pytest.raises(ClusterRunError, match="rank"):
        run_training(
            MLP,
            Strategy(),
            RunOptions(world_size=2, iters=2, timeout_s=120, collective_timeout_s=5, budget_s=0),
            extra_args=("--test-hang-rank", "1"),
        )
    assert _ddlsim_ranks() == []


def test_compiled_blocks_match_and_report_compile_time() -> None:
    strategy = Strategy.from_dict({"op_fusion": {"compiled": ["body.0", "head"]}})
    compiled = run_training(MLP, strategy, RunOptions(world_size=2, iters=2, warmup=1, budget_s=0))
    eager = run_training(MLP, Strategy(), RunOptions(world_size=2, iters=2, warmup=1, budget_s=0))
    assert compiled.applied["compiled"] == ["body.0", "head"]
    assert compiled.applied["compiled_graphs"] >= 2
    assert compiled.compile_time_s is not None and compiled.compile_time_s > 0
    # Inductor's kernels vectorise to the host's width (AVX2 or AVX-512) and reassociate sums:
    # the losses agree to the last few bits, which bits depends on the CPU.
    for got, want in zip(compiled.losses, eager.losses, strict=True):
        assert abs(got - want) <= 1e-4 * abs(want)


def test_batch_runs_executor_jobs(profile_batch: BatchRun) -> None:
    code, out = profile_batch(
        "jobs:\n"
        "  - {kind: run, model: mlp, batch_size: 8, world_size: 2, iters: 2, warmup: 0,\n"
        "     measure_budget_s: 0,\n"
        "     strategy: {tensor_fusion: {bucket_cap_mb: 1, implementation: hooks}}}\n"
        "  - {kind: run, model: mlp, world_size: 2, strategy: {parallel: {dp: 3}}}\n"
        "  - {kind: run, model: mlp, world_size: 2, device: cpu, backend: nccl}\n"
    )
    assert code == 1
    assert len(out["done"]) == 1
    errors = " | ".join(job["error"] for job in out["failed"])
    assert len(out["failed"]) == 2
    assert "backend 'nccl' needs device 'cuda', got device 'cpu'" in errors
    assert "dp(3) * tp(1) * pp(1) != world_size(2)" in errors
    with Store.open() as store:
        (stored,) = store.measurements()
    assert stored.world_size == 2 and len(stored.iteration_time_ms) == 2
    assert stored.applied["fusion"] == "hooks"


def test_batch_compare_job_stores_each_strategy_beside_its_reference(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "batch.yaml"
    path.write_text(
        "jobs:\n"
        "  - {kind: compare, model: mlp, batch_size: 8, world_size: 2, iters: 2, warmup: 0,\n"
        "     rounds: 2, measure_budget_s: 0,\n"
        "     strategies: [{tensor_fusion: {bucket_cap_mb: 1, implementation: hooks}}, {}]}\n"
        "  - {kind: compare, model: mlp, world_size: 2, strategies: []}\n"
    )
    assert main(["profile", "batch", str(path), "--json"]) == 2
    assert "(compare) needs 'strategies', a non-empty list" in capsys.readouterr().err
    path.write_text("\n".join(path.read_text().splitlines()[:4]) + "\n")
    assert main(["profile", "batch", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["done"]) == 1
    with Store.open() as store:
        stored = store.measurements()
        strategies = [store.load_strategy(strategy_hash=m.strategy_hash) for m in stored]
        exported = tmp_path / "d.json.gz"
        export_dataset(store, exported, meta={})
    # DDP's defaults (given again in the list, run once) and the hook buckets, one launch
    assert sorted(s.tensor_fusion.implementation for s in strategies) == ["auto", "hooks"]
    assert len({m.env["launch_id"] for m in stored}) == 1
    assert all(len(m.iteration_time_ms) == 4 and m.env["side_by_side"] == 2 for m in stored)
    runs = load_dataset(exported).runs
    reference = next(r for r in runs if r.strategy == Strategy())
    hooks = next(r for r in runs if r.strategy != Strategy())
    assert hooks.extra["reference_ms"] == reference.measured_ms
    assert hooks.speedup == pytest.approx(reference.measured_ms / hooks.measured_ms)
    assert reference.speedup == 1.0
    assert hooks.extra["ci95_ms"] is not None and hooks.extra["stopped_by"] == "minimum"
    # the machine's speed probe, after each of the 2 rounds, goes with the runs
    assert hooks.extra["probe_ms"] > 0 and hooks.extra["probe_ms"] == reference.extra["probe_ms"]


def test_side_by_side_strategies_train_apart_and_take_turns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ddlsim run --strategy A --strategy B ...``: one launch, every strategy stored."""
    strategies = [
        Strategy(),
        Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": 0.1, "dear": True}}),
        Strategy.from_dict({"parallel": {"pp": 2, "micro_batches": 2}}),
    ]
    rounds, iters, warmup = 2, 2, 1
    chosen = [arg for s in strategies for arg in ("--strategy", json.dumps(s.to_dict()))]
    db = f"sqlite:///{tmp_path / 'sbs.db'}"
    code = main(
        [
            "run",
            MLP_JSON,
            "--world-size",
            "2",
            *chosen,
            *("--iters", str(iters), "--warmup", str(warmup), "--measure-budget", "0"),
            *("--rounds", str(rounds), "--db", db, "--json"),
        ]
    )
    assert code == 0
    results = json.loads(capsys.readouterr().out)
    assert [Strategy.from_dict(r["strategy"]) for r in results] == strategies
    assert [r["applied"]["plan"] for r in results] == ["ddp", "ddp", "pipeline"]
    assert [r["applied"]["fusion"] for r in results[:2]] == ["ddp", "hooks"]
    # Each model trains on its own: every step it ran (warm-up, the one settling step of each
    # turn, the kept ones) matches single-process training, as if it had run alone.
    steps = warmup + rounds * (1 + iters)
    want = reference_losses(MLP, steps)
    for result in results:
        env = result["env"]
        assert len(result["iteration_time_ms"]["samples"]) == rounds * iters
        assert len(env["warmup_ms"]) == warmup
        assert (env["side_by_side"], env["rounds"]) == (3, rounds)
        # The mlp's loss falls to 1e-4 of its first within these steps: compare its tail
        # against the first step's scale (an AVX2-only host differs by 3e-4 relative there).
        assert_losses_match(result["losses"], want, rtol=1e-4, atol=1e-6 * want[0])
    with Store.open(db) as store:
        stored = store.measurements()
    assert [m.id for m in stored] == [r["id"] for r in results] == [1, 2, 3]
    assert len({m.env["launch_id"] for m in stored}) == 1
    assert _ddlsim_ranks() == []


def test_one_strategy_side_by_side_is_a_plain_run() -> None:
    (result,) = compare_training(
        MLP, [Strategy()], RunOptions(world_size=2, iters=2, warmup=1, budget_s=0), rounds=2
    )
    # One strategy has no turns to settle from: rounds of kept steps back to back.
    assert len(result.samples_ms) == 4
    want = reference_losses(MLP, 5)
    assert_losses_match(result.losses, want, rtol=1e-4, atol=1e-6 * want[0])


@pytest.mark.parametrize(
    ("count", "kwargs", "options", "message"),
    [
        (0, {}, {}, r"0 strategies to compare; allowed: 1 to 16"),
        (MAX_SIDE_BY_SIDE + 1, {}, {}, r"17 strategies to compare; allowed: 1 to 16"),
        (2, {"rounds": 0}, {}, r"rounds\(0\) must be an integer >= 1"),
        (2, {"settle": -1}, {}, r"settle\(-1\) must be an integer >= 0"),
        (2, {}, {"trace": True}, "trace is for one strategy's run"),
    ],
)
def test_bad_comparisons_are_refused_before_any_rank_starts(
    count: int, kwargs: dict, options: dict, message: str
) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        compare_training(MLP, [Strategy()] * count, RunOptions(world_size=2, **options), **kwargs)
    assert _ddlsim_ranks() == []


def test_the_protocol_measures_until_the_interval_is_met() -> None:
    result = run_training(
        MLP, Strategy(), RunOptions(world_size=2, iters=5, ci_target=0.3, budget_s=60)
    )
    # A wide interval is met within a few turns; steps slowed in spells by the other tests'
    # ranks may still need the budget, which the rule then obeys (test_protocol holds the rule).
    assert result.stopped_by in ("interval", "budget")
    if result.stopped_by == "interval":
        assert result.ci_half_width <= 0.3
    low, high = result.ci95_ms
    assert low <= result.median_ms <= high
    assert len(result.samples_ms) >= 6 and len(result.samples_ms) % 5 == 0  # turns of 5


def test_the_protocol_stops_on_its_budget_when_the_interval_is_out_of_reach() -> None:
    result = run_training(
        MLP, Strategy(), RunOptions(world_size=2, iters=3, warmup=1, ci_target=1e-6, budget_s=2)
    )
    assert result.stopped_by == "budget"
    assert len(result.warmup_ms) >= 1
    assert result.env()["stopped_by"] == "budget"
    # one speed probe a round
    assert len(result.probe_ms) == result.rounds and min(result.probe_ms) > 0
    assert result.env()["probe_ms"] == statistics.median(result.probe_ms)


def test_four_ranks_share_the_cores_the_same_way_every_run() -> None:
    cores = sorted(os.sched_getaffinity(0))
    options = RunOptions(world_size=4, iters=1, warmup=0, budget_s=0)
    first, second = (run_training(MLP, Strategy(), options) for _ in range(2))
    assert first.rank_cores == second.rank_cores
    for rank in range(4):
        assert first.rank_cores[rank] == [cores[rank % len(cores)]]


def test_run_prints_its_median_interval_and_placement(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", MLP_JSON, "--world-size", "2", "--iters", "6", "--measure-budget", "0"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "95 % interval" in text and "rank 0 on core" in text and "stopped by minimum" in text


def _side_by_side_like_one_process(
    spec: ModelSpec, strategies: list[Strategy], *, rounds: int
) -> list[RunResult]:
    """``strategies`` side by side on 2 ranks, one kept step a turn, each checked to train step
    for step as one process does."""
    iters, warmup = 1, 1
    results = compare_training(
        spec,
        strategies,
        RunOptions(world_size=2, iters=iters, warmup=warmup, budget_s=0),
        rounds=rounds,
    )
    want = reference_losses(spec, warmup + rounds * (1 + iters))
    for result in results:
        assert_losses_match(result.losses, want, rtol=1e-4, atol=1e-6 * want[0])
    return results


def test_side_by_side_compiled_blocks_under_hooks_and_dear() -> None:
    # Two models of one class, their blocks compiled, one under DeAR (whose forward pre-hooks
    # wait for and apply each bucket's all-gather) and one under the executor's hooks: the
    # collection of cpu-v3 stopped on this pair (ELECTRA) with "modified by an inplace
    # operation" in the compiled backward. DeAR's waits for a compiled block now sit on the
    # block, outside the compiled code, so both train as they would alone.
    spec = ZOO["gpt2-tiny"].with_inputs(batch_size=4, seq_len=16)
    blocks = {"compiled": ["transformer.h.0", "transformer.h.1"]}
    strategies = [
        Strategy.from_dict({"tensor_fusion": {"implementation": "hooks"}, "op_fusion": blocks}),
        Strategy.from_dict({"tensor_fusion": {"dear": True}, "op_fusion": blocks}),
    ]
    results = _side_by_side_like_one_process(spec, strategies, rounds=2)
    assert all(result.applied["compiled"] == blocks["compiled"] for result in results)


def test_a_parameter_without_gradient_is_frozen_under_every_plan() -> None:
    # DINOv2's mask_token is used only when a mask is given: no gradient reaches it, so DDP's
    # reducer stopped ("did not receive grad") and DeAR looked up a bucket it is in none of.
    spec = ZOO["dinov2-tiny"].with_inputs(batch_size=4)
    assert capture_graph(spec).params_without_grad == ["dinov2.embeddings.mask_token"]
    strategies = [
        Strategy(),
        Strategy.from_dict({"tensor_fusion": {"dear": True, "bucket_cap_mb": 0.1}}),
        Strategy.from_dict({"parallel": {"fsdp": True}}),
    ]
    results = _side_by_side_like_one_process(spec, strategies, rounds=1)
    launched = {p for b in results[1].applied["buckets"] for p in b["params"]}
    assert "dinov2.embeddings.mask_token" not in launched


def test_memory_profile_reports_the_allocators_peak_of_live_tensors() -> None:
    """On the CPU each rank's peak comes from its allocator's reports (from before the build
    through two steps), not the resident set: at least the weights, gradients and AdamW's two
    moments of the mlp, and below the process's resident set (the interpreter, libraries)."""
    options = RunOptions(world_size=2, iters=1, warmup=1, max_warmup=1, budget_s=0)
    profiled = run_training(MLP, Strategy(), dataclasses.replace(options, memory_profile=True))
    plain = run_training(MLP, Strategy(), options)
    assert profiled.peak_memory_source == "allocator"
    assert plain.peak_memory_source == "resident_set"
    assert profiled.to_json()["peak_memory_source"] == "allocator"
    assert "peak_memory_source" not in plain.to_json()
    graph = capture_graph(MLP)
    weights = sum(p.nbytes for p in graph.params)
    for peak in profiled.peak_memory_bytes:
        assert 4 * weights <= peak < min(plain.peak_memory_bytes)
