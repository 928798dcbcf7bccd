"""Plain-torch reference models: small, fast, dependency-free; for tests and sanity checks.

Each has a ``Config`` dataclass (the spec's ``config`` maps onto its fields) and takes
``inputs`` and ``labels`` keyword arguments, returning an object with a ``loss`` attribute like
the transformers models do, so the graph capture treats both sources alike.
"""

import dataclasses
from typing import Any, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


class ReferenceOutput(NamedTuple):
    loss: torch.Tensor
    logits: torch.Tensor


class ReferenceClassifier(nn.Module):
    """A reference model: a classifier whose loss is cross-entropy of its logits on ``labels``.

    A subclass names its ``Config`` dataclass (``config_class``) and its inputs
    (``input_kind``), builds its layers in ``__init__`` after this one's, and computes
    ``logits`` from ``inputs``.
    """

    config_class: ClassVar[type]
    input_kind: ClassVar[str]

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """Shapes: ``inputs: [batch, ...]`` -> ``[batch, num_classes]``."""
        raise NotImplementedError

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> ReferenceOutput:
        logits = self.logits(inputs)
        return ReferenceOutput(loss=F.cross_entropy(logits, labels), logits=logits)


@dataclasses.dataclass(kw_only=True, slots=True)
class MLPConfig:
    in_features: int = 1024
    hidden_sizes: tuple[int, ...] = (2048, 2048)
    num_classes: int = 10


class MLP(ReferenceClassifier):
    """Linear + ReLU layers then a classifier; input ``[batch, in_features]``."""

    config_class = MLPConfig
    input_kind = "features"

    def __init__(self, config: MLPConfig) -> None:
        super().__init__(config)
        layers: list[nn.Module] = []
        width = config.in_features
        for hidden in config.hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, config.num_classes)

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(inputs))


@dataclasses.dataclass(kw_only=True, slots=True)
class VGGConfig:
    num_channels: int = 3
    # Output channels per conv layer; 0 marks a 2x2 max-pool, as in the VGG papers' tables.
    layers: tuple[int, ...] = (64, 0, 128, 0, 256, 256, 0, 512, 512, 0)
    classifier_width: int = 512
    num_classes: int = 10


class VGG(ReferenceClassifier):
    """A VGG-style CNN (3x3 convs, batch norm, max-pools, two-layer classifier)."""

    config_class = VGGConfig
    input_kind = "image"

    def __init__(self, config: VGGConfig) -> None:
        super().__init__(config)
        blocks: list[nn.Module] = []
        channels = config.num_channels
        for width in config.layers:
            if width == 0:
                blocks.append(nn.MaxPool2d(2))
                continue
            blocks += [
                nn.Conv2d(channels, width, 3, padding=1),
                nn.BatchNorm2d(width),
                nn.ReLU(),
            ]
            channels = width
        self.features = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(channels, config.classifier_width),
            nn.ReLU(),
            nn.Linear(config.classifier_width, config.num_classes),
        )

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(inputs)), 1))


REFERENCE_MODELS: dict[str, type[ReferenceClassifier]] = {"MLP": MLP, "VGG": VGG}
