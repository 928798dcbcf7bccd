"""The GPU dataset's plan: sixteen families none reserved, jobs a worker accepts, lease order."""

import pytest

from ddlsim.data.limits import SpecLimits
from ddlsim.data.specs.strategy import Strategy
from ddlsim.profiler.batch import Job, on_device, parse_batch_data
from ddlsim.simulator.dataset import models_of
from ddlsim.simulator.dataset.gpu_plan import SIDE_BY_SIDE, gpu_models, gpu_plan
from ddlsim.workflows.profile import check_job
from tests.simulator.test_dataset import RESERVED


def test_sixteen_families_one_model_each_none_reserved() -> None:
    models = gpu_models()
    families = [spec.family for spec in models]
    assert len(set(families)) == len(families) == 16
    for spec in models:
        text = f"{spec.family} {spec.cls}".lower()
        assert not any(name in text for name in RESERVED), spec.label
    assert models_of("gpu-v1") == models
    # The 7B decoders keep their layer's shapes with two layers.
    cut = {spec.label: spec for spec in models}["mistral-7b-2l"]
    assert cut.config["num_hidden_layers"] == 2


def test_plan_is_a_batch_the_worker_accepts_in_lease_order() -> None:
    jobs = parse_batch_data({"jobs": gpu_plan()})
    assert len(jobs) == 80
    # the lent GPU machines have 128 GiB: half of it is the limit a run's processes may take there
    gpu_host = SpecLimits(max_run_bytes=64 * 2**30)
    for job in on_device(jobs, "cpu"):
        check_job(job, gpu_host)  # raises on a setting a worker would refuse
    kinds = [job.kind for job in jobs]
    # every family's profiles at its zoo batch first, in both precisions, then the launches
    first = jobs[:32]
    assert kinds[:32] == ["kernels"] * 32 and kinds[32:48] == ["compare"] * 16
    assert {job.settings["precision"] for job in first} == {"fp32", "bf16"}
    zoo_batch = {spec.label: spec.inputs.batch_size for spec in gpu_models()}
    for job in first:
        model = job.settings["model"]
        label = model if isinstance(model, str) else model["name"]
        assert job.settings["batch_size"] == zoo_batch[label]
    for job in jobs[48:]:
        model = job.settings["model"]
        label = model if isinstance(model, str) else model["name"]
        assert job.settings["batch_size"] == 2 * zoo_batch[label]
    # each launch: DDP's defaults (added by the runner) beside bf16, compiled and both
    strategies = [Strategy.from_dict(raw) for raw in SIDE_BY_SIDE]
    assert {(s.precision, s.compile) for s in strategies} == {
        ("bf16", False),
        ("fp32", True),
        ("bf16", True),
    }
    assert all(job.settings["world_size"] == 1 for job in jobs[32:48])


def test_on_device_moves_model_jobs_only_and_keys_them_apart() -> None:
    jobs = [
        Job(kind="kernels", settings={"model": "mlp"}),
        Job(kind="kernels", settings={"model": "mlp", "device": "cpu"}),
        Job(kind="compare", settings={"model": "mlp", "strategies": [{}]}),
        Job(kind="fusion", settings={"model": "mlp"}),
        Job(kind="collectives", settings={"world_size": 2}),
    ]
    moved = on_device(jobs, "cuda")
    # the two kernels jobs become one; fusion and collectives jobs stay as they were
    assert [job.kind for job in moved] == ["kernels", "compare", "fusion", "collectives"]
    assert [job.settings.get("device") for job in moved] == ["cuda", "cuda", None, None]
    assert moved[0].key != jobs[0].key and moved[2].key == jobs[3].key
    with pytest.raises(Exception, match="device 'tpu' is not supported; allowed: cpu, cuda"):
        on_device(jobs, "tpu")


def test_a_kernel_profile_precision_it_cannot_run_is_refused_by_name() -> None:
    job = Job(kind="kernels", settings={"model": "mlp", "precision": "fp16"})
    with pytest.raises(Exception, match="precision 'fp16' is not supported in a kernel profile"):
        check_job(job)
