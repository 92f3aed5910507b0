"""Property-based tests of the live service against its own OpenAPI schema (schemathesis): for generated valid
and invalid requests to every operation, no 5xx, and every response conforms to the schema (status code,
content type, body). Run against both modes: the embedded one (one server, its own solver pool, on SQLite) and
the distributed one (2 API replicas and a Celery worker over the real Redis and PostgreSQL, requests alternating
between the replicas). Between them every route runs on both databases. Bounded (few examples per operation)."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import load_all_checks, not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi import checks as openapi_checks

from helpers.api import KEY_A, KEY_B, Server, Worker, purge_broker, unique_queue

CHECK_NAMES = (
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "negative_data_rejection",
)


@pytest.fixture(scope="module")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The embedded server on SQLite only: the distributed test below fuzzes the same routes and job store on
    PostgreSQL (its replicas run on it), so a second embedded run there repeated that for 30 s of the suite."""
    return f"sqlite:///{tmp_path_factory.mktemp('db') / 'memsched.db'}"


@pytest.fixture(scope="module")
def api_schema(server: Server) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


def _call(case: schemathesis.Case, base_url: str) -> None:
    load_all_checks()
    checks = [not_a_server_error, *(getattr(openapi_checks, n) for n in CHECK_NAMES)]
    # ?wait is a real long-poll: a generated wait=3600 would hold the test for the server's max_wait_s.
    if case.query and "wait" in case.query:
        case.query["wait"] = 0
    # The key goes in unless the case is a negative one about its headers (a missing or malformed Authorization is
    # the point of such a case: putting the key back would make it valid, and its acceptance a false failure).
    headers = {}
    if not (case.meta is not None and case.meta.is_negative_at(ParameterLocation.HEADER)):
        headers["Authorization"] = f"Bearer {KEY_A}"
    case.call_and_validate(base_url=base_url, headers=headers, checks=checks, timeout=30)


@schema.parametrize()
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms_to_its_schema(case: schemathesis.Case, server: Server) -> None:
    _call(case, server.url)


# ------------------------------------------------------------------------------------------------ distributed


@pytest.fixture(scope="module")
def replicas(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    """2 API replicas (the embedded server's limits) and 1 Celery worker on the shared Redis and PostgreSQL,
    with a queue and key prefix of this module alone (as tests/integration/test_api_distributed.py does)."""
    tmp = tmp_path_factory.mktemp("distributed")
    queue = unique_queue()
    shared = {"broker_url": redis_url, "queue": queue, "broker_key_prefix": f"{queue}:"}
    limits = {"max_body_bytes": str(512 * 1024), "max_layers": "40", "max_time_limit_s": "60", "max_wait_s": "30"}
    apis = [Server(pg_url, tmp / f"api{i}.log", api_keys=f"{KEY_A},{KEY_B}", **limits, **shared) for i in range(2)]
    worker = Worker(
        {
            **os.environ,
            "MEMSCHED_DATABASE_URL": pg_url,
            "MEMSCHED_LOG_LEVEL": "info",
            **{f"MEMSCHED_{k.upper()}": v for k, v in {**limits, **shared}.items()},
        },
        tmp / "worker.log",
        "--concurrency",
        "1",
        "--name",
        f"schemathesis-{queue}@%h",
    )
    try:
        with ThreadPoolExecutor(3) as pool:
            for f in [pool.submit(p.start) for p in (worker, *apis)]:
                f.result()
        yield apis
    finally:
        for p in (*apis, worker):
            p.stop()
        with contextlib.suppress(Exception):
            purge_broker(redis_url, queue, f"{queue}:")


@pytest.fixture(scope="module")
def distributed_schema(replicas: list[Server]) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(replicas[0].url + "/openapi.json")


@pytest.fixture(scope="module")
def next_replica(replicas: list[Server]) -> Iterator[str]:
    return itertools.cycle([r.url for r in replicas])


distributed = schemathesis.pytest.from_fixture("distributed_schema")


@distributed.parametrize()
# Fewer examples than the embedded run, which fuzzes the same schema and routes: this run is about the replicas
# and the Celery path answering every kind of request alike.
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@pytest.mark.postgres
def test_distributed_api_conforms_to_its_schema(
    case: schemathesis.Case, replicas: list[Server], next_replica: Iterator[str]
) -> None:
    _call(case, next(next_replica))
    for r in replicas:
        assert r.proc is not None and r.proc.poll() is None, r.log()
