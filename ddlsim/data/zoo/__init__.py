"""The model zoo: real architectures at named sizes, with the inputs they train on.

Transformers entries mirror the configs their authors published (sizes from the papers and
model cards); they are built with random weights, never downloaded. Two plain-torch reference
models serve fast tests. The entries are listed by family in :mod:`.classic_families` and
:mod:`.structural_families`, the mixtures of experts in :mod:`.moe_families`.
"""

import json
from pathlib import Path

from ddlsim.data.errors import UnknownModelError
from ddlsim.data.specs._serde import load_json_or_file
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.zoo.classic_families import CLASSIC_MODELS
from ddlsim.data.zoo.moe_families import MOE_MODELS
from ddlsim.data.zoo.structural_families import STRUCTURAL_MODELS

ZOO: dict[str, ModelSpec] = {
    spec.label: spec for spec in [*CLASSIC_MODELS, *STRUCTURAL_MODELS, *MOE_MODELS]
}

__all__ = ["ZOO", "resolve_model", "spec_json", "zoo_names"]


def zoo_names() -> list[str]:
    """Zoo names in listing order."""
    return list(ZOO)


def resolve_model(text: str) -> ModelSpec:
    """A zoo name, a spec file (JSON or YAML) or an inline JSON spec.

    Raises:
        UnknownModelError: when ``text`` is none of these, naming the zoo's models.
        InvalidModelSpecError: when the spec itself is malformed.
    """
    if text in ZOO:
        return ZOO[text]
    if text.strip().startswith("{") or Path(text).is_file():
        return ModelSpec.from_dict(load_json_or_file(text, "model spec", UnknownModelError))
    raise UnknownModelError(
        f"model {text!r} is not in the zoo, not a spec file and not inline JSON; "
        f"zoo: {', '.join(ZOO)}"
    )


def spec_json(spec: ModelSpec) -> str:
    """The spec as canonical JSON (sorted keys): what the graph hash covers."""
    return json.dumps(spec.to_dict(), sort_keys=True)
