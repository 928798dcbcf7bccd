"""``/v1/published``: published training runs on GPU clusters set against ddlsim's predictions
of them (:mod:`ddlsim.workflows.published`, as ``benchmarks/published.py`` predicts them).

A file's predictions take seconds the first time; the service keeps them in memory until the
file changes.
"""

from typing import Annotated

from fastapi import APIRouter
from pydantic import Field

from ddlsim.service.api.deps import PredictorDep
from ddlsim.service.api.errors import BadRequestError
from ddlsim.service.api.schemas import PublishedFiles, PublishedPredictions
from ddlsim.workflows.published import (
    RowError,
    describe_published,
    predict_published,
    published_files,
)

router = APIRouter(prefix="/v1", tags=["clusters"])
FileName = Annotated[str, Field(max_length=255, description="a file GET /v1/published lists")]


@router.get("/published")
def published() -> PublishedFiles:
    """The shipped files of published runs, with what each holds."""
    return PublishedFiles.model_validate(
        {"files": [describe_published(name) for name in published_files()]}
    )


@router.get("/published/{name}")
def published_predictions(name: FileName, predictor: PredictorDep) -> PublishedPredictions:
    """Every run of the file predicted against its published figure, with the error."""
    if name not in published_files():
        raise BadRequestError(
            f"published file {name!r} is not shipped; allowed: {', '.join(published_files())}",
            field="path.name",
            status=404,
        )
    try:
        with predictor.slot():
            return PublishedPredictions.model_validate(predict_published(name))
    except RowError as exc:  # a shipped file without rows
        raise BadRequestError(str(exc), field="path.name", status=409) from None
