"""Which of a model's saved activations tensor parallelism splits, by the module that saves them.

The peak-memory model (:mod:`ddlsim.simulator.memory_timeline`) sums what autograd saves by
module (:mod:`ddlsim.profiler.saved`); under a family's tensor-parallel plan
(:mod:`ddlsim.plans.tp_plans`) the tensors saved between a column-split and a row-split
projection are split over the ranks, the rest kept whole.
"""

import functools
import json

import torch

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.models import build_model
from ddlsim.data.specs.model import ModelSpec
from ddlsim.plans.tp_plans import TensorParallelPlan, matches, tp_plan


def activation_split_paths(spec: ModelSpec) -> frozenset[str]:
    """The module paths whose saved tensors tensor parallelism splits (``spec``'s family plan):
    its row-split projections (their inputs are split), its attention modules (the heads are
    split), the modules that hold column-split projections (a gated MLP multiplies their split
    outputs) and the modules without parameters of their own beside one (the MLP's
    activation, whose input is split). Empty for a model without a plan."""
    plan = _plan(spec)
    if plan is None:
        return frozenset()
    return _split_paths(json.dumps(spec.to_dict(), sort_keys=True))


@functools.lru_cache(maxsize=64)
def _split_paths(spec_json: str) -> frozenset[str]:
    spec = ModelSpec.from_dict(json.loads(spec_json))
    plan = tp_plan(spec)
    with torch.device("meta"):
        model = build_model(spec)
    modules = dict(model.named_modules())
    colwise = [p for p in modules if p and _style(plan, p) == "colwise"]
    beside = {p.rpartition(".")[0] for p in colwise}
    found = set()
    for path, module in modules.items():
        if not path:
            continue
        own = next(module.parameters(recurse=False), None)
        parent = path.rpartition(".")[0]
        if (
            _style(plan, path) == "rowwise"
            or matches(plan.attention, path)
            or path in beside
            or (own is None and parent in beside and _style(plan, path) is None)
        ):
            found.add(path)
    return frozenset(found)


def _plan(spec: ModelSpec) -> TensorParallelPlan | None:
    try:
        return tp_plan(spec)
    except InvalidStrategyError:
        return None


def _style(plan: TensorParallelPlan, path: str) -> str | None:
    for pattern, style in plan.modules.items():
        if matches(pattern, path):
            return style
    return None
