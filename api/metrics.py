"""Prometheus metrics: jobs by state (read from the database at scrape time, so they survive restarts),
solve seconds, cache hits. One registry per app, so several apps in one process (tests) do not collide."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# The *_created series (counter creation timestamps) only add noise to a service's scrape.
disable_created_metrics()


class _JobsByState(Collector):
    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily("memsched_jobs", "Schedule jobs in the database, by state", labels=["state"])
        try:
            for state, n in sorted(self._counts().items()):
                g.add_metric([state], n)
        except Exception:
            # A scrape must not fail because the database blinked; /readyz reports that instead.
            log.warning("could not count jobs for /metrics", exc_info=True)
        yield g


class _Broker(Collector):
    """Distributed mode: the broker's queue depth and Celery's live workers, asked at scrape time."""

    def __init__(self, depth: Callable[[], int], workers: Callable[[], int]) -> None:
        self._depth, self._workers = depth, workers

    def collect(self) -> Iterator[Metric]:
        for name, doc, fn in (
            ("memsched_queue_depth", "Solve messages waiting in the broker's queue", self._depth),
            ("memsched_workers_live", "Celery workers consuming the queue that answered a broadcast", self._workers),
        ):
            g = GaugeMetricFamily(name, doc)
            try:
                g.add_metric([], fn())
            except Exception as e:  # noqa: BLE001  # kombu, redis, amqp or OS errors alike
                # The broker is down: leave the sample out rather than fail the scrape (/readyz says why).
                log.warning("could not read %s for /metrics: %s: %s", name, type(e).__name__, str(e)[:200])
            yield g


class Metrics:
    def __init__(
        self,
        job_counts: Callable[[], dict[str, int]],
        broker: tuple[Callable[[], int], Callable[[], int]] | None = None,
    ) -> None:
        """`broker` (distributed mode): queue depth and live workers. Solves then run in the workers, so
        this process does not export the solve counters it would never increment."""
        self.registry = CollectorRegistry()
        solves_here = self.registry if broker is None else None
        self.solve_seconds = Histogram(
            "memsched_solve_seconds",
            "Wall seconds of each solve in the worker processes",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
            registry=solves_here,
        )
        self.solves = Counter(
            "memsched_solves",
            "Solves run, by outcome (done | failed | requeued)",
            ["outcome"],
            registry=solves_here,
        )
        self.cache_hits = Counter(
            "memsched_cache_hits",
            "Schedule requests answered from a stored or in-flight identical job instead of a new solve",
            registry=self.registry,
        )
        self.registry.register(_JobsByState(job_counts))
        if broker is not None:
            self.registry.register(_Broker(*broker))

    def render(self) -> bytes:
        return generate_latest(self.registry)
