"""Distributed mode (MEMSCHED_BROKER_URL set): solves are Celery tasks run by `memsched worker` processes on
any machines, and `memsched serve` replicas only store jobs and send messages.

Celery and the broker own delivery; nothing here is a queue, a heartbeat or a lease of our own:

* A job's message carries its id and the versions of the replica that sent it (memsched, trace and schedule
  schema). The row in the database stays the job's state; the worker reads the question from it and writes
  the answer to it.
* acks_late + reject_on_worker_lost: a message is acknowledged only after the answer is stored, so a worker
  killed mid-solve has its job delivered again (at once when only the pool process died; by Redis after the
  visibility timeout, or by RabbitMQ when the connection drops, when the whole worker went away). The row
  counts the attempts and fails the job with the reason after MEMSCHED_MAX_ATTEMPTS.
* Celery's time limits per job: at the soft limit (time limit + MEMSCHED_JOB_GRACE_S) the solver is stopped
  and the heuristic's schedule returned with a message; at the hard limit (+ another grace) the process is
  killed and the job failed with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import memsched
from memsched.api import crud
from memsched.api.db import Database
from memsched.api.errors import BrokerUnavailable
from memsched.api.runners import Readiness, solve_process
from memsched.api.runners.embedded import kill_pool, spawn_pool
from memsched.api.settings import BROKER_SCHEMES, Settings
from memsched.api.tables import JobRow
from memsched.errors import MemschedError
from memsched.options import SolveResources
from memsched.schema import SCHEDULE_SCHEMA_VERSION, TRACE_SCHEMA_VERSION, JobStatus

log = logging.getLogger(__name__)

TASK_NAME = "memsched.solve"
_ROW_WAIT_S = 10.0
"""How long a worker waits for the row of a message it received: the replica commits right after sending."""


def job_versions() -> dict[str, str]:
    """What a job message carries, and what a worker compares with its own before solving."""
    return {
        "memsched": memsched.__version__,
        "trace_schema": TRACE_SCHEMA_VERSION,
        "schedule_schema": SCHEDULE_SCHEMA_VERSION,
    }


def _describe(v: dict[str, Any]) -> str:
    return (
        f"memsched {v.get('memsched', '?')} (trace schema {v.get('trace_schema', '?')}, "
        f"schedule schema {v.get('schedule_schema', '?')})"
    )


def broker_kind(url: str) -> str:
    """'redis' or 'amqp' from the URL's scheme; MemschedError naming the fix for anything else."""
    kind = BROKER_SCHEMES.get(urlsplit(url).scheme.lower())
    if kind is not None:
        return kind
    raise MemschedError(
        f"MEMSCHED_BROKER_URL {safe_broker_url(url)!r}: use redis://host:6379/0 (Redis) or "
        "amqp://user:password@host:5672// (RabbitMQ)"
    )


def safe_broker_url(url: str) -> str:
    """The URL with its password masked, for logs and error messages."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url


# How long a dead worker's hold on Redis's redelivery-sweep lock lasts (see `make_celery`).
RESTORE_MUTEX_EXPIRE_S = 5


def make_celery(settings: Settings) -> Any:
    """The Celery app of a replica or a worker. Its settings are the same on both sides."""
    from celery import Celery

    assert settings.broker_url
    kind = broker_kind(settings.broker_url)
    app = Celery("memsched", broker=settings.broker_url, set_as_current=False)
    transport: dict[str, Any] = {}
    if kind == "redis":
        vt = settings.effective_visibility_timeout_s
        transport = {
            # Redis re-delivers an unacknowledged message after this long: longer than any job may run.
            "visibility_timeout": vt,
            # Check for such messages often enough that a lost worker's job restarts soon after vt (kombu's
            # default scans only every 100 s).
            "unacked_restore_interval": max(1.0, min(10.0, vt / 4)),
            "unacked_restore_throttle": 1,
            # A sweep holds a Redis lock; a worker killed mid-sweep leaves it held until it expires, and until
            # then no worker delivers a lost job again (kombu's default, 300 s, would stall one for 5 minutes).
            # A sweep takes milliseconds, and each restore is a WATCH transaction, so a short expiry is safe.
            "unacked_mutex_expire": RESTORE_MUTEX_EXPIRE_S,
            "global_keyprefix": settings.broker_key_prefix,
            "socket_connect_timeout": 3,
        }
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # One message per pool process at a time: a reserved message is a running one, so the visibility
        # timeout is measured from its start, and idle workers are not starved by a busy one's prefetch.
        worker_prefetch_multiplier=1,
        task_default_queue=settings.queue,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=3,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
    )
    return app


# ------------------------------------------------------------------------------------------ API replica side


class CeleryRunner:
    """The Runner of distributed mode: send a job's message to the Celery broker, wait for its row to finish
    (a `memsched worker` anywhere writes it), render plots, and probe the broker for /readyz and /metrics."""

    def __init__(self, db: Database, settings: Settings) -> None:
        assert settings.broker_url
        self.db = db
        self.settings = settings
        self.kind = broker_kind(settings.broker_url)
        self.safe_url = safe_broker_url(settings.broker_url)
        self.app = make_celery(settings)
        self._plot_pool: ProcessPoolExecutor | None = None

    async def start(self) -> None:
        if self.db.url.startswith("sqlite"):
            log.warning(
                "distributed mode over SQLite: API replicas and workers must share one database, so they must run "
                "on this machine; use PostgreSQL (MEMSCHED_DATABASE_URL=postgresql+psycopg://...) beyond it"
            )
        log.info("distributed mode: solves go to Celery queue %r on %s", self.settings.queue, self.safe_url)

    async def stop(self) -> None:
        if self._plot_pool is not None:
            # wait=True: reap the plot worker and close its queues (no leaked-semaphore warning at exit).
            await asyncio.to_thread(kill_pool, self._plot_pool, True)
            self._plot_pool = None
        with contextlib.suppress(OSError):
            self.app.close()

    def notify(self) -> None:
        """Nothing to wake: the message was sent at submission (enqueue)."""

    def enqueue(self, job_id: str, time_limit_s: float) -> None:
        """Send the job's message, with Celery's soft and hard time limits for it. BrokerUnavailable if the
        broker does not take it (the caller then stores nothing and answers 503)."""
        from kombu.exceptions import KombuError

        try:
            self.app.send_task(
                TASK_NAME,
                args=[job_id],
                kwargs={"versions": job_versions()},
                queue=self.settings.queue,
                soft_time_limit=self.settings.soft_limit_s(time_limit_s),
                time_limit=self.settings.hard_limit_s(time_limit_s),
                retry=True,
                retry_policy={"max_retries": 2, "interval_start": 0.2, "interval_step": 0.3, "interval_max": 0.5},
            )
        except (KombuError, OSError) as e:
            log.warning("could not send job %s to %s: %s", job_id, self.safe_url, e)
            raise BrokerUnavailable(f"the job queue ({self.kind} broker {self.safe_url}) is unavailable: {e}") from e

    async def wait(self, job_id: str, timeout: float) -> None:
        """Return when the job is done or failed (written by a worker, anywhere), or after `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pause = 0.02
        while True:
            if await asyncio.to_thread(self._finished, job_id):
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            await asyncio.sleep(min(pause, remaining))
            pause = min(pause * 1.5, 0.5)

    def _finished(self, job_id: str) -> bool:
        with self.db.session() as s:
            return crud.is_finished(s, job_id)

    async def render_plot(self, trace_json: str, schedule_json: str) -> bytes:
        if self._plot_pool is None:
            self._plot_pool = spawn_pool(1)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._plot_pool, solve_process.render_plot, trace_json, schedule_json)

    # ------------------------------------------------------------------ probes

    def queue_depth(self) -> int:
        """Messages waiting in the queue (not those running). Raises if the broker does not answer."""
        from kombu.exceptions import ChannelError

        with self.app.connection_for_read() as conn:
            # A probe answers at once: no retries (kombu's would add seconds while the broker is down).
            conn.ensure_connection(max_retries=0, timeout=3)
            channel = conn.channel()
            try:
                return int(channel.queue_declare(queue=self.settings.queue, passive=True).message_count)
            except ChannelError:
                return 0  # not declared yet: no worker has consumed from it and nothing was sent
            finally:
                with contextlib.suppress(Exception):
                    channel.close()

    def readiness(self) -> Readiness:
        try:
            return Readiness(workers=self.live_workers(timeout=0.5), broker=self.kind, queue_depth=self.queue_depth())
        except Exception as e:  # noqa: BLE001  # any broker failure (kombu, redis, amqp, OS) means "not ready"
            log.warning("readiness check failed: broker %s: %s", self.safe_url, e)
            raise BrokerUnavailable(
                f"broker {self.safe_url} is not reachable: {type(e).__name__}: {str(e)[:200]}"
            ) from None

    def live_workers(self, timeout: float = 1.0) -> int:
        """Workers that answer Celery's broadcast and consume this queue (Celery's own remote control)."""
        with self.app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=0, timeout=3)  # fail fast, before the broadcast's own retries
        replies = self.app.control.inspect(timeout=timeout).active_queues() or {}
        return sum(1 for queues in replies.values() if any(q.get("name") == self.settings.queue for q in queues))


# ------------------------------------------------------------------------------------------------ worker side


class _WorkerState:
    """The settings of this worker, and one database engine per process (pool processes are forked)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._db: Database | None = None
        self._pid = 0

    def db(self) -> Database:
        if self._db is None or self._pid != os.getpid():
            if self._db is not None:
                # Inherited from the main process by fork: forget its connections without closing them, so the
                # parent's stay usable (SQLAlchemy's advice for forked processes).
                self._db.engine.dispose(close=False)
            self._db = Database(self.settings.database_url)
            self._pid = os.getpid()
        return self._db


_STATE: list[_WorkerState] = []
"""This worker's state (one element), set by worker_app()."""


def _state() -> _WorkerState:
    assert _STATE, "the memsched task runs only in a worker started by `memsched worker`"
    return _STATE[0]


def _with_db_retries(what: str, fn: Any) -> Any:
    """Run a database step, retrying for up to a minute while the database is unreachable: the answer of a
    long solve is worth waiting for."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    delay, deadline = 0.5, time.monotonic() + 60
    while True:
        try:
            with _state().db().session() as s:
                return fn(s)
        except (OperationalError, InterfaceError) as e:
            if time.monotonic() > deadline:
                raise
            log.warning("%s: database unavailable (%s); retrying in %.1f s", what, str(e).splitlines()[0], delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def _running_elsewhere(task: Any, job_id: str) -> bool:
    """Whether Celery reports this job active on a live worker other than this process."""
    me = (task.request.hostname, os.getpid())
    try:
        active = task.app.control.inspect(timeout=1.0).active() or {}
    except Exception:  # the broker blinked: assume the old attempt is gone (the attempt bound still holds)
        log.warning("could not ask the workers which jobs they run", exc_info=True)
        return False
    for host, requests in active.items():
        for r in requests:
            args = r.get("args") or []
            if args and args[0] == job_id and (host, r.get("worker_pid")) != me:
                return True
    return False


def run_task(task: Any, job_id: str, versions: dict[str, Any] | None = None) -> str:
    """The Celery task: refuse a job from another version; claim the row; solve with the embedded mode's solve
    function under Celery's soft limit; store the answer. Returns what happened (for the worker's log).

    When the database stays unreachable (a minute of retries), the message goes back to the queue (Celery's
    Reject), so the job runs once the database is back instead of being acknowledged unanswered."""
    from celery.exceptions import Reject
    from sqlalchemy.exc import InterfaceError, OperationalError

    try:
        return _run_job(task, job_id, versions)
    except (OperationalError, InterfaceError) as e:
        log.error("job %s: database unavailable (%s); returning its message to the queue", job_id, e)
        raise Reject(str(e), requeue=True) from e


def _row_exists(s: Any, job_id: str) -> bool:
    return s.get(JobRow, job_id) is not None


def _run_job(task: Any, job_id: str, versions: dict[str, Any] | None) -> str:
    from celery.exceptions import SoftTimeLimitExceeded

    st = _state()
    me = f"{task.request.hostname} (pid {os.getpid()})"
    # The replica commits the row right after sending the message: a fast worker may be here first.
    deadline = time.monotonic() + _ROW_WAIT_S
    while not _with_db_retries("looking up a job", lambda s: _row_exists(s, job_id)):
        if time.monotonic() > deadline:
            log.warning("job %s: no such job in the database after %.0f s; message dropped", job_id, _ROW_WAIT_S)
            return "missing"
        time.sleep(0.02)
    mine = job_versions()
    if (versions or {}) != mine:
        reason = (
            f"refused by worker {me}: it runs {_describe(mine)}, but the job was queued by an API replica "
            f"running {_describe(versions or {})}; run API replicas and workers of one memsched version "
            "(upgrade them together, or give each version its own MEMSCHED_QUEUE)"
        )
        log.error("job %s: %s", job_id, reason)
        _with_db_retries("refusing a job", lambda s: crud.fail_unfinished(s, job_id, reason))
        return "refused"

    claim = _with_db_retries(
        "claiming a job",
        lambda s: crud.claim_delivery(
            s, job_id, me, st.settings.max_attempts, lambda: _running_elsewhere(task, job_id)
        ),
    )
    if claim is None:
        return "missing"
    if isinstance(claim, str):
        log.info("job %s not run: %s", job_id, claim)
        return claim
    if _with_db_retries("looking up the cache", lambda s: crud.answer_from_cache(s, job_id)):
        log.info("job %s answered from an identical finished job", job_id)
        return "cached"

    hard, soft = task.request.timelimit or (None, None)
    vt = st.settings.effective_visibility_timeout_s
    if st.settings.broker_url and broker_kind(st.settings.broker_url) == "redis" and hard and hard >= vt:
        log.warning(
            "job %s: its hard time limit (%g s) is not below this worker's visibility timeout (%g s): Redis may "
            "deliver it again while it runs; raise MEMSCHED_VISIBILITY_TIMEOUT_S",
            job_id,
            hard,
            vt,
        )
    overran = (
        f"reached its soft time limit of {soft:g} s (time limit {claim.params.time_limit_s:g} s + MEMSCHED_JOB_GRACE_S)"
        if soft
        else "was stopped by Celery's soft time limit"
    )
    log.info("job %s: attempt %d on %s", job_id, claim.attempts, me)
    outcome = solve_process.solve_with_fallback(
        claim.trace_json,
        claim.budget_bytes,
        claim.params,
        SolveResources(threads=st.settings.solver_threads),
        SoftTimeLimitExceeded,
        overran,
        lambda: None,  # the hard limit is Celery's, already armed
    )
    for _ in range(3):
        try:
            _with_db_retries(
                "storing a result",
                lambda s: crud.finish_job(
                    s,
                    job_id,
                    outcome.schedule_json,
                    outcome.error,
                    outcome.min_feasible_bytes,
                    outcome.wall_s,
                    outcome.min_feasible_host_bytes,
                ),
            )
            break
        except SoftTimeLimitExceeded:  # arrived just after the solve returned: the answer is still good
            continue
    status = JobStatus.DONE if outcome.schedule_json is not None else JobStatus.FAILED
    log.info("job %s %s in %.3f s", job_id, status.value, outcome.wall_s)
    return status.value


def _make_request_class() -> type:
    from celery.worker.request import Request

    class JobRequest(Request):
        """Runs in the worker's main process: a job killed at its hard time limit is failed with the reason
        (its pool process, which would have written it, is gone)."""

        def on_timeout(self, soft: bool, timeout: float) -> None:
            super().on_timeout(soft, timeout)
            if soft or not self.args:
                return
            job_id = str(self.args[0])
            reason = (
                f"the solve ran past its hard time limit of {timeout:g} s (its time limit + 2 x "
                "MEMSCHED_JOB_GRACE_S: neither the solver nor the heuristic fallback stopped in time) and its "
                "worker process was killed; resubmit with solver 'heuristic', a shorter time_limit_s or a "
                "smaller trace"
            )
            try:
                _with_db_retries("failing a timed-out job", lambda s: crud.fail_unfinished(s, job_id, reason))
            except Exception:
                log.exception("job %s: could not record its hard time limit", job_id)

    return JobRequest


def worker_app(settings: Settings) -> Any:
    """The Celery app of `memsched worker`, with the solve task registered."""
    _STATE[:] = [_WorkerState(settings)]
    app = make_celery(settings)
    app.task(
        name=TASK_NAME,
        bind=True,
        acks_late=True,
        reject_on_worker_lost=True,
        Request=_make_request_class(),
    )(run_task)
    return app


def run_worker(settings: Settings, concurrency: int, queues: list[str], name: str | None, loglevel: str) -> None:
    """Start a Celery worker (prefork pool of `concurrency` processes) consuming `queues`; returns at shutdown."""
    assert settings.broker_url
    db = Database(settings.database_url)
    # The tables, if no replica has made them yet (under the same lock); and a clear error now, not at the first
    # job, when the database is not reachable.
    db.create_all()
    log.info(
        "memsched worker: %d processes, queues %s, broker %s, database %s",
        concurrency,
        ",".join(queues),
        safe_broker_url(settings.broker_url),
        db.safe_url,
    )
    db.dispose()
    app = worker_app(settings)
    # Import the solver stack and compile its kernels now, in the parent, so forked pool processes start with
    # them loaded: a job never compiles, so a soft time limit never lands mid-compile.
    from memsched.service import prepare_solver

    prepare_solver()

    nodename = name or f"memsched-{os.getpid()}@%h"
    argv = [
        "worker",
        f"--concurrency={concurrency}",
        f"--queues={','.join(queues)}",
        f"--hostname={nodename}",
        f"--loglevel={loglevel.upper()}",
        "--pool=prefork",
        # Workers need no gossip or start-up sync with each other; skipping them makes starts fast.
        "--without-gossip",
        "--without-mingle",
    ]
    app.worker_main(argv=argv)
