"""Schemathesis against the API's OpenAPI spec: generated requests, valid and not, to every
operation (with the token, so that writes get past it), and no answer may be a 5xx."""

from pathlib import Path

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
    described = []
    for path, operations in spec["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            (success,) = [code for code in operation["responses"] if code.startswith("2")]
            schema = operation["responses"][success]["content"]["application/json"]["schema"]
            assert "$ref" in schema, (where, schema)
            model = components[schema["$ref"].removeprefix("#/components/schemas/")]
            assert model["type"] == "object" and model["properties"], where
            described.append(where)
    assert len(described) >= 19, described
