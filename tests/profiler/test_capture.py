"""The captured graph against independent references: FlopCounterMode, the autograd engine."""

import json
from collections.abc import Callable
from typing import Any

import pytest
from torch.utils.flop_counter import FlopCounterMode

from ddlsim.data.errors import InvalidModelSpecError, InvalidOptionError, InvalidStrategyError
from ddlsim.data.graph.annotate import with_strategy
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.models import build_model, make_batch, training_loss
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy, TensorFusionPlan
from ddlsim.data.zoo import ZOO, resolve_model
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.profiler.fake import fake_model
from ddlsim.profiler.flops import register_missing_flop_formulas

GraphOf = Callable[[str], IterationGraph]

# Inline specs beyond the zoo: other classes, heads and a bare encoder (synthetic loss).
SPECS: dict[str, dict[str, Any]] = {
    "bert-model": {
        "class": "BertModel",
        "config": {
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 2,
            "intermediate_size": 128,
        },
        "inputs": {"batch_size": 2, "seq_len": 32},
    },
    "roberta-seqcls": {
        "class": "RobertaForSequenceClassification",
        "config": {
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 2,
            "intermediate_size": 128,
            "num_labels": 3,
        },
        "inputs": {"batch_size": 2, "seq_len": 32},
    },
    "gpt2-eager-attn": {
        "class": "GPT2LMHeadModel",
        "config": {"n_layer": 2, "n_embd": 64, "n_head": 2, "attn_implementation": "eager"},
        "inputs": {"batch_size": 2, "seq_len": 32},
    },
    "llama-eager-attn": {
        "class": "LlamaForCausalLM",
        "config": {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "vocab_size": 256,
            "attn_implementation": "eager",
        },
        "inputs": {"batch_size": 2, "seq_len": 32},
    },
}


def _reference_flops(spec: ModelSpec) -> tuple[int, int]:
    """(forward, forward+backward) FLOPs counted by FlopCounterMode on a fake-tensor run."""
    register_missing_flop_formulas()
    fake = fake_model(spec)
    with fake.mode:
        with FlopCounterMode(display=False) as forward_counter:
            loss = training_loss(fake.model, fake.batch)
        with FlopCounterMode(display=False) as backward_counter:
            loss.backward()
    forward = forward_counter.get_total_flops()
    return forward, forward + backward_counter.get_total_flops()


def _check_flops(graph: IterationGraph) -> None:
    forward, total = _reference_flops(graph.model)
    ours_forward = graph.flops_of("forward")
    ours_total = ours_forward + graph.flops_of("backward")
    assert total > 0
    assert ours_total == pytest.approx(total, rel=0.01)
    assert ours_forward == pytest.approx(forward, rel=0.01)


@pytest.mark.parametrize("name", list(ZOO))
def test_flops_agree_with_flop_counter_on_zoo(name: str, zoo_graph: GraphOf) -> None:
    _check_flops(zoo_graph(name))


@pytest.mark.parametrize("name", list(SPECS))
def test_flops_agree_with_flop_counter_on_specs(name: str) -> None:
    _check_flops(capture_graph(resolve_model(json.dumps(SPECS[name]))))


@pytest.mark.parametrize("name", ["mlp", "bert-tiny", "gpt2-tiny", "resnet-18"])
def test_flops_agree_with_flop_counter_on_real_tensors(name: str) -> None:
    """Independent of the fake-tensor setup: a real eager iteration under FlopCounterMode."""
    register_missing_flop_formulas()
    spec = ZOO[name].with_inputs(**REAL[name])
    model = build_model(spec)
    batch = make_batch(spec, model)
    with FlopCounterMode(display=False) as counter:
        training_loss(model, batch).backward()
    graph = capture_graph(spec)
    total = graph.flops_of("forward") + graph.flops_of("backward")
    assert total == pytest.approx(counter.get_total_flops(), rel=0.01)


def test_cpu_attention_counts_like_the_math_path() -> None:
    """The registered CPU flash-attention formula equals the matmuls of eager attention
    forward; its backward also recomputes the attention scores, so it counts more."""
    sdpa = dict(SPECS["llama-eager-attn"])
    sdpa["config"] = {**sdpa["config"], "attn_implementation": "sdpa"}
    eager_graph = capture_graph(resolve_model(json.dumps(SPECS["llama-eager-attn"])))
    sdpa_graph = capture_graph(resolve_model(json.dumps(sdpa)))
    assert any("flash_attention_for_cpu" in n.op for n in sdpa_graph.nodes)
    assert not any("flash_attention_for_cpu" in n.op for n in eager_graph.nodes)
    assert sdpa_graph.flops_of("forward") == eager_graph.flops_of("forward")
    assert sdpa_graph.flops_of("backward") > eager_graph.flops_of("backward")


# Small enough to run for real on the CPU; vision inputs shrunk.
REAL = {
    "mlp": {},
    "vgg-mini": {"batch_size": 2},
    "gpt2-tiny": {"batch_size": 2, "seq_len": 16},
    "bert-tiny": {"batch_size": 2, "seq_len": 16},
    "vit-tiny": {"batch_size": 2, "image_size": 32},
    "resnet-18": {"batch_size": 2, "image_size": 64},
    "llama-tiny": {"batch_size": 2, "seq_len": 16},
    "t5-tiny": {"batch_size": 2, "seq_len": 16},
}


@pytest.mark.parametrize("name", list(REAL))
def test_grad_ready_order_matches_autograd(name: str) -> None:
    spec = ZOO[name].with_inputs(**REAL[name])
    graph = capture_graph(spec)
    model = build_model(spec)
    order: list[str] = []
    names = {id(p): n for n, p in model.named_parameters()}
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(lambda p: order.append(names[id(p)]))
    training_loss(model, make_batch(spec, model)).backward()
    assert graph.grad_ready_order == order
    assert len(order) == len(graph.params)


def test_deterministic(zoo_graph: GraphOf) -> None:
    again = capture_graph(ZOO["gpt2-tiny"])
    first = zoo_graph("gpt2-tiny")
    assert again.graph_hash == first.graph_hash
    assert again.to_json() == first.to_json()
    other = capture_graph(ZOO["gpt2-tiny"].with_inputs(batch_size=8))
    assert other.graph_hash != first.graph_hash


@pytest.mark.parametrize("name", ["gpt2-tiny", "resnet-18", "t5-tiny"])
def test_json_round_trip(name: str, zoo_graph: GraphOf) -> None:
    graph = zoo_graph(name)
    again = IterationGraph.from_json(graph.to_json())
    assert again == graph
    assert again.graph_hash == graph.graph_hash


@pytest.mark.parametrize("name", ["gpt2-tiny", "bert-tiny", "resnet-18", "t5-tiny", "vgg-mini"])
def test_structure(name: str, zoo_graph: GraphOf) -> None:
    graph = zoo_graph(name)
    preds = graph.predecessors()
    params = {p.name for p in graph.params}
    ready = graph.nodes_of("grad_ready")
    assert sorted(str(n.param) for n in ready) == sorted(params)  # one node per gradient
    for node in ready:
        assert preds[node.id], "a gradient must depend on the op that produced it"
        assert all(graph.nodes[p].phase == "backward" for p in preds[node.id])
    # The collectives partition the gradients and wait for all of theirs.
    comm = graph.nodes_of("comm")
    assert sorted(p for n in comm for p in n.params) == sorted(params)
    ready_id = {n.param: n.id for n in ready}
    for node in comm:
        assert set(preds[node.id]) == {ready_id[p] for p in node.params}
    # One optimizer step per parameter, after the collective carrying its gradient.
    steps = graph.nodes_of("optimizer")
    assert sorted(str(n.param) for n in steps) == sorted(params)
    for node in steps:
        (source,) = preds[node.id]
        assert node.param in graph.nodes[source].params
    # Phases run in order: forward, then backward (with collectives), then the optimizer.
    phases = [n.phase for n in graph.nodes]
    last_forward = max(i for i, p in enumerate(phases) if p == "forward")
    first_backward = min(i for i, p in enumerate(phases) if p == "backward")
    assert last_forward < first_backward
    assert min(n.id for n in steps) > max(n.id for n in graph.nodes if n.phase == "backward")


@pytest.mark.parametrize("name", ["gpt2-tiny", "bert-tiny", "resnet-18", "llama-tiny"])
def test_flops_are_attributed_to_modules(name: str, zoo_graph: GraphOf) -> None:
    graph = zoo_graph(name)
    compute = graph.nodes_of("compute")
    total = sum(n.flops for n in compute)
    named = sum(n.flops for n in compute if n.module)
    assert named / total > 0.99
    # Backward matmuls point at the forward op they differentiate, in the same module.
    for node in compute:
        if node.phase == "backward" and node.forward_id is not None:
            forward = graph.nodes[node.forward_id]
            assert forward.phase == "forward"
            assert forward.module == node.module


def test_tied_weights_counted_once(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    names = [p.name for p in graph.params]
    assert "transformer.wte.weight" in names
    assert "lm_head.weight" not in names  # tied to the token embedding
    assert graph.num_params == sum(p.numel for p in graph.params)


def test_node_costs_on_a_linear_layer(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("mlp")
    spec = ZOO["mlp"]
    first = next(n for n in graph.nodes if n.op == "aten.addmm.default" and n.module == "body.0")
    batch, width = spec.inputs.batch_size, 1024
    hidden = 2048
    assert first.flops == 2 * batch * width * hidden
    assert first.outputs[0].shape == (batch, hidden)
    # reads bias, input and weight; writes the output
    assert first.bytes_read == 4 * (hidden + batch * width + width * hidden)
    assert first.bytes_written == 4 * batch * hidden
    views = [n for n in graph.nodes if n.is_view]
    assert views and all(n.bytes_read == n.bytes_written == 0 for n in views)


def test_ddp_default_buckets(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    comm = graph.nodes_of("comm")
    assert [n.op for n in comm] == ["all_reduce"] * len(comm)
    sizes = [n.grad_bytes for n in comm]
    assert sizes[0] >= 1024 * 1024  # DDP's small first bucket, then 25 MiB caps
    assert sum(sizes) == graph.grad_bytes


def test_explicit_buckets_and_dear(zoo_graph: GraphOf) -> None:
    order = zoo_graph("mlp").grad_ready_order
    buckets = (tuple(order[0::2]), tuple(order[1::2]))  # non-contiguous on purpose
    strategy = Strategy(tensor_fusion=TensorFusionPlan(buckets=buckets, dear=True))
    graph = capture_graph(ZOO["mlp"], CaptureOptions(strategy=strategy))
    comm = graph.nodes_of("comm")
    assert [n.op for n in comm] == ["reduce_scatter", "reduce_scatter", "all_gather", "all_gather"]
    assert {frozenset(n.params) for n in comm} == {frozenset(b) for b in buckets}
    preds = graph.predecessors()
    for gather in comm[2:]:
        (scatter,) = preds[gather.id]
        assert graph.nodes[scatter].op == "reduce_scatter"
        assert graph.nodes[scatter].bucket == gather.bucket
    assert graph.strategy == strategy


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"tensor_fusion": {"bucket_cap_mb": 0.1, "dear": True}},
        {"tensor_fusion": {"bucket_caps_mb": [65536], "implementation": "hooks"}},
        {"parallel": {"fsdp": True}},
    ],
)
@pytest.mark.parametrize("name", ["gpt2-tiny", "mlp"])
def test_with_strategy_equals_a_new_capture(
    name: str, raw: dict[str, Any], zoo_graph: GraphOf
) -> None:
    strategy = Strategy.from_dict(raw)
    captured = capture_graph(ZOO[name], CaptureOptions(strategy=strategy))
    moved = with_strategy(zoo_graph(name), strategy)
    assert moved.graph_hash == captured.graph_hash
    assert moved.strategy == strategy
    # and back again: the default strategy's graph from the moved one
    assert with_strategy(moved, Strategy()).graph_hash == zoo_graph(name).graph_hash


def test_with_strategy_refuses_bad_buckets(zoo_graph: GraphOf) -> None:
    strategy = Strategy(tensor_fusion=TensorFusionPlan(buckets=(("body.0.weight",),)))
    with pytest.raises(InvalidStrategyError, match="miss 5 gradient"):
        with_strategy(zoo_graph("mlp"), strategy)


def test_bad_buckets_are_refused() -> None:
    strategy = Strategy(tensor_fusion=TensorFusionPlan(buckets=(("body.0.weight",),)))
    with pytest.raises(InvalidStrategyError, match="miss 5 gradient"):
        capture_graph(ZOO["mlp"], CaptureOptions(strategy=strategy))


def test_model_failure_is_a_spec_error() -> None:
    spec = ZOO["vgg-mini"].with_inputs(image_size=8)  # five 2x2 pools do not fit in 8 pixels
    with pytest.raises(InvalidModelSpecError, match=r"vgg-mini \(VGG\) failed on inputs"):
        capture_graph(spec)


def test_in_place_ops_count_their_output_once(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    compute = graph.nodes_of("compute")
    in_place = [n for n in compute if n.op.split(".")[1].endswith("_") and n.outputs]
    assert in_place, "dropout's bernoulli_ writes in place"
    for node in in_place:
        (out,) = node.outputs
        numel = 1
        for dim in out.shape:
            numel *= dim
        assert node.bytes_written == numel * (8 if out.dtype in ("int64", "float64") else 4)


def test_bare_encoder_trains_every_parameter() -> None:
    graph = capture_graph(resolve_model(json.dumps(SPECS["bert-model"])))
    assert graph.summary()["params_without_grad"] == []  # the pooler too
    assert len(graph.grad_ready_order) == len(graph.params)


def test_large_batches_cost_no_memory() -> None:
    graph = capture_graph(ZOO["vit-tiny"].with_inputs(batch_size=4096))
    assert graph.model.inputs.batch_size == 4096
    assert graph.flops_of("forward") > 0


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        ({"op_fusion": {"compiled": ["body.9"]}}, r"op_fusion.compiled\[0\] names 'body.9'"),
        (
            {"parallel": {"fsdp": True, "fsdp_groups": [["body.0"], ["hed"]]}},
            r"fsdp_groups\[1\]\[0\] names 'hed'.*did you mean head",
        ),
    ],
)
def test_strategy_module_paths_are_checked(strategy: dict, message: str) -> None:
    with pytest.raises(InvalidStrategyError, match=message):
        capture_graph(ZOO["mlp"], CaptureOptions(strategy=Strategy.from_dict(strategy)))


def test_optimizer_choice(zoo_graph: GraphOf) -> None:
    adamw = zoo_graph("mlp")
    sgd = capture_graph(ZOO["mlp"], CaptureOptions(optimizer="sgd"))
    assert {n.op for n in sgd.nodes_of("optimizer")} == {"optimizer.sgd"}
    assert adamw.flops_of("optimizer") > sgd.flops_of("optimizer") > 0
    with pytest.raises(InvalidOptionError, match="optimizer 'lamb' is not supported"):
        CaptureOptions(optimizer="lamb")  # type: ignore[arg-type]
