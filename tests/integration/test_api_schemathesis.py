"""Property-based tests of the live service against its own OpenAPI schema (schemathesis): for generated valid
and invalid requests to every operation, no 5xx, and every response conforms to the schema (status code,
content type, body). Bounded (few examples per operation) so it finishes in well under a minute."""

from __future__ import annotations

import pytest
import schemathesis
from api_helpers import KEY_A, Server
from hypothesis import HealthCheck, settings
from schemathesis.checks import load_all_checks, not_a_server_error
from schemathesis.specs.openapi import checks as openapi_checks

# The server and database fixtures (tests/conftest_api.py explains why they are not in a conftest.py).
pytest_plugins = ["conftest_api"]

CHECK_NAMES = (
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "negative_data_rejection",
)


@pytest.fixture(scope="module")
def api_schema(server: Server) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms_to_its_schema(case: schemathesis.Case, server: Server) -> None:
    load_all_checks()
    checks = [not_a_server_error, *(getattr(openapi_checks, n) for n in CHECK_NAMES)]
    # ?wait is a real long-poll: a generated wait=3600 would hold the test for the server's max_wait_s.
    if case.query and "wait" in case.query:
        case.query["wait"] = 0
    case.call_and_validate(base_url=server.url, headers={"Authorization": f"Bearer {KEY_A}"}, checks=checks, timeout=30)
