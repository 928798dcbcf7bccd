"""Collective models from stored fits, and the micro-batch a rank runs."""

import pytest

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import CollectiveProfileRecord
from ddlsim.data.zoo import ZOO
from ddlsim.simulator.costs import UNSHAPED_GBPS, comm_models, rank_spec, uses_ring

MIB = 1024 * 1024


def _fit(
    collective: str, alpha_us: float, busbw_gbps: float, **kw: object
) -> CollectiveProfileRecord:
    values: dict = {
        "collective": collective,
        "backend": "gloo",
        "world_size": 4,
        "bandwidth": "1gbit",
        "network": "netns",
        "alpha_us": alpha_us,
        "busbw_gbps": busbw_gbps,
        "r2": 1.0,
        "samples": [],
        "rank_cores": {},
        "env": {},
        "id": 7,
    }
    values.update(kw)
    return CollectiveProfileRecord(**values)


def test_fitted_collectives_are_used_and_the_newest_fit_wins() -> None:
    old, new = _fit("all_reduce", 100.0, 0.5, id=1), _fit("all_reduce", 10.0, 0.9, id=2)
    other_link = _fit("all_reduce", 1.0, 9.0, bandwidth="none", id=3)
    models = comm_models(
        [old, new, other_link], world_size=4, bandwidth="1gbit", bandwidth_gbps=1.0, ring=False
    )
    all_reduce = models.models["all_reduce"]
    assert (all_reduce.alpha_us, all_reduce.busbw_gbps) == (10.0, 0.9)
    assert models.sources["all_reduce"] == "all_reduce profile 2"
    # 2(n-1)/n of 1 MiB at 0.9 Gb/s, plus alpha.
    assert all_reduce.time_us(MIB) == pytest.approx(10.0 + 1.5 * MIB * 8 / 0.9e3)


def test_missing_fits_fall_back_to_the_line_rate_and_say_so() -> None:
    models = comm_models([], world_size=2, bandwidth="1gbit", bandwidth_gbps=1.0, ring=False)
    assert models.models["reduce_scatter"].busbw_gbps == 1.0
    assert models.sources["reduce_scatter"] == "line rate 1 Gb/s (no reduce_scatter profile)"
    unshaped = comm_models([], world_size=2, bandwidth="none", bandwidth_gbps=None, ring=False)
    assert unshaped.models["all_reduce"].busbw_gbps == UNSHAPED_GBPS


def test_dear_ring_is_modelled_from_send_recv() -> None:
    send_recv = _fit("sendrecv", 200.0, 0.95)
    models = comm_models(
        [send_recv], world_size=4, bandwidth="1gbit", bandwidth_gbps=1.0, ring=True
    )
    scatter = models.models["reduce_scatter"]
    # Three steps of a quarter of the buffer each: 3 * (alpha + (MiB / 4) / bandwidth).
    assert scatter.time_us(MIB) == pytest.approx(3 * (200.0 + MIB / 4 * 8 / 0.95e3))
    assert models.sources["all_gather"] == "sendrecv profile 7"
    assert models.sources["all_reduce"].startswith("line rate")


def test_dear_ring_uses_its_own_fits_where_measured() -> None:
    send_recv = _fit("sendrecv", 200.0, 0.95)
    ring = _fit("ring_reduce_scatter", 900.0, 0.5, id=9)
    models = comm_models(
        [send_recv, ring], world_size=4, bandwidth="1gbit", bandwidth_gbps=1.0, ring=True
    )
    scatter = models.models["reduce_scatter"]
    # The ring's own fit, whole: (n - 1) / n of the buffer at its bus bandwidth, its latency
    # not multiplied by the steps.
    assert scatter.time_us(MIB) == pytest.approx(900.0 + 0.75 * MIB * 8 / 0.5e3)
    assert models.sources["reduce_scatter"] == "ring_reduce_scatter profile 9"
    # The all-gather has no ring fit of its own: send/recv steps still.
    assert models.sources["all_gather"] == "sendrecv profile 7"
    # Without DeAR's ring, the ring's fits are not used for the backend's reduce-scatter.
    plain = comm_models(
        [send_recv, ring], world_size=4, bandwidth="1gbit", bandwidth_gbps=1.0, ring=False
    )
    assert plain.sources["reduce_scatter"].startswith("line rate")


def test_ring_follows_the_strategy_and_backend() -> None:
    dear = Strategy.from_dict({"tensor_fusion": {"dear": True}})
    native = Strategy.from_dict({"tensor_fusion": {"dear": True, "reduce_scatter": "native"}})
    assert uses_ring(dear, "gloo") and not uses_ring(dear, "nccl")
    assert not uses_ring(native, "gloo") and not uses_ring(Strategy(), "gloo")


def test_rank_spec_takes_the_micro_batch() -> None:
    spec = ZOO["gpt2-tiny"].with_inputs(batch_size=8)
    plan = Strategy.from_dict({"parallel": {"micro_batches": 2}})
    assert rank_spec(spec, plan, world_size=2).inputs.batch_size == 2
    assert rank_spec(spec, Strategy(), world_size=1).inputs.batch_size == 8
    with pytest.raises(InvalidStrategyError, match=r"batch_size\(8\) is not divisible by dp\(8\)"):
        rank_spec(spec, plan, world_size=8)


def test_a_collective_without_a_fit_takes_the_all_reduce_fit_not_a_free_latency() -> None:
    all_reduce = _fit("all_reduce", 400.0, 0.9)
    models = comm_models(
        [all_reduce], world_size=4, bandwidth="1gbit", bandwidth_gbps=1.0, ring=True
    )
    for op in ("reduce_scatter", "all_gather", "sendrecv"):
        model = models.models[op]
        assert (model.alpha_us, model.busbw_gbps) == (400.0, 0.9)
    # DeAR's ring without its fits or send/recv's: the all-reduce's latency a bucket
    assert models.sources["reduce_scatter"] == "all_reduce profile 7 (no sendrecv profile)"
    # half an all-reduce's bytes: (n - 1) / n of the buffer
    scatter = models.models["reduce_scatter"].time_us(MIB)
    assert scatter == pytest.approx(400.0 + 0.75 * MIB * 8 / 0.9e3)
    plain = comm_models(
        [all_reduce], world_size=4, bandwidth="1gbit", bandwidth_gbps=1.0, ring=False
    )
    assert plain.sources["all_gather"] == "all_reduce profile 7 (no all_gather profile)"
