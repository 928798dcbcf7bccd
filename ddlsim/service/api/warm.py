"""What the service loads as it starts, so that its first request is as fast as the next.

Without it, the first request that checks a model spec imports transformers' modelling code
and the model family's module (transformers imports them lazily; scipy comes with them), the
first prediction loads the cost model, and the first GPU-cluster prediction captures on fake
tensors for the first time: 2.3 s for the first refusal of an oversized spec on this machine,
0.02 s for the next.
"""

from ddlsim.data.limits import check_limits
from ddlsim.data.models import check_model_spec, import_transformers
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.data.zoo import ZOO
from ddlsim.service.api.predictor import Predictor
from ddlsim.workflows.scale import ScaleRequest, predict_at_scale

WARM_MODEL = "gpt2-tiny"
"""The zoo model whose checks and GPU-cluster prediction run once at start."""


def warm_up(predictor: Predictor) -> None:
    """Import every zoo family's transformers module, check :data:`WARM_MODEL` as a request's
    model is checked, load ``predictor``'s cost model and price the model on one DGX node."""
    transformers = import_transformers()
    for spec in ZOO.values():
        if spec.source == "transformers":
            getattr(transformers, spec.cls)
    model = ZOO[WARM_MODEL]
    check_model_spec(model)
    check_limits(model)
    predictor.cost_model()
    cluster = GpuClusterSpec.parse("dgx-h100:1")
    predict_at_scale(
        ScaleRequest(
            model=model,
            cluster=cluster,
            plan=ScalePlan(dp=cluster.world_size),
            global_batch=cluster.world_size,
            seq_len=model.inputs.seq_len or 128,
        )
    )
