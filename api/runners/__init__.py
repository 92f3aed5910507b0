"""Who runs the solves of queued jobs. The routes see only the `Runner` protocol; two implementations sit side
by side:

- `embedded.EmbeddedRunner` (one server): a pool of solver processes in the server, fed from the database,
  which is the queue.
- `celery_runner.CeleryRunner` (distributed mode, MEMSCHED_BROKER_URL): the job's message goes to a Celery
  broker and `memsched worker` processes, on any machine, solve it (`celery_runner.run_worker`).

Both run the same solve inside their worker processes: `solve_process.solve_with_fallback`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Readiness:
    """What /readyz reports about the solvers."""

    workers: int
    """Solver processes (embedded), or live Celery workers consuming the queue (distributed)."""
    broker: str | None = None
    """Distributed mode: the broker's kind (redis or amqp)."""
    queue_depth: int | None = None
    """Distributed mode: jobs waiting in the broker's queue."""


class Runner(Protocol):
    """Runs the solves of queued jobs; the routes' and the app's only view of a runner."""

    async def start(self) -> None:
        """Start taking jobs (the embedded runner first re-queues jobs a previous run left running)."""

    async def stop(self) -> None:
        """Stop taking jobs; a job still running stays 'running' in the database and is re-queued, never lost."""

    def enqueue(self, job_id: str, time_limit_s: float) -> None:
        """Hand over a job that needs a solve, before its row is committed (crud.submit_job). Raises
        BrokerUnavailable if it cannot be handed over: the caller then stores nothing and answers 503."""

    def notify(self) -> None:
        """A job was committed: start it now rather than at the next poll."""

    async def wait(self, job_id: str, timeout: float) -> None:
        """Return when the job is done or failed, or after `timeout` seconds."""

    async def render_plot(self, trace_json: str, schedule_json: str) -> bytes:
        """The schedule's timeline as a PNG, rendered off the event loop."""

    def readiness(self) -> Readiness:
        """The solvers' state for /readyz; raises BrokerUnavailable when the broker does not answer."""
