"""Per-layer placements over the tensor-parallel ranks (``parallel.layers``, ``parallel.vocab``)
train exactly like one process on the global batch; placements a model cannot take are refused
before any rank starts, naming the block and the value."""

import re

import pytest

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.plan import check_strategy
from ddlsim.plans.feasibility import model_supports
from ddlsim.plans.tp_plans import check_layouts
from ddlsim.profiler.capture import capture_graph
from tests.executor.harness import assert_matches_reference
from tests.executor.test_tensor_parallel import SPECS, _run

# (model, layers, vocab): every layout beside every other, on each family's blocks.
MIXED = [
    ("gpt2-tiny", ["batch", "tp"], "replicate"),
    ("gpt2-tiny", ["replicate", "batch"], "split"),
    ("llama-tiny", ["tp", "batch"], "split"),
    ("bert-tiny", ["batch", "replicate"], "split"),
    ("t5-tiny", ["batch", "batch", "tp", "tp"], "split"),
    ("vit-4-heads", ["batch", "tp"], "split"),
]


@pytest.mark.parametrize(("name", "layers", "vocab"), MIXED)
def test_mixed_layouts_match_single_process(name: str, layers: list[str], vocab: str) -> None:
    spec = SPECS[name]
    results = _run(spec, 2, {"tp": 2, "layers": layers, "vocab": vocab})
    assert_matches_reference(results, spec)
    applied = results[0].applied
    assert applied["vocab"] == vocab
    blocks = check_layouts(
        spec,
        Strategy.from_dict({"parallel": {"tp": 2, "layers": layers}}).parallel,
        rank_batch=None,
    )
    split_blocks = [block for block, layout in zip(blocks, layers, strict=True) if layout == "tp"]
    # Only the tp blocks (and the vocabulary modules when split) were given a style.
    for path, style in applied["styles"].items():
        inside = any(path.startswith(f"{block}.") for block in split_blocks)
        assert style.startswith("vocab_") or inside, path
    assert all(any(p.startswith(f"{b}.") for p in applied["styles"]) for b in split_blocks)
    vocab_styles = [style for style in applied["styles"].values() if style.startswith("vocab_")]
    if vocab == "replicate":
        assert not vocab_styles
    elif name != "vit-4-heads":  # ViT has no vocabulary
        assert vocab_styles
    if "batch" in layers:
        assert "all_gather:tp" in applied["collectives"]


def test_every_block_batch_with_data_parallelism_matches_single_process() -> None:
    spec = SPECS["gpt2-tiny"]
    results = _run(spec, 4, {"dp": 2, "tp": 2, "layers": ["batch", "batch"], "vocab": "replicate"})
    assert_matches_reference(results[:1], spec)
    applied = results[0].applied
    assert applied["styles"] == {}
    assert applied["collectives"] == ["all_reduce:tp", "all_gather:tp", "all_reduce:dp"]


def _graph(name: str) -> IterationGraph:
    return capture_graph(ZOO[name])


def test_layers_must_name_every_block() -> None:
    strategy = Strategy.from_dict({"parallel": {"tp": 2, "layers": ["tp", "batch", "tp"]}})
    with pytest.raises(InvalidStrategyError, match=r"3 entries but gpt2-tiny has 2 blocks"):
        check_strategy(ZOO["gpt2-tiny"], strategy, 2, _graph("gpt2-tiny"))
    assert not model_supports(ZOO["gpt2-tiny"], strategy)


def test_batch_layout_needs_a_micro_batch_tp_divides() -> None:
    spec = ZOO["gpt2-tiny"].with_inputs(batch_size=2)
    strategy = Strategy.from_dict({"parallel": {"tp": 2, "layers": ["tp", "batch"]}})
    # On 4 ranks dp is 2: one sample a rank, which two tensor-parallel ranks cannot share.
    message = "parallel.layers[1] is 'batch' (transformer.h.1): a micro-batch of 1 samples"
    with pytest.raises(InvalidStrategyError, match=re.escape(message)):
        check_strategy(spec, strategy, 4, _graph("gpt2-tiny"))
    assert model_supports(spec, strategy)  # the model itself can take it


def test_a_stack_sharing_its_position_bias_takes_one_layout() -> None:
    strategy = Strategy.from_dict({"parallel": {"tp": 2, "layers": ["tp", "batch", "tp", "tp"]}})
    with pytest.raises(InvalidStrategyError, match=r"encoder\.block share the position bias"):
        check_strategy(ZOO["t5-tiny"], strategy, 2, _graph("t5-tiny"))


@pytest.mark.parametrize(
    ("parallel", "message"),
    [
        ({"tp": 2, "layers": ["tp", "rows"]}, "parallel.layers[1] 'rows' is not supported"),
        ({"tp": 1, "layers": ["batch"]}, "they need tp > 1, got tp(1)"),
        ({"tp": 2, "vocab": "columns"}, "parallel.vocab 'columns' is not supported"),
        ({"tp": 2, "pp": 2, "layers": ["tp"]}, "combines with data parallelism only"),
    ],
)
def test_bad_layouts_are_refused_by_name(parallel: dict, message: str) -> None:
    with pytest.raises(InvalidStrategyError, match=re.escape(message)):
        Strategy.from_dict({"parallel": parallel})


def test_uniform_strategies_keep_their_json() -> None:
    # Strategies stored before per-layer placements existed keep their keys.
    assert "layers" not in Strategy.from_dict({"parallel": {"tp": 2}}).to_dict()["parallel"]
    mixed = Strategy.from_dict({"parallel": {"tp": 2, "layers": ["tp", "batch"]}})
    assert Strategy.from_dict(mixed.to_dict()) == mixed
    assert mixed.describe() == "tp2, layers tp,batch vocab split"
