"""FSDP2's and DTensor's costs, measured in one process on a world of one rank."""

import pytest
import torch.distributed as dist

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.zoo import ZOO
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
