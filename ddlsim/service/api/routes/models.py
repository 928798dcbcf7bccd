"""``/v1/models``: the zoo and the specs registered under a name."""

from typing import Any

from fastapi import APIRouter

from ddlsim.data.zoo import ZOO
from ddlsim.service.api.deps import WRITE, StoreDep
from ddlsim.service.api.errors import BadRequestError
from ddlsim.service.api.inputs import resolve, spec_of
from ddlsim.service.api.schemas import ModelList, ModelPublic, ModelRegistration, Registered

router = APIRouter(prefix="/v1/models", tags=["models"])


# A spec's name and family (and a zoo model's spec_hash) are in its JSON only where set.
@router.get("", response_model_exclude_unset=True)
def list_models(store: StoreDep) -> ModelList:
    """The zoo's models, then the newest spec registered under each other name."""
    zoo = [{**spec.to_dict(), "origin": "zoo"} for spec in ZOO.values()]
    registered = [
        {**spec.to_dict(), "origin": "registered", "spec_hash": spec_hash}
        for spec_hash, spec in store.model_specs()
        if spec.name and spec.name not in ZOO
    ]
    return ModelList.model_validate({"models": zoo + _latest_by_name(registered)})


@router.get("/{name}", response_model_exclude_unset=True)
def get_model(name: str, store: StoreDep) -> ModelPublic:
    """A zoo model, else the newest spec registered as ``name``."""
    return ModelPublic.model_validate(resolve(store, name, field="path.name").to_dict())


@router.post("", status_code=201, dependencies=WRITE)
def register_model(body: ModelRegistration, store: StoreDep) -> Registered:
    """Register a spec under its name (not a zoo model's); a later one of a name wins."""
    spec = spec_of(body.spec, field="body.spec")
    if not spec.name:
        raise BadRequestError("a registered spec needs a 'name'", field="body.spec.name")
    if spec.name in ZOO:
        raise BadRequestError(
            f"name {spec.name!r} is a zoo model's; choose another", field="body.spec.name"
        )
    return Registered(name=spec.name, spec_hash=store.save_model_spec(spec=spec))


def _latest_by_name(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:  # oldest first: a later registration of a name wins
        latest[row["name"]] = row
    return sorted(latest.values(), key=lambda r: r["name"])
