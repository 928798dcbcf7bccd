"""``ddlsim predict``: profiles once, replays, stores the prediction."""

import json
from pathlib import Path

import pytest

from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import ZOO
from ddlsim.service.cli import main
from ddlsim.workflows.validate import CANDIDATES, strategies_for
from tests.data.records import collective_profile


def _predict(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    command = ["predict", "mlp", "--batch-size", "16", "--profile-iters", "2", *args]
    if "--simulator" not in args:
        command += ["--simulator", "replay"]
    assert main(command) == 0
    return json.loads(capsys.readouterr().out)


def test_predict_profiles_once_then_reuses_the_profile(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "replay.json"
    first = _predict(capsys, "--world-size", "2", "--bandwidth", "1gbit", "--json")
    assert first["kernel_profile"]["profiled_now"] is True
    assert first["rank_batch_size"] == 8
    assert first["simulator_version"] == "replay-3"
    parts = first["breakdown"]
    assert first["iteration_time_ms"] == pytest.approx(
        parts["compute_ms"] + parts["exposed_comm_ms"]
    )
    assert parts["exposed_comm_ms"] > 0  # 1 Gbit/s with no overlap left at the end
    dear = json.dumps({"tensor_fusion": {"bucket_cap_mb": 1, "dear": True}})
    second = _predict(
        capsys,
        "--world-size",
        "2",
        "--bandwidth",
        "1gbit",
        "--strategy",
        dear,
        "--trace",
        str(trace),
        "--json",
    )
    assert second["kernel_profile"] == {"id": first["kernel_profile"]["id"], "profiled_now": False}
    # no fit of the link in the store: the shipped dataset's (DeAR's ring from its send/recv)
    assert "sendrecv fit of the shipped dataset" in second["collective_models"]["reduce_scatter"]
    names = {e["name"] for e in json.loads(trace.read_text())["traceEvents"]}
    assert any(name.startswith("all_gather") for name in names)
    with Store.open() as store:
        stored = store.predictions()
    assert [p.iteration_time_ms for p in stored] == [
        first["iteration_time_ms"],
        second["iteration_time_ms"],
    ]


def test_a_link_the_store_has_no_fit_of_is_priced_from_the_shipped_dataset(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("--world-size", "2", "--bandwidth", "1gbit", "--json")
    shipped = _predict(capsys, *args)
    sources = shipped["collective_models"]
    assert all("of the shipped dataset" in source for source in sources.values()), sources
    # A fit the store has of the link, even of one collective, replaces every shipped one.
    with Store.open() as store:
        fit = collective_profile(world_size=2, alpha_us=5000.0, busbw_gbps=0.5)
        stored_id = store.save_collective_profile(profile=fit)
    own = _predict(capsys, *args)
    assert own["collective_models"]["all_reduce"] == f"all_reduce profile {stored_id}"
    assert all("shipped" not in source for source in own["collective_models"].values())
    # a higher latency and a lower rate than the shipped fit: the same plan is slower
    assert own["iteration_time_ms"] > shipped["iteration_time_ms"]
    # A link the shipped dataset has no fit of either: its nominal rate, and the payload says so.
    other = _predict(capsys, "--world-size", "2", "--bandwidth", "300mbit", "--json")
    assert other["collective_models"]["all_reduce"].startswith("line rate 0.3 Gb/s")


def _predict_json(capsys: pytest.CaptureFixture[str], args: list[str]) -> dict:
    assert main([*args, "--simulator", "replay", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_one_rank_predicts_pure_compute(capsys: pytest.CaptureFixture[str]) -> None:
    out = _predict(capsys, "--json")
    assert out["breakdown"]["exposed_comm_ms"] == pytest.approx(0.0)


def test_bad_strategy_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["predict", "mlp", "--world-size", "2", "--strategy", '{"parallel": {"dp": 3}}'])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dp(3) * tp(1) * pp(1) != world_size(2)" in err


def test_unsupported_plan_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["predict", "mlp", "--world-size", "2", "--strategy", '{"parallel": {"tp": 2}}'])
    assert code == 2
    refused = capsys.readouterr().err
    assert "mlp (MLP) has no tensor-parallel plan, so tp(2) cannot apply" in refused


def test_tensor_parallel_collectives_are_exposed(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["predict", "gpt2-tiny", "--world-size", "2", "--bandwidth", "1gbit"]
    args += ["--profile-iters", "2", "--simulator", "replay", "--json"]
    assert main([*args, "--strategy", '{"parallel": {"tp": 2}}']) == 0
    out = json.loads(capsys.readouterr().out)
    parts = out["breakdown"]
    assert out["rank_batch_size"] == 4  # one data-parallel rank: the whole batch
    assert parts["exposed_comm_ms"] == pytest.approx(parts["comm_ms"])  # blocking
    assert out["iteration_time_ms"] == pytest.approx(
        parts["compute_ms"] + parts["exposed_comm_ms"]
    )


def test_per_layer_placements_are_predicted_and_checked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["predict", "gpt2-tiny", "--world-size", "2", "--bandwidth", "1gbit"]
    args += ["--profile-iters", "2", "--simulator", "replay", "--json"]
    placed = {"parallel": {"tp": 2, "layers": ["batch", "tp"], "vocab": "replicate"}}
    assert main([*args, "--strategy", json.dumps(placed)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy"]["parallel"]["layers"] == ["batch", "tp"]
    assert out["breakdown"]["comm_ms"] > 0  # the boxing and tp block's collectives
    too_many = {"parallel": {"tp": 2, "layers": ["batch", "tp", "tp"]}}
    assert main([*args, "--strategy", json.dumps(too_many)]) == 2
    err = capsys.readouterr().err
    assert "parallel.layers has 3 entries but gpt2-tiny has 2 blocks" in err
    assert err.count("\n") == 1


def test_fsdp_gathers_and_scatters(capsys: pytest.CaptureFixture[str]) -> None:
    def run(*extra: str) -> dict:
        args = ["predict", "gpt2-tiny", "--world-size", "2", "--bandwidth", "1gbit"]
        assert (
            main([*args, "--profile-iters", "2", "--simulator", "replay", *extra, "--json"]) == 0
        )
        return json.loads(capsys.readouterr().out)

    ddp = run()
    fsdp = run("--strategy", '{"parallel": {"fsdp": true}}')
    # the blocks' parameters are gathered before forward and again before backward, and
    # their gradients reduce-scattered: 1.5x the bytes of an all-reduce (the root, with the
    # embeddings, is gathered once: 1x)
    assert fsdp["breakdown"]["comm_ms"] > ddp["breakdown"]["comm_ms"]
    parts = fsdp["breakdown"]
    assert fsdp["iteration_time_ms"] == pytest.approx(
        parts["compute_ms"] + parts["exposed_comm_ms"]
    )
    # Both predictions price the one kernel profile the first call stored, so FSDP2's runtime
    # (copies, hooks, DTensor parameters in the optimizer: simulator.runtime) shows as compute
    # on top of the same kernels, whatever the live profile's noise. (Whether the whole
    # iteration comes out slower than DDP's depends on how much of the extra communication the
    # profiled compute hides, so it is not asserted.)
    assert fsdp["breakdown"]["compute_ms"] > ddp["breakdown"]["compute_ms"]


def test_validate_runs_predicts_and_scores(capsys: pytest.CaptureFixture[str]) -> None:
    # Fits of the unshaped link are stored first, so the command does not profile the link.
    with Store.open() as store:
        for collective in ("all_reduce", "sendrecv"):
            fit = collective_profile(
                collective=collective,
                world_size=2,
                bandwidth="none",
                alpha_us=100.0,
                busbw_gbps=5.0,
            )
            store.save_collective_profile(profile=fit)
    args = ["simulator", "validate", "mlp", "--batch-size", "16", "--bandwidth", "none"]
    args += ["--strategies", "2", "--iters", "2", "--warmup", "1", "--profile-iters", "2"]
    args += ["--measure-budget", "0"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [row["strategy"] for row in out["rows"]] == [
        Strategy().to_dict(),
        Strategy.from_dict(CANDIDATES[1]).to_dict(),
    ]
    assert all(row["predicted_ms"] > 0 and row["measured_ms"] > 0 for row in out["rows"])
    assert out["mape"] >= 0 and -1 <= out["kendall_tau"] <= 1
    assert out["noise_mape"] is not None and out["noise_mape"] >= 0
    # one launch, side by side: the speed-up of the second strategy over DDP's defaults
    assert out["side_by_side"] is True
    (first, second) = out["rows"]
    measured = first["measured_ms"] / second["measured_ms"]
    predicted = first["predicted_ms"] / second["predicted_ms"]
    gain = out["speedup_error"]
    assert gain["runs"] == 1 and gain["median"] == pytest.approx(abs(predicted / measured - 1))
    with Store.open() as store:
        measurements = store.measurements()
        assert len(measurements) == 3 and len(store.predictions()) == 2
        assert all(m.env["side_by_side"] == 3 for m in measurements)
        assert len(store.collective_profiles()) == 2  # nothing profiled again


def test_pipeline_plans_have_bubbles(capsys: pytest.CaptureFixture[str]) -> None:
    plan = {"parallel": {"pp": 2, "micro_batches": 2, "pp_schedule": "gpipe"}}
    args = ["--world-size", "2", "--bandwidth", "1gbit", "--strategy", json.dumps(plan), "--json"]
    out = _predict(capsys, *args)
    assert out["rank_batch_size"] == 8  # 16 over one data-parallel rank and 2 micro-batches
    parts = out["breakdown"]
    assert parts["bubble_ms"] > 0
    assert out["iteration_time_ms"] == pytest.approx(
        parts["compute_ms"] + parts["exposed_comm_ms"] + parts["bubble_ms"]
    )
    # interleaved: two stages a rank (the mlp's four blocks), the same work in all
    plan["parallel"]["pp_schedule"] = "interleaved_1f1b"
    interleaved = _predict(capsys, *args[:-2], json.dumps(plan), "--json")
    steps = interleaved["breakdown"]
    assert interleaved["iteration_time_ms"] == pytest.approx(
        steps["compute_ms"] + steps["exposed_comm_ms"] + steps["bubble_ms"]
    )
    assert steps["bubble_ms"] >= 0 and steps["compute_ms"] > 0
    # a tensor-parallel first stage: its collectives and the resharding are communication
    staged = {"parallel": {"pp": 2, "micro_batches": 2, "stages": ["tp", "batch"]}}
    args_staged = ["predict", "gpt2-tiny", "--world-size", "4", "--profile-iters", "2"]
    out_staged = _predict_json(capsys, [*args_staged, "--strategy", json.dumps(staged)])
    out_plain = _predict_json(
        capsys,
        [*args_staged, "--strategy", json.dumps({"parallel": {"pp": 2, "micro_batches": 2}})],
    )
    assert out_staged["breakdown"]["comm_ms"] != out_plain["breakdown"]["comm_ms"]
    assert out_staged["iteration_time_ms"] > 0
    # FSDP beside a pipeline with several stages a rank is not replayed: refused with the
    # reason (one stage a rank is: tests/simulator/test_pipeline.py)
    plan = {
        "parallel": {
            "pp": 2,
            "fsdp": True,
            "micro_batches": 2,
            "pp_schedule": "interleaved_1f1b",
            "virtual_stages": 2,
        }
    }
    refused = ["predict", "mlp", "--world-size", "2", "--strategy", json.dumps(plan)]
    code = main([*refused, "--simulator", "replay"])
    assert code == 2
    assert "fsdp" in capsys.readouterr().err


def test_validate_draws_parallel_plans_the_model_supports() -> None:
    gpt2 = strategies_for(ZOO["gpt2-tiny"].with_inputs(batch_size=8), 2, len(CANDIDATES))
    kinds = {(s.parallel.fsdp, s.parallel.tp, s.parallel.pp) for s in gpt2}
    assert {(True, 1, 1), (False, 2, 1), (False, 1, 2)} <= kinds
    assert gpt2[0] == Strategy()
    mixed = [s for s in gpt2 if s.parallel.layers]
    assert [s.parallel.layers for s in mixed] == [("tp", "batch")]  # per model's blocks
    assert mixed[0].parallel.vocab == "replicate"
    # batch blocks need a micro-batch tp divides: on 4 ranks with 4 samples dp is 2, and the
    # tensor-parallel ranks would share 2 samples, which they can; with 2 samples, 1
    assert any(
        s.parallel.layers
        for s in strategies_for(ZOO["gpt2-tiny"].with_inputs(batch_size=4), 4, len(CANDIDATES))
    )
    assert not any(
        s.parallel.layers
        for s in strategies_for(ZOO["gpt2-tiny"].with_inputs(batch_size=2), 4, len(CANDIDATES))
    )
    mlp = strategies_for(ZOO["mlp"].with_inputs(batch_size=8), 2, len(CANDIDATES))
    assert all(s.parallel.tp == 1 for s in mlp)  # the mlp has no tensor-parallel plan
    assert any(s.parallel.fsdp for s in mlp)
    # a plan needing more ranks than there are is left out, not an error
    assert all(s.parallel.tp * s.parallel.pp == 1 for s in strategies_for(ZOO["mlp"], 1, 20))


def test_an_emulated_cluster_spec_is_the_world_size_and_link(
    capsys: pytest.CaptureFixture[str],
) -> None:
    by_flags = _predict(capsys, "--world-size", "2", "--bandwidth", "1gbit", "--json")
    spec = json.dumps({"world_size": 2, "nodes": 2, "inter_node": {"bandwidth_gbps": "1gbit"}})
    by_spec = _predict(capsys, "--cluster", spec, "--json")
    assert by_spec["iteration_time_ms"] == by_flags["iteration_time_ms"]
    assert by_spec["world_size"] == 2
    # Ranks sharing a node are not what this machine emulates; a contradiction is named.
    shared = json.dumps({"world_size": 2, "nodes": 1})
    assert main(["predict", "mlp", "--cluster", shared, "--simulator", "replay"]) == 2
    assert "2 ranks a node" in capsys.readouterr().err
    assert main(["predict", "mlp", "--cluster", spec, "--world-size", "4"]) == 2
    assert "--world-size 4 contradicts --cluster's world_size 2" in capsys.readouterr().err


def test_an_expert_parallel_plan_is_replayed_with_its_exchanges(
    capsys: pytest.CaptureFixture[str],
) -> None:
    strategy = json.dumps({"parallel": {"ep": 2}})
    args = ["predict", "mixtral-tiny", "--world-size", "2", "--strategy", strategy, "--json"]
    assert main(args) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["predictor"] == "replay"  # no learned model has seen expert parallelism
    assert "all_to_all over ep 2" in payload["collective_models"]
    assert "all_reduce over edp 1" not in payload["collective_models"]  # ep == dp: none
    with Store.open() as store:
        assert len(store.predictions()) == 1


@pytest.mark.parametrize(
    ("model", "parallel", "named"),
    [
        ("mixtral-tiny", {"ep": 2, "fsdp": True}, "parallel.ep beside fsdp"),
        ("llama-tiny", {"cp": 2, "cp_comm": "all_gather"}, "parallel.cp"),
        ("llama-tiny", {"zero": 1}, "parallel.zero"),
    ],
)
def test_plans_the_replay_does_not_schedule_are_refused_not_priced_as_ddp(
    capsys: pytest.CaptureFixture[str], model: str, parallel: dict, named: str
) -> None:
    strategy = json.dumps({"parallel": parallel})
    args = ["predict", model, "--world-size", "2", "--strategy", strategy, "--simulator", "replay"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"the replay does not schedule {named} yet" in err
    with Store.open() as store:
        assert store.predictions() == []
