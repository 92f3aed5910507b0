"""When a sweep must stop: its deadline, and the filters it must not start past it.

The dominance filters are compiled loops (the fluid one cannot stop part way), and on a boundary of a few hundred
thousand labels one takes seconds (the FIFO filter handles about 170,000 labels a second on one core). A
sweep that checked the clock only between boundaries overran its deadline by the length of the filters and
expansions it started just before it (bert-large at 50%: 37.6 s for a 30 s limit). So a sweep asks this
clock before every filter, and stops rather than start one that it predicts would end past the deadline.
Stopping there is always sound: the labels not yet filtered are still pending, and the sweep's partial
bound (the least cost on its frontier) covers them. The FIFO filter's time per label varies with how far into
its ring each label looks, so it also counts its work and stops at the budget the clock gives it (work_budget).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

_MIN_TIMED = 4096
"""Filters of fewer labels are too short to time reliably (and too short to matter)."""
_SAFETY = 1.25
"""Predictions are scaled by this: a filter's time per label grows slowly with its size."""
_S_PER_WORK = 2e-8
"""Prior of the FIFO filter's seconds per unit of work (measured: 1-1.5e-8 on one core), until one is timed."""
_MIN_WORK = 1 << 20
"""Filters of less work are too short to time reliably."""


@dataclass
class SweepClock:
    """A sweep's deadline and its filters' measured speed."""

    deadline: float
    """time.perf_counter() value at which the sweep stops."""
    s_per_label: float
    """Seconds one filter spends per label: a prior until a filter of _MIN_TIMED labels or more is timed."""
    s_per_work: float | None = None
    """Seconds per unit of a filter's own work count (FIFO filter: labels plus comparisons), the most measured
    so far (None: none measured yet, _S_PER_WORK is assumed): a filter that counts its work stops at the budget
    this gives (work_budget)."""

    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return time.perf_counter() > self.deadline

    def affordable(self, labels: int) -> bool:
        """Whether a filter of `labels` labels, started now, is predicted to end by the deadline."""
        return time.perf_counter() + _SAFETY * labels * self.s_per_label <= self.deadline

    def work_budget(self) -> int:
        """The work a filter started now may do and still end by the deadline (at least 1: it can start)."""
        left = self.deadline - time.perf_counter()
        return max(1, int(left / (_SAFETY * (self.s_per_work or _S_PER_WORK)))) if left > 0 else 0

    def timed_work(self, work: int, seconds: float) -> None:
        """Record a filter's measured work and time: the slowest rate seen sets the budget (its comparisons
        cost more as its labels spread over memory)."""
        if work >= _MIN_WORK:
            self.s_per_work = max(self.s_per_work or 0.0, seconds / work)

    def timed(self, labels: int, seconds: float) -> None:
        """Record a filter's measured time (the latest large one sets the speed: it tracks the label shape)."""
        if labels >= _MIN_TIMED:
            self.s_per_label = seconds / labels
