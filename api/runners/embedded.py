"""The embedded runner (one server): solves queued jobs in a pool of worker processes, a capped number at a time.

The database is the queue: a job is a row, claimed atomically (queued -> running) when a worker is free.
Nothing about a job lives only in memory, so a restart loses none: running jobs are re-queued (or failed
after repeated interruptions) at start-up and queued ones are simply picked up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from anyio import to_thread

from memsched.api import crud
from memsched.api.db import Database
from memsched.api.metrics import Metrics
from memsched.api.runners import Readiness, solve_process
from memsched.api.settings import Settings
from memsched.schema import JobStatus

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long shutdown waits for a killed worker process to be reaped (it is SIGKILLed: milliseconds).
_REAP_S = 5.0

# How often the dispatcher looks for queued jobs even without a wake-up (jobs written by another process).
_POLL_S = 1.0


def spawn_pool(workers: int) -> ProcessPoolExecutor:
    """Worker processes that exit when this server does."""
    # spawn, not fork: the server has threads (the thread pool, the database pool), and forking a
    # threaded process can copy a held lock into the child.
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=solve_process.watch_parent,
        initargs=(os.getpid(),),
    )


class EmbeddedRunner:
    """The Runner of one server: the database is the queue, a process pool in this server solves."""

    def __init__(self, db: Database, settings: Settings, metrics: Metrics) -> None:
        self.db = db
        self.settings = settings
        self.metrics = metrics
        self._pool: ProcessPoolExecutor | None = None
        self._plot_pool: ProcessPoolExecutor | None = None
        self._wake = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        self._done_events: dict[str, asyncio.Event] = {}
        self._dispatcher: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- lifecycle

    def _new_pool(self, workers: int) -> ProcessPoolExecutor:
        return spawn_pool(workers)

    async def start(self) -> None:
        requeued, failed, queued = await self._db(lambda s: crud.recover(s, self.settings.max_attempts))
        if requeued or failed or queued:
            log.info(
                "recovered jobs after restart: %d re-queued, %d failed after repeated interruptions, "
                "%d queued in total",
                requeued,
                failed,
                queued,
            )
        self._pool = self._new_pool(self.settings.workers)
        # Start the workers now (imports included) so the first job does not pay for it.
        loop = asyncio.get_running_loop()
        for _ in range(self.settings.workers):
            warm = loop.run_in_executor(self._pool, solve_process.warm_up)
            # Mark the result as seen: a warm-up cut short by shutdown is not worth an "exception never
            # retrieved" warning.
            warm.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._dispatcher = asyncio.create_task(self._dispatch(), name="memsched-dispatcher")

    async def stop(self) -> None:
        """Stop taking jobs. Jobs still running stay 'running' in the database and are re-queued at the next
        start: a shutdown never loses them."""
        if self._dispatcher is not None:
            self._dispatcher.cancel()
        for t in list(self._running):
            t.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        for pool in (self._pool, self._plot_pool):
            # Kill, not wait: a long solve would hold up the shutdown, and its job is re-queued at the next
            # start anyway; idle workers lose nothing.
            if pool is not None:
                await to_thread.run_sync(kill_pool, pool, True)
        self._pool = self._plot_pool = None

    # ---------------------------------------------------------------- API used by routes

    def enqueue(self, job_id: str, time_limit_s: float) -> None:
        """Nothing to hand over: the job's row is the queue entry, and notify() wakes the dispatcher."""

    def notify(self) -> None:
        """A job was queued: wake the dispatcher now instead of at its next poll."""
        self._wake.set()

    def readiness(self) -> Readiness:
        return Readiness(workers=self.settings.workers)

    async def wait(self, job_id: str, timeout: float) -> None:
        """Return when the job is done or failed, or after `timeout` seconds. The event wakes us at once
        when this process finishes it; the periodic database check covers a job that finished before we
        started waiting, or in another process."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            ev = self._done_events.setdefault(job_id, asyncio.Event())
            if await self._db(lambda s: crud.is_finished(s, job_id)):
                self._done_events.pop(job_id, None)  # nothing will set it now: do not keep it
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ev.wait(), min(remaining, _POLL_S))

    async def render_plot(self, trace_json: str, schedule_json: str) -> bytes:
        # Plots get their own single process so they never wait behind long solves.
        if self._plot_pool is None:
            self._plot_pool = self._new_pool(1)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._plot_pool, solve_process.render_plot, trace_json, schedule_json)

    async def _db(self, fn: Callable[[Any], T]) -> T:
        def run() -> T:
            with self.db.session() as s:
                return fn(s)

        return await to_thread.run_sync(run)

    # ---------------------------------------------------------------- dispatching

    async def _dispatch(self) -> None:
        while True:
            try:
                while len(self._running) < self.settings.workers:
                    job = await self._db(crud.claim_next)
                    if job is None:
                        break
                    task = asyncio.create_task(self._run(job), name=f"memsched-job-{job.id}")
                    self._running.add(task)
                    task.add_done_callback(self._task_done)
            except asyncio.CancelledError:
                raise
            except Exception:
                # The database went away for a moment: keep the dispatcher alive and try again.
                log.exception("dispatcher could not claim a job; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _POLL_S)
            self._wake.clear()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._wake.set()  # a worker is free

    def _signal_done(self, job_id: str) -> None:
        ev = self._done_events.pop(job_id, None)
        if ev is not None:
            ev.set()

    async def _run(self, job: crud.ClaimedJob) -> None:
        assert self._pool is not None
        pool = self._pool
        s = self.settings
        loop = asyncio.get_running_loop()
        # The worker stops an overrunning solver by itself after time_limit + grace and gives the heuristic
        # one more grace; the watchdog here kills the worker after a third, for code no signal reaches.
        time_limit_s = job.params.time_limit_s
        watchdog_s = time_limit_s + 3 * s.job_grace_s
        try:
            fut = loop.run_in_executor(
                pool,
                solve_process.run_solve,
                job.trace_json,
                job.budget_bytes,
                job.params,
                s.job_grace_s,
                s.solver_threads,
            )
            outcome = await asyncio.wait_for(fut, watchdog_s)
        except TimeoutError:
            log.error("job %s: no answer %.0f s after its start; killing its worker pool", job.id, watchdog_s)
            self._recycle(pool)
            await self._db(
                lambda ses: crud.finish_job(
                    ses,
                    job.id,
                    None,
                    f"the solver did not stop within {watchdog_s:g} s (time limit {time_limit_s:g} s plus "
                    f"grace) and its worker was killed; resubmit with solver 'heuristic' or a shorter "
                    "time_limit_s",
                )
            )
            self.metrics.solves.labels(JobStatus.FAILED).inc()
            self._signal_done(job.id)
            return
        except BrokenProcessPool:
            # A worker died (out of memory, killed, or recycled for another job's overrun). The job itself
            # may be innocent: re-queue it unless it has been interrupted too often.
            self._recycle(pool)
            requeued = await self._db(
                lambda ses: crud.requeue_job(ses, job.id, "its worker process died", s.max_attempts)
            )
            self.metrics.solves.labels("requeued" if requeued else JobStatus.FAILED).inc()
            if requeued:
                self._wake.set()
            else:
                self._signal_done(job.id)
            return
        except asyncio.CancelledError:
            # Shutdown: leave the row 'running'; start-up recovery re-queues it.
            raise
        except Exception as e:
            # Not the solver's doing (that is caught in the worker): a bug here. Fail the job with a reason
            # rather than leave it 'running' until the next restart.
            log.exception("job %s: the runner failed", job.id)
            reason = f"internal error: {type(e).__name__}: {e}"
            await self._db(lambda ses: crud.finish_job(ses, job.id, None, reason))
            self.metrics.solves.labels(JobStatus.FAILED).inc()
            self._signal_done(job.id)
            return
        await self._db(
            lambda ses: crud.finish_job(
                ses,
                job.id,
                outcome.schedule_json,
                outcome.error,
                outcome.min_feasible_bytes,
                outcome.wall_s,
                outcome.min_feasible_host_bytes,
            )
        )
        self.metrics.solve_seconds.observe(outcome.wall_s)
        self.metrics.solves.labels(JobStatus.DONE if outcome.schedule_json is not None else JobStatus.FAILED).inc()
        log.info(
            "job %s %s in %.3f s",
            job.id,
            JobStatus.DONE if outcome.schedule_json is not None else JobStatus.FAILED,
            outcome.wall_s,
        )
        self._signal_done(job.id)

    def _recycle(self, pool: ProcessPoolExecutor) -> None:
        """Replace a pool whose worker is stuck or dead (once, however many jobs notice it)."""
        if self._pool is pool:
            kill_pool(pool)
            self._pool = self._new_pool(self.settings.workers)


def kill_pool(pool: ProcessPoolExecutor, wait: bool = False) -> None:
    """Kill the pool's processes and shut it down. `wait=True` (at server shutdown) also reaps the processes
    and joins the pool's manager thread, which closes the queues between server and workers: without it the
    process exits with their locks still registered and the resource tracker warns of leaked semaphores.
    The wait is short, the workers being dead already; `wait=False` is for the event loop's own thread."""
    # ProcessPoolExecutor has no public way to stop a running task (terminate_workers() arrives in 3.14), so
    # kill its processes directly; their futures then fail with BrokenProcessPool.
    procs = list(getattr(pool, "_processes", {}).values())
    for p in procs:
        if p.is_alive():
            if p.pid is not None:
                solve_process.kill_descendants(p.pid)  # the solver binaries it started, first
            p.kill()
    if wait:
        for p in procs:
            p.join(_REAP_S)
    pool.shutdown(wait=wait, cancel_futures=True)
