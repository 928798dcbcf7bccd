"""How a zoo entry is made: a model class and config at a named size, with its inputs."""

from ddlsim.data.specs.model import InputSpec, ModelSource, ModelSpec


def zoo_entry(
    name: str, family: str, cls: str, config: dict[str, object], **inputs: int
) -> ModelSpec:
    """A zoo model named ``name`` of ``family``: class ``cls`` (a transformers class, or a
    plain-torch reference model for family ``"reference"``) built from ``config`` with random
    weights, trained on ``inputs`` (``InputSpec`` fields)."""
    source: ModelSource = "reference" if family == "reference" else "transformers"
    return ModelSpec(
        source=source,
        cls=cls,
        config=config,
        inputs=InputSpec(**inputs),
        name=name,
        family=family,
    )
