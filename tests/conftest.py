"""The suite's one conftest: the markers each test gets from what it exercises, and the fixtures of the service
tests (a real uvicorn server over SQLite, and over a real PostgreSQL: a database created for this session and
dropped after it; Redis and RabbitMQ brokers). Helpers that tests import directly live in tests/helpers/.

Markers (`pytest -m ...`), set here by module so that each rule has one home:
- `solver`: the optimizer's searches and proofs (DP, MILP, local search, solve()).
- `service`: the REST service, its database, brokers and client.
- `torch`: the runtime (tracer, replay, measure) on real PyTorch models.
- `slow`: longer than ~20 s on the 2-core CI machine (`make unit` leaves them out).
- `gpu`: needs CUDA (skipped without it).
- `wallclock`: asserts a wall-clock promise, or compares measured timings; `make test` runs these alone, after
  the two-worker phase."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from helpers.api import (
    AMQP_URL,
    KEY_A,
    KEY_B,
    REDIS_URL,
    PgTarget,
    RedisServer,
    Server,
    broker_answers,
    find_pg,
    try_install_and_start_pg,
    try_install_redis,
)


@pytest.fixture(scope="session")
def pg_target() -> PgTarget:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install -e '.[api]'); cannot test PostgreSQL")
    target, why = find_pg()
    if target is None:
        done = try_install_and_start_pg()
        target, why2 = find_pg()
        if target is None:
            pytest.skip(f"no PostgreSQL reachable ({why}); tried: {done}; then: {why2}")
    return target


@pytest.fixture(scope="session")
def pg_url(pg_target: PgTarget) -> Iterator[str]:
    """A fresh database for this session, dropped at the end (even if tests fail)."""
    with pg_target.throwaway_database() as url:
        yield url


# ------------------------------------------------------------------------------------------------ servers


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('db') / 'memsched.db'}"
        return
    # A database of the module's own, like SQLite's file: a server starting on a database that an earlier
    # module's server left with a running job re-queues and solves it, which a module counting its solves
    # would see as its own.
    target: PgTarget = request.getfixturevalue("pg_target")
    with target.throwaway_database() as url:
        yield url


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with two API keys and small limits, so the limit tests need only small bodies."""
    srv = Server(
        database_url,
        tmp_path_factory.mktemp("log") / "server.log",
        api_keys=f"{KEY_A},{KEY_B}",
        max_body_bytes=str(512 * 1024),
        max_layers="40",
        max_time_limit_s="60",
        max_wait_s="30",
    ).start()
    try:
        yield srv
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------------------ brokers


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The shared Redis on 127.0.0.1:6379 (MEMSCHED_TEST_REDIS_URL); without one, our own redis-server; skip
    only if neither is possible. Tests keep apart from others by queue name and key prefix, not by database."""
    pytest.importorskip("celery", reason="celery is not installed (pip install -e '.[api]')")
    why = broker_answers(REDIS_URL)
    if not why:
        yield REDIS_URL
        return
    if shutil.which("redis-server") is None:
        done = try_install_redis()
        if shutil.which("redis-server") is None:
            pytest.skip(f"no Redis at {REDIS_URL} ({why}) and no redis-server binary to start one ({done})")
    own = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield own.url
    finally:
        own.stop()


@pytest.fixture(scope="session")
def amqp_url() -> str:
    pytest.importorskip("celery", reason="celery is not installed (pip install -e '.[api]')")
    why = broker_answers(AMQP_URL)
    if why:
        pytest.skip(f"no RabbitMQ at {AMQP_URL} ({why}); set MEMSCHED_TEST_AMQP_URL to test the amqp path")
    return AMQP_URL


# ------------------------------------------------------------------------------------------------ markers

_AREA = {
    "solver": (
        "test_dp",
        "test_ilp",
        "test_solve",
        "test_polish",
        "test_heuristic",
        "test_jit",
        "test_fastsim",
        "test_simulator",
        "test_baselines",
        "test_actions",
    ),
    "service": ("test_api_",),
    "torch": (
        "test_runtime_",
        "test_tracer_",
        "test_costmodel_plans",
        "test_bench_peers",
        "test_layers",
        "test_integrations_",
        "test_exports",
        "test_builtin_decoders",
    ),
}
"""Module-name prefixes of each area's tests."""

_SLOW = (
    "test_api_distributed.py",
    "test_api_schemathesis.py",
    "test_api_restart.py",
    "test_api_docs_offline.py",
    "test_runtime_ddp.py",
    "test_runtime_fsdp.py",
    "test_runtime_measure_cli.py",
    "test_runtime_compile_autocast.py",
    "test_costmodel_plans.py",
    "test_bench_peers.py",
    "test_jit.py",
)
"""Modules whose tests take more than ~20 s each on the 2-core CI machine (`--durations` shows them)."""


_WALLCLOCK = (
    "test_solve_deadline.py",
    "test_dp.py::test_time_limit_bounds_the_whole_call",
    "test_cli.py::test_console_script_import_and_compare_under_5s",
    "test_runtime_recompute_tail.py::test_the_tracer_measures_a_gpt2_blocks_rerun_below_its_forward",
    "test_runtime_recompute_tail.py::test_the_tracer_leaves_a_relu_blocks_rerun_at_its_forward",
    "test_dp_lagrange.py::test_solve_proves_a_long_chain_the_exact_sweep_alone_cannot",
    "test_cli_process.py::test_a_first_solve_keeps_its_limit_while_the_kernels_compile",
    "test_dp_relaxed.py::test_the_solve_proves_the_h100_resnet50_at_75_percent_by_its_short_queue_climb",
    "test_dp_relaxed.py::test_the_solve_proves_the_retraced_h100_resnet50_at_75_percent_by_its_queue_ladder",
)
"""Modules, or module::test, that assert a wall-clock promise (wall <= limit x 1.1 + 0.5 s for the whole
process): measured beside another worker's multi-process test they overran (6.2 s for a 5 s limit), which
says nothing of the promise on the machine the user runs alone. Also tests that compare two timings the tracer
measures: beside another worker, a GPT-2 block's re-run measured as long as its forward on two of three blocks
(2026-11-28, in two CI runs of three), and a ReLU block's re-run 0.47-0.59 of its forward where it is 0.87-0.94
alone (2026-11-30, one fresh-clone run of three), which says nothing of the tracer on a quiet machine. And a solve that
must prove a 400-layer chain within its limit (beside another worker it ended 3.7% short), and one that must prove
the H100 ResNet-50 at 75% within 10 s (about 3 s alone)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = item.path.name
        for marker, prefixes in _AREA.items():
            if name.startswith(prefixes):
                item.add_marker(getattr(pytest.mark, marker))
        if name in _SLOW:
            item.add_marker(pytest.mark.slow)
        if name in _WALLCLOCK or f"{name}::{item.originalname}" in _WALLCLOCK:
            item.add_marker(pytest.mark.wallclock)
