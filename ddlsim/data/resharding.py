"""Cross-mesh resharding's layouts and messages: a tensor leaving one sub-mesh in one layout and
arriving on another sub-mesh in another layout. Shared by the profiler, which moves tensors so
(:mod:`ddlsim.profiler.reshard_rank`), and the simulator, which prices the moves
(:mod:`ddlsim.simulator.resharding`, whose docstring describes the methods).

A sub-mesh of ``ranks`` ranks holds the tensor ``shard`` (split along its first dimension, rank
``i`` holding the ``i``-th of ``ranks`` equal parts: S(0)) or ``replicate`` (every rank holds
all of it: B). The tensor is cut into tiles so that every tile lies wholly on the ranks that
hold it and wholly in the part a destination rank receives.
"""

import dataclasses
import math

from ddlsim.data.errors import InvalidOptionError

MESH_LAYOUTS: tuple[str, ...] = ("shard", "replicate")
RESHARD_METHODS: tuple[str, ...] = ("sendrecv_allgather", "broadcast")


@dataclasses.dataclass(frozen=True, slots=True)
class MeshLayout:
    """A sub-mesh of ``ranks`` ranks holding a tensor in ``layout`` (``MESH_LAYOUTS``)."""

    ranks: int
    layout: str

    def __post_init__(self) -> None:
        if not isinstance(self.ranks, int) or self.ranks < 1:
            raise InvalidOptionError(f"a mesh needs ranks >= 1, got {self.ranks!r}")
        if self.layout not in MESH_LAYOUTS:
            raise InvalidOptionError(
                f"mesh layout {self.layout!r} is not supported; allowed: {', '.join(MESH_LAYOUTS)}"
            )

    @classmethod
    def parse(cls, text: str) -> "MeshLayout":
        """``RANKS:LAYOUT`` (``2:shard``, ``1:replicate``).

        Raises:
            InvalidOptionError: naming the text and what is allowed.
        """
        ranks, _, layout = text.partition(":")
        if not ranks.strip().isdigit() or not layout:
            raise InvalidOptionError(
                f"mesh {text!r} is not RANKS:LAYOUT; e.g. 2:shard or 1:replicate"
            )
        return cls(int(ranks), layout.strip())

    @property
    def parts(self) -> int:
        """How many parts the tensor is split into on this mesh (1 when replicated)."""
        return self.ranks if self.layout == "shard" else 1

    def holders(self, tile: int, tiles: int) -> list[int]:
        """The ranks of this mesh that hold (or need) tile ``tile`` of ``tiles``."""
        if self.layout == "replicate":
            return list(range(self.ranks))
        return [tile * self.ranks // tiles]


@dataclasses.dataclass(frozen=True, slots=True)
class Transfer:
    """One message: tile ``tile`` (``nbytes``, the ``tile``-th equal slice of the whole tensor)
    from source rank ``src`` to destination rank ``dst`` (indices in their own meshes)."""

    src: int
    dst: int
    nbytes: float
    tile: int = 0


def tile_count(src: MeshLayout, dst: MeshLayout) -> int:
    """Tiles the tensor is cut into: every tile on whole source ranks and destination parts; a
    replicating destination of several ranks counts as split among them (each rank receives an
    equal share before the all-gather)."""
    dst_parts = dst.ranks if dst.layout == "replicate" else dst.parts
    return math.lcm(src.parts, dst_parts)


def plan_transfers(nbytes: float, src: MeshLayout, dst: MeshLayout, method: str) -> list[Transfer]:
    """The messages ``method`` sends across the meshes (before any all-gather): tiles in
    order, each from the least loaded source rank that holds it.

    Raises:
        InvalidOptionError: an unknown method.
    """
    if method not in RESHARD_METHODS:
        raise InvalidOptionError(
            f"resharding method {method!r} is not supported; allowed: {', '.join(RESHARD_METHODS)}"
        )
    # A broadcast sends whole source parts; send/recv cuts them as the receivers share them.
    tiles = math.lcm(src.parts, dst.parts) if method == "broadcast" else tile_count(src, dst)
    tile_bytes = nbytes / tiles
    sent = [0.0] * src.ranks
    out: list[Transfer] = []
    for tile in range(tiles):
        if method == "broadcast" and dst.layout == "replicate":
            receivers = list(range(dst.ranks))
        elif dst.layout == "replicate":
            receivers = [tile * dst.ranks // tiles]  # the tile's designated receiver
        else:
            receivers = dst.holders(tile, tiles)
        owner = min(src.holders(tile, tiles), key=lambda rank: (sent[rank], rank))
        sent[owner] += tile_bytes * len(receivers)
        out.extend(Transfer(owner, receiver, tile_bytes, tile) for receiver in receivers)
    return out
