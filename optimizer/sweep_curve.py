"""The memory/time curve of one trace: a solved schedule at each of a set of budgets, from the smallest feasible
one up to keep-all, with the budgets placed where the curve bends rather than on a fixed grid.

Each budget is solved by `solve` (the one entry point `memsched solve` uses). What is reused across budgets is
only what the cost model makes sound, because the optimal overhead OPT(B) never rises with the budget B:

- a schedule whose peak fits a budget fits every larger one, so a point's answer is the best schedule found at
  its own budget or at any smaller one (re-labelled with its own budget, its prediction unchanged);
- a lower bound proven at a budget holds at every smaller one (OPT(B) >= OPT(B') >= bound(B') for B <= B'),
  so a point's bound is the best bound proven at its own budget or at any larger one.

After that exchange the curve is non-increasing and every bound is still a true bound.

Points whose gap is still open when every budget is solved are solved again, from their answer so far, with the
time the sweep has left of its budget, n_points x the limit per point over the `parallel` solves: `_refine`. The
better schedule and the larger bound of the two solves are kept (both are true of that budget).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

from memsched.errors import InfeasibleBudgetError, InfeasibleHostBudgetError, MemschedError, UnsettledBudgetError
from memsched.optimizer.budget import keepall_activation_peak, min_feasible_budget
from memsched.schema import Schedule, SolverStatus, Trace
from memsched.units import format_bytes

log = logging.getLogger(__name__)

Submit = Callable[[int], "Future[Schedule]"]
"""Starts the solve of one budget (bytes); its future holds the schedule, or InfeasibleBudgetError where none
fits. The caller decides where it runs (this process, or a pool): the curve only decides which budgets."""
Resubmit = Callable[[int, float, Schedule], "Future[Schedule]"]
"""Starts another solve of one budget (bytes) with the given time limit (seconds), from the given schedule (the
point's answer so far), where Submit runs it."""

MIN_POINTS = 2
MAX_POINTS = 200
"""The most points one sweep may ask for (each is a solve)."""
_REL_TOL = 1e-9
_HOST_BISECTIONS = 6
"""Solves a sweep spends at most on finding where a host budget starts to fit (each halves the interval)."""
_KNEE_DEPTH = 0.05
"""A knee lies at least this far below the chord of its stretch of the curve, in the unit square (budget range
x overhead range): a smaller sag is a gentle curve or the solver's gap, not a bend."""
_FLAT_S = 1e-12
"""Overheads at or below this are zero (the simulator's rounding)."""
_REFINE_MIN = 2.0
"""A point is solved again only with at least this many times its first limit: a solve from scratch with about
the same time ends about where the first one did."""


@dataclass
class CurvePoint:
    """One budget of the curve and its answer."""

    budget_bytes: int
    """The budget, bytes (whole device peak)."""
    schedule: Schedule
    """The best schedule found at this budget or a smaller one, labelled with this budget."""
    bound_s: float | None
    """A true lower bound on the overhead of any schedule at this budget, seconds (None: none proven)."""
    status: SolverStatus
    """optimal (the bound proves the requested gap), feasible (a bound, a larger gap) or heuristic (no bound)."""
    reused_from: int | None = None
    """The smaller budget whose schedule this point reuses, where that beat the point's own solve."""
    solve_s: float = 0.0
    """Wall seconds of this point's own solve."""

    @property
    def overhead_s(self) -> float:
        return self.schedule.prediction.overhead_s

    @property
    def gap(self) -> float | None:
        """(overhead - bound) / overhead; 0 where the overhead is 0; None without a bound."""
        if self.bound_s is None:
            return None
        if self.overhead_s <= _FLAT_S:
            return 0.0
        return max(0.0, (self.overhead_s - self.bound_s) / self.overhead_s)


@dataclass
class Knee:
    """A budget below which the cost rises steeply."""

    budget_bytes: int
    """The knee's budget, bytes."""
    overhead_s: float
    """Overhead at the knee, seconds."""
    slope_below_s_per_byte: float
    """Seconds of overhead each byte less costs just below the knee."""
    slope_above_s_per_byte: float
    """Seconds of overhead each byte more saves just above it."""


@dataclass
class SweepCurve:
    """The answer of a sweep."""

    lo_bytes: int
    """The smallest budget swept (the smallest feasible one unless a larger start was asked for)."""
    hi_bytes: int
    """The largest budget swept (keep-all's peak unless a smaller end was asked for)."""
    keepall_step_s: float
    """The in-core step time the overheads are measured against, seconds."""
    points: list[CurvePoint]
    """The solved budgets, smallest first."""
    knees: list[Knee]
    """The knee points, smallest budget first."""
    zero_overhead_bytes: int | None
    """The smallest swept budget with no overhead (None: every swept budget costs time)."""
    wall_s: float
    """Wall seconds of the whole sweep."""
    notes: list[str] = field(default_factory=list)
    """What the sweep adjusted (a start below the smallest feasible budget, points merged, ...)."""


def budget_range(trace: Trace, lo: int | None, hi: int | None) -> tuple[int, int, list[str]]:
    """The range to sweep: [lo, hi] clipped to [smallest feasible, keep-all peak], with notes on any clipping.
    Raises MemschedError for an empty range and InfeasibleBudgetError for one wholly below the smallest
    feasible budget (with that budget)."""
    notes: list[str] = []
    floor = min_feasible_budget(trace)
    top = trace.static.total + keepall_activation_peak(trace)
    if lo is not None and hi is not None and lo >= hi:
        raise MemschedError(
            f"budget range: the start ({lo} bytes) is not below the end ({hi} bytes); give a start below the end "
            "(--from / --to, or budget_from / budget_to)"
        )
    if hi is not None and hi < floor:
        raise InfeasibleBudgetError(hi, floor, "the whole budget range lies below it")
    start = floor if lo is None else lo
    if start < floor:
        notes.append(f"start raised from {start} to the smallest feasible budget, {floor} bytes")
        start = floor
    end = top if hi is None else hi
    if end > top:
        notes.append(f"end lowered from {end} to keep-all's peak, {top} bytes (more memory changes nothing)")
        end = top
    if start >= end:
        raise MemschedError(
            f"budget range: nothing to sweep between {start} and {end} bytes (keep-all already fits at the "
            "start); give a start below keep-all's peak"
        )
    return start, end, notes


def _restart(points: dict[int, CurvePoint], start: int, grid: Callable[[int], list[int]]) -> list[int]:
    """The sweep's start raised to `start`: the points solved below it dropped (in place), and the budgets to solve
    next, `grid(start)` less those solved."""
    for x in [x for x in points if x < start]:
        del points[x]
    return [x for x in grid(start) if x not in points]


def sweep(
    trace: Trace,
    submit: Submit,
    n_points: int,
    lo: int | None = None,
    hi: int | None = None,
    gap: float = 0.01,
    parallel: int = 1,
    refine: Resubmit | None = None,
    point_limit_s: float | None = None,
) -> SweepCurve:
    """Solve `n_points` budgets in [lo, hi] (default: smallest feasible to keep-all), up to `parallel` at once:
    first an even grid, then, each time a solve ends, the middle of the interval where the curve bends most
    (see `_priority`) among those no running solve is splitting already. With `refine` and `point_limit_s` (each
    point's time limit), the points left outside `gap` are then solved again within the sweep's budget,
    n_points x point_limit_s / parallel from its start (`_refine`)."""
    if not MIN_POINTS <= n_points <= MAX_POINTS:
        raise MemschedError(f"points: {n_points} is out of range; give {MIN_POINTS} to {MAX_POINTS}")
    t0 = time.perf_counter()
    if hi is not None and hi < min_feasible_budget(trace) and (lo is None or lo < hi):
        # Wholly below the least budget any plan reaches. With some actions left out (keep and recompute: a CPU
        # trace's default) the smallest feasible budget lies above that one, so the solver of these options says
        # which it is: the number is the one a solve of `hi` gives, not a bound passed off as it.
        submit(hi).result()
    start, end, notes = budget_range(trace, lo, hi)
    points: dict[int, CurvePoint] = {}
    running: dict[Future[Schedule], tuple[int, float]] = {}
    min_step = max(1, (end - start) // (64 * MAX_POINTS))

    def grid(a: int) -> list[int]:
        k = min(n_points, max(3, parallel + 2))
        return list(dict.fromkeys(a + round((end - a) * i / (k - 1)) for i in range(k)))

    queue = grid(start)
    host_floor = -1  # the largest budget at which no plan fits the host budget (SolveOptions.host_budget)
    host_steps = 0
    while True:
        while len(running) < parallel and len(points) + len(running) < n_points:
            busy = {b for b, _ in running.values()}
            b = queue.pop(0) if queue else _next_budget(points, start, end, busy, min_step)
            if b is None:
                break
            if b in points or b in busy:
                continue
            running[submit(b)] = (b, time.perf_counter())
        if not running:
            break
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for f in done:
            b, since = running.pop(f)
            try:
                sc = f.result()
            except InfeasibleBudgetError as e:
                # Only with some actions left out: the smallest feasible budget is then above offload-all's,
                # and the solver says where. Start there; budgets below it are dropped.
                if e.min_feasible_bytes <= b:
                    raise
                if e.min_feasible_bytes >= end:
                    if hi is not None:
                        raise
                    raise MemschedError(
                        f"budget range: nothing to sweep above {e.min_feasible_bytes} bytes with these actions"
                    ) from None
                if e.min_feasible_bytes > start:
                    start = e.min_feasible_bytes
                    notes.append(f"start raised to {start} bytes, the smallest budget that fits these actions")
                    queue = _restart(points, start, grid)
                continue
            except UnsettledBudgetError as e:
                # The DP could neither fit a plan of these actions to this budget nor rule one out in a point's time:
                # start at the smallest budget known to fit rather than lose the sweep; below it, not searched.
                if e.fits_bytes <= b or e.fits_bytes >= end:
                    raise
                if e.fits_bytes > start:
                    start = e.fits_bytes
                    notes.append(
                        f"start raised to {start} bytes, a budget these actions fit: below it the exact DP could "
                        f"neither fit nor rule out a plan within a point's time limit ({b} bytes; a longer time "
                        "limit may settle it)"
                    )
                    queue = _restart(points, start, grid)
                continue
            except InfeasibleHostBudgetError:
                # The host budget needs fewer offloaded bytes the larger the budget (OPT's plans nest the same
                # way): bisect for the smallest budget where it fits, a few steps, then start at a point that fits.
                if b >= end:
                    raise  # not even at the top: its smallest host budget is the least over the range
                host_floor = max(host_floor, b)
                good = min((x for x in points if x > host_floor), default=end)
                host_steps += 1
                start = (host_floor + good) // 2 if host_steps <= _HOST_BISECTIONS and good - host_floor > 1 else good
                queue = _restart(points, start, grid)
                continue
            if b < start:
                continue  # solved before the start was raised
            points[b] = _point(sc, b)
            points[b].solve_s = time.perf_counter() - since
        _exchange(points, gap)
    if refine is not None and point_limit_s is not None:
        end_by = t0 + n_points * point_limit_s / parallel
        _refine(points, refine, parallel, gap, end_by, point_limit_s, notes)
    if host_floor >= 0:
        notes.append(
            f"start raised to {start} bytes: at {host_floor} bytes and below no plan fits the host budget "
            "(between the two, not searched)"
        )
    if len(points) < n_points:
        notes.append(f"stopped at {len(points)} points: every interval is flat or narrower than {min_step} bytes")
    ordered = sorted(points.values(), key=lambda p: p.budget_bytes)
    zero = next((p.budget_bytes for p in ordered if p.overhead_s <= _FLAT_S), None)
    return SweepCurve(
        lo_bytes=start,
        hi_bytes=end,
        keepall_step_s=ordered[0].schedule.prediction.keepall_step_s,
        points=ordered,
        knees=find_knees(ordered),
        zero_overhead_bytes=zero,
        wall_s=time.perf_counter() - t0,
        notes=notes,
    )


def _open(p: CurvePoint) -> bool:
    """Whether a point's answer is not proven within the sweep's gap (no bound, or a larger gap)."""
    return p.status != SolverStatus.OPTIMAL


def _refine(
    points: dict[int, CurvePoint],
    refine: Resubmit,
    parallel: int,
    gap: float,
    end_by: float,
    point_limit_s: float,
    notes: list[str],
) -> None:
    """Solve the open points again from their answers so far (solve()'s `start`: it tries to prove that answer
    first), widest gap first, `parallel` at once, until `end_by` (time.perf_counter()):
    each gets an even share of the time left, counted in rounds of `parallel` over the points still to start and
    those running (at least _REFINE_MIN x its first limit, else it and the rest are not started). The better
    schedule and the larger bound of a point's two solves are kept, and the exchange between budgets runs
    again."""
    todo = sorted((p for p in points.values() if _open(p)), key=lambda p: -(p.gap if p.gap is not None else math.inf))
    running: dict[Future[Schedule], tuple[CurvePoint, float, float]] = {}
    tried: list[tuple[CurvePoint, float, float]] = []  # (point, its limit, seconds its second solve took)
    while todo or running:
        while todo and len(running) < parallel:
            now = time.perf_counter()
            # The points still to start and those running share the slots in rounds of `parallel`.
            limit = (end_by - now) / math.ceil((len(todo) + len(running)) / parallel)
            if limit < _REFINE_MIN * point_limit_s:
                todo = []  # the rest would get no more time than their first solve had
                break
            p = todo.pop(0)
            running[refine(p.budget_bytes, limit, p.schedule)] = (p, now, limit)
        if not running:
            break
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for f in done:
            p, since, limit = running.pop(f)
            took = time.perf_counter() - since
            p.solve_s += took
            try:
                again = f.result()
            except MemschedError as e:  # the first answer stands: a second solve only ever adds to it
                log.warning("sweep: solving %d bytes again failed: %s", p.budget_bytes, e)
                notes.append(f"solving {format_bytes(p.budget_bytes)} again failed ({e}); its first answer stands")
                continue
            tried.append((p, limit, took))
            _merge(p, again, limit)
        _exchange(points, gap)
    if tried:
        closed = sum(1 for p, _, _ in tried if not _open(p))
        budgets = ", ".join(
            f"{format_bytes(p.budget_bytes)} ({took:.2g} s of a {limit:.0f} s limit)" for p, limit, took in tried
        )
        notes.append(
            f"solved again with the time the sweep had left (its points' limit, {point_limit_s:g} s each, over "
            f"{parallel} at once): {budgets}; {closed} of {len(tried)} now within the gap"
        )


def _merge(p: CurvePoint, again: Schedule, limit: float) -> None:
    """A point's second solve into it: the better schedule, the larger bound (both hold at this budget)."""
    first = p.schedule.solver
    if again.prediction.overhead_s < p.overhead_s * (1 - _REL_TOL):
        p.schedule = again
        p.reused_from = None
    bound = again.solver.best_bound_s
    if bound is not None and (p.bound_s is None or bound > p.bound_s):
        p.bound_s = bound
    gap = f"{100 * first.gap:.2f}%" if first.gap is not None else "no bound"
    note = f"sweep: solved again with {limit:.1f} s, the time the sweep had left (the first solve: {gap})"
    rec = p.schedule.solver
    if note not in rec.details:
        p.schedule.solver = rec.model_copy(update={"details": [*rec.details, note]})


def solved_now(solve: Callable[[int], Schedule]) -> Submit:
    """A Submit that solves in this process, at once (its futures are done when returned)."""

    def submit(budget: int) -> Future[Schedule]:
        f: Future[Schedule] = Future()
        try:
            f.set_result(solve(budget))
        except MemschedError as e:
            f.set_exception(e)
        return f

    return submit


def _point(sc: Schedule, budget: int) -> CurvePoint:
    rec = sc.solver
    return CurvePoint(budget_bytes=budget, schedule=sc, bound_s=rec.best_bound_s, status=rec.status)


def _unit(points: Sequence[CurvePoint], start: int, end: int) -> list[tuple[float, float]]:
    """The points in the unit square: budget over the range, overhead over the largest one."""
    top = max((p.overhead_s for p in points), default=0.0) or 1.0
    span = max(1, end - start)
    return [((p.budget_bytes - start) / span, p.overhead_s / top) for p in points]


def _turn(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
    """The angle (radians, 0..pi) by which the path a -> b -> c changes direction at b."""
    u = (b[0] - a[0], b[1] - a[1])
    v = (c[0] - b[0], c[1] - b[1])
    nu, nv = math.hypot(*u), math.hypot(*v)
    if nu == 0 or nv == 0:
        return 0.0
    cos = max(-1.0, min(1.0, (u[0] * v[0] + u[1] * v[1]) / (nu * nv)))
    return math.acos(cos)


def _priority(xy: list[tuple[float, float]], i: int, flat: bool) -> float:
    """How much the interval between points i and i+1 needs another point: its length in the unit square
    (long where the overhead changes fast), doubled where the curve turns at either end. A flat interval
    (both ends cost the same, so by monotonicity everything between does too) needs none."""
    if flat:
        return 0.0
    (x0, y0), (x1, y1) = xy[i], xy[i + 1]
    turn = max(
        _turn(xy[i - 1], xy[i], xy[i + 1]) if i > 0 else 0.0,
        _turn(xy[i], xy[i + 1], xy[i + 2]) if i + 2 < len(xy) else 0.0,
    )
    return math.hypot(x1 - x0, y1 - y0) * (1.0 + turn / math.pi)


def _next_budget(points: dict[int, CurvePoint], start: int, end: int, busy: set[int], min_step: int) -> int | None:
    """The middle of the interval that needs a point most (see `_priority`), skipping intervals that a running
    solve is splitting already; None where none is left."""
    ordered = sorted(points.values(), key=lambda p: p.budget_bytes)
    xy = _unit(ordered, start, end)
    best: tuple[float, int] | None = None
    for i in range(len(ordered) - 1):
        a, b = ordered[i], ordered[i + 1]
        if b.budget_bytes - a.budget_bytes < 2 * min_step or any(a.budget_bytes < x < b.budget_bytes for x in busy):
            continue
        flat = abs(a.overhead_s - b.overhead_s) <= _REL_TOL * max(a.overhead_s, b.overhead_s, _FLAT_S)
        pr = _priority(xy, i, flat)
        if pr > 0 and (best is None or pr > best[0]):
            best = (pr, (a.budget_bytes + b.budget_bytes) // 2)
    return None if best is None else best[1]


def _exchange(points: dict[int, CurvePoint], gap: float) -> None:
    """Share answers between budgets where the cost model makes it sound (see the module's docstring)."""
    ordered = sorted(points.values(), key=lambda p: p.budget_bytes)
    best: CurvePoint | None = None
    for p in ordered:  # the best schedule at this budget or below
        if best is not None and best.overhead_s < p.overhead_s * (1 - _REL_TOL):
            src = best.reused_from if best.reused_from is not None else best.budget_bytes
            p.schedule = best.schedule.model_copy(update={"budget_bytes": p.budget_bytes}, deep=True)
            p.reused_from = src
        if best is None or p.overhead_s < best.overhead_s * (1 - _REL_TOL):
            best = p
    bound: float | None = None
    for p in reversed(ordered):  # the best bound at this budget or above
        if p.bound_s is not None and (bound is None or p.bound_s > bound):
            bound = p.bound_s
        p.bound_s = None if bound is None else min(bound, p.overhead_s)
    for p in ordered:
        g = p.gap
        p.status = (
            SolverStatus.HEURISTIC
            if g is None
            else SolverStatus.OPTIMAL
            if g <= gap + _REL_TOL
            else SolverStatus.FEASIBLE
        )
        _relabel(p)


def _relabel(p: CurvePoint) -> None:
    """Make the point's schedule say what the curve says of it (bound, gap, status, where it came from)."""
    rec = p.schedule.solver
    update: dict[str, object] = {"best_bound_s": p.bound_s, "gap": p.gap, "status": p.status}
    details = list(rec.details)
    if p.reused_from is not None:
        note = f"sweep: the schedule solved at budget {p.reused_from} bytes, which also fits this larger budget"
        if note not in details:
            details.append(note)
    if p.bound_s is not None and rec.best_bound_s is not None and p.bound_s > rec.best_bound_s * (1 + _REL_TOL):
        note = "sweep: bound raised to one proven at a larger budget (a bound there holds at every smaller one)"
        if note not in details:
            details.append(note)
    update["details"] = details
    p.schedule.solver = rec.model_copy(update=update)


def find_knees(ordered: Sequence[CurvePoint]) -> list[Knee]:
    """The knees of a falling curve, found as Kneedle does (Satopaa et al., 2011): in the unit square (budget
    over the range, overhead over the largest), the point farthest below the chord between a stretch's ends,
    kept where that distance is at least _KNEE_DEPTH; then the same within the stretches on either side of it
    (two levels), so a curve with a steep start and a second bend gets both."""
    if len(ordered) < 3:
        return []
    xy = _unit(ordered, ordered[0].budget_bytes, ordered[-1].budget_bytes)
    found: list[int] = []

    def split(i0: int, i1: int, depth: int) -> None:
        (x0, y0), (x1, y1) = xy[i0], xy[i1]
        norm = math.hypot(x1 - x0, y1 - y0)
        if i1 - i0 < 2 or norm == 0:
            return
        # Signed distance below the chord (positive where the curve sags under it, as a falling convex one does).
        dist = [((x1 - x0) * (xy[i][1] - y0) - (y1 - y0) * (xy[i][0] - x0)) / -norm for i in range(i0 + 1, i1)]
        best = max(range(len(dist)), key=dist.__getitem__)
        if dist[best] < _KNEE_DEPTH:
            return
        k = i0 + 1 + best
        found.append(k)
        if depth < 2:
            split(i0, k, depth + 1)
            split(k, i1, depth + 1)

    split(0, len(ordered) - 1, 0)
    knees = []
    for i in sorted(found):
        a, b, c = ordered[i - 1], ordered[i], ordered[i + 1]
        knees.append(
            Knee(
                budget_bytes=b.budget_bytes,
                overhead_s=b.overhead_s,
                slope_below_s_per_byte=(a.overhead_s - b.overhead_s) / max(1, b.budget_bytes - a.budget_bytes),
                slope_above_s_per_byte=(b.overhead_s - c.overhead_s) / max(1, c.budget_bytes - b.budget_bytes),
            )
        )
    return knees
