"""How big a model a shared service takes: parameters, layers, FLOPs and activations of one
iteration, estimated before anything is built, each against a limit the operator may set.

The estimate builds the model with one and with two of its repeated layers on the meta device
(no memory, no initialisation) and extrapolates linearly to the config's layer count, so a
spec with a million layers costs two tiny builds, not a million. FLOPs follow the usual
``6 * parameters * tokens`` of a training step; activations Korthikanti et al.'s ``34`` bytes a
token a hidden unit a layer (16-bit activations, no recomputation).
"""

import dataclasses
import functools
import json
import os
from collections.abc import Mapping

import torch

from ddlsim.data.errors import InvalidModelSpecError, InvalidOptionError, one_line
from ddlsim.data.models import (
    MIN_STRIDE,
    build_config,
    build_model,
    check_model_spec,
    count_parameters,
)
from ddlsim.data.specs.model import ModelSpec

LAYER_KEYS: tuple[str, ...] = ("n_layer", "num_hidden_layers", "num_layers")
_WIDTH_KEYS = ("hidden_size", "n_embd", "d_model", "hidden_dim", "width")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
# A convolutional network's activations scale with the pixels times its stem's channels.
_STEM_CHANNELS = 64
_LIMIT_ENV = {
    "max_params": "DDLSIM_MAX_PARAMS",
    "max_layers": "DDLSIM_MAX_LAYERS",
    "max_flops": "DDLSIM_MAX_FLOPS",
    "max_activation_bytes": "DDLSIM_MAX_ACTIVATION_BYTES",
    "max_iters": "DDLSIM_MAX_ITERS",
    "max_message_bytes": "DDLSIM_MAX_MESSAGE_BYTES",
    "max_run_bytes": "DDLSIM_MAX_RUN_BYTES",
}
_INTEGER_LIMITS = frozenset({"max_layers", "max_iters", "max_message_bytes"})


def _half_the_memory() -> float:
    """Half this machine's physical memory: what the runs of one job may use (every rank of an
    emulated cluster runs here)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SpecLimits:
    """The largest model a service instance builds, profiles or predicts, and the most work a
    queued job may ask for: ``max_iters`` bounds every count of steps, repeats or rounds,
    ``max_message_bytes`` every collective's message, ``max_run_bytes`` the memory that the
    processes of one run on this machine need together (:func:`check_run`)."""

    max_params: float = 2e11
    max_layers: int = 1024
    max_flops: float = 1e18
    max_activation_bytes: float = 4 * 2**40
    max_iters: int = 10_000
    max_message_bytes: int = 2**30
    max_run_bytes: float = dataclasses.field(default_factory=_half_the_memory)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "SpecLimits":
        """Defaults, each overridden by its ``DDLSIM_MAX_*`` variable.

        Raises:
            InvalidOptionError: naming a variable that is not a positive number.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, float] = {}
        for field, name in _LIMIT_ENV.items():
            if name in environ:
                try:
                    value = float(environ[name])
                except ValueError:
                    value = -1.0
                if not value > 0:
                    raise InvalidOptionError(f"{name}={environ[name]!r} must be a positive number")
                values[field] = int(value) if field in _INTEGER_LIMITS else value
        return cls(**values)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SpecEstimate:
    """One training iteration of a spec at its inputs: ``activation_bytes`` in 16 bits
    (Korthikanti et al.'s ``s b h L (34 + 5 a s / h)``, and the output logits), ``run_bytes``
    what one process training it in fp32 with AdamW holds (16 bytes a parameter for weights,
    gradients and the two moments; the activations twice over)."""

    params: float
    layers: int
    flops: float
    activation_bytes: float

    @property
    def run_bytes(self) -> float:
        return 16.0 * self.params + 2.0 * self.activation_bytes


def layer_key(config: object) -> tuple[str, int] | None:
    """The config key counting the repeated layers, and its value (``None`` for none)."""
    for key in LAYER_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return key, value
    return None


def _params_with(spec: ModelSpec, config: Mapping[str, object]) -> int:
    changed = dataclasses.replace(spec, config=dict(config))
    try:
        with torch.device("meta"):
            return count_parameters(build_model(changed))
    except (RuntimeError, ValueError, TypeError, OverflowError, MemoryError) as exc:
        raise InvalidModelSpecError(
            f"{spec.label} cannot be built from its config: {one_line(exc)}"
        ) from None


def estimate(spec: ModelSpec) -> SpecEstimate:
    """Parameters, layers, FLOPs and activations of one training iteration of ``spec``
    (memoised: every API request asks it of its model).

    Raises:
        InvalidModelSpecError: when the spec is invalid or cannot be built.
    """
    return _estimate(json.dumps(spec.to_dict(), sort_keys=True))


@functools.lru_cache(maxsize=512)
def _estimate(spec_json: str) -> SpecEstimate:
    spec = ModelSpec.from_dict(json.loads(spec_json))
    build_config(spec, check_model_spec(spec))  # the inputs against the config (positions)
    # The model at one short sample: only the tokens below depend on batch and sequence.
    one = spec.with_inputs(batch_size=1, seq_len=None if spec.inputs.seq_len is None else 1)
    bare = one.to_dict()
    params, layers, width, patch, heads, vocab = _shape(json.dumps(bare, sort_keys=True))
    inputs = spec.inputs
    tokens = float(inputs.batch_size)
    activations = tokens
    if inputs.seq_len is not None:
        tokens = activations = tokens * inputs.seq_len
    elif inputs.image_size is not None and patch > 0:
        tokens = activations = tokens * (inputs.image_size // patch) ** 2
    elif inputs.image_size is not None:
        # A convolutional network: its stem's activations at every pixel, and its weights
        # applied about once per position of the last stage.
        activations = tokens * inputs.image_size**2
        tokens *= max(1, inputs.image_size // MIN_STRIDE) ** 2
    per_layer = 34.0 * activations * width
    if inputs.seq_len is not None:  # attention scores: 5 a s^2 b bytes a layer
        per_layer += 5.0 * heads * inputs.seq_len * activations
    # A convolutional network's later stages see a quarter of the pixels of the one before:
    # all of them together about its stem at full resolution.
    at_full_size = 1 if inputs.image_size is not None and patch == 0 else layers
    return SpecEstimate(
        params=params,
        layers=layers,
        flops=6.0 * params * tokens,
        activation_bytes=per_layer * at_full_size + 4.0 * activations * vocab,
    )


@functools.lru_cache(maxsize=512)
def _shape(spec_json: str) -> tuple[float, int, int, int, int, int]:
    """Parameters, layers, width, patch size, attention heads and output vocabulary of a model
    (memoised apart from its inputs: a batch of jobs over many input sizes builds each model
    twice, not each job)."""
    spec = ModelSpec.from_dict(json.loads(spec_json))
    config = build_config(spec)
    found = layer_key(config) if spec.source == "transformers" else None
    if found is None:
        params = float(_params_with(spec, spec.config))
        layers = 1
    else:
        key, layers = found
        one = _params_with(spec, {**spec.config, key: 1})
        two = _params_with(spec, {**spec.config, key: 2})
        params = float(one + (two - one) * (layers - 1))
    patch = getattr(config, "patch_size", None)
    patch = patch if isinstance(patch, int) and patch > 0 else 0
    if spec.inputs.image_size is not None and patch == 0:
        stem = getattr(config, "embedding_size", None)
        width = stem if isinstance(stem, int) else _STEM_CHANNELS
    else:
        width = next((w for k in _WIDTH_KEYS if isinstance(w := getattr(config, k, None), int)), 0)
        stages = getattr(config, "hidden_sizes", None)  # a staged network: its first stage's
        if not width and isinstance(stages, list) and stages and isinstance(stages[0], int):
            width = stages[0]
    heads = next((h for k in _HEAD_KEYS if isinstance(h := getattr(config, k, None), int)), 0)
    vocab = getattr(config, "vocab_size", None) if spec.inputs.seq_len is not None else None
    return params, layers, width, patch, heads, vocab if isinstance(vocab, int) else 0


def check_limits(spec: ModelSpec, limits: SpecLimits | None = None) -> SpecEstimate:
    """Refuse a spec over any limit, before it is built for real.

    Raises:
        InvalidModelSpecError: naming the estimate, the limit and the variable that sets it.
    """
    limits = limits or SpecLimits.from_env()
    found = estimate(spec)
    checks = (
        ("layers", found.layers, limits.max_layers, "max_layers"),
        ("parameters", found.params, limits.max_params, "max_params"),
        ("FLOPs per iteration", found.flops, limits.max_flops, "max_flops"),
        (
            "activation bytes",
            found.activation_bytes,
            limits.max_activation_bytes,
            "max_activation_bytes",
        ),
    )
    for what, value, limit, field in checks:
        if value > limit:
            raise InvalidModelSpecError(
                f"{spec.label}: about {_number(value)} {what}, over this service's limit of "
                f"{_number(limit)} ({_LIMIT_ENV[field]}); use a smaller config or inputs"
            )
    return found


def _number(value: float) -> str:
    return f"{value:,.0f}" if value < 1e7 else f"{value:.3g}"


def check_run(spec: ModelSpec, processes: int, limits: SpecLimits | None = None) -> None:
    """Refuse a run of ``processes`` processes on this machine, each training ``spec`` at its
    inputs (a rank at its micro-batch), whose memory together is over ``max_run_bytes``.

    Raises:
        InvalidModelSpecError: naming the estimate, the limit and the variable that sets it.
    """
    limits = limits or SpecLimits.from_env()
    need = processes * estimate(spec).run_bytes
    if need > limits.max_run_bytes:
        each = f"{processes} processes of " if processes > 1 else ""
        raise InvalidModelSpecError(
            f"{spec.label} at batch {spec.inputs.batch_size}: {each}about "
            f"{need / 2**30:,.1f} GiB to train here, over this service's limit of "
            f"{limits.max_run_bytes / 2**30:,.1f} GiB (DDLSIM_MAX_RUN_BYTES; default half this "
            "machine's memory); use a smaller batch or model"
        )
