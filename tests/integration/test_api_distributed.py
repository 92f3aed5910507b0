"""The distributed mode end to end: API replicas (`python -m memsched.api` with MEMSCHED_BROKER_URL) and
`memsched worker` processes as real subprocesses, over the real Redis (and RabbitMQ) and PostgreSQL on
127.0.0.1. Solves are tiny or short so that the module takes about a minute."""

from __future__ import annotations

import contextlib
import os
import random
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.api import KEY_A, RedisServer, Server, Worker, purge_broker, unique_queue
from memsched.api.examples import synthetic_trace

pytestmark = pytest.mark.postgres

# Short limits keep the redelivery test short: a worker lost mid-solve has its job delivered again after
# the visibility timeout, which must exceed the largest hard limit (4 s + 2 x 1 s).
LIMITS = {"max_time_limit_s": "4", "job_grace_s": "1", "visibility_timeout_s": "8", "max_attempts": "3"}

# The fault the time limits exist for: a solver that ignores its own limit. Jobs asking for gap 0.25 get an exact
# solver that sleeps far past it (the heuristic fallback is the real one); with gap 0.5 the fallback sleeps
# too. Every other job is solved by the real optimizer, so a "long solve" here is long on any machine.
SLOW_SOLVER = """
import time
from memsched.api.runners import solve_process as worker

_real = worker.solve_trace

def _slow(trace, budget, options=None, resources=None):
    if options is not None and (options.gap == 0.5 or (options.gap == 0.25 and options.solver != "heuristic")):
        time.sleep(60)
    return _real(trace, budget, options, resources)

worker.solve_trace = _slow
"""
SLOW, SLOWER = 0.25, 0.5


@dataclass
class Cluster:
    """API replicas and workers sharing one database, broker and queue."""

    db_url: str
    broker_url: str
    tmp: Path
    settings: dict[str, str]
    apis: list[Server] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)

    @property
    def queue(self) -> str:
        return self.settings["queue"]

    def worker_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "MEMSCHED_DATABASE_URL": self.db_url,
            "MEMSCHED_LOG_LEVEL": "info",
            **{f"MEMSCHED_{k.upper()}": v for k, v in self.settings.items()},
        }

    def api(self, name: str, **overrides: str) -> Server:
        srv = Server(self.db_url, self.tmp / f"{name}.log", api_keys=KEY_A, **{**self.settings, **overrides})
        self.apis.append(srv)
        return srv

    def worker(self, name: str, prelude: str = SLOW_SOLVER) -> Worker:
        w = Worker(
            self.worker_env(),
            self.tmp / f"{name}.log",
            "--concurrency",
            "1",
            "--name",
            f"{name}-{self.queue}@%h",
            prelude=prelude,
        )
        self.workers.append(w)
        return w

    def stop(self) -> None:
        for p in [*self.apis, *self.workers]:
            p.stop()
        with contextlib.suppress(Exception):  # a broker stopped by the test itself has nothing left to purge
            purge_broker(self.broker_url, self.queue, self.settings.get("broker_key_prefix", "memsched:"))


def _start_all(*procs: Server | Worker) -> None:
    # Start them side by side: each waits for its own readiness.
    with ThreadPoolExecutor(len(procs)) as pool:
        for f in [pool.submit(p.start) for p in procs]:
            f.result()


@pytest.fixture(scope="module")
def cluster(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """2 API replicas and 2 workers (one solver process each) on the shared Redis, with a queue and key prefix
    of this module alone."""
    queue = unique_queue()
    c = Cluster(
        pg_url,
        redis_url,
        tmp_path_factory.mktemp("cluster"),
        {"broker_url": redis_url, "queue": queue, "broker_key_prefix": f"{queue}:", "max_layers": "3000", **LIMITS},
    )
    try:
        c.worker("w0"), c.worker("w1")
        c.api("api0"), c.api("api1")
        _start_all(*c.workers, *c.apis)
        yield c
    finally:
        c.stop()


def _post(
    client: httpx.Client, trace: dict[str, Any], budget: str, solver: str, time_limit_s: float, gap: float = 0.01
) -> dict:
    r = client.post(
        "/v1/schedules",
        json={"trace": trace, "budget": budget, "solver": solver, "time_limit_s": time_limit_s, "gap": gap},
    )
    assert r.status_code in (200, 202), r.text
    return r.json()


def _final(client: httpx.Client, job_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/schedules/{job_id}", params={"wait": 10}).json()
        if job["status"] in ("done", "failed") or time.monotonic() > deadline:
            return job


def _attempt_lines(workers: list[Worker], job_id: str) -> list[str]:
    return [
        line
        for w in workers
        for line in w.log_path.read_text(errors="replace").splitlines()
        if f"job {job_id}: attempt" in line
    ]


def test_100_jobs_round_robin_with_repeats_are_solved_once(cluster: Cluster) -> None:
    """100 submissions of 40 distinct questions, round-robin over two replicas, 8 at a time: every job
    finishes, repeats share a job, and each question is solved exactly once."""
    traces = [synthetic_trace(6, scale=s).model_dump(mode="json") for s in range(101, 111)]
    questions = [(t, b) for t in range(10) for b in ("50%", "60%", "70%", "80%")]
    asks = [questions[i % len(questions)] for i in range(100)]
    random.Random(13).shuffle(asks)
    clients = [api.client() for api in cluster.apis]

    def submit(i: int) -> tuple[tuple[int, str], dict]:
        t, b = asks[i]
        return asks[i], _post(clients[i % 2], traces[t], b, "auto" if b == "80%" else "heuristic", 4)

    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(submit, range(100)))
        ids: dict[tuple[int, str], set[str]] = {}
        for q, job in answers:
            ids.setdefault(q, set()).add(job["id"])
        assert len(ids) == 40 and all(len(v) == 1 for v in ids.values()), "a repeated question got a second job"
        jobs = [next(iter(v)) for v in ids.values()]
        finals = [_final(clients[i % 2], j) for i, j in enumerate(jobs)]
        metrics = clients[0].get("/metrics").text
    finally:
        for c in clients:
            c.close()
    assert [f["status"] for f in finals] == ["done"] * 40, [f["reason"] for f in finals if f["status"] != "done"]
    assert all(f["attempts"] == 1 and f["schedule"] for f in finals)
    # Solved once: one attempt per job in the workers' logs, and nothing else solved.
    for j in jobs:
        assert len(_attempt_lines(cluster.workers, j)) == 1, j
    assert re.search(r"^memsched_workers_live 2\.0$", metrics, re.M), metrics
    assert re.search(r"^memsched_queue_depth 0\.0$", metrics, re.M), metrics


def _hold_restore_lock_as_a_killed_worker_would(cluster: Cluster) -> None:
    """A worker killed while it sweeps for lost messages leaves kombu's sweep lock held for the expiry it was
    taken with; until then no worker delivers a lost job again. Take it as such a worker would have."""
    import redis
    from kombu.transport.redis import Channel

    from memsched.api.runners.celery_runner import make_celery
    from memsched.api.settings import Settings

    options = make_celery(Settings(database_url=cluster.db_url, **cluster.settings)).conf.broker_transport_options
    expire_s = options.get("unacked_mutex_expire", Channel.unacked_mutex_expire)
    client = redis.Redis.from_url(cluster.broker_url)
    client.set(f"{cluster.settings['broker_key_prefix']}{Channel.unacked_mutex_key}", "killed", px=int(expire_s * 1000))
    client.close()


def _log_tails(procs: list[Worker]) -> str:
    return "\n".join(
        f"--- {w.log_path.name}\n" + "\n".join(w.log_path.read_text(errors="replace").splitlines()[-15:]) for w in procs
    )


def test_worker_killed_mid_solve_its_job_completes_on_the_other(cluster: Cluster) -> None:
    """kill -9 the worker (main and pool processes) running a long solve, as it holds the lock of the sweep
    for lost messages: Redis delivers the job again after the visibility timeout, the other worker completes
    it, and the row records the interruption."""
    trace = synthetic_trace(12, scale=201).model_dump(mode="json")
    with cluster.apis[0].client() as c0, cluster.apis[1].client() as c1:
        job = _post(c0, trace, "50%", "cbc", 4, gap=SLOW)
        deadline = time.monotonic() + 30
        while not (lines := _attempt_lines(cluster.workers, job["id"])) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lines, "no worker started the job"
        victim = next(w for w in cluster.workers if w.proc and f"job {job['id']}: attempt" in w.log_path.read_text())
        survivor = next(w for w in cluster.workers if w is not victim and w.proc)
        time.sleep(1.0)  # mid-solve
        assert c1.get(f"/v1/schedules/{job['id']}").json()["status"] == "running"
        victim.kill()
        _hold_restore_lock_as_a_killed_worker_would(cluster)
        try:
            final = _final(c1, job["id"], timeout=60)
            tails = _log_tails(cluster.workers)
        finally:
            # Put a worker back for the tests that follow.
            cluster.workers.remove(victim)
            cluster.worker(f"w{len(cluster.workers) + 1}").start()
    assert final["status"] == "done", (final, tails)
    assert final["attempts"] == 2
    assert "attempt 1 was interrupted" in final["reason"] and "its worker was lost mid-solve" in final["reason"]
    # The second attempt overran too and ended at its soft limit with the heuristic's schedule.
    assert "soft time limit of 5 s" in final["schedule"]["solver"]["message"]
    assert f"job {job['id']}: attempt 2 on" in survivor.log_path.read_text()


def test_restarting_an_api_replica_loses_no_job(cluster: Cluster) -> None:
    """Jobs submitted through one replica finish while it restarts; the other replica sees them finish."""
    trace = synthetic_trace(40, scale=301).model_dump(mode="json")
    api0, api1 = cluster.apis[:2]
    with api0.client() as c0:
        jobs = [_post(c0, trace, f"{p}%", "cbc", 2)["id"] for p in (45, 50, 55, 60)]
    api0.stop()
    with api1.client() as c1:
        finals = [_final(c1, j) for j in jobs]
    api0.start()
    with api0.client() as c0:
        again = [c0.get(f"/v1/schedules/{j}").json() for j in jobs]
    assert [f["status"] for f in finals] == ["done"] * 4, finals
    assert [a["status"] for a in again] == ["done"] * 4
    assert all(f["attempts"] == 1 for f in finals)


def test_soft_time_limit_returns_the_heuristics_schedule(cluster: Cluster) -> None:
    """A solver still running at Celery's soft limit (time limit + grace) is stopped; the job is done with the
    heuristic's schedule, status 'heuristic' (no bound claimed) and a message saying so."""
    trace = synthetic_trace(12, scale=401).model_dump(mode="json")
    with cluster.apis[1].client() as c:
        final = _final(c, _post(c, trace, "50%", "cbc", 1, gap=SLOW)["id"])
    assert final["status"] == "done", final
    rec = final["schedule"]["solver"]
    assert "the cbc solver reached its soft time limit of 2 s (time limit 1 s + MEMSCHED_JOB_GRACE_S)" in rec["message"]
    assert "this is the heuristic's schedule" in rec["message"]
    assert rec["status"] == "heuristic" and rec["best_bound_s"] is None
    assert final["solve_s"] < 3


def test_hard_time_limit_fails_the_job_with_the_reason(cluster: Cluster) -> None:
    """When even the heuristic fallback overruns, Celery kills the pool process at the hard limit (time limit +
    2 x grace) and the worker's main process fails the job with the reason; the worker lives on."""
    trace = synthetic_trace(12, scale=501).model_dump(mode="json")
    with cluster.apis[0].client() as c:
        final = _final(c, _post(c, trace, "50%", "cbc", 1, gap=SLOWER)["id"])
        after = _final(c, _post(c, trace, "60%", "heuristic", 1)["id"])
    assert final["status"] == "failed", final
    assert "hard time limit of 3 s" in final["reason"] and "worker process was killed" in final["reason"]
    assert after["status"] == "done"


# ------------------------------------------------------------------------------------------------ own broker


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test alone, which it may stop and start (the shared one is never stopped)."""
    import shutil

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed: cannot take a broker down and up again")
    srv = RedisServer(tmp_path).start()
    try:
        yield srv
    finally:
        srv.stop()


def test_broker_down_answers_503_and_queued_jobs_complete_after(
    pg_url: str, own_redis: RedisServer, tmp_path: Path
) -> None:
    queue = unique_queue()
    c = Cluster(pg_url, own_redis.url, tmp_path, {"broker_url": own_redis.url, "queue": queue, **LIMITS})
    try:
        c.worker("w0"), c.api("api0")
        _start_all(*c.workers, *c.apis)
        trace = synthetic_trace(40, scale=601).model_dump(mode="json")
        with c.apis[0].client() as client:
            # A backlog: 1 worker, 4 solves of ~2 s; the broker goes down while they wait.
            jobs = [_post(client, trace, f"{p}%", "cbc", 2)["id"] for p in (45, 50, 55, 60)]
            own_redis.stop()
            down = client.post(
                "/v1/schedules", json={"trace": trace, "budget": "65%", "solver": "heuristic", "time_limit_s": 2}
            )
            ready = client.get("/readyz")
            time.sleep(3)
            own_redis.start()
            finals = [_final(client, j, timeout=90) for j in jobs]
            after = client.post(
                "/v1/schedules?wait=30",
                json={"trace": trace, "budget": "65%", "solver": "heuristic", "time_limit_s": 2},
            )
            ready_after = client.get("/readyz")
    finally:
        c.stop()
    assert down.status_code == 503 and down.headers["Retry-After"] == "5", down.text
    assert "job queue" in down.json()["detail"] and "nothing was stored" in down.json()["detail"]
    assert ready.status_code == 503 and "broker" in ready.json()["detail"]
    assert [f["status"] for f in finals] == ["done"] * 4, finals
    assert after.status_code == 200 and after.json()["status"] == "done", after.text
    assert ready_after.status_code == 200 and ready_after.json()["broker"] == "redis"


def test_worker_of_another_version_refuses_the_job(pg_url: str, redis_url: str, tmp_path: Path) -> None:
    queue = unique_queue()
    c = Cluster(
        pg_url, redis_url, tmp_path, {"broker_url": redis_url, "queue": queue, "broker_key_prefix": f"{queue}:"}
    )
    try:
        c.worker("old", prelude="import memsched; memsched.__version__ = '0.0.9'"), c.api("api0")
        _start_all(*c.workers, *c.apis)
        with c.apis[0].client() as client:
            trace = synthetic_trace(5, scale=701).model_dump(mode="json")
            final = _final(client, _post(client, trace, "60%", "heuristic", 2)["id"], timeout=30)
    finally:
        c.stop()
    assert final["status"] == "failed"
    reason = final["reason"]
    assert "refused by worker old-" in reason and "it runs memsched 0.0.9" in reason
    assert "API replica running memsched 0.1.0 (trace schema 1, schedule schema 1)" in reason
    assert "of one memsched version" in reason


def test_rabbitmq_path(pg_url: str, amqp_url: str, tmp_path: Path) -> None:
    """The amqp broker: jobs with repeats complete once each, and a worker killed mid-solve has its job
    delivered again at once (RabbitMQ re-queues a dead connection's unacknowledged messages)."""
    queue = unique_queue()
    c = Cluster(pg_url, amqp_url, tmp_path, {"broker_url": amqp_url, "queue": queue, **LIMITS})
    try:
        c.worker("w0"), c.api("api0")
        _start_all(*c.workers, *c.apis)
        small = synthetic_trace(6, scale=801).model_dump(mode="json")
        with c.apis[0].client() as client:
            ids = [_post(client, small, f"{p}%", "heuristic", 2)["id"] for p in (50, 60, 70, 50, 60, 70)]
            assert ids[:3] == ids[3:]
            finals = [_final(client, j) for j in ids[:3]]
            ready = client.get("/readyz").json()
            long = _post(client, synthetic_trace(12, scale=802).model_dump(mode="json"), "50%", "cbc", 4, SLOW)["id"]
            deadline = time.monotonic() + 30
            while not _attempt_lines(c.workers, long) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)
            c.workers[0].kill()
            c.worker("w1").start()
            final = _final(client, long, timeout=60)
    finally:
        c.stop()
    assert [f["status"] for f in finals] == ["done"] * 3 and all(f["attempts"] == 1 for f in finals)
    assert ready["broker"] == "amqp" and ready["workers"] == 1
    assert final["status"] == "done" and final["attempts"] == 2, final
    assert "attempt 1 was interrupted" in final["reason"]
