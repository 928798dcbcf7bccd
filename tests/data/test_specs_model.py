import pytest

from ddlsim.data.errors import InvalidModelSpecError
from ddlsim.data.specs.model import InputSpec, ModelSpec

SPEC = {
    "source": "transformers",
    "class": "BertForMaskedLM",
    "config": {"num_hidden_layers": 2},
    "inputs": {"batch_size": 8, "seq_len": 128},
}


def test_round_trip() -> None:
    spec = ModelSpec.from_dict(SPEC)
    assert spec.cls == "BertForMaskedLM"
    assert spec.inputs == InputSpec(batch_size=8, seq_len=128)
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict() == SPEC


def test_source_defaults_to_transformers() -> None:
    raw = {k: v for k, v in SPEC.items() if k != "source"}
    assert ModelSpec.from_dict(raw).source == "transformers"


def test_with_inputs_overrides_only_given_values() -> None:
    spec = ModelSpec.from_dict(SPEC).with_inputs(batch_size=2)
    assert spec.inputs == InputSpec(batch_size=2, seq_len=128)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({**SPEC, "source": "hub"}, "source 'hub' is not supported; allowed: transformers"),
        ({**SPEC, "klass": "X"}, "unknown key 'klass' in model spec"),
        ({k: v for k, v in SPEC.items() if k != "class"}, "model spec needs 'class'"),
        ({**SPEC, "inputs": {"batch_size": 0, "seq_len": 4}}, "inputs.batch_size must be >= 1"),
        ({**SPEC, "inputs": {"seq_len": 4}}, "inputs.batch_size is required"),
        ({**SPEC, "inputs": {"batch_size": 2, "seq": 4}}, "unknown key 'seq' in inputs"),
        ({**SPEC, "inputs": {"batch_size": 2, "seq_len": 1.5}}, "inputs.seq_len must be an int"),
        ({**SPEC, "config": [1]}, "config must be a JSON object"),
        ({**SPEC, "name": {"a": 1}}, "name must be a string"),
    ],
)
def test_invalid(raw: dict, message: str) -> None:
    with pytest.raises(InvalidModelSpecError, match=message):
        ModelSpec.from_dict(raw)
