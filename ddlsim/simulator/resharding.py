"""Cross-mesh resharding: a tensor leaving one sub-mesh in one layout and arriving on another
sub-mesh in another layout (a pipeline stage's activations or their gradients, when the stages
are placed on different ranks with different layouts), priced for each way of moving it.

Layouts and tiles are :mod:`ddlsim.data.resharding`'s. Two ways to move the tiles:

* ``sendrecv_allgather``: each tile crosses once, by send/recv, from one of the source ranks
  that hold it (the least loaded) to one destination rank; when the destination replicates,
  that rank is the tile's designated receiver (the destination's ranks receive equal shares)
  and the destination then all-gathers the whole tensor among its ranks. This is Alpa's
  send/recv plus local all-gather: the slow link between meshes carries every byte once.
* ``broadcast``: each tile is broadcast from one source rank that holds it to every destination
  rank that needs it (only when the destination replicates: otherwise each tile has one
  receiver and this is the send/recv above). On gloo a broadcast sends the whole buffer from
  its root to each other rank in turn.

Each rank's link is a full-duplex NIC (what the emulated cluster shapes: upload and download
each at the link rate): a phase lasts as long as its busiest rank direction, the sum of its
messages' times under the fitted send/recv model (``alpha_us + bytes / busbw`` each); the
all-gather is priced by its own fitted model over the destination's ranks.
"""

from collections.abc import Mapping

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.resharding import MeshLayout, Transfer, plan_transfers


def phase_us(transfers: list[Transfer], link: AlphaBeta) -> float:
    """How long ``transfers`` take at once: the busiest rank direction (a source's upload, a
    destination's download), each message at ``link``'s time for its bytes."""
    upload: dict[int, float] = {}
    download: dict[int, float] = {}
    for t in transfers:
        cost = link.time_us(int(t.nbytes))
        upload[t.src] = upload.get(t.src, 0.0) + cost
        download[t.dst] = download.get(t.dst, 0.0) + cost
    return max([*upload.values(), *download.values()], default=0.0)


def price_resharding(
    nbytes: float,
    src: MeshLayout,
    dst: MeshLayout,
    *,
    sendrecv: AlphaBeta,
    all_gather: AlphaBeta | None = None,
) -> Mapping[str, float]:
    """Each method's time (ms) to move a tensor of ``nbytes`` from ``src`` to ``dst``: the
    transfers at ``sendrecv``'s fitted rate, plus for ``sendrecv_allgather`` into a replicating
    destination of several ranks the all-gather of the whole tensor over them (``all_gather``,
    fitted over ``dst.ranks`` ranks). ``broadcast`` is priced only where it differs (the
    destination replicates over several ranks).

    Raises:
        InvalidOptionError: ``all_gather`` missing where it is needed, or fitted over another
            number of ranks.
    """
    out: dict[str, float] = {}
    transfers = plan_transfers(nbytes, src, dst, "sendrecv_allgather")
    total = phase_us(transfers, sendrecv)
    if dst.layout == "replicate" and dst.ranks > 1:
        if all_gather is None or all_gather.world_size != dst.ranks:
            raise InvalidOptionError(
                f"resharding into {dst.ranks} replicating ranks needs an all_gather fitted over "
                f"{dst.ranks} ranks, got {all_gather and all_gather.world_size}"
            )
        total += all_gather.time_us(int(nbytes))
        out["broadcast"] = phase_us(plan_transfers(nbytes, src, dst, "broadcast"), sendrecv) / 1e3
    out["sendrecv_allgather"] = total / 1e3
    return out


def cheapest(prices: Mapping[str, float]) -> tuple[str, float]:
    """The method of ``prices`` that takes least, and its time."""
    method = min(prices, key=lambda name: (prices[name], name))
    return method, prices[method]
