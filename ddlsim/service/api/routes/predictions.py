"""``/v1/predictions`` and ``/v1/simulator/versions``: predictions answered at once, from the
store's kernel profiles (a missing one is a 409: a profiling run takes it)."""

from fastapi import APIRouter

from ddlsim.plans.feasibility import check, run_target
from ddlsim.service.api.cluster_inputs import refused
from ddlsim.service.api.deps import WRITE, PredictorDep, StoreDep
from ddlsim.service.api.inputs import built, inputs_of, strategy_of
from ddlsim.service.api.schemas import PredictionPublic, PredictionRequest, SimulatorVersions
from ddlsim.simulator.cost_model import COST_MODEL_VERSION, SIMULATOR_VERSION
from ddlsim.workflows.requests import PredictRequest

router = APIRouter(prefix="/v1", tags=["predictions"])


@router.post("/predictions", dependencies=WRITE)
def prediction(
    body: PredictionRequest, store: StoreDep, predictor: PredictorDep
) -> PredictionPublic:
    """The strategy's predicted iteration time on the ranks and link asked for."""
    spec = inputs_of(store, body)
    strategy = strategy_of(body.strategy)
    refused(
        lambda: check(spec, strategy, run_target(body.world_size, "cpu")), field="body.strategy"
    )
    request = built(
        lambda: PredictRequest(
            model=spec,
            strategy=strategy,
            world_size=body.world_size,
            bandwidth=body.bandwidth,
            profile_missing=False,
            simulator=predictor.simulator,
        ),
        body=body,
    )
    predicted, profile = predictor.predict(request)
    return PredictionPublic.model_validate(
        {
            "model": spec.label,
            "world_size": request.world_size,
            "strategy": strategy.to_dict(),
            "kernel_profile_id": profile.id,
            **predicted.to_json(),
        }
    )


@router.get("/simulator/versions")
def versions(predictor: PredictorDep) -> SimulatorVersions:
    """The simulator's versions and the cost model's checkpoint."""
    return SimulatorVersions(
        simulator=SIMULATOR_VERSION,
        cost_model=COST_MODEL_VERSION,
        checkpoint=predictor.checkpoint_meta(),
    )
