"""GPU-cluster predictions of decoders without a family plan: the tensor-parallel split derived
from their module structure prices like a family's."""

import pytest

from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.plans.tp_plans import PLANS
from ddlsim.workflows.scale import ScaleRequest, predict_at_scale, tp_options

_DIMS = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
}
SPECS = {
    "qwen2": ModelSpec.from_dict(
        {
            "source": "transformers",
            "class": "Qwen2ForCausalLM",
            "config": _DIMS,
            "inputs": {"batch_size": 16, "seq_len": 1024},
        }
    ),
    "nemotron": ModelSpec.from_dict(
        {
            "source": "transformers",
            "class": "NemotronForCausalLM",
            "config": {**_DIMS, "head_dim": 64},
            "inputs": {"batch_size": 16, "seq_len": 1024},
        }
    ),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_tp2_prediction_on_a_dgx_h100(name: str) -> None:
    assert name not in PLANS
    spec = SPECS[name]
    cluster = GpuClusterSpec.parse("dgx-h100:1")
    # 4 key/value heads: tp 1, 2 and 4 split them, 8 does not.
    assert tp_options(spec, cluster) == (1, 2, 4)

    def predict(plan: ScalePlan) -> float:
        request = ScaleRequest(
            model=spec, cluster=cluster, plan=plan, global_batch=16, seq_len=1024
        )
        prediction = predict_at_scale(request)
        assert prediction.fits
        return prediction.iteration_s

    split = predict(ScalePlan(dp=4, tp=2))
    assert 0 < split < 10
    # Sequence parallelism shards the activations between the split modules.
    assert predict(ScalePlan(dp=4, tp=2, sequence_parallel=True)) > 0
