"""``ModelSpec``: which model to build and with which synthetic inputs.

Two sources: ``"transformers"`` (any Hugging Face model class, built from a config with random
weights, never downloaded) and ``"reference"`` (the plain-torch models in ``data.reference``).
The spec checks its own structure on construction; whether the class exists and the config
keys are known is checked by :func:`data.models.check_model_spec`, which needs transformers.
"""

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Literal

from ddlsim.data.errors import InvalidModelSpecError
from ddlsim.data.specs._serde import check_keys, expect_choice, expect_int, present

ModelSource = Literal["transformers", "reference"]
MODEL_SOURCES: tuple[str, ...] = ("transformers", "reference")


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class InputSpec:
    """Shape of one synthetic training batch.

    ``batch_size`` is the global batch; ``seq_len`` applies to text models and ``image_size``
    (square, pixels) to vision models. Which of the two a model needs is checked when the model
    is built.
    """

    batch_size: int
    seq_len: int | None = None
    image_size: int | None = None

    def __post_init__(self) -> None:
        expect_int(self.batch_size, "inputs.batch_size", InvalidModelSpecError)
        if self.seq_len is not None:
            expect_int(self.seq_len, "inputs.seq_len", InvalidModelSpecError)
        if self.image_size is not None:
            expect_int(self.image_size, "inputs.image_size", InvalidModelSpecError)

    def to_dict(self) -> dict[str, int]:
        return {
            "batch_size": self.batch_size,
            **present(seq_len=self.seq_len, image_size=self.image_size),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "InputSpec":
        check_keys(raw, {"batch_size", "seq_len", "image_size"}, "inputs", InvalidModelSpecError)
        if "batch_size" not in raw:
            raise InvalidModelSpecError("inputs.batch_size is required")
        return cls(
            batch_size=raw["batch_size"],
            seq_len=raw.get("seq_len"),
            image_size=raw.get("image_size"),
        )


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class ModelSpec:
    """A model class, its config and its inputs; ``name`` is the zoo name when there is one.

    JSON form: ``{"source": "transformers", "class": "BertForMaskedLM", "config": {...},
    "inputs": {"batch_size": 8, "seq_len": 128}}``.

    Raises:
        InvalidModelSpecError: on a bad source, an empty class name, a non-mapping config or
            invalid inputs.
    """

    source: ModelSource
    cls: str
    config: Mapping[str, Any]
    inputs: InputSpec
    name: str | None = None
    family: str | None = None

    def __post_init__(self) -> None:
        expect_choice(self.source, MODEL_SOURCES, "source", InvalidModelSpecError)
        if not isinstance(self.cls, str) or not self.cls:
            raise InvalidModelSpecError(f"class must be a non-empty string, got {self.cls!r}")
        for key in ("name", "family"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, str):
                raise InvalidModelSpecError(f"{key} must be a string, got {value!r}")
        if not isinstance(self.config, Mapping):
            raise InvalidModelSpecError(f"config must be a JSON object, got {self.config!r}")
        object.__setattr__(self, "config", dict(self.config))
        try:
            json.dumps(self.config, sort_keys=True)
        except TypeError as exc:
            raise InvalidModelSpecError(f"config must be JSON-serializable: {exc}") from None

    @property
    def label(self) -> str:
        """A short human name: the zoo name, else the class."""
        return self.name or self.cls

    def with_inputs(
        self,
        *,
        batch_size: int | None = None,
        seq_len: int | None = None,
        image_size: int | None = None,
    ) -> "ModelSpec":
        """Return a copy whose inputs take the given overrides (``None`` keeps a value)."""
        inputs = InputSpec(
            batch_size=batch_size if batch_size is not None else self.inputs.batch_size,
            seq_len=seq_len if seq_len is not None else self.inputs.seq_len,
            image_size=image_size if image_size is not None else self.inputs.image_size,
        )
        return dataclasses.replace(self, inputs=inputs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "class": self.cls,
            "config": json.loads(json.dumps(dict(self.config), sort_keys=True)),
            "inputs": self.inputs.to_dict(),
            **present(name=self.name, family=self.family),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "ModelSpec":
        allowed = {"source", "class", "config", "inputs", "name", "family"}
        check_keys(raw, allowed, "model spec", InvalidModelSpecError)
        for key in ("class", "inputs"):
            if key not in raw:
                raise InvalidModelSpecError(f"model spec needs {key!r}; got keys {sorted(raw)}")
        inputs = raw["inputs"]
        if not isinstance(inputs, Mapping):
            raise InvalidModelSpecError(f"inputs must be a JSON object, got {inputs!r}")
        return cls(
            source=raw.get("source", "transformers"),
            cls=raw["class"],
            config=raw.get("config", {}),
            inputs=InputSpec.from_dict(inputs),
            name=raw.get("name"),
            family=raw.get("family"),
        )
