"""Fusion profiles: blocks timed alone eager and compiled, stored from the command line and from
batch files; bad blocks refused by name."""

import json
from pathlib import Path

import pytest

from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.store import Store
from ddlsim.data.zoo import ZOO
from ddlsim.profiler.capture import capture_graph
from ddlsim.profiler.fusion import _block_inputs, profile_fusion
from ddlsim.service.cli import main

MLP = ZOO["mlp"].with_inputs(batch_size=8)


def test_blocks_are_timed_eager_and_compiled() -> None:
    graph, profile = profile_fusion(MLP, ["body.0", "head"], iters=2, warmup=1)
    assert graph.graph_hash == capture_graph(MLP).graph_hash == profile.graph_hash
    assert [b.block for b in profile.blocks] == ["body.0", "head"]
    for block in profile.blocks:
        assert block.eager_ms > 0 and block.compiled_ms > 0 and block.compile_s > 0
    assert profile.backend == "inductor" and profile.env["threads"] == "1"
    assert json.loads(json.dumps(profile.to_json()))["blocks"][0]["speedup"] > 0


def test_block_inputs_are_what_the_block_receives() -> None:
    from ddlsim.data.models import build_model, make_batch

    model = build_model(MLP)
    modules = {"body.1": model.get_submodule("body.1")}
    ((x,), kwargs) = _block_inputs(model, modules, make_batch(MLP, model))["body.1"]
    assert kwargs == {} and x.requires_grad and x.is_leaf
    assert x.shape[0] == MLP.inputs.batch_size


@pytest.mark.parametrize(
    ("blocks", "error", "message"),
    [
        (["body.9"], InvalidStrategyError, r"blocks\[0\] 'body.9' is not a module of mlp"),
        (["body.0", "body.0"], InvalidStrategyError, "repeats a block"),
        ([], InvalidOptionError, "no repeated blocks"),
    ],
)
def test_bad_blocks_are_refused(blocks: list[str], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        profile_fusion(MLP, blocks, iters=1)
    with pytest.raises(InvalidOptionError, match=r"iters\(0\)"):
        profile_fusion(MLP, iters=0)


def test_command_and_batch_store_the_profile(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["profile", "fusion", "mlp", "--blocks", "body.1", "--iters", "1", "--batch-size"]
    code = main([*args, "8", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert [b["block"] for b in out["blocks"]] == ["body.1"]
    batch = tmp_path / "batch.yaml"
    batch.write_text(
        "jobs:\n  - {kind: fusion, model: mlp, batch_size: 8, blocks: [body.2], iters: 1}\n"
    )
    assert main(["profile", "batch", str(batch), "--json"]) == 0
    capsys.readouterr()
    with Store.open() as store:
        stored = store.fusion_profiles()
    assert [[b["block"] for b in p.blocks] for p in stored] == [["body.1"], ["body.2"]]
    assert stored[0].graph_hash == out["graph_hash"] == stored[1].graph_hash
    assert stored[0].blocks[0]["compiled_ms"] == out["blocks"][0]["compiled_ms"]
    code = main(["profile", "fusion", "mlp", "--blocks", "nope"])
    assert code == 2
    assert "'nope' is not a module of mlp" in capsys.readouterr().err
