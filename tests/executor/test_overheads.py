"""FSDP2's and DTensor's costs, and a gradient bucket's, measured in one process on a world of
one rank."""

import pytest
import torch.distributed as dist

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.models import build_model
from ddlsim.data.zoo import ZOO
from ddlsim.executor.bucket_overheads import measure_bucket_overheads
from ddlsim.executor.overheads import measure_plan_overheads


def test_plan_overheads_count_groups_modules_and_leave_no_group_behind() -> None:
    spec = ZOO["bert-tiny"].with_inputs(batch_size=2, seq_len=16)
    result = measure_plan_overheads(spec, iterations=1, warmup=0)
    # BERT's two layers are FSDP groups, and the root one more; each layer splits its query,
    # key, value, attention output, intermediate and output projections.
    assert result["fsdp_groups"] == 3
    assert result["tp_modules"] >= 12
    for key in (
        "fsdp_us_per_group",
        "fsdp_step_us_per_param",
        "tp_us_per_module",
        "tp_step_us_per_param",
    ):
        assert result[key] >= 0.0
    assert result["eager_us"] > 0 and result["optimizer_us"] > 0
    assert not dist.is_initialized()


def test_a_model_without_a_tensor_parallel_plan_is_refused() -> None:
    with pytest.raises(InvalidOptionError, match="no tensor-parallel plan"):
        measure_plan_overheads(ZOO["resnet-18"], iterations=1)
    with pytest.raises(InvalidOptionError, match="iterations"):
        measure_plan_overheads(ZOO["bert-tiny"], iterations=0)


def test_bucket_overheads_compare_one_bucket_with_one_a_parameter() -> None:
    spec = ZOO["mlp"].with_inputs(batch_size=4)
    result = measure_bucket_overheads(spec, iterations=2, warmup=1)
    params = sum(1 for p in build_model(spec).parameters() if p.requires_grad)
    # the hooks' partitions are given; DDP's buckets are counted from what it launched
    assert result["buckets"] == {
        "hooks_one": 1,
        "hooks_many": params,
        "ddp_one": 1,
        "ddp_many": params,
    }
    assert result["hooks_us_per_bucket"] >= 0 and result["ddp_us_per_bucket"] >= 0
    assert all(us > 0 for us in result["step_us"].values())
    assert not dist.is_initialized()
    with pytest.raises(InvalidOptionError, match="iterations"):
        measure_bucket_overheads(spec, iterations=0)
