import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ddlsim.data.errors import InvalidModelSpecError, UnknownModelError
from ddlsim.data.models import (
    batch_fields,
    build_model,
    check_model_spec,
    count_parameters,
    make_batch,
)
from ddlsim.data.zoo import ZOO, resolve_model


def test_zoo_covers_families_and_sizes() -> None:
    families: dict[str, int] = {}
    for spec in ZOO.values():
        assert spec.family is not None
        families[spec.family] = families.get(spec.family, 0) + 1
    transformers_families = {f for f, n in families.items() if f != "reference" and n >= 2}
    assert {"gpt2", "bert", "vit", "resnet"} <= transformers_families
    assert len(transformers_families) >= 16
    assert {"MLP", "VGG"} <= {s.cls for s in ZOO.values() if s.source == "reference"}


@pytest.mark.parametrize("name", list(ZOO))
def test_every_entry_builds_with_its_inputs(name: str) -> None:
    spec = ZOO[name]
    check_model_spec(spec)
    with torch.device("meta"):
        model = build_model(spec)
    assert count_parameters(model) > 0
    batch = make_batch(spec, model)
    assert all(t.shape[0] == spec.inputs.batch_size for t in batch.values())


# Published parameter counts of the standard sizes (within 1 %).
@pytest.mark.parametrize(
    ("name", "parameters"),
    [
        ("gpt2-small", 124.4e6),
        ("gpt2-medium", 354.8e6),
        ("bert-base", 109.5e6),
        ("vit-base", 86.6e6),
        ("resnet-18", 11.7e6),
        ("resnet-50", 25.6e6),
        ("t5-small", 60.5e6),
        ("opt-125m", 125.2e6),
        ("convnext-tiny", 28.6e6),
        ("convnext-atto", 3.7e6),
        ("mistral-7b", 7.24e9),
        ("falcon-7b", 6.92e9),
        ("gptj-6b", 6.05e9),
        ("electra-small", 13.5e6),
        ("bart-base", 139.4e6),
        ("efficientnet-b0", 5.3e6),
        ("mixtral-8x7b", 46.7e9),
        ("qwen3-30b-a3b", 30.5e9),
        ("gpt-oss-120b", 116.8e9),
        ("deepseek-v3", 671e9),
    ],
)
def test_standard_sizes(name: str, parameters: float) -> None:
    with torch.device("meta"):
        model = build_model(ZOO[name])
    assert count_parameters(model) == pytest.approx(parameters, rel=0.01)


def test_gpt2_has_cache_off() -> None:
    with torch.device("meta"):
        model = build_model(ZOO["gpt2-tiny"])
    config: Any = model.config
    assert config.use_cache is False


def test_resolve_inline_and_file(tmp_path: Path) -> None:
    raw = {
        "class": "GPT2LMHeadModel",
        "config": {"n_layer": 1, "n_embd": 64, "n_head": 2},
        "inputs": {"batch_size": 2, "seq_len": 16},
    }
    inline = resolve_model(json.dumps(raw))
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(raw))
    assert resolve_model(str(path)) == inline
    yaml_path = tmp_path / "spec.yaml"
    yaml_path.write_text(
        "class: GPT2LMHeadModel\nconfig: {n_layer: 1, n_embd: 64, n_head: 2}\n"
        "inputs: {batch_size: 2, seq_len: 16}\n"
    )
    assert resolve_model(str(yaml_path)) == inline


def test_unknown_model_lists_the_zoo() -> None:
    with pytest.raises(UnknownModelError, match=r"'gpt5' is not in the zoo.*gpt2-small"):
        resolve_model("gpt5")


def _spec(cls: str, config: dict, **inputs: int) -> dict:
    return {"class": cls, "config": config, "inputs": inputs}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_spec("BertForMaskedLMM", {}, batch_size=2, seq_len=8), "did you mean BertForMaskedLM"),
        (_spec("os.system", {}, batch_size=2, seq_len=8), "'os.system' is not a transformers"),
        (_spec("BertConfig", {}, batch_size=2, seq_len=8), "'BertConfig' is not a transformers"),
        (
            _spec("BertForMaskedLM", {"hiden_size": 8}, batch_size=2, seq_len=8),
            "config key 'hiden_size' is not a BertConfig field; did you mean hidden_size",
        ),
        (
            _spec("BertForMaskedLM", {}, batch_size=2),
            "inputs.seq_len is required for BertForMaskedLM",
        ),
        (
            _spec("ViTForImageClassification", {}, batch_size=2, seq_len=8),
            "inputs.image_size is required",
        ),
        (
            _spec("ViTForImageClassification", {}, batch_size=2, image_size=32, seq_len=8),
            r"inputs.seq_len\(8\) does not apply to ViTForImageClassification",
        ),
        (
            _spec("BertForMaskedLM", {}, batch_size=2, seq_len=8, image_size=32),
            r"inputs.image_size\(32\) does not apply to BertForMaskedLM",
        ),
    ],
)
def test_bad_specs(raw: dict, message: str) -> None:
    with pytest.raises(InvalidModelSpecError, match=message):
        check_model_spec(resolve_model(json.dumps(raw)))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            _spec("BertForMaskedLM", {"num_hidden_layers": 1}, batch_size=2, seq_len=1024),
            r"inputs.seq_len\(1024\) > config.max_position_embeddings\(512\)",
        ),
        (
            _spec("ViTForImageClassification", {}, batch_size=2, image_size=100),
            r"image_size\(100\) is not a multiple of config.patch_size\(16\)",
        ),
        (
            _spec(
                "BertForMaskedLM",
                {"hidden_size": 100, "num_attention_heads": 3},
                batch_size=1,
                seq_len=8,
            ),
            "cannot be built from config",
        ),
        (
            _spec("BertForMaskedLM", {"num_hidden_layers": "two"}, batch_size=1, seq_len=8),
            "BertConfig rejects config",
        ),
    ],
)
def test_bad_config_values_and_shapes(raw: dict, message: str) -> None:
    with torch.device("meta"), pytest.raises(InvalidModelSpecError, match=message):
        build_model(resolve_model(json.dumps(raw)))


def test_composite_models_are_refused_clearly() -> None:
    spec = resolve_model(json.dumps(_spec("CLIPModel", {}, batch_size=2, seq_len=8)))
    with torch.device("meta"):
        model = build_model(spec)
    with pytest.raises(InvalidModelSpecError, match=r"CLIPModel has no config\.vocab_size"):
        batch_fields(spec, model)


def test_batch_fields_and_real_batch_agree() -> None:
    spec = ZOO["bert-tiny"].with_inputs(batch_size=3, seq_len=16)
    model = build_model(spec)
    fields = batch_fields(spec, model)
    batch = make_batch(spec, model, seed=1)
    assert set(batch) == set(fields) == {"input_ids", "labels"}
    for name, field in fields.items():
        assert batch[name].shape == field.shape
        assert batch[name].dtype == field.dtype
        assert int(batch[name].max()) < (field.high or 0)
    assert torch.equal(make_batch(spec, model, seed=1)["input_ids"], batch["input_ids"])
