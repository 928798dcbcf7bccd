"""From request bodies to the tools' objects: model references resolved (the zoo, then the
store's registered specs), strategies checked, use-case requests built, each refusal naming the
body's field.

Model specs are data: a string names a model and is never read as a path.
"""

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

from ddlsim.data.errors import DdlsimError, one_line
from ddlsim.data.limits import check_limits, check_run
from ddlsim.data.models import check_model_spec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import ZOO
from ddlsim.service.api.errors import BadRequestError
from ddlsim.service.api.schemas import INPUT_FIELDS, Inputs
from ddlsim.simulator.costs import rank_spec

T = TypeVar("T")

# A refusal's message starts with the option it names: "world_size(1) must be ...".
_NAMED = re.compile(r"^(\w+)\(")
# The tools' names of options whose body field is named otherwise.
_BODY_NAMES = {
    "time_limit_s": "time_limit",
    "budget_s": "measure_budget_s",
    "max_iters": "iters",
    "max_warmup": "warmup",
}


def built(build: Callable[[], T], *, body: BaseModel) -> T:
    """``build()``: a use case's request made from ``body``, which checks it.

    Raises:
        BadRequestError: 422 naming the body's field the tools' refusal names (else the body).
    """
    try:
        return build()
    except DdlsimError as exc:
        field = "body"
        named = _NAMED.match(str(exc))
        if named is not None:
            name = _BODY_NAMES.get(named.group(1), named.group(1))
            if name in type(body).model_fields:
                field = f"body.{name}"
        raise BadRequestError(one_line(exc), field=field, status=422) from None


def inputs_of(store: Store, body: Inputs) -> ModelSpec:
    """The body's model with the inputs it asks for."""
    spec = resolve_ref(store, body.model, field="body.model")
    try:
        sized = spec.with_inputs(
            batch_size=body.batch_size, seq_len=body.seq_len, image_size=body.image_size
        )
        check_limits(sized)  # before any graph, profile or run is made of it
    except DdlsimError as exc:
        raise BadRequestError(one_line(exc), field="body", status=422) from None
    return sized


def runs_fit(spec: ModelSpec, rank_batch: int, processes: int) -> None:
    """Refuse a job whose runs would not fit this machine: ``processes`` processes, each
    training ``spec`` at ``rank_batch`` (:func:`ddlsim.data.limits.check_run`)."""
    try:
        check_run(spec.with_inputs(batch_size=rank_batch), processes)
    except DdlsimError as exc:
        raise BadRequestError(one_line(exc), field="body", status=422) from None


def request_json(body: Inputs, spec: ModelSpec, **resolved: Any) -> dict[str, Any]:
    """The body as a queued use case's request JSON (its REST names, which ``from_json`` of
    :mod:`ddlsim.workflows.requests` reads): ``model`` the body's model resolved at its inputs
    (``spec``), and each ``resolved`` field in place of the body's."""
    fields = body.model_dump(exclude=set(INPUT_FIELDS))
    return {**fields, "model": spec.to_dict(), **resolved}


def resolve(store: Store, name: str, *, field: str) -> ModelSpec:
    """A zoo model, else the newest spec registered under ``name``."""
    if name in ZOO:
        return ZOO[name]
    found = [spec for _, spec in store.model_specs(label=name) if spec.name == name]
    if not found:
        raise BadRequestError(
            f"model {name!r} is neither in the zoo nor registered; zoo: {', '.join(ZOO)}",
            field=field,
            status=404,
        )
    return found[-1]


def resolve_ref(store: Store, ref: Any, *, field: str) -> ModelSpec:
    """A model given by name (:func:`resolve`) or as a spec object (:func:`spec_of`)."""
    if isinstance(ref, str):
        return resolve(store, ref, field=field)
    if isinstance(ref, dict):
        return spec_of(ref, field=field)
    raise BadRequestError(
        f"a model is a name or a spec object, got {type(ref).__name__}", field=field, status=422
    )


def spec_of(raw: Any, *, field: str) -> ModelSpec:
    """A model spec object, checked (its class must be one the tools may build)."""
    finite(raw, field=field)
    try:
        spec = ModelSpec.from_dict(raw)
        check_model_spec(spec)
        check_limits(spec)
    except DdlsimError as exc:
        raise BadRequestError(one_line(exc), field=field, status=422) from None
    return spec


def strategy_of(raw: dict[str, Any] | None) -> Strategy:
    """The body's strategy (DDP's defaults when there is none)."""
    if raw is None:
        return Strategy()
    return Strategy.from_dict(strategy_object(raw, field="body.strategy"))


def strategy_object(raw: Any, *, field: str) -> dict[str, Any]:
    """A strategy given as an object, checked, in canonical form."""
    if not isinstance(raw, dict):
        raise BadRequestError(
            f"a strategy is an object, got {type(raw).__name__}", field=field, status=422
        )
    finite(raw, field=field)
    try:
        return Strategy.from_dict(raw).to_dict()
    except DdlsimError as exc:
        raise BadRequestError(one_line(exc), field=field, status=422) from None


def finite(raw: Any, *, field: str) -> None:
    """Refuse NaN and infinities anywhere in ``raw`` (JSON has none; some databases refuse)."""
    try:
        json.dumps(raw, allow_nan=False)
    except ValueError:
        raise BadRequestError(
            "NaN and infinite numbers are not allowed", field=field, status=422
        ) from None


def rank_of(spec: ModelSpec, strategy: Strategy, world_size: int) -> ModelSpec:
    """The spec one rank trains (the whole model on one rank)."""
    return rank_spec(spec, strategy, world_size) if world_size > 1 else spec
