"""The dataset's plan (which jobs, in which order) and its file (export, load)."""

import dataclasses
import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.annotate import with_strategy
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.models import repeated_blocks
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import (
    FusionProfileRecord,
    Store,
    add_graph,
    add_strategy,
    strategy_hash,
)
from ddlsim.data.zoo import ZOO
from ddlsim.simulator.dataset import (
    PARALLEL_COLLECTIVES,
    SETTINGS,
    Dataset,
    KernelEntry,
    LinkFit,
    PlanOptions,
    RunEntry,
    add_session,
    dataset_models,
    drop_done,
    export_dataset,
    layers_pool,
    load_dataset,
    merge_datasets,
    mixed_pool,
    models_of,
    parallel_pool,
    plan_jobs,
    save_dataset,
    strategy_pool,
    with_references,
)
from ddlsim.simulator.train import build_training_set
from tests.data.records import collective_profile, kernel_profile, measurement
from tests.simulator.loaders import assert_refuses_other_files

GraphOf = Callable[[str], IterationGraph]


def _labels_by_family(models: list[ModelSpec]) -> dict[str, set[str]]:
    """Each family's model labels; every model has a family and a label of its own."""
    families: dict[str, set[str]] = {}
    for spec in models:
        assert spec.family is not None
        families.setdefault(spec.family, set()).add(spec.label)
    assert len({s.label for s in models}) == len(models)
    return families


def test_dataset_models_cover_eight_families_in_two_sizes() -> None:
    families = _labels_by_family(dataset_models())
    assert len(families) >= 8
    assert all(len(labels) == 2 for labels in families.values())


# Families kept out of every dataset: they stand for models the simulator has never seen.
RESERVED: tuple[str, ...] = (
    *("distilbert", "mobilenet", "swin", "gpt_neox", "gptneox", "bloom", "deit", "regnet"),
    "pegasus",
)


def test_cpu_v3_models_cover_sixteen_families_none_reserved() -> None:
    models = models_of("cpu-v3")
    families = _labels_by_family(models)
    assert len(families) >= 16
    assert all(len(labels) == 2 for labels in families.values())
    assert all(m in models for m in dataset_models())  # cpu-v2's models stay, same inputs
    for spec in models:
        text = f"{spec.family} {spec.cls}".lower()
        assert not any(name in text for name in RESERVED), spec.label
    assert models_of("cpu-v2") == dataset_models()
    with pytest.raises(InvalidOptionError, match="'cpu-v9' is unknown; allowed: cpu-v2, cpu-v3"):
        models_of("cpu-v9")


def test_mixed_pool_alternates_kinds_and_keeps_every_strategy() -> None:
    data = [Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": k + 1}}) for k in range(5)]
    parallel = [Strategy.from_dict({"parallel": {"fsdp": True}})]
    parallel.append(Strategy.from_dict({"parallel": {"pp": 2, "micro_batches": 2}}))
    mixed = mixed_pool(data, parallel)
    assert mixed == [data[0], data[1], parallel[0], data[2], data[3], parallel[1], data[4]]
    assert mixed_pool([], parallel) == parallel
    assert mixed_pool(data, []) == data


def _run(strategy: Strategy, samples: tuple[float, ...], launch: str) -> RunEntry:
    return RunEntry(
        model=ZOO["mlp"],
        strategy=strategy,
        world_size=2,
        bandwidth="1gbit",
        samples_ms=samples,
        seed=0,
        created_at="",
        extra={"launch_id": launch, "ci95_ms": [min(samples), max(samples)]},
    )


def test_runs_get_the_reference_measured_in_their_launch() -> None:
    bucket = Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": 4}})
    runs = [
        _run(Strategy(), (10.0, 11.0, 12.0), "a"),
        _run(bucket, (8.0, 8.0, 9.0), "a"),
        _run(bucket, (20.0, 21.0, 22.0), "b"),  # a launch without DDP's defaults
    ]
    reference, faster, alone = with_references(runs)
    assert faster.extra["reference_ms"] == 11.0
    assert faster.extra["reference_ci95_ms"] == [10.0, 12.0]
    assert faster.speedup == pytest.approx(11.0 / 8.0)
    assert reference.speedup == 1.0
    assert alone.speedup is None and "reference_ms" not in alone.extra
    assert reference.ci_half_width == pytest.approx(1.0 / 11.0)
    assert dataclasses.replace(alone, extra={}).ci_half_width is None


def _link(world_size: int, busbw_gbps: float) -> LinkFit:
    return LinkFit(
        collective="all_reduce",
        world_size=world_size,
        bandwidth="1gbit",
        alpha_us=100.0,
        busbw_gbps=busbw_gbps,
        r2=1.0,
    )


def test_merged_collections_keep_both_and_count_a_shared_run_once() -> None:
    bucket = Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": 4}})
    first = Dataset(
        runs=(_run(Strategy(), (10.0, 11.0), "a"), _run(bucket, (9.0, 9.0), "a")),
        kernels={},
        links=(_link(2, 0.9), _link(4, 0.8)),
        meta={"note": "first"},
    )
    second = Dataset(
        runs=(_run(bucket, (9.0, 9.0), "a"), _run(bucket, (7.0, 7.0), "b")),
        kernels={},
        links=(_link(2, 0.95),),
        meta={"note": "second"},
    )
    merged = merge_datasets(first, second)
    assert len(merged.runs) == 3
    assert {f.world_size: f.busbw_gbps for f in merged.links} == {2: 0.95, 4: 0.8}
    assert [part["note"] for part in merged.meta["parts"]] == ["first", "second"]
    assert next(r for r in merged.runs if r.extra["launch_id"] == "a" and r.strategy == bucket)
    assert merged.runs[1].extra["reference_ms"] == 10.5


def test_side_by_side_plan_covers_every_kind_at_every_setting() -> None:
    spec = ZOO["gpt2-tiny"].with_inputs(batch_size=8)
    caps = [Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": k}}) for k in (1, 2, 3)]
    fsdp = Strategy.from_dict({"parallel": {"fsdp": True}})
    tp4 = Strategy.from_dict({"parallel": {"tp": 4}})
    options = PlanOptions(per_group=1, side_by_side=True)
    settings = [(2, "1gbit"), (4, "1gbit")]
    jobs = plan_jobs([spec], {spec.label: [*caps, fsdp, tp4]}, settings, options)
    compares = {j["world_size"]: j["strategies"] for j in jobs if j["kind"] == "compare"}
    # in turn each setting would get one cap; FSDP joins both, tp(4) the 4-rank launch only
    assert compares[2] == [caps[0].to_dict(), fsdp.to_dict()]
    assert compares[4] == [caps[1].to_dict(), fsdp.to_dict(), tp4.to_dict()]


def test_a_plan_leaves_out_what_a_dataset_file_holds(zoo_graph: GraphOf) -> None:
    spec = ZOO["mlp"].with_inputs(batch_size=8)
    bucket = Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": 1}})
    fsdp = Strategy.from_dict({"parallel": {"fsdp": True}})
    options = PlanOptions(per_group=2, side_by_side=True, collectives=("all_reduce",))
    jobs = plan_jobs([spec], {spec.label: [bucket, fsdp]}, [(2, "1gbit")], options)
    assert [j["kind"] for j in jobs] == ["collectives", "kernels", "compare"]
    graph = zoo_graph("mlp")  # the zoo's mlp, batch 64: another kernel profile than batch 4
    runs = tuple(
        dataclasses.replace(_run(s, (5.0,), "x"), model=spec) for s in (Strategy(), bucket)
    )
    held = Dataset(
        runs=runs,
        kernels={(spec.label, 64): KernelEntry(graph=graph, node_ms={}, iteration_time_ms=1.0)},
        links=(_link(2, 0.9),),
        meta={},
    )
    # the link is fitted; the kernel profile is at another batch; FSDP was never run
    assert [j["kind"] for j in drop_done(jobs, held)] == ["kernels", "compare"]
    with_fsdp = dataclasses.replace(
        held, runs=(*runs, dataclasses.replace(runs[1], strategy=fsdp))
    )
    assert [j["kind"] for j in drop_done(jobs, with_fsdp)] == ["kernels"]


def test_strategy_pool_is_twenty_valid_strategies(zoo_graph: GraphOf) -> None:
    graph: IterationGraph = zoo_graph("gpt2-tiny")
    pool = strategy_pool(graph.grad_ready_order, repeated_blocks(ZOO["gpt2-tiny"]))
    assert len(pool) == 20
    assert len({s.to_json() for s in pool}) == 20
    assert Strategy() not in pool
    for strategy in pool:  # every bucket plan partitions the gradients
        with_strategy(graph, strategy)
    assert {s.tensor_fusion.dear for s in pool} == {True, False}
    assert any(s.op_fusion.compiled for s in pool)
    assert any(s.parallel.micro_batches == 2 for s in pool)
    assert any(s.tensor_fusion.buckets for s in pool)


def _pools(labels: list[str], size: int = 6) -> dict[str, list[Strategy]]:
    pool = [Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": k + 1}}) for k in range(size)]
    pool.append(Strategy.from_dict({"parallel": {"micro_batches": 2}}))
    return {label: pool for label in labels}


def test_plan_runs_defaults_in_every_group_round_robin() -> None:
    models = [ZOO["mlp"].with_inputs(batch_size=8), ZOO["gpt2-tiny"].with_inputs(batch_size=8)]
    jobs = plan_jobs(models, _pools([m.label for m in models]), options=PlanOptions(per_group=3))
    kinds = [j["kind"] for j in jobs]
    # links first, then kernel profiles, then runs
    assert kinds == sorted(kinds, key=["collectives", "kernels", "run"].index)
    assert sum(k == "collectives" for k in kinds) == len(SETTINGS)
    runs = [j for j in jobs if j["kind"] == "run"]
    first = runs[: len(models) * len(SETTINGS)]
    assert all(j["strategy"] == Strategy().to_dict() and j["seed"] == 0 for j in first)
    groups = len(models) * len(SETTINGS)
    repeats = [j for j in runs if j["seed"] == 1]
    assert len(repeats) == groups // 2
    assert len(runs) == groups * 4 + len(repeats)
    # kernel profiles at every rank micro-batch: 8/2, 8/4, and with two micro-batches 8/8
    batches = {(j["model"]["name"], j["batch_size"]) for j in jobs if j["kind"] == "kernels"}
    assert {b for name, b in batches if name == "mlp"} <= {4, 2, 1}
    assert ("mlp", 4) in batches and ("mlp", 2) in batches


def test_plan_leaves_out_strategies_the_batch_cannot_split() -> None:
    spec = ZOO["mlp"].with_inputs(batch_size=4)
    pool = [Strategy.from_dict({"parallel": {"micro_batches": 4}})]
    jobs = plan_jobs([spec], {spec.label: pool}, settings=[(2, "1gbit")])
    runs = [j for j in jobs if j["kind"] == "run"]
    assert [j["strategy"] for j in runs] == [Strategy().to_dict()]


def test_per_layer_placements_need_a_micro_batch_tp_divides() -> None:
    pool = layers_pool(2)
    assert [s.parallel.layers for s in pool[:4]] == [
        ("tp", "batch"),
        ("batch", "batch"),
        ("replicate", "batch"),
        ("batch", "tp"),
    ]
    assert {s.parallel.tp for s in pool} == {1, 2, 4}  # 1: the staged pipelines
    assert [s.parallel.stages for s in pool[-2:]] == [("tp", "batch")] * 2
    assert layers_pool(1) == []
    spec = ZOO["gpt2-tiny"].with_inputs(batch_size=2)
    jobs = plan_jobs([spec], {spec.label: pool[:2]}, settings=[(2, "1gbit"), (4, "1gbit")])
    runs = [(j["world_size"], j["strategy"]) for j in jobs if j["kind"] in ("run", "compare")]
    placed = [ws for ws, strategy in runs if strategy["parallel"].get("layers")]
    # 2 samples: tp 2 over 2 ranks splits them (dp 1); over 4 ranks each dp rank has 1
    assert placed and set(placed) == {2}
    # a tensor-parallel stage needs two ranks a stage: 4 ranks, never 2
    staged = plan_jobs(
        [spec.with_inputs(batch_size=8)],
        {spec.label: pool[-2:]},
        settings=[(2, "1gbit"), (4, "1gbit")],
    )
    assert {
        j["world_size"]
        for j in staged
        if j["kind"] in ("run", "compare") and j["strategy"]["parallel"].get("stages")
    } == {4}


def test_plan_options_are_checked() -> None:
    with pytest.raises(InvalidOptionError, match=r"per_group\(0\)"):
        PlanOptions(per_group=0)
    with pytest.raises(InvalidOptionError, match=r"rounds\(0\)"):
        PlanOptions(rounds=0)
    with pytest.raises(InvalidOptionError, match=r"ci_target\(1.5\)"):
        PlanOptions(ci_target=1.5)


def test_export_and_load_round_trip(tmp_path: Path, zoo_graph: GraphOf) -> None:
    graph: IterationGraph = zoo_graph("mlp")
    strategy = Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": 1, "dear": True}})
    store = Store.open(f"sqlite:///{tmp_path / 'd.db'}")
    compute = [n.id for n in graph.nodes if n.kind in ("compute", "optimizer")]
    with store.transaction() as session:
        add_graph(session, graph=graph)
        add_strategy(session, strategy=strategy)
    node_ms = {i: 0.1 for i in compute}
    label = graph.model.label
    store.save_kernel_profile(
        profile=kernel_profile(
            graph.graph_hash, model=label, node_ms=node_ms, env={"probe_ms": "4.5000"}
        )
    )
    store.save_collective_profile(profile=collective_profile(world_size=2, busbw_gbps=0.9))
    store.save_measurement(
        measurement=measurement(
            graph.graph_hash,
            strategy_hash(strategy),
            model=label,
            iteration_time_ms=[12.0, 11.0, 13.0],
            env={"seed": 1, "rank_cores": {"0": [0], "1": [1]}, "probe_ms": 5.4},
        )
    )
    timing = {"block": "body.0", "eager_ms": 2.0, "compiled_ms": 1.5, "compile_s": 3.0}
    store.save_fusion_profile(
        profile=FusionProfileRecord(
            graph_hash=graph.graph_hash,
            model=label,
            device="cpu",
            backend="inductor",
            iters=3,
            blocks=[timing],
            env={},
        )
    )
    out = tmp_path / "d.json.gz"
    # only the named models' runs and profiles: another model's store exports nothing
    other = export_dataset(store, tmp_path / "o.json.gz", meta={}, models=[ZOO["gpt2-tiny"]])
    assert other == {"kernels": 0, "fusion": 0, "links": 1, "runs": 0, "runs_left_out": 1}
    counts = export_dataset(store, out, meta={"note": "test"}, models=[graph.model])
    store.close()
    assert counts == {"kernels": 1, "fusion": 1, "links": 1, "runs": 1, "runs_left_out": 0}
    dataset = load_dataset(out)
    (run,) = dataset.runs
    assert run.strategy == strategy and run.model == graph.model
    assert run.measured_ms == 12.0 and run.seed == 1 and run.world_size == 2
    entry = dataset.kernel_for(graph.model)
    assert entry is not None and entry.graph.graph_hash == graph.graph_hash
    assert entry.node_ms == {i: 0.1 for i in compute}
    # the speed probes: the run's compute is replayed 1.2x its profile's
    assert entry.probe_ms == 4.5 and run.speed_ratio(entry) == pytest.approx(1.2)
    assert dataset.links[0].busbw_gbps == 0.9
    assert dataset.meta == {"note": "test"}
    fused = dataset.fusion[(graph.model.label, graph.model.inputs.batch_size)]
    assert fused.blocks == (timing,) and fused.ratios() == {"body.0": 0.75}
    assert dataset.select(exclude=[run.family]).runs == ()


def test_load_refuses_other_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json.gz"
    with gzip.open(bad, "wt") as f:
        json.dump({"format": 99}, f)
    assert_refuses_other_files(load_dataset, bad, format_number=99)


def test_plan_runs_parallel_plans_where_the_world_size_allows() -> None:
    spec = ZOO["gpt2-tiny"].with_inputs(batch_size=8)
    pool = [s for s in parallel_pool() if s.parallel.tp in (1, 4) and s.parallel.pp == 1]
    options = PlanOptions(per_group=len(pool), collectives=PARALLEL_COLLECTIVES)
    jobs = plan_jobs([spec], {spec.label: pool}, options=options)
    links = [j for j in jobs if j["kind"] == "collectives"]
    assert all(set(j["collectives"]) == set(PARALLEL_COLLECTIVES) for j in links)
    tp4 = {
        j["world_size"]
        for j in jobs
        if j["kind"] == "run" and j["strategy"]["parallel"]["tp"] == 4
    }
    assert tp4 == {4}  # four-way tensor parallelism needs four ranks
    fsdp = {
        j["world_size"] for j in jobs if j["kind"] == "run" and j["strategy"]["parallel"]["fsdp"]
    }
    assert fsdp == {2, 4}


def test_plan_profiles_the_compiled_blocks_at_their_micro_batches() -> None:
    spec = ZOO["mlp"].with_inputs(batch_size=8)
    compiled = Strategy.from_dict({"op_fusion": {"compiled": ["body.1", "body.0"]}})
    pool = [compiled, Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": 1}})]
    jobs = plan_jobs([spec], {spec.label: pool}, options=PlanOptions(per_group=2))
    kinds = [j["kind"] for j in jobs]
    assert kinds == sorted(kinds, key=["collectives", "kernels", "fusion", "run"].index)
    fusion = [(j["batch_size"], j["blocks"]) for j in jobs if j["kind"] == "fusion"]
    # the first setting's rank batch (8 / 2) first, then that of the 4-rank runs (8 / 4)
    assert fusion == [(4, ["body.0", "body.1"]), (2, ["body.0", "body.1"])]


def test_a_later_session_replays_from_its_own_profiles(tmp_path: Path, zoo_graph: GraphOf) -> None:
    graph = zoo_graph("mlp")
    timed = [n.id for n in graph.nodes if n.kind in ("compute", "optimizer")]
    key = (graph.model.label, graph.model.inputs.batch_size)

    def collection(node_ms: float, launch: str, busbw_gbps: float) -> Dataset:
        kernel = KernelEntry(
            graph=graph, node_ms=dict.fromkeys(timed, node_ms), iteration_time_ms=1.0
        )
        bucket = Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": 4}})
        runs = tuple(
            dataclasses.replace(_run(s, (10.0, 11.0), launch), world_size=1)
            for s in (Strategy(), bucket)
        )
        return Dataset(
            runs=runs,
            kernels={key: kernel},
            links=(_link(1, busbw_gbps),),
            meta={"note": launch},
        )

    base = collection(0.1, "a", 0.9)
    # The same runs measured again on a machine twice as slow: their own profiles say so.
    later = collection(0.2, "b", 0.5)
    combined = add_session(base, later, "slow", replaces=lambda run: run.strategy != Strategy())
    assert len(combined.runs) == 3  # base's bucket run replaced by the session's runs
    assert combined.source_of(combined.runs[-1]) is combined.sessions["slow"]
    assert combined.source_of(combined.runs[0]) is combined
    out = tmp_path / "s.json.gz"
    save_dataset(combined, out)
    loaded = load_dataset(out)
    assert loaded.sessions["slow"].kernels[key].node_ms == later.kernels[key].node_ms
    assert loaded.sessions["slow"].runs == () and loaded.sessions["slow"].meta == later.meta
    samples = build_training_set(loaded).samples
    by_group: dict[str, list[float]] = {}
    for sample in samples:
        by_group.setdefault(sample.group, []).append(sample.replay_ms)
    (slow,) = (group for group in by_group if group.startswith("slow/"))
    (fast,) = (group for group in by_group if not group.startswith("slow/"))
    assert len(by_group[slow]) == 2 and len(by_group[fast]) == 1
    # DDP's defaults, replayed from each session's own kernel times (twice as long) and link.
    assert by_group[slow][0] > 1.3 * by_group[fast][0]
    with pytest.raises(InvalidOptionError, match="session name 'slow' must be new"):
        add_session(combined, later, "slow", replaces=lambda run: False)
    # A session measured again retires the old one: its runs and profiles leave together.
    again = add_session(combined, later, "slow-2", replaces=lambda run: False, retires=["slow"])
    assert sorted(again.sessions) == ["slow-2"]
    assert [r.extra.get("session") for r in again.runs] == [None, "slow-2", "slow-2"]
    with pytest.raises(InvalidOptionError, match="cannot retire session gone: not in the"):
        add_session(combined, later, "x", replaces=lambda run: False, retires=["gone"])
    stray = dataclasses.replace(base.runs[0], extra={"session": "gone"})
    with pytest.raises(InvalidOptionError, match="names session 'gone'; the dataset holds: none"):
        base.source_of(stray)


def test_a_run_replays_at_the_speed_its_probe_measured(tmp_path: Path, zoo_graph: GraphOf) -> None:
    graph = zoo_graph("mlp")
    timed = [n.id for n in graph.nodes if n.kind in ("compute", "optimizer")]
    key = (graph.model.label, graph.model.inputs.batch_size)
    kernel = KernelEntry(
        graph=graph, node_ms=dict.fromkeys(timed, 0.1), iteration_time_ms=1.0, probe_ms=4.0
    )
    plain = dataclasses.replace(_run(Strategy(), (10.0, 11.0), "a"), world_size=1)
    # the same launch on a machine that probed 1.5x slower, and one from before the probe
    slow = dataclasses.replace(plain, extra={**plain.extra, "probe_ms": 6.0})
    assert slow.speed_ratio(kernel) == pytest.approx(1.5)
    assert plain.speed_ratio(kernel) == 1.0
    assert slow.speed_ratio(dataclasses.replace(kernel, probe_ms=None)) == 1.0
    # rounded to SPEED_STEP: probes within a step replay one graph
    near = dataclasses.replace(plain, extra={**plain.extra, "probe_ms": 4.03})
    assert near.speed_ratio(kernel) == pytest.approx(1.0)
    dataset = Dataset(runs=(plain, slow), kernels={key: kernel}, links=(_link(1, 1.0),), meta={})
    out = tmp_path / "p.json.gz"
    save_dataset(dataset, out)
    loaded = load_dataset(out)
    assert loaded.kernels[key].probe_ms == 4.0
    assert loaded.runs[1].extra["probe_ms"] == 6.0
    fast_sample, slow_sample = build_training_set(loaded).samples
    assert slow_sample.replay_ms == pytest.approx(1.5 * fast_sample.replay_ms, rel=1e-6)
    assert fast_sample.model_key != slow_sample.model_key
