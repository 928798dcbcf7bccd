"""What large GPU runs use (issue 38): overlap with contention, NVLink SHARP, context
parallelism, ZeRO stages, Transformer Engine's kernels, a power-capped GPU's clock and the
search limited to what a framework offers."""

import dataclasses

import pytest

from ddlsim.data.errors import InvalidClusterError, InvalidStrategyError
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec, preset
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.data.specs.strategy import Strategy
from ddlsim.plans.runnable import check_paper_only
from ddlsim.search.scale_plans import ScaleSpace, SpaceLimits, layouts
from ddlsim.simulator.gpu.memory import weight_bytes
from ddlsim.simulator.gpu.nccl import Group, NcclModel
from ddlsim.simulator.gpu.overlap import CONTENTION, decomposed_tp_ms, exposed_ms, overlapped_ms
from ddlsim.simulator.gpu.prediction import ScalePrediction
from ddlsim.workflows.scale import ScaleRequest, predict_at_scale

LLAMA = ModelSpec.from_dict(
    {
        "source": "transformers",
        "class": "LlamaForCausalLM",
        "config": {
            "hidden_size": 512,
            "intermediate_size": 1376,
            "num_hidden_layers": 8,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "vocab_size": 4096,
            "max_position_embeddings": 4096,
        },
        "inputs": {"batch_size": 1, "seq_len": 4096},
    }
)


def _predict(
    plan: ScalePlan, *, cluster: str = "dgx-h100:1", seq_len: int = 4096
) -> ScalePrediction:
    return predict_at_scale(
        ScaleRequest(
            model=LLAMA,
            cluster=GpuClusterSpec.parse(cluster),
            plan=plan,
            global_batch=16,
            seq_len=seq_len,
        )
    )


def test_overlap_costs_the_contention() -> None:
    # Communication shorter than the compute slows it by the contention while it runs.
    assert overlapped_ms(10.0, 4.0) == pytest.approx(10.0 + CONTENTION * 4.0)
    # Longer communication is the time.
    assert overlapped_ms(2.0, 10.0) == pytest.approx(10.0)
    assert exposed_ms(10.0, 0.0) == 0.0
    # Decomposed TP: one step in tp stays exposed, the rest hides behind the matmuls.
    hidden = decomposed_tp_ms(8.0, 100.0, 8)
    assert 1.0 < hidden < 8.0
    assert decomposed_tp_ms(8.0, 100.0, 1) == 0.0


def test_nvls_speeds_all_reduce_of_a_whole_h100_node_only() -> None:
    h100 = NcclModel(preset("dgx-h100"))
    ring = 450 * 0.8
    assert h100.busbw_gbps("all_reduce", Group(8, 8)) == pytest.approx(480.0)
    # Four GPUs or fewer: no gain (NVIDIA/nccl issue 1455); six: between.
    assert h100.busbw_gbps("all_reduce", Group(4, 4)) == pytest.approx(ring)
    assert ring < h100.busbw_gbps("all_reduce", Group(6, 6)) < 480.0
    assert h100.busbw_gbps("all_gather", Group(8, 8)) == pytest.approx(ring)
    a100 = NcclModel(preset("dgx-a100-80g"))
    assert a100.busbw_gbps("all_reduce", Group(8, 8)) == pytest.approx(300 * 0.8)
    with pytest.raises(InvalidClusterError, match="nvls_gbps must be a number >= 0"):
        dataclasses.replace(preset("dgx-h100"), nvls_gbps=-1.0)


def test_context_parallelism_splits_the_sequence() -> None:
    plain = _predict(ScalePlan(dp=8, micro_batches=2))
    split = _predict(ScalePlan(dp=4, cp=2, micro_batches=4))
    # Each rank keeps half of each sequence's activations.
    assert split.memory.activations < 0.6 * plain.memory.activations
    assert split.tokens_per_s_per_gpu > 0 and split.fits
    # The ring's exposed sends land in the node's column.
    assert split.breakdown_ms["exposed_comm_node"] > 0
    gathered = _predict(ScalePlan(dp=4, cp=2, cp_comm="all_gather", micro_batches=4))
    assert gathered.iteration_s > 0
    with pytest.raises(InvalidStrategyError, match=r"seq_len\(4098\) must be a multiple of 2"):
        _predict(ScalePlan(dp=4, cp=2, micro_batches=1), seq_len=4098)
    with pytest.raises(InvalidStrategyError, match=r"cp\(2\) != world_size\(8\)"):
        _predict(ScalePlan(dp=8, cp=2, micro_batches=1))


def test_zero_stages_shard_what_they_say() -> None:
    params, block = 10**9, 10**7

    def per_param(**kw: object) -> float:
        return weight_bytes(ScalePlan(dp=8, **kw), params, block) / params  # type: ignore[arg-type]

    assert per_param() == 18.0
    assert per_param(zero=1) == per_param(distributed_optimizer=True) == 4.0 + 12.0 / 8
    assert per_param(zero=2) == 2.0 + 14.0 / 8
    assert per_param(fsdp=True) < per_param(zero=2)
    # Sharded optimizers reduce-scatter and gather instead of all-reducing: same traffic, a
    # smaller step.
    ddp = _predict(ScalePlan(dp=8, micro_batches=2))
    zero1 = _predict(ScalePlan(dp=8, micro_batches=2, zero=1))
    assert zero1.memory.weights_and_optimizer < ddp.memory.weights_and_optimizer
    assert zero1.breakdown_ms["optimizer"] < ddp.breakdown_ms["optimizer"]
    with pytest.raises(InvalidStrategyError, match=r"parallel.zero\(1\) and parallel.fsdp"):
        ScalePlan(dp=8, zero=1, fsdp=True)


def test_transformer_engine_fuses_fp8_casts() -> None:
    plan = ScalePlan(dp=4, tp=2, sequence_parallel=True, micro_batches=2, precision="fp8")
    torch_fp8 = _predict(plan)
    te_fp8 = _predict(dataclasses.replace(plan, kernels="transformer_engine"))
    assert te_fp8.iteration_s < torch_fp8.iteration_s
    assert te_fp8.memory.activations < torch_fp8.memory.activations
    assert "te" in dataclasses.replace(plan, kernels="transformer_engine").label()
    strategy = dataclasses.replace(plan, kernels="transformer_engine").to_strategy()
    assert Strategy.from_dict(strategy.to_dict()).kernels == "transformer_engine"
    assert "kernels" not in plan.to_strategy().to_dict()
    bf16 = dataclasses.replace(strategy, precision="bf16")
    with pytest.raises(InvalidStrategyError, match="kernels 'transformer_engine' is priced"):
        check_paper_only(bf16)
    with pytest.raises(InvalidStrategyError, match="kernels 'triton' is not supported"):
        Strategy(kernels="triton")


def test_mfu_and_flops_convention() -> None:
    prediction = _predict(ScalePlan(dp=8, micro_batches=2, recompute="full"))
    assert prediction.model_tflops_per_gpu < prediction.tflops_per_gpu
    peak = preset("dgx-h100").gpu.peak_tflops["bf16"]
    assert prediction.mfu == pytest.approx(prediction.model_tflops_per_gpu / peak)


def test_a_power_capped_clock_slows_compute_not_memory() -> None:
    capped = preset("grand-teton-h100")
    gpu = capped.gpu
    assert gpu.peak("bf16") == pytest.approx(989.4 * gpu.clock_mhz / gpu.peak_clock_mhz)  # type: ignore[operator]
    assert gpu.hbm_gbps == 2400.0
    slower = dataclasses.replace(capped, gpu=dataclasses.replace(gpu, clock_mhz=900.0))
    assert slower.gpu.peak("bf16") < gpu.peak("bf16")
    assert GpuClusterSpec.from_dict(capped.to_dict()) == capped
    with pytest.raises(
        InvalidClusterError, match=r"clock_mhz and gpu\.peak_clock_mhz go together"
    ):
        dataclasses.replace(gpu, peak_clock_mhz=None)
    fast = _predict(ScalePlan(dp=8, micro_batches=2), cluster="grand-teton-h100:1")
    request = ScaleRequest(
        model=LLAMA,
        cluster=slower,
        plan=ScalePlan(dp=8, micro_batches=2),
        global_batch=16,
        seq_len=4096,
    )
    assert predict_at_scale(request).iteration_s > fast.iteration_s


def test_search_keeps_to_what_the_framework_offers() -> None:
    space = ScaleSpace(
        gpus=16, gpus_per_node=8, layers=8, tp_options=(1, 2), global_batch=16, seq_len=8192
    )
    every = list(layouts(space))
    assert any(plan.cp > 1 for plan in every)
    assert any(plan.distributed_optimizer for plan in every)
    limited = list(
        layouts(
            dataclasses.replace(
                space,
                limits=SpaceLimits(
                    recompute=("full",), sharding=("none",), cp=(1,), sequence_parallel=False
                ),
            )
        )
    )
    assert limited and all(
        plan.recompute == "full"
        and not plan.fsdp
        and not plan.distributed_optimizer
        and plan.cp == 1
        and not plan.sequence_parallel
        for plan in limited
    )
    with pytest.raises(InvalidStrategyError, match="search space sharding 'zero9' is not one"):
        SpaceLimits(sharding=("zero9",))
    with pytest.raises(InvalidStrategyError, match="unknown key 'tp'"):
        SpaceLimits.from_dict({"tp": [1]})
