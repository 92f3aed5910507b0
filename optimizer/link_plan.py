"""The link plan: a constructive start read off the link windows' Lagrangian, for long traces whose copy link
is the bottleneck.

At each set of prices the link windows' Lagrangian (`optimizer/dp/lagrange.py`, `LinkLagrangian`) solves a
shortest path whose arcs are plans: keep, offload or recompute segments. One such plan is bang-bang (a step makes
offload free, the next makes it dear), but averaged over the later half of the ascent each layer's share of its
steps in each action approaches the LP optimum's fractions. Where the LP recomputes a layer, it is usually in a
run of neighbours that share one checkpoint: the layers it recomputes are not those that free the most bytes
alone (the ratio plan's order), and a run of them kept as one segment holds one input instead of one per layer.

The family rounds those shares, with three parameters:
- a: recompute every layer whose recompute share is at least `a`; a run of such layers is one segment;
- the tail: offload each other layer whole up to the tail, keep it from there on (as in the ratio plan: the last
  layers' copies would still be queued when the backward needs them back);
- c: offload only the layers whose offload share is at least `c` (0: all of them up to the tail).

Each member is scored by the compiled simulator (`FastSim`); the best member that fits is the candidate. The
shares come from several windows of the ascent (`LinkLagrangian.windows`: the later half, then single blocks of
steps): the prices circle their best, and one stretch of them can round far below the average (DenseNet-121 at 25%,
30 s: 0.0489 s from one block against 0.0798 s from the later half).
Measured (2026-11-30, one core; the shares after 6 s of the Lagrangian, then the scan): the 1,000-layer synthetic
chain at 20%, 0.1035 s, where the ratio plan gives 0.1230 s and the 60 s solve answered 0.1126 s; the DAG 0.1412
s (ratio 0.1639, 60 s 0.1542); the 200-layer chain after 0.5 s 0.02859 s (ratio 0.0366, 10 s 0.0311). On
DenseNet-121 (concatenations: no layer frees bytes alone) it loses to the greedy, and the solve keeps the best.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memsched.optimizer.decisions import ALL_ACTIONS, KEEP, Decision, offload_all, recompute
from memsched.optimizer.fastsim import KIND_CONTINUE, KIND_KEEP, KIND_OFFLOAD, KIND_START, FastSim
from memsched.optimizer.ratio import grid, whole_offloads
from memsched.optimizer.simulate import SimResult, simulate
from memsched.schema import Action, Trace

_RECOMPUTE_LEVELS = 20
"""Thresholds `a` of the first scan: 1/20, 2/20, ..., 1."""
_COARSE_TAIL = 50
"""Points of the first scan over the tail."""
_FINE = 8
"""The finer scan divides the coarse steps by this."""
_OFFLOAD_LEVELS = (0.0, 0.25, 0.5, 0.75)
"""Thresholds `c` of the finer scan (the first scan offloads every layer up to the tail)."""
_WINDOW_PATIENCE = 3
"""The scans stop after this many windows in a row whose members beat no member of an earlier one: where every window
rounds to the same plan (DenseNet-121 at 50%: 15 windows, 1.5 s of a 30 s solve) or none fits (PipeDream ResNet-50
with every node output saved: 32 windows, 0.5 s of 10 s), the rest would only take the local search's time."""


@dataclass(frozen=True)
class LinkShares:
    """Each layer's share of the link Lagrangian's later steps in which its least priced plan recomputed or
    offloaded it (index = layer)."""

    recompute: np.ndarray
    """float64 in [0, 1]: the share of steps in a recompute segment."""
    offload: np.ndarray
    """float64 in [0, 1]: the share of steps offloaded (any option)."""
    steps: int
    """How many steps the shares average."""
    since: int = 0
    """The first of those steps (0-based): they are steps since, ..., since + steps - 1."""


def link_plan(
    trace: Trace,
    budget_bytes: int,
    shares: LinkShares | Sequence[LinkShares],
    allowed: frozenset[Action] = ALL_ACTIONS,
    host_budget: int | None = None,
    deadline: float | None = None,
) -> SimResult | None:
    """The best plan of the family (module docstring) that fits the budget and the host budget, simulated; None
    where no member fits. `shares`: one set of shares, or several windows of the same ascent
    (`LinkLagrangian.windows`), scanned in their order: the first scan of each, and the finer one around a window's
    best member where that beats every member so far, until _WINDOW_PATIENCE windows in a row beat none.
    `deadline` (perf_counter): the scans stop there, with the best member found so far."""
    n = trace.n
    windows = [shares] if isinstance(shares, LinkShares) else list(shares)
    for w in windows:
        if len(w.recompute) != n or len(w.offload) != n:
            raise ValueError(f"link_plan: shares for {len(w.recompute)} layers, the trace has {n}")
    movable, whole = whole_offloads(trace, allowed)
    may_recompute = Action.RECOMPUTE in allowed
    score = FastSim(trace, budget_bytes)
    # The best member that fits: (overhead, its window, a, tail, c).
    best: tuple[float, LinkShares, float, int, float] | None = None
    # Layers that must start a segment of their own: after code that saves between two layers (segment_last).
    starts = np.array([i > 0 and trace.layers[i - 1].code_after_saves for i in range(n)], dtype=bool)

    def arrays(w: LinkShares, a: float, tail: int, c: float) -> tuple[np.ndarray, np.ndarray]:
        """The member's (kind, offloaded bytes) per layer, as FastSim reads them."""
        rec = w.recompute >= a if may_recompute else np.zeros(n, dtype=bool)
        off = movable & ~rec & (w.offload >= c)
        off[tail:] = False
        kind = np.full(n, KIND_KEEP, dtype=np.int64)
        kind[off] = KIND_OFFLOAD
        # CONTINUE after a layer not recomputed starts a segment: a run of recomputed layers is one segment.
        kind[rec] = KIND_CONTINUE
        kind[rec & starts] = KIND_START
        return kind, np.where(off, whole, 0)

    def scan(
        w: LinkShares,
        levels: list[float],
        tails: list[int],
        offloads: tuple[float, ...],
        seen: set[tuple[float, int, float]],
    ) -> tuple[float, float, int, float] | None:
        """Score every member of window w; its best that fits, (overhead, a, tail, c), the scan's first one that the
        deadline cut included; None where none fits."""
        found: tuple[float, float, int, float] | None = None
        for tail in tails:
            for a in levels:
                for c in offloads:
                    if deadline is not None and time.perf_counter() >= deadline:
                        return found
                    if (a, tail, c) in seen:
                        continue
                    seen.add((a, tail, c))
                    kind, nbytes = arrays(w, a, tail, c)
                    overhead, excess = score(kind, nbytes)
                    fits = excess == 0 and (host_budget is None or int(nbytes.sum()) <= host_budget)
                    if fits and (found is None or overhead < found[0]):
                        found = (overhead, a, tail, c)
        return found

    levels = [round((k + 1) / _RECOMPUTE_LEVELS, 6) for k in range(_RECOMPUTE_LEVELS)] if may_recompute else [1.0]
    tail_step = max(1, n // _COARSE_TAIL) if movable.any() else n
    level_step = 1.0 / _RECOMPUTE_LEVELS
    idle = 0  # windows in a row that beat no earlier member
    for w in windows:
        if idle >= _WINDOW_PATIENCE:
            break
        seen: set[tuple[float, int, float]] = set()
        coarse = scan(w, levels, sorted(grid(0, n, tail_step), reverse=True), (0.0,), seen)
        if coarse is None or (best is not None and coarse[0] >= best[0]):
            idle += 1
            continue
        idle = 0
        best = (coarse[0], w, *coarse[1:])
        _, a0, t0, _ = coarse
        fine_levels = [round(a0 + k * level_step / 4, 6) for k in range(-3, 4) if 0.0 < a0 + k * level_step / 4 <= 1.0]
        fine_tails = grid(max(0, t0 - tail_step), min(n, t0 + tail_step), max(1, tail_step // _FINE))
        fine = scan(
            w, fine_levels if may_recompute else [1.0], fine_tails, _OFFLOAD_LEVELS if movable.any() else (0.0,), seen
        )
        if fine is not None and fine[0] < best[0]:
            best = (fine[0], w, *fine[1:])
    if best is None:
        return None
    kind, _ = arrays(*best[1:])
    decisions: list[Decision] = []
    start = -1
    for i in range(n):
        if kind[i] in (KIND_START, KIND_CONTINUE):
            start = i if start < 0 or kind[i] == KIND_START else start
            decisions.append(recompute(group=start))
            continue
        start = -1
        decisions.append(offload_all(trace, i) if kind[i] == KIND_OFFLOAD else KEEP)
    sim = simulate(trace, decisions, budget_bytes, with_events=False)
    return sim if sim.feasible else None


__all__ = ["LinkShares", "link_plan"]
