"""Cross-mesh resharding measured and priced side by side: what ``ddlsim profile reshard`` and
``benchmarks/resharding.py`` run."""

from collections.abc import Callable, Sequence
from typing import Any

from ddlsim.cluster import remove_stale_namespaces
from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.resharding import RESHARD_METHODS, MeshLayout
from ddlsim.data.store import Store
from ddlsim.profiler.resharding import measure_resharding
from ddlsim.simulator.resharding import price_resharding


def link_fit(store: Store, collective: str, world_size: int, bandwidth: str) -> AlphaBeta:
    """The store's latest gloo fit of ``collective`` over ``world_size`` ranks at
    ``bandwidth``; for ``sendrecv`` (one message a rank each way, whatever the ranks) the
    nearest world size's when that one has none.

    Raises:
        InvalidOptionError: no such fit, naming the command that measures it.
    """
    profiles = store.collective_profiles(
        backend="gloo", collective=collective, bandwidth=bandwidth
    )
    fits = [p for p in profiles if p.world_size == world_size]
    if not fits and collective == "sendrecv" and profiles:
        nearest = min({p.world_size for p in profiles}, key=lambda n: (abs(n - world_size), n))
        fits = [p for p in profiles if p.world_size == nearest]
    if not fits:
        raise InvalidOptionError(
            f"the store has no {collective} fit over {world_size} ranks at {bandwidth}: run "
            f"`ddlsim profile collectives --world-size {world_size} --bandwidth {bandwidth}`"
        )
    latest = fits[-1]
    return AlphaBeta(
        collective=collective,
        world_size=latest.world_size,
        alpha_us=latest.alpha_us,
        busbw_gbps=latest.busbw_gbps,
    )


def reshard(
    store: Store,
    src: MeshLayout,
    dst: MeshLayout,
    sizes: Sequence[int],
    *,
    bandwidth: str,
    warmup: int = 2,
    repeats: int = 7,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Each method that differs for these meshes (broadcast only into a replicating
    destination of several ranks), measured side by side at each size, with its price from the
    store's fits: rows ``{"method", "size_bytes", "measured_ms", "times_us", "predicted_ms",
    "error"}``, ``error`` the prediction's relative error.

    Raises:
        InvalidOptionError: a fit the store lacks (before any process starts), bad sizes or
            counts.
        ClusterRunError: a rank failed, or a method delivered wrong values.
    """
    gathers = dst.layout == "replicate" and dst.ranks > 1
    sendrecv = link_fit(store, "sendrecv", src.ranks + dst.ranks, bandwidth)
    gather = link_fit(store, "all_gather", dst.ranks, bandwidth) if gathers else None
    methods = list(RESHARD_METHODS) if gathers else ["sendrecv_allgather"]
    remove_stale_namespaces()
    measured = measure_resharding(
        src,
        dst,
        sizes,
        bandwidth=bandwidth,
        methods=methods,
        warmup=warmup,
        repeats=repeats,
        progress=progress,
    )
    rows = []
    for sample in measured["samples"]:
        prices = price_resharding(
            sample["size_bytes"], src, dst, sendrecv=sendrecv, all_gather=gather
        )
        predicted = prices[sample["method"]]
        rows.append(
            {
                "method": sample["method"],
                "size_bytes": sample["size_bytes"],
                "measured_ms": sample["median_ms"],
                "times_us": sample["times_us"],
                "predicted_ms": predicted,
                "error": predicted / sample["median_ms"] - 1,
            }
        )
    return rows
