"""Schemathesis against the API's OpenAPI spec: generated requests, valid and not, to every
operation (with the token, so that writes get past it), and no answer may be a 5xx."""

from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok

from ddlsim.service.api import Settings, create_app

TOKEN = "fuzz-token"
EXAMPLES = 30  # an operation


def test_no_request_gets_a_server_error(tmp_path: Path) -> None:
    app = create_app(Settings(db=f"sqlite:///{tmp_path / 'api.db'}", token=TOKEN))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # the spec itself is valid
        operations.append(result.ok())
    assert len(operations) >= 15, [o.label for o in operations]
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def no_server_error(case: schemathesis.Case) -> None:
            case.call_and_validate(
                headers={"Authorization": f"Bearer {TOKEN}"}, checks=[not_a_server_error]
            )

        no_server_error()


def test_every_v1_operation_has_a_response_schema(tmp_path: Path) -> None:
    """Each ``/v1`` operation's success answers a named model with typed fields, not an
    untyped object."""
    app = create_app(Settings(db=f"sqlite:///{tmp_path / 'api.db'}", token=TOKEN))
    spec = app.openapi()
    components = spec["components"]["schemas"]
    described, files = [], []
    for path, operations in spec["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            (success,) = [code for code in operation["responses"] if code.startswith("2")]
            content = operation["responses"][success]["content"]
            if "application/gzip" in content:
                files.append(where)  # a download: the file, not a JSON object
                continue
            schema = content["application/json"]["schema"]
            assert "$ref" in schema, (where, schema)
            model = components[schema["$ref"].removeprefix("#/components/schemas/")]
            assert model["type"] == "object" and model["properties"], where
            described.append(where)
    assert len(described) >= 19, described
    assert files == ["GET /v1/dataset-exports/{task_id}/file"]


def _schema(spec: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = spec["components"]["schemas"][
        ref["$ref"].removeprefix("#/components/schemas/")
    ]
    return schema


def _ref(schema: dict[str, Any]) -> dict[str, Any]:
    """The one ``$ref`` of a property: itself, or the non-null member of ``X | None``."""
    if "$ref" in schema:
        return schema
    (ref,) = [s for s in schema.get("anyOf", []) if "$ref" in s]
    return ref


def test_the_gpu_cluster_operations_answer_typed_schemas(tmp_path: Path) -> None:
    """The clusters, a cluster prediction and a cluster search each have a named request and
    response schema down to the prediction's figures."""
    app = create_app(Settings(db=f"sqlite:///{tmp_path / 'api.db'}", token=TOKEN))
    spec = app.openapi()
    paths = spec["paths"]

    def answer(path: str, method: str) -> tuple[str, dict[str, Any]]:
        responses = paths[path][method]["responses"]
        (code,) = [c for c in responses if c.startswith("2")]
        ref = responses[code]["content"]["application/json"]["schema"]
        return code, _schema(spec, ref)

    def body(path: str) -> dict[str, Any]:
        content = paths[path]["post"]["requestBody"]["content"]["application/json"]
        return _schema(spec, content["schema"])

    code, listed = answer("/v1/clusters", "get")
    assert code == "200" and listed["title"] == "ClusterList"
    item = _schema(spec, listed["properties"]["clusters"]["items"])
    assert {"name", "usage", "gpu", "gpus_per_node", "nvlink_gbps", "nic_gbits"} <= set(
        item["properties"]
    )

    code, predicted = answer("/v1/cluster-predictions", "post")
    assert code == "201" and predicted["title"] == "ClusterPredictionPublic"
    figures = predicted["properties"]
    assert {"iteration_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "model_tflops_per_gpu"} <= (
        set(figures)
    )
    assert {"mfu", "fits", "micro_batch_size", "layout", "strategy", "id"} <= set(figures)
    assert figures["breakdown_ms"]["additionalProperties"]["type"] == "number"
    memory = _schema(spec, figures["memory"])
    assert set(memory["properties"]) == {"total_gib", "parts_gib"}
    assert _schema(spec, figures["cluster"])["title"] == "GpuClusterPublic"
    assert body("/v1/cluster-predictions")["title"] == "ClusterPredictionRequest"
    assert set(body("/v1/cluster-predictions")["required"]) == {"model", "cluster", "strategy"}
    assert answer("/v1/cluster-predictions/{prediction_id}", "get")[1] == predicted
    assert answer("/v1/cluster-predictions", "get")[1]["title"] == "ClusterPredictionList"

    code, job = answer("/v1/cluster-searches", "post")
    assert code == "202" and job["title"] == "ClusterSearchPublic"
    assert {"status", "progress", "message"} <= set(job["properties"])
    result = _schema(spec, _ref(job["properties"]["result"]))
    assert result["title"] == "ClusterSearchResult"
    layout = _schema(spec, result["properties"]["layouts"]["items"])
    assert {"rank", "layout", "strategy", "breakdown_ms", "memory", "mfu"} <= set(
        layout["properties"]
    )
    assert body("/v1/cluster-searches")["title"] == "ClusterSearchRequest"
    assert answer("/v1/cluster-searches/{task_id}", "get")[1] == job
    assert answer("/v1/published/{name}", "get")[1]["title"] == "PublishedPredictions"
