"""When a sweep must stop: its deadline, and the filters it must not start past it.

The dominance filters are compiled loops that cannot stop part way, and on a boundary of a few hundred
thousand labels one takes seconds (the FIFO filter handles about 170,000 labels a second on one core). A
sweep that checked the clock only between boundaries overran its deadline by the length of the filters and
expansions it started just before it (bert-large at 50%: 37.6 s for a 30 s limit). So a sweep asks this
clock before every filter, and stops rather than start one that it predicts would end past the deadline.
Stopping there is always sound: the labels not yet filtered are still pending, and the sweep's partial
bound (the least cost on its frontier) covers them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

_MIN_TIMED = 4096
"""Filters of fewer labels are too short to time reliably (and too short to matter)."""
_SAFETY = 1.25
"""Predictions are scaled by this: a filter's time per label grows slowly with its size."""


@dataclass
class SweepClock:
    """A sweep's deadline and its filters' measured speed."""

    deadline: float
    """time.perf_counter() value at which the sweep stops."""
    s_per_label: float
    """Seconds one filter spends per label: a prior until a filter of _MIN_TIMED labels or more is timed."""

    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return time.perf_counter() > self.deadline

    def affordable(self, labels: int) -> bool:
        """Whether a filter of `labels` labels, started now, is predicted to end by the deadline."""
        return time.perf_counter() + _SAFETY * labels * self.s_per_label <= self.deadline

    def timed(self, labels: int, seconds: float) -> None:
        """Record a filter's measured time (the latest large one sets the speed: it tracks the label shape)."""
        if labels >= _MIN_TIMED:
            self.s_per_label = seconds / labels
