"""Users' clusters: collectives measured under torchrun per fabric level and stored; a GPU
cluster profile fitted to measured all-reduce gives the measured bus bandwidth back, and
``--cluster NAME`` prices with it."""

import json
import subprocess
from pathlib import Path

import pytest

from ddlsim.data.errors import InvalidClusterError, InvalidOptionError
from ddlsim.data.specs.gpu_cluster import preset
from ddlsim.data.store import Store
from ddlsim.profiler.collective_fit import CollectiveProfile, fit_latency_bandwidth, make_sample
from ddlsim.simulator.gpu.nccl import Group, NcclModel, fitted_cluster
from ddlsim.workflows.clusters import (
    CollectivesRequest,
    Measured,
    cluster_from,
    resolve_cluster,
)
from tests.torchrun import BIN, torchrun_agents


def test_collectives_under_torchrun_are_fitted_per_level_and_stored(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'store.db'}"
    outputs = torchrun_agents(
        [
            "profile",
            "collectives",
            "--launcher",
            "env",
            "--backend",
            "gloo",
            "--sizes",
            "16k,256k",
            "--repeats",
            "2",
            "--collectives",
            "all_reduce",
            "all_gather",
            "sendrecv",
            "--json",
        ],
        nodes=2,
        nproc=2,
        env={"DDLSIM_DB": db},
    )
    printed = [json.loads(out) for out in outputs if out.strip()]
    assert len(printed) == 1, "rank 0 alone reports"
    report = printed[0]
    assert report["nodes"] == 2 and report["gpus_per_node"] == 2
    levels = report["levels"]
    assert set(levels) == {"node", "cluster"}
    assert {f["collective"] for f in levels["node"]["fits"]} == {"all_reduce", "all_gather"}
    assert {f["collective"] for f in levels["cluster"]["fits"]} == {
        "all_reduce",
        "all_gather",
        "sendrecv",
    }
    assert levels["node"]["world_size"] == 2 and levels["cluster"]["world_size"] == 4
    with Store.open(db) as store:
        stored = store.collective_profiles()
    assert sorted((p.bandwidth, p.collective) for p in stored) == [
        ("env:cluster", "all_gather"),
        ("env:cluster", "all_reduce"),
        ("env:cluster", "sendrecv"),
        ("env:node", "all_gather"),
        ("env:node", "all_reduce"),
    ]
    assert len(report["ids"]) == 5


def _profile(level: str, size: int, busbw_gbytes: float, alpha_us: float) -> CollectiveProfile:
    factor = 2 * (size - 1) / size
    sizes = [2**20, 2**26, 2**30]
    samples = [
        make_sample(
            "all_reduce", b, [alpha_us + factor * b / (busbw_gbytes * 1e3)] * 3, world_size=size
        )
        for b in sizes
    ]
    fit = fit_latency_bandwidth(samples, world_size=size, backend="nccl", bandwidth=level)
    return CollectiveProfile(
        fits=(fit,),
        samples=tuple(samples),
        network="env",
        backend="nccl",
        world_size=size,
        bandwidth=level,
        rank_cores={},
    )


def test_a_cluster_fitted_to_measured_all_reduce_gives_it_back() -> None:
    measured = Measured(
        profiles={
            "node": _profile("env:node", 8, 300.0, 40.0),
            "cluster": _profile("env:cluster", 32, 160.0, 90.0),
        },
        nodes=4,
        gpus_per_node=8,
        device_name="NVIDIA H100 80GB HBM3",
    )
    cluster = cluster_from(measured, name="ours")
    assert cluster.gpu == preset("dgx-h100").gpu, "the GPU recognised from its name"
    model = NcclModel(cluster)
    assert model.busbw_gbps("all_reduce", Group(8, 8)) == pytest.approx(300.0, rel=1e-6)
    assert model.busbw_gbps("all_reduce", Group(32, 8)) == pytest.approx(160.0, rel=1e-6)
    ring_steps_alpha = model.latency_us("all_reduce", Group(8, 8))
    assert ring_steps_alpha == pytest.approx(40.0, rel=1e-6)
    assert model.latency_us("all_reduce", Group(32, 8)) == pytest.approx(90.0, rel=1e-6)
    for nodes, alpha in ((2, 50.0), (4, 60.0), (16, 120.0)):
        fitted = cluster_from(
            Measured(
                profiles={
                    "node": _profile("env:node", 8, 300.0, 20.0),
                    "cluster": _profile("env:cluster", 8 * nodes, 160.0, alpha),
                },
                nodes=nodes,
                gpus_per_node=8,
                device_name="NVIDIA H100 80GB HBM3",
            ),
            name="ours",
        )
        got = NcclModel(fitted).latency_us("all_reduce", Group(8 * nodes, 8))
        assert got == pytest.approx(alpha, rel=1e-6), (nodes, got)
    unknown = Measured(
        profiles=measured.profiles, nodes=4, gpus_per_node=8, device_name="Some GPU"
    )
    with pytest.raises(InvalidOptionError, match="not one of the presets'"):
        cluster_from(unknown, name="x")


def test_a_stored_cluster_profile_is_a_cluster_for_predict_and_search(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    cluster = fitted_cluster(
        preset("dgx-h100"),
        name="ours",
        nodes=2,
        gpus_per_node=8,
        node_busbw_gbps=300.0,
        node_alpha_us=40.0,
        cluster_busbw_gbps=150.0,
        cluster_alpha_us=80.0,
    )
    with Store.open(url) as store:
        store.save_cluster_profile(name="ours", spec=cluster.to_dict(), measured={})
    assert resolve_cluster("ours", url) == cluster
    assert resolve_cluster("ours:16", url).nodes == 16
    assert resolve_cluster("dgx-h100:2", url).name == "dgx-h100"
    with pytest.raises(InvalidClusterError, match="or a stored cluster profile: ours"):
        resolve_cluster("theirs", url)
    done = subprocess.run(
        [
            str(BIN / "ddlsim"),
            "predict",
            "gpt2-tiny",
            "--cluster",
            "ours:1",
            "--batch-size",
            "8",
            "--plan",
            '{"parallel": {"dp": 8}}',
            "--json",
            "--db",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["cluster"]["name"] == "ours"


def test_a_named_profile_needs_nccl_and_a_proper_name() -> None:
    with pytest.raises(InvalidOptionError, match="measure it with backend 'nccl'"):
        CollectivesRequest(backend="gloo", name="ours")
    with pytest.raises(InvalidOptionError, match="not a preset"):
        CollectivesRequest(name="dgx-h100")
