"""The API's schemas, split by direction: request bodies (:mod:`.requests`) and responses
(:mod:`.responses`)."""

from ddlsim.service.api.schemas.requests import (
    INPUT_FIELDS,
    ExecutionRequest,
    GraphRequest,
    Inputs,
    ModelRegistration,
    PredictionRequest,
    ProfilingRun,
    StrategyRequest,
)
from ddlsim.service.api.schemas.responses import (
    Dashboard,
    GraphPublic,
    Health,
    JobList,
    JobPublic,
    ModelList,
    ModelListed,
    ModelPublic,
    PredictionPublic,
    ProfilingRunPublic,
    Registered,
    SimulatorVersions,
)

__all__ = [
    "INPUT_FIELDS",
    "Dashboard",
    "ExecutionRequest",
    "GraphPublic",
    "GraphRequest",
    "Health",
    "Inputs",
    "JobList",
    "JobPublic",
    "ModelList",
    "ModelListed",
    "ModelPublic",
    "ModelRegistration",
    "PredictionPublic",
    "PredictionRequest",
    "ProfilingRun",
    "ProfilingRunPublic",
    "Registered",
    "SimulatorVersions",
    "StrategyRequest",
]
