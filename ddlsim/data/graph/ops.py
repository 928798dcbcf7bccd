"""Coarse categories of ATen ops: features that carry across models for the cost models."""

OP_CATEGORIES: tuple[str, ...] = (
    "matmul",
    "conv",
    "attention",
    "norm",
    "softmax",
    "activation",
    "elementwise",
    "reduction",
    "embedding",
    "loss",
    "pool",
    "dropout",
    "view",
    "memory",
    "grad_ready",
    "comm",
    "optimizer",
    "other",
)

# Checked in order: the first matching substring wins.
_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("scaled_dot_product", "flash_attention", "efficient_attention")),
    ("matmul", ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul", "linear")),
    ("conv", ("convolution", "conv2d", "conv1d")),
    ("norm", ("layer_norm", "batch_norm", "group_norm", "rms_norm", "_native_batch_norm")),
    ("softmax", ("softmax",)),
    ("loss", ("nll_loss", "cross_entropy", "mse_loss")),
    ("embedding", ("embedding",)),
    ("pool", ("pool",)),
    ("dropout", ("dropout", "bernoulli")),
    (
        "activation",
        ("gelu", "relu", "silu", "tanh", "sigmoid", "threshold_backward", "hardtanh", "elu"),
    ),
    (
        "view",
        (
            "aten.view",
            "aten._unsafe_view",
            "aten.reshape",
            "aten.t.",
            "aten.transpose",
            "aten.permute",
            "aten.expand",
            "aten.unsqueeze",
            "aten.squeeze",
            "aten.slice",
            "aten.select",
            "aten.alias",
            "aten.detach",
            "aten.split",
            "aten.unbind",
            "aten.as_strided",
            "aten.chunk",
            "aten.narrow",
            "aten.unflatten",
            "aten.flatten",
        ),
    ),
    ("reduction", ("aten.sum", "aten.mean", "aten.amax", "aten.max", "aten.var", "aten.norm")),
    (
        "memory",
        (
            "aten.clone",
            "aten.copy",
            "aten.cat",
            "aten.stack",
            "aten.empty",
            "aten.zeros",
            "aten.ones",
            "aten.full",
            "aten.new_",
            "aten.fill",
            "aten.arange",
            "aten.contiguous",
            "aten._to_copy",
            "aten.index",
            "aten.gather",
            "aten.scatter",
            "aten.constant_pad",
            "aten.scalar_tensor",
            "aten.lift_fresh",
        ),
    ),
    ("grad_ready", ("grad_ready",)),
    ("comm", ("all_reduce", "reduce_scatter", "all_gather", "broadcast")),
    ("optimizer", ("optimizer.",)),
)


def op_category(op: str) -> str:
    """The category of ``op`` (``"aten.mm.default"`` -> ``"matmul"``); ``"other"`` if unknown.

    Elementwise arithmetic is recognized by its ``aten.<name>`` prefix after the rules above.
    """
    for category, needles in _RULES:
        if any(needle in op for needle in needles):
            return category
    if op.startswith("aten."):
        return "elementwise"
    return "other"
