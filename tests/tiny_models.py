"""Tiny transformers models built from their configs, for tests of plans derived from a
model's modules."""

from collections.abc import Mapping
from typing import Any

from ddlsim.data.specs.model import ModelSpec


def transformers_spec(
    cls: str, dims: Mapping[str, Any], *, batch_size: int, seq_len: int, **config: Any
) -> ModelSpec:
    """A ``transformers`` model of class ``cls`` with ``dims`` and ``config`` as its config."""
    return ModelSpec.from_dict(
        {
            "source": "transformers",
            "class": cls,
            "config": {**dims, **config},
            "inputs": {"batch_size": batch_size, "seq_len": seq_len},
        }
    )
