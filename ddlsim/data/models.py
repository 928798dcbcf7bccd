"""Build a model and one synthetic batch from a ``ModelSpec``.

Transformers models are built from their config with random weights: nothing is downloaded, no
hub is consulted. Class names are looked up as attributes of the ``transformers`` package (never
evaluated), and config keys are checked against the config class, which would otherwise accept a
misspelt key silently.
"""

import dataclasses
import difflib
import inspect
import os
from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import nn

from ddlsim.data.errors import InvalidModelSpecError, one_line
from ddlsim.data.moe import ExpertsShape, experts_shape, use_grouped_experts
from ddlsim.data.reference import REFERENCE_MODELS
from ddlsim.data.specs.model import ModelSpec

InputKind = Literal["text", "image", "features"]

# Head suffixes and the labels each expects; anything else gets a synthetic loss (see make_batch).
_TOKEN_LABEL_HEADS = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration")
_CLASS_LABEL_HEADS = ("ForSequenceClassification", "ForImageClassification")
# Keys every transformers config accepts even when its defaults do not list them.
_COMMON_CONFIG_KEYS = {
    "num_labels",
    "attn_implementation",
    "id2label",
    "label2id",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "tie_word_embeddings",
    # Read by the modeling code (Qwen3-MoE, Llama) where the config class declares no field.
    "head_dim",
}
# transformers' attention implementations that need nothing beyond torch.
ATTENTION_IMPLEMENTATIONS: tuple[str, ...] = ("eager", "sdpa", "flex_attention")
# Config attributes that bound the sequence length, by model family.
_MAX_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len")
MIN_STRIDE = 32  # a convolutional network's downsampling over its stages


@dataclasses.dataclass(kw_only=True, slots=True)
class ModelInfo:
    """What ``check_model_spec`` resolved: the classes and the kind of input."""

    model_cls: Any
    config_cls: Any
    input_kind: InputKind


def import_transformers() -> Any:
    """Import transformers with hub access off and its warnings quiet.

    ddlsim never loads weights or code from a hub; ``HF_HUB_OFFLINE`` makes any accidental
    attempt fail fast instead of reaching the network.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _transformers_class(name: str) -> Any:
    transformers = import_transformers()

    candidate = getattr(transformers, name, None) if name.isidentifier() else None
    if not (inspect.isclass(candidate) and issubclass(candidate, transformers.PreTrainedModel)):
        # Offer close names among the model classes transformers exports.
        exported = [n for n in dir(transformers) if n[:1].isupper() and "For" in n]
        close = difflib.get_close_matches(name, exported, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise InvalidModelSpecError(
            f"class {name!r} is not a transformers model class{hint} "
            "(give a class such as BertForMaskedLM or GPT2LMHeadModel)"
        )
    return candidate


def _known_config_keys(config_cls: Any) -> set[str]:
    keys = set(config_cls().to_dict())
    keys |= set(inspect.signature(config_cls.__init__).parameters) - {"self", "kwargs"}
    keys |= set(getattr(config_cls, "attribute_map", {}))
    return keys | _COMMON_CONFIG_KEYS


def _check_config_keys(config: Mapping[str, Any], known: set[str], config_name: str) -> None:
    for key in sorted(config):
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise InvalidModelSpecError(f"config key {key!r} is not a {config_name} field{hint}")


def check_model_spec(spec: ModelSpec) -> ModelInfo:
    """Resolve the spec's class and check its config keys and inputs.

    Raises:
        InvalidModelSpecError: naming the unknown class, the unknown config key or the input
            that does not fit the model.
    """
    if spec.source == "reference":
        ref_cls = REFERENCE_MODELS.get(spec.cls)
        if ref_cls is None:
            raise InvalidModelSpecError(
                f"reference class {spec.cls!r} does not exist; allowed: "
                f"{', '.join(sorted(REFERENCE_MODELS))}"
            )
        fields = {f.name for f in dataclasses.fields(ref_cls.config_class)}
        _check_config_keys(spec.config, fields, ref_cls.config_class.__name__)
        ref_kind: InputKind = "features" if ref_cls.input_kind == "features" else "image"
        info = ModelInfo(model_cls=ref_cls, config_cls=ref_cls.config_class, input_kind=ref_kind)
    else:
        model_cls = _transformers_class(spec.cls)
        config_cls = model_cls.config_class
        _check_config_keys(spec.config, _known_config_keys(config_cls), config_cls.__name__)
        attn = spec.config.get("attn_implementation")
        if attn is not None and attn not in ATTENTION_IMPLEMENTATIONS:
            # Anything else names a kernel package or a Hub repository transformers would
            # import or download.
            raise InvalidModelSpecError(
                f"config.attn_implementation {attn!r} is not supported; allowed: "
                f"{', '.join(ATTENTION_IMPLEMENTATIONS)} (the implementations torch itself has)"
            )
        params = inspect.signature(model_cls.forward).parameters
        if "input_ids" in params:
            kind: InputKind = "text"
        elif "pixel_values" in params:
            kind = "image"
        else:
            raise InvalidModelSpecError(
                f"class {spec.cls!r} takes neither input_ids nor pixel_values; "
                "supported: text and vision models"
            )
        info = ModelInfo(model_cls=model_cls, config_cls=config_cls, input_kind=kind)
    _check_inputs(spec, info)
    return info


def _check_inputs(spec: ModelSpec, info: ModelInfo) -> None:
    inputs = spec.inputs
    kind = {"text": "a text model", "image": "a vision model", "features": "a feature model"}[
        info.input_kind
    ]
    if info.input_kind == "text" and inputs.seq_len is None:
        raise InvalidModelSpecError(f"inputs.seq_len is required for {spec.cls} ({kind})")
    if info.input_kind == "image" and inputs.image_size is None:
        raise InvalidModelSpecError(f"inputs.image_size is required for {spec.cls} ({kind})")
    if info.input_kind != "text" and inputs.seq_len is not None:
        raise InvalidModelSpecError(
            f"inputs.seq_len({inputs.seq_len}) does not apply to {spec.cls} ({kind})"
        )
    if info.input_kind != "image" and inputs.image_size is not None:
        raise InvalidModelSpecError(
            f"inputs.image_size({inputs.image_size}) does not apply to {spec.cls} ({kind})"
        )


def spec_experts(spec: ModelSpec) -> ExpertsShape | None:
    """The routed experts of ``spec``'s model, its family's defaults included (a zoo spec
    names only what differs from them); ``None`` for a dense model."""
    return experts_shape(build_config(spec))


def build_config(spec: ModelSpec, info: ModelInfo | None = None) -> Any:
    """The model's config object, with the spec's inputs reconciled into it."""
    info = info or check_model_spec(spec)
    values = dict(spec.config)
    if spec.source == "reference":
        for key, value in values.items():
            if isinstance(value, list):
                values[key] = tuple(value)
        try:
            return info.config_cls(**values)
        except TypeError as exc:
            raise InvalidModelSpecError(
                f"{info.config_cls.__name__} rejects config {dict(spec.config)}: {one_line(exc)}"
            ) from None
    attn = values.pop("attn_implementation", None)
    try:
        config = info.config_cls(**values)
    except Exception as exc:  # config classes validate with exceptions of their own
        raise InvalidModelSpecError(
            f"{info.config_cls.__name__} rejects config {dict(spec.config)}: {one_line(exc)}"
        ) from None
    if attn is not None:
        config._attn_implementation = attn
    use_grouped_experts(config)
    if hasattr(config, "use_cache"):
        # Training never reads the KV cache; with it on, GPT-2 returns extra outputs.
        config.use_cache = False
    inputs = spec.inputs
    if info.input_kind == "image" and hasattr(config, "image_size"):
        if "image_size" in spec.config and spec.config["image_size"] != inputs.image_size:
            raise InvalidModelSpecError(
                f"inputs.image_size({inputs.image_size}) != config.image_size"
                f"({spec.config['image_size']}); this model takes one image size"
            )
        config.image_size = inputs.image_size
    patch = getattr(config, "patch_size", None)
    image_size = inputs.image_size
    if info.input_kind == "image" and isinstance(patch, int) and image_size and image_size % patch:
        raise InvalidModelSpecError(
            f"inputs.image_size({inputs.image_size}) is not a multiple of "
            f"config.patch_size({patch})"
        )
    staged = not isinstance(patch, int) or isinstance(getattr(config, "hidden_sizes", None), list)
    convolutional = spec.source == "transformers" and staged
    if info.input_kind == "image" and convolutional and image_size and image_size < MIN_STRIDE:
        # Its stages halve the image five times: smaller, a pooling or a batch norm of one
        # value fails while the model runs.
        raise InvalidModelSpecError(
            f"inputs.image_size({image_size}) is under {MIN_STRIDE} pixels, the stride of "
            f"{spec.cls}'s last stage"
        )
    if info.input_kind == "text" and inputs.seq_len is not None:
        for key in _MAX_POSITION_KEYS:
            limit = getattr(config, key, None)
            if isinstance(limit, int) and inputs.seq_len > limit:
                raise InvalidModelSpecError(
                    f"inputs.seq_len({inputs.seq_len}) > config.{key}({limit}) of {spec.cls}"
                )
    return config


def build_model(spec: ModelSpec, *, seed: int = 0) -> nn.Module:
    """Build the model with random weights, in training mode, under the ambient device/mode.

    Inside a ``FakeTensorMode`` the parameters are fake: no memory, no initialization cost.
    """
    info = check_model_spec(spec)
    config = build_config(spec, info)
    torch.manual_seed(seed)
    try:
        model = info.model_cls(config)
    except Exception as exc:
        # Constructors check their config (heads dividing the hidden size, ...) in their own ways.
        raise InvalidModelSpecError(
            f"{spec.cls} cannot be built from config {dict(spec.config)}: {one_line(exc)}"
        ) from None
    model.train()
    return model


@dataclasses.dataclass(frozen=True, slots=True)
class InputField:
    """One model input: its shape, and either ``high`` (integers in ``[0, high)``) or floats."""

    shape: tuple[int, ...]
    high: int | None = None

    @property
    def dtype(self) -> torch.dtype:
        return torch.long if self.high is not None else torch.float32


def _config_int(config: Any, key: str, spec: ModelSpec) -> int:
    value = getattr(config, key, None)
    if not isinstance(value, int):
        raise InvalidModelSpecError(
            f"{spec.cls} has no config.{key} (composite configs such as text_config/"
            "vision_config are not supported); give a single text or vision model class"
        )
    return value


def batch_fields(spec: ModelSpec, model: nn.Module) -> dict[str, InputField]:
    """The inputs (and labels, where the head takes them) of one global batch.

    Shapes:
        text: ``input_ids: [batch_size, seq_len]``, ``labels`` per head.
        image: ``pixel_values: [batch_size, num_channels, image_size, image_size]``.
        features (reference MLP): ``inputs: [batch_size, in_features]``.

    Raises:
        InvalidModelSpecError: when the config lacks what the inputs need (composite models).
    """
    info = check_model_spec(spec)
    config: Any = model.config
    batch = spec.inputs.batch_size
    if spec.source == "reference":
        classes = _config_int(config, "num_classes", spec)
        if info.input_kind == "features":
            shape: tuple[int, ...] = (batch, config.in_features)
        else:
            size = spec.inputs.image_size or 0
            shape = (batch, config.num_channels, size, size)
        return {"inputs": InputField(shape), "labels": InputField((batch,), classes)}

    out: dict[str, InputField] = {}
    if info.input_kind == "text":
        seq = spec.inputs.seq_len or 0
        vocab = _config_int(config, "vocab_size", spec)
        out["input_ids"] = InputField((batch, seq), vocab)
        if spec.cls.endswith(_TOKEN_LABEL_HEADS):
            out["labels"] = InputField((batch, seq), vocab)
        elif spec.cls.endswith("ForTokenClassification"):
            out["labels"] = InputField((batch, seq), _config_int(config, "num_labels", spec))
        elif spec.cls.endswith("ForQuestionAnswering"):
            out["start_positions"] = InputField((batch,), seq)
            out["end_positions"] = InputField((batch,), seq)
    else:
        size = spec.inputs.image_size or 0
        channels = getattr(config, "num_channels", 3)
        out["pixel_values"] = InputField((batch, channels, size, size))
    if spec.cls.endswith(_CLASS_LABEL_HEADS):
        out["labels"] = InputField((batch,), _config_int(config, "num_labels", spec))
    return out


def make_batch(
    spec: ModelSpec, model: nn.Module, *, seed: int = 0, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """One synthetic batch (random ids, labels and pixels from ``seed``) on ``device``.

    Shapes: as :func:`batch_fields`.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    batch = {}
    for name, field in batch_fields(spec, model).items():
        if field.high is not None:
            value = torch.randint(0, field.high, field.shape, generator=gen)
        else:
            value = torch.randn(field.shape, generator=gen)
        batch[name] = value.to(device)
    return batch


def training_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Forward pass and the scalar loss to differentiate.

    Heads that compute a loss from ``labels`` return it; for the others (bare encoders) the loss
    is the sum of the means of all floating-point outputs (hidden states, pooled output), so
    every parameter that shapes an output receives a gradient.
    """
    output = model(**batch)
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    values = output.to_tuple() if hasattr(output, "to_tuple") else output
    if isinstance(values, torch.Tensor):
        values = (values,)
    means = [
        value.float().mean()
        for value in values
        if isinstance(value, torch.Tensor) and value.is_floating_point()
    ]
    if not means:
        raise InvalidModelSpecError(f"{type(model).__name__} returned no floating-point output")
    return torch.stack(means).sum()


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameter elements (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def repeated_blocks(spec: ModelSpec) -> list[str]:
    """Module paths of the model's repeated blocks: the items of every outermost
    ``nn.ModuleList`` (T5 has two, encoder and decoder), else of its longest ``nn.Sequential``."""
    with torch.device("meta"):
        model = build_model(spec)
    for kind in (nn.ModuleList, nn.Sequential):
        found: list[tuple[str, nn.Module]] = []
        for name, module in model.named_modules():
            inside = any(name.startswith(f"{outer}.") for outer, _ in found)
            if name and isinstance(module, kind) and not inside:
                found.append((name, module))
        if kind is nn.Sequential and found:
            found = [max(found, key=lambda item: len(list(item[1].children())))]
        if found:
            return [
                f"{name}.{child}" for name, module in found for child, _ in module.named_children()
            ]
    return []
