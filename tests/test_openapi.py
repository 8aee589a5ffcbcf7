"""The committed OpenAPI document matches the app, is valid, and documents every endpoint."""

from __future__ import annotations

from typing import Any

import pytest
from openapi_spec_validator import validate

from openapi.export import SPEC_PATH, current_spec, render

ADMIN_WITHOUT_ERRORS = {"/healthz", "/metrics", "/readyz", "/v1/cluster", "/v1/topics"}


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return current_spec()


def test_committed_document_matches_the_app(spec: dict[str, Any]) -> None:
    assert SPEC_PATH.read_text() == render(spec), (
        "openapi/openapi.json drifted from the app: run `python -m openapi.export`"
    )


def test_document_is_valid_openapi(spec: dict[str, Any]) -> None:
    validate(spec)


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, m, op) for path, ops in spec["paths"].items() for m, op in ops.items()]


def test_every_operation_has_a_summary(spec: dict[str, Any]) -> None:
    missing = [f"{m} {p}" for p, m, op in _operations(spec) if not op.get("summary")]
    assert not missing


def test_errors_are_documented_as_problems(spec: dict[str, Any]) -> None:
    for path, method, op in _operations(spec):
        errors = {s: r for s, r in op["responses"].items() if s.startswith(("4", "5"))}
        if path in ADMIN_WITHOUT_ERRORS and method == "get":
            continue
        assert errors, f"{method} {path} documents no error response"
        assert "422" not in op["responses"], "validation errors are 400 problems here"
        for status, response in errors.items():
            if status == "503":
                continue
            assert "application/problem+json" in response.get("content", {}), (method, path, status)


def _has_example(schema: dict[str, Any], components: dict[str, Any]) -> bool:
    if "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[1]]
    return bool(schema.get("examples") or schema.get("example"))


def test_request_and_response_bodies_have_examples(spec: dict[str, Any]) -> None:
    components = spec["components"]["schemas"]
    for path, method, op in _operations(spec):
        body = op.get("requestBody")
        if body:
            for media, content in body["content"].items():
                if media == "application/vnd.logbus.batch":
                    continue  # binary
                assert (
                    _has_example(content.get("schema", {}), components) or "example" in content
                ), (method, path, media)
        ok = next((r for s, r in op["responses"].items() if s.startswith("2")), None)
        assert ok is not None
        json_body = ok.get("content", {}).get("application/json")
        if json_body and json_body.get("schema", {}).get("$ref"):
            assert _has_example(json_body["schema"], components), (method, path)


def test_record_paths_are_documented(spec: dict[str, Any]) -> None:
    paths = spec["paths"]
    produce = paths["/v1/topics/{topic}/records"]["post"]
    assert set(produce["requestBody"]["content"]) == {
        "application/json",
        "application/x-ndjson",
        "application/vnd.logbus.batch",
        "application/octet-stream",
    }
    assert "Logbus-Key" in {p["name"] for p in produce["parameters"]}
    fetch = paths["/v1/topics/{topic}/partitions/{partition}/records"]["get"]
    names = {p["name"] for p in fetch["parameters"]}
    assert {"offset", "max_bytes", "max_records", "min_bytes", "wait_ms"} <= names
    by_name = {p["name"]: p for p in fetch["parameters"]}
    assert by_name["offset"]["required"] is True
    partition = by_name["partition"]["schema"]
    assert (partition["minimum"], partition["maximum"]) == (0, 2**31 - 1)
    assert by_name["topic"]["schema"]["pattern"] == "^[a-zA-Z0-9._-]{1,249}$"


def test_names_and_ranges_the_server_enforces_are_documented(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    create = schemas["TopicCreate"]["properties"]
    assert create["name"]["pattern"] == "^[a-zA-Z0-9._-]{1,249}$"
    assert create["partitions"]["maximum"] == 10_000
    segment = create["configs"]["properties"]["segment.bytes"]
    assert segment["type"] == "integer" and segment["minimum"] == 14
    assert create["configs"]["additionalProperties"] is False
    offset = schemas["OffsetIn"]["properties"]["offset"]
    assert offset["minimum"] == 0 and offset["maximum"] == 2**63 - 1
    assert isinstance(offset["maximum"], int)  # a double would be 2^63


def test_fetch_documents_every_error_it_can_answer(spec: dict[str, Any]) -> None:
    """An internal topic (403), a stored record no reader can serve (500, naming its offset)
    and a failed log directory (503) are answers of a fetch: the document says so."""
    op = spec["paths"]["/v1/topics/{topic}/partitions/{partition}/records"]["get"]
    for status in ("403", "500", "503"):
        assert status in op["responses"], status
    assert "next_offset" in op["responses"]["500"]["description"]
