"""What the replay needs to know about a rank and its links, from stored profiles.

A rank of a data-parallel plan runs the model on its share of the global batch, one micro-batch
at a time: its node durations come from a kernel profile of the model at that micro-batch
(:func:`rank_spec`). Its collectives run over the ``dp`` ranks on the cluster's links: their
durations come from the latency-bandwidth fits of a collective profile of the same backend,
world size and link (:func:`comm_models`), or, where none was measured, from the link's nominal
rate, and the caller is told which.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy

# The rate assumed for an unshaped link without a measured fit: this machine's raw TCP between
# namespaces (DESIGN.md: 11.7 Gb/s), rounded down.
UNSHAPED_GBPS = 10.0
REPLAY_OPS: tuple[str, ...] = ("all_reduce", "reduce_scatter", "all_gather", "sendrecv")


class LinkFitLike(Protocol):
    """A fitted collective on one link: a stored profile or a dataset's fit."""

    @property
    def collective(self) -> str: ...
    @property
    def world_size(self) -> int: ...
    @property
    def bandwidth(self) -> str: ...
    @property
    def alpha_us(self) -> float: ...
    @property
    def busbw_gbps(self) -> float: ...
    @property
    def cpu_alpha_us(self) -> float: ...
    @property
    def cpu_us_per_byte(self) -> float: ...


class BackendFit(LinkFitLike, Protocol):
    """A fit of one backend's collective: a stored profile, or the shipped dataset's fit of a
    link the store has none of (:func:`simulator.default.shipped_link_fits`)."""

    @property
    def backend(self) -> str: ...


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CommModels:
    """One model per collective the replay may meet, and where each came from."""

    models: dict[str, AlphaBeta]
    sources: dict[str, str]


def rank_spec(spec: ModelSpec, strategy: Strategy, world_size: int) -> ModelSpec:
    """``spec`` at the micro-batch one data-parallel rank runs.

    Raises:
        InvalidStrategyError: ``dp * tp * pp != world_size``, or a global batch that does not
            split into ``dp * micro_batches`` equal parts.
    """
    batch = strategy.parallel.rank_batch_size(spec.inputs.batch_size, world_size)
    return spec.with_inputs(batch_size=batch)


def uses_ring(strategy: Strategy, backend: str) -> bool:
    """Whether the executor runs DeAR's collectives as its own ring over send/recv."""
    fusion = strategy.tensor_fusion
    if not fusion.dear:
        return False
    if fusion.reduce_scatter == "auto":
        return backend == "gloo"
    return fusion.reduce_scatter == "ring"


def comm_models(
    profiles: Sequence[LinkFitLike],
    *,
    world_size: int,
    bandwidth: str,
    bandwidth_gbps: float | None,
    ring: bool,
    ops: Sequence[str] = REPLAY_OPS,
) -> CommModels:
    """Collective models over ``world_size`` ranks on a link of ``bandwidth``.

    ``profiles`` are stored fits; the newest matching one of each collective wins. With
    ``ring`` (DeAR on gloo), reduce-scatter and all-gather are the executor's ring: its own
    fits (``ring_reduce_scatter``, ``ring_all_gather``: the ring measured on its thread) where
    there are, else ``world_size - 1`` send/recv steps, each of ``1 / world_size`` of the
    buffer, from the send/recv fit. A collective without a fit of its own (nor, for the ring,
    a send/recv fit) takes the all-reduce's fit of the link: its latency, bus bandwidth and
    CPU work (a reduce-scatter or all-gather then moves half an all-reduce's bytes; priced
    free of latency, DeAR's many small buckets looked free, and the quickstart's search, whose
    store has only all-reduce fits, picked 28 of them measured at 0.51x of DDP's defaults).
    Without an all-reduce fit either, the link's nominal rate (``UNSHAPED_GBPS`` for an
    unshaped link) with no latency. ``ops``: the collectives to model (the replay's by
    default; expert parallelism adds ``all_to_all``).
    """
    newest: dict[str, LinkFitLike] = {}
    for profile in profiles:
        if profile.world_size == world_size and profile.bandwidth == bandwidth:
            newest[profile.collective] = profile  # oldest first: later ones replace
    line_gbps = bandwidth_gbps if bandwidth_gbps is not None else UNSHAPED_GBPS
    models: dict[str, AlphaBeta] = {}
    sources: dict[str, str] = {}
    n = world_size
    for op in ops:
        fitted = op
        if ring and op in ("reduce_scatter", "all_gather"):
            fitted = f"ring_{op}" if f"ring_{op}" in newest else "sendrecv"
        record = newest.get(fitted)
        missing = ""
        if (record is None or not record.busbw_gbps > 0) and _usable(newest.get("all_reduce")):
            missing, fitted, record = f" (no {fitted} profile)", "all_reduce", newest["all_reduce"]
        if record is None or not record.busbw_gbps > 0:
            models[op] = AlphaBeta(collective=op, world_size=n, alpha_us=0.0, busbw_gbps=line_gbps)
            sources[op] = f"line rate {line_gbps:g} Gb/s (no {fitted} profile)"
            continue
        ring_steps = fitted == "sendrecv" and op != "sendrecv"
        alpha_us = record.alpha_us * (n - 1) if ring_steps else record.alpha_us
        # A ring's n - 1 steps each send 1 / n of the buffer: (n - 1) / n of it in all.
        cpu_alpha_us = record.cpu_alpha_us * (n - 1) if ring_steps else record.cpu_alpha_us
        per_byte = record.cpu_us_per_byte * ((n - 1) / n if ring_steps else 1.0)
        models[op] = AlphaBeta(
            collective=op,
            world_size=n,
            alpha_us=max(0.0, alpha_us),
            busbw_gbps=record.busbw_gbps,
            cpu_alpha_us=cpu_alpha_us,
            cpu_us_per_byte=per_byte,
        )
        name = getattr(record, "id", None)
        source = getattr(record, "source", None) or (
            f"{fitted} profile {name}" if name is not None else f"{fitted} fit"
        )
        sources[op] = source + missing
    return CommModels(models=models, sources=sources)


def _usable(record: LinkFitLike | None) -> bool:
    return record is not None and record.busbw_gbps > 0


def compute_scale(ranks_on_machine: int, cores: int) -> float:
    """How much slower each rank computes than the one-rank kernel profile says, when
    ``ranks_on_machine`` single-threaded ranks share ``cores`` CPU cores (an emulated cluster
    on one machine: 4 ranks on 2 cores get half a core each). 1 where every rank has a core
    (or a GPU) of its own.

    Raises:
        InvalidOptionError: a count below 1.
    """
    if ranks_on_machine < 1 or cores < 1:
        raise InvalidOptionError(
            f"ranks_on_machine({ranks_on_machine}) and cores({cores}) must be >= 1"
        )
    return max(1.0, ranks_on_machine / cores)


def scaled(node_ms: Mapping[int, float], scale: float) -> dict[int, float]:
    """``node_ms`` with every duration multiplied by ``scale``."""
    return {node: ms * scale for node, ms in node_ms.items()}
