"""Cross-mesh resharding priced by method: which messages cross, how long the busiest link
direction is busy, and the destination's all-gather."""

import pytest

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.resharding import MeshLayout, Transfer, plan_transfers
from ddlsim.simulator.resharding import cheapest, phase_us, price_resharding

MB = 1_000_000
# 8 Gbit/s: one byte a nanosecond, so a message of n bytes takes alpha + n / 1000 us.
LINK = AlphaBeta(collective="sendrecv", world_size=2, alpha_us=10.0, busbw_gbps=8.0)
GATHER2 = AlphaBeta(collective="all_gather", world_size=2, alpha_us=50.0, busbw_gbps=8.0)


def _us(nbytes: float) -> float:
    return 10.0 + nbytes / 1000


def test_shards_into_a_replicating_mesh_cross_once_then_gather() -> None:
    src, dst = MeshLayout(2, "shard"), MeshLayout(2, "replicate")
    assert plan_transfers(4 * MB, src, dst, "sendrecv_allgather") == [
        Transfer(0, 0, 2 * MB, tile=0),
        Transfer(1, 1, 2 * MB, tile=1),
    ]
    prices = price_resharding(4 * MB, src, dst, sendrecv=LINK, all_gather=GATHER2)
    assert prices["sendrecv_allgather"] == pytest.approx(
        (_us(2 * MB) + GATHER2.time_us(4 * MB)) / 1e3
    )
    # Each source broadcasts its half to both destination ranks: two messages up, two down.
    assert prices["broadcast"] == pytest.approx(2 * _us(2 * MB) / 1e3)


def test_a_replicated_source_sends_each_receiver_its_part_from_a_different_rank() -> None:
    src, dst = MeshLayout(2, "replicate"), MeshLayout(2, "shard")
    transfers = plan_transfers(4 * MB, src, dst, "sendrecv_allgather")
    assert sorted((t.src, t.dst) for t in transfers) == [(0, 0), (1, 1)]
    prices = price_resharding(4 * MB, src, dst, sendrecv=LINK)
    assert prices == {"sendrecv_allgather": pytest.approx(_us(2 * MB) / 1e3)}  # no broadcast


def test_meshes_of_different_sizes_cut_tiles_by_both() -> None:
    # 2 shards into 4: four tiles, each destination rank gets one from the source holding it.
    transfers = plan_transfers(4 * MB, MeshLayout(2, "shard"), MeshLayout(4, "shard"), "broadcast")
    assert [(t.src, t.dst, t.nbytes) for t in transfers] == [
        (0, 0, MB),
        (0, 1, MB),
        (1, 2, MB),
        (1, 3, MB),
    ]
    # 4 shards into 2 replicating ranks: each destination receives two tiles, then gathers.
    four = plan_transfers(
        4 * MB, MeshLayout(4, "shard"), MeshLayout(2, "replicate"), "sendrecv_allgather"
    )
    assert [(t.src, t.dst) for t in four] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert phase_us(four, LINK) == pytest.approx(2 * _us(MB))


def test_one_source_rank_broadcasts_the_whole_tensor() -> None:
    transfers = plan_transfers(
        4 * MB, MeshLayout(1, "replicate"), MeshLayout(2, "replicate"), "broadcast"
    )
    assert [(t.src, t.dst, t.nbytes) for t in transfers] == [(0, 0, 4 * MB), (0, 1, 4 * MB)]


def test_the_cheapest_method_and_bad_input() -> None:
    assert cheapest({"broadcast": 2.0, "sendrecv_allgather": 1.5}) == ("sendrecv_allgather", 1.5)
    with pytest.raises(InvalidOptionError, match="needs an all_gather fitted over 2 ranks"):
        price_resharding(MB, MeshLayout(2, "shard"), MeshLayout(2, "replicate"), sendrecv=LINK)
    with pytest.raises(InvalidOptionError, match="mesh layout 'rows' is not supported"):
        MeshLayout(2, "rows")
    with pytest.raises(InvalidOptionError, match="ranks >= 1"):
        MeshLayout(0, "shard")
    with pytest.raises(InvalidOptionError, match="method 'scatter' is not supported"):
        plan_transfers(MB, MeshLayout(2, "shard"), MeshLayout(2, "shard"), "scatter")
