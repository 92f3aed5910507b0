"""The memory-state dynamic program: an exact search over the real problem, with no windows on offload
timing or segment length (docs/formulation.md, 'The memory-state DP').

Two uses:

- `beam_search`: the same sweep keeping a few hundred labels per boundary, decoded into schedules that the
  simulator judges: a strong incumbent, fast;
- `exact_search`: the full sweep, pruned by an incumbent. Copies are fluid in it (bytes drain at the link's
  bandwidth, slowed by copy latency as no real copy beats: DpProblem.fluid_d2h_bw), which is optimistic, so its
  optimum is a lower bound on every schedule's overhead.
  Where the label cap is hit it retries with coarser byte quanta (rounded down: still a relaxation).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from memsched.optimizer.dp.decode import decode
from memsched.optimizer.dp.fifo import DEFAULT_MAX_LABELS as FIFO_MAX_LABELS
from memsched.optimizer.dp.fifo import fifo_sweep
from memsched.optimizer.dp.fifo_kernels import QUEUE
from memsched.optimizer.dp.problem import DpProblem, build_problem, near_exact_cells, relaxed_problem
from memsched.optimizer.dp.sweep import BeamRank, SweepConfig, SweepResult, run_sweep
from memsched.optimizer.simulate import SimResult, simulate
from memsched.schema import Trace

log = logging.getLogger(__name__)

DEFAULT_BEAM_WIDTH = 192
DEFAULT_MAX_LABELS = 24_000_000
"""Labels held at once (stored for decoding + pending); about 0.7 GB at 30 bytes a label."""


@dataclass
class DpOutcome:
    """What a DP run established."""

    schedules: list[SimResult] = field(default_factory=list)
    """Decoded plans that fit the budget, simulated (timing from default_timing), cheapest first."""
    bound_s: float | None = None
    """A lower bound on the overhead of every schedule of this trace at this budget (None: none proved)."""
    fluid_optimum: bool = False
    """The bound is the fluid relaxation's exact optimum (the sweep finished at byte resolution, unpruned
    below the threshold)."""
    found_plans: bool = False
    """The last sweep finished with complete plans below its threshold (whether or not they decode within the
    budget: `schedules` holds those that do). A finished sweep without any proves that nothing fits."""
    cap_hit: bool = False
    """The label cap stopped a sweep (a coarser one may have followed)."""
    timed_out: bool = False
    """The deadline stopped the last sweep."""
    quantum_bytes: int = 1
    """Resolution of the last sweep (1 = exact)."""
    peak_labels: int = 0
    """Most labels at one boundary in the last sweep."""
    wall_s: float = 0.0
    """Seconds spent."""
    notes: list[str] = field(default_factory=list)
    """Approximations and limits worth reporting."""
    stopped_at: int | None = None
    """A FIFO sweep stopped before its last boundary (by the clock or its label cap): the last boundary it
    processed (None: it finished, or not a FIFO sweep)."""
    swept_s: float | None = None
    """A beam's cheapest complete plan as the sweep itself priced it (fluid copies: stalls and latency
    optimistic), to compare with what the simulator makes of the plans (None: no plan, or not a beam)."""

    @property
    def message(self) -> str:
        return "; ".join(self.notes)


def _decode_finals(trace: Trace, p: DpProblem, res: SweepResult, budget_bytes: int, limit: int = 8) -> list[SimResult]:
    sims: list[SimResult] = []
    seen: set[tuple[object, ...]] = set()
    for _cost, label in res.finals[:limit]:
        decisions = decode(trace, p, res, label)
        key = tuple(decisions)
        if key in seen:
            continue
        seen.add(key)
        sim = simulate(trace, decisions, budget_bytes, with_events=False)
        if sim.feasible:
            sims.append(sim)
    return sorted(sims, key=lambda s: s.overhead_s)


def _approximation_notes(p: DpProblem) -> list[str]:
    notes = []
    if not p.offload_complete:
        notes.append("a layer has too many saved tensors to try every offload subset: no DP bound claimed")
    if p.relaxed:
        notes.append(
            "layers with many saved tensors offload byte ranges in the bound (a relaxation: the bound holds, "
            "its plans are rounded to real tensor subsets)"
        )
    if p.output_relaxed:
        notes.append(
            "a layer saves part of its own output, or one a later layer than the next reads: the bound prices it as "
            "if kept (a relaxation: the bound holds, its plans are simulated)"
        )
    if not p.held_complete:
        notes.append("over 62 checkpoint producers cross one boundary: the extra ones count as held (optimistic)")
    return notes


def beam_search(
    trace: Trace,
    budget_bytes: int,
    deadline: float,
    width: int = DEFAULT_BEAM_WIDTH,
    threshold: float = np.inf,
    problem: DpProblem | None = None,
    rank: BeamRank = BeamRank.DRAINED,
) -> DpOutcome:
    """The sweep with at most `width` labels per boundary, dropping plans that already cost `threshold`
    (the best schedule known), its labels scored as `rank` says; its decoded plans (no bound). `problem`:
    build_problem(trace, budget_bytes), where the caller already has it."""
    t0 = time.perf_counter()
    p = problem or build_problem(trace, budget_bytes)
    if p.fluid_d2h_bw != p.d2h_bw or p.fluid_h2d_bw != p.h2d_bw:
        # The beam ranks plans by the fluid cost at the link's own bandwidth, as it did before latency slowed the
        # proving sweeps' link (DpProblem.fluid_d2h_bw): a search, not a bound, so it keeps the ranking whose
        # plans were measured (the slower link, on the ResNet-50 H100 trace at 75%: 0.00389 -> 0.00422 s).
        p = dataclasses.replace(p, fluid_d2h_bw=p.d2h_bw, fluid_h2d_bw=p.h2d_bw, _remaps={})
    res = run_sweep(p, SweepConfig(deadline=deadline, beam=width, threshold=threshold, beam_rank=rank))
    out = DpOutcome(timed_out=res.timed_out, peak_labels=res.peak_labels, notes=_approximation_notes(p))
    if res.finished:
        out.schedules = _decode_finals(trace, p, res, budget_bytes)
        out.swept_s = res.finals[0][0] if res.finals else None
    out.wall_s = time.perf_counter() - t0
    return out


_FIRST_THRESHOLD = 0.7
"""The first exact sweep's threshold, as a fraction of incumbent x (1 - gap). It prunes hard and is cheap (a tenth
to a quarter of the full sweep on ResNet-50): it finds the fluid optimum outright when that is below it, and
otherwise proves its threshold as a bound."""
_CLIMB_FROM_PROVEN = 0.15
"""Climbing from a bound the caller holds (`proven_s`, above _FIRST_THRESHOLD of the top: the link windows'
Lagrangian on a long trace; exact_search's `climb_from_proven`): the first sweep's threshold lies this fraction of the
way from that bound to the top. Before, such a climb jumped to the top: on DenseNet-121 at 50% (30 s), with the link
windows' bound at 0.74 of the top, its one sweep was cut by its pace and proved 0.016 s, where sweeps at 0.0165 /
0.0175 / 0.018 s finish in 0.7 / 1.9 / 2.9 s; climbing, it proves 0.0183 s (gap 18.2% -> 6.3%). Not for the host
budget's climbs (ResNet-50, whose top sweep finishes): there the extra steps cost the bound 0.5-1.5%."""
_CLIMB_GROWTH = 4.0
"""Climbing (exact_search's `climb`): each later sweep's threshold is the highest whose predicted time is at most
this many times the last finished sweep's. A sweep's time grows about exponentially in its threshold
(ResNet-50 at 3.7 GiB, 2026-11-25: x2 per 7-12% of the threshold; 4.8 s just above the fluid optimum, 29 s at
19% above), so where the incumbent lies far above the sweep's optimum a climb from below reaches it several
times faster than one sweep at the incumbent, and a climb cut by the clock has proved its last step. Where the
incumbent is close, the steps cost up to a third more than the one sweep: measured on ResNet-50 at 5 s a solve,
climbing everywhere narrowed 6 of 10 budgets' gaps and lost one proof (7.5 GiB: 1% -> 25%), so it climbs only
where a host budget binds (its incumbent obeys the host budget, the sweep does not)."""
_CLIMB_FROM_PROVEN_GROWTH = 2.0
"""_CLIMB_GROWTH for the long traces' climbs (exact_search's `climb_from_proven`). Their incumbent is the local
search's, which lies well above the sweep's optimum (DenseNet-121: 5-20%), so the climb ends at the first step that
finishes above that optimum, and a finished lower step is worth more than a top step the clock cuts. Their sweeps'
times are also predicted worst: the first steps are short and mostly fixed costs. DenseNet-121 at 75%, 10 s: from
steps of 0.14 and 0.38 s, a 4x step went to the top (0.00298 s), predicted at 1.7 s; it was cut at its deadline
after 2.25 s. With 2x steps the climb ran 0.00227 / 0.00246 / 0.00280 s, the last one finished in 1.65 s and found
the optimum (0.002594 s), which the solve proved (gap 18.8% -> 0)."""
_CLIMB_PRIOR_DOUBLING = 0.06
"""Until two sweeps have been timed: a sweep's time doubles per this fraction of the climb's span (from 0: the top
threshold; ResNet-50 at 3.7 GiB: 0.065 with an incumbent 20% above the optimum, 0.081 with one 1% above).
A climb from a held bound (exact_search's `climb_from_proven`) takes this fraction of its top threshold instead
(next_threshold's `prior_scale`): its span, from that bound to the top, is narrow (DenseNet-121 at 50%: 6% of the
top), and how fast a sweep's time grows is a matter of the thresholds themselves (measured doublings, as fractions
of the top: ResNet-50 0.065, DenseNet-121 at 75% 0.05, at 50% 0.03). Of the span, the prior said DenseNet-121 at
50% doubles per 0.00007 s where it doubles per 0.0006 s (sweeps at 0.0178 / 0.0184 / 0.0187 / 0.019 s: 3.6 / 7.1 /
11.1 / 16 s), so the second step of a 60 s solve rose 0.00004 s in 8 s; the clamp (_CLIMB_SLOPE_RANGE, of the span)
holds the new prior to half the span there."""
_CLIMB_SAFETY = 0.7
"""A step is sized to end within this share of the time left: a sweep cut at its deadline proves nothing more
than the last finished one, and the predictions are off by up to 1.3x."""
_CLIMB_SLOPE_RANGE = (0.02, 0.5)
"""Measured doublings are clamped to this range (fractions of the climb's span): very short sweeps are noise."""
_CLIMB_MIN_TIMED_S = 0.05
"""Sweeps shorter than this are timed as this long (fixed costs dominate them)."""
_CLIMB_GAMBLE = 1.5
"""Where no step fits with a margin, the top sweep is still tried if predicted to take at most this many times
the time left (the predictions are off by up to 1.3x either way)."""
_CLIMB_SNAP = 0.97
"""A step that would reach this fraction of the climb's span goes to the top."""


def predicted_s(
    timed: list[tuple[float, float]], threshold: float, span: float, prior_scale: float | None = None
) -> float:
    """The predicted seconds of a climbing sweep at `threshold`, from the finished ones' (threshold, seconds): the
    last one's time, doubled per the doubling distance of the last two (the prior before two: _CLIMB_PRIOR_DOUBLING
    of `prior_scale`, default `span`; clamped to _CLIMB_SLOPE_RANGE of `span`, the range the climb covers)."""
    th, t = timed[-1][0], max(timed[-1][1], _CLIMB_MIN_TIMED_S)
    return t * 2.0 ** ((threshold - th) / _doubling(timed, span, prior_scale))


def _doubling(timed: list[tuple[float, float]], span: float, prior_scale: float | None = None) -> float:
    """The threshold distance over which a climbing sweep's time doubles, from the last two finished sweeps."""
    th, t = timed[-1][0], max(timed[-1][1], _CLIMB_MIN_TIMED_S)
    doubling = _CLIMB_PRIOR_DOUBLING * (span if prior_scale is None else prior_scale)
    if len(timed) >= 2:
        th0, t0 = timed[-2][0], max(timed[-2][1], _CLIMB_MIN_TIMED_S)
        if t > t0 and th > th0:
            doubling = (th - th0) * np.log(2.0) / np.log(t / t0)
    lo, hi = (f * span for f in _CLIMB_SLOPE_RANGE)
    return min(max(doubling, lo), hi)


def next_threshold(
    timed: list[tuple[float, float]],
    top: float,
    left_s: float,
    span: float | None = None,
    top_share: float | None = None,
    growth: float = _CLIMB_GROWTH,
    prior_scale: float | None = None,
) -> float | None:
    """The threshold of the next climbing sweep up to `top`, from the finished ones' (threshold, seconds) and the
    `left_s` seconds left, or None where no sweep above the last is predicted to end in time. `span`: the range
    the climb covers, the scale of the prior and the clamps (default: top, a climb from 0). `top_share`: the top
    is chosen wherever its sweep is predicted to take at most this share of `left_s`, however many times the last
    sweep's time that is (`growth` caps only the steps below it): for a climb whose top sweep alone ends the
    search, and which gives that sweep more of its time (flow/shares.py, FIFO_CLIMB_TOP_SHARE). `growth`: a step's
    predicted time is at most this many times the last sweep's (_CLIMB_GROWTH, _CLIMB_FROM_PROVEN_GROWTH).
    `prior_scale`: the prior doubling's scale, before two sweeps are timed (default: `span`; predicted_s)."""
    span = top if span is None else span
    th, t = timed[-1][0], max(timed[-1][1], _CLIMB_MIN_TIMED_S)
    doubling = _doubling(timed, span, prior_scale)
    top_s = predicted_s(timed, top, span, prior_scale)
    target = min(growth * t, _CLIMB_SAFETY * left_s)
    if top_s <= target or (top_share is not None and top_s <= top_share * left_s):
        return top
    if target > t:
        step = th + doubling * np.log2(target / t)
        return top if step >= top - (1.0 - _CLIMB_SNAP) * span else step
    # No step fits with a margin. The top sweep alone can end the search, so it is tried where the prediction
    # is within its error of the time left; else the time goes to the phases after the DP.
    return top if top_s <= _CLIMB_GAMBLE * left_s else None


def exact_search(
    trace: Trace,
    budget_bytes: int,
    deadline: float,
    incumbent_s: float | None,
    gap: float,
    max_labels: int = DEFAULT_MAX_LABELS,
    problem: DpProblem | None = None,
    quantum_bytes: int = 1,
    climb: bool = False,
    proven_s: float = 0.0,
    backlog_quantum_bytes: int | None = None,
    pace: float | None = None,
    climb_from_proven: bool = False,
    finish_by: float | None = None,
) -> DpOutcome:
    """Exact sweeps under rising thresholds up to incumbent x (1 - gap): _FIRST_THRESHOLD of it, then all of it,
    or with `climb` (where the incumbent is expected to lie well above the sweep's optimum: a host budget the
    sweep leaves out) steps sized by their predicted time (_CLIMB_GROWTH; _CLIMB_FROM_PROVEN_GROWTH with
    `climb_from_proven`). A sweep that hits the label cap is
    retried at a coarser resolution. The bound it returns holds for every schedule (see DpOutcome.bound_s): each
    finished sweep proves its threshold, or finds the fluid optimum below it. `quantum_bytes` > 1: retained
    bytes and backlogs rounded down to its multiples from the start (a relaxation: fewer labels, a lower
    bound); `backlog_quantum_bytes`: the backlogs' own quantum (SweepConfig). `proven_s`: a bound the caller
    already holds (another relaxation's); a first sweep at or below it could prove nothing new, so the search
    starts at the top threshold instead. `pace`: each sweep stops as soon as its pace predicts that it cannot
    finish by the deadline (SweepConfig.pace; projected on the shape of the last finished sweep's time where one
    took long enough to have a shape). `climb_from_proven`: a climb whose first step would lie at or below
    `proven_s` starts just above it (_CLIMB_FROM_PROVEN), not at the top, and climbs in smaller steps
    (_CLIMB_FROM_PROVEN_GROWTH). `finish_by` (later than `deadline`): no sweep starts after `deadline` and the
    climb's steps are sized to it, but one that started may run on to this time where its projection says it ends
    by then (SweepConfig.finish_by): a sweep cut by the clock proves no more than the bound held."""
    t0 = time.perf_counter()
    p = problem or build_problem(trace, budget_bytes)
    out = DpOutcome(notes=_approximation_notes(p))
    top = np.inf if incumbent_s is None else incumbent_s * (1.0 - gap)
    threshold: float | None = (
        top if not np.isfinite(top) or top * _FIRST_THRESHOLD <= proven_s else top * _FIRST_THRESHOLD
    )
    span = top  # the range the climb covers (next_threshold)
    prior_scale: float | None = None  # the prior doubling's scale (next_threshold; default: span)
    if climb and climb_from_proven and np.isfinite(top) and proven_s < top <= proven_s / _FIRST_THRESHOLD:
        # A climb whose first step would lie at or below the bound already held starts above that bound instead
        # of jumping to the top: the top sweep is the one that may not finish (_CLIMB_FROM_PROVEN). Its prior
        # doubling stays a fraction of the thresholds themselves, not of this span (_CLIMB_PRIOR_DOUBLING).
        span = top - proven_s
        threshold = proven_s + _CLIMB_FROM_PROVEN * span
        prior_scale = top
    # The future-cost bound of the empty plan holds for every schedule whatever the offload options (it lets
    # any byte be offloaded): a bound before any sweep, and the one left where no sweep finishes.
    root_bound = float(p.future[0, 0])
    best_bound = 0.0
    growth = _CLIMB_FROM_PROVEN_GROWTH if climb_from_proven else _CLIMB_GROWTH  # a climbing step's time, x the last
    timed: list[tuple[float, float]] = []  # (threshold, seconds) of the finished sweeps that found nothing below
    profile: np.ndarray | None = None  # the shape of the last finished sweep's time (SweepConfig.pace_profile)
    while threshold is not None:
        started = time.perf_counter()
        res = _sweep_with_cap(
            p, out, deadline, threshold, max_labels, quantum_bytes, backlog_quantum_bytes, pace, profile, finish_by
        )
        log.debug(
            "exact DP: threshold %.6g s, %s in %.2f s",
            threshold,
            "finished" if res.finished else "stopped",
            time.perf_counter() - started,
        )
        if res.bound_s is not None and np.isfinite(res.bound_s):
            best_bound = max(best_bound, res.bound_s)
        if not res.finished:
            if res.paced:
                note = (
                    f"the exact DP stopped at layer {res.boundary_reached} of {p.n}: at its pace it would not have "
                    "reached the last layer by its deadline"
                )
            elif res.timed_out:
                note = f"the exact DP stopped at its deadline at layer {res.boundary_reached} of {p.n}"
            else:
                note = "the exact DP stopped at its label cap"
            out.notes.append(note)
            break
        if res.finals and res.finals[0][0] < threshold:
            # Nothing below the threshold was pruned, so the cheapest plan found is the fluid optimum.
            out.fluid_optimum = out.quantum_bytes == 1 and not p.relaxed and not p.output_relaxed and not p.link_work
            out.found_plans = True
            out.schedules = _decode_finals(trace, p, res, budget_bytes)
            break
        if threshold >= top:
            break
        timed.append((threshold, time.perf_counter() - started))
        if timed[-1][1] >= _CLIMB_MIN_TIMED_S:  # shorter ones are fixed costs, not a shape
            profile = res.profile
        if not climb:
            if finish_by is not None and time.perf_counter() >= deadline:
                # Past the deadline only a sweep already running may run on (finish_by), not a new one.
                out.timed_out = True
                out.notes.append(f"the exact DP proved {best_bound:.6g} s and stopped at its deadline")
                break
            threshold = top
            continue
        threshold = next_threshold(
            timed, top, deadline - time.perf_counter(), span, growth=growth, prior_scale=prior_scale
        )
        if threshold is None:
            out.timed_out = True  # by the clock, as a sweep cut at its deadline would be
            out.notes.append(
                f"the exact DP proved {best_bound:.6g} s and stopped: its next sweep was not predicted to end "
                "by its deadline"
            )
    out.bound_s = max(best_bound, root_bound) if p.offload_complete else root_bound
    out.wall_s = time.perf_counter() - t0
    return out


def fifo_beam_search(
    trace: Trace,
    budget_bytes: int,
    deadline: float,
    width: int,
    threshold: float = np.inf,
    problem: DpProblem | None = None,
    queue: int = QUEUE,
) -> DpOutcome:
    """The FIFO sweep (optimizer/dp/fifo.py) keeping at most `width` labels per boundary, dropping plans that
    already cost `threshold`: its decoded plans (no bound). Its labels carry the copies' real completion times,
    so where stalls decide the plan (low budgets) it finds plans the fluid beam misprices. Devices with
    concurrent copies only. On a relaxed `problem` (relaxed_problem) with short queues (`queue`) it ranks by an
    optimistic cost; its plans are still decoded into real tensor subsets and priced by the simulator."""
    t0 = time.perf_counter()
    p = problem or build_problem(trace, budget_bytes)
    assert not p.serial, "on a serial device the fluid beam is exact already"
    res = fifo_sweep(p, deadline, threshold, beam=width, queue=queue)
    out = DpOutcome(timed_out=res.timed_out, cap_hit=res.cap_hit, peak_labels=res.peak_labels)
    if res.finished:
        out.schedules = _decode_finals(trace, p, res, budget_bytes)
    out.wall_s = time.perf_counter() - t0
    return out


def fifo_search(
    trace: Trace,
    budget_bytes: int,
    deadline: float,
    incumbent_s: float,
    gap: float,
    problem: DpProblem | None = None,
    max_labels: int = FIFO_MAX_LABELS,
    queue: int = QUEUE,
) -> DpOutcome:
    """Tier 2 (optimizer/dp/fifo.py): the sweep with FIFO copy queues, pruned at incumbent x (1 - gap). Exact
    for the simulator's timing, so where it finishes its bound closes the gaps the fluid sweep leaves on
    stall-heavy traces; stopped early, its frontier is still a bound. Devices with concurrent copies only.
    `queue`: the copies each queue holds exactly (fifo_sweep; shorter merges more, optimistically)."""
    t0 = time.perf_counter()
    p = problem or build_problem(trace, budget_bytes)
    assert not p.serial, "on a serial device the fluid sweep is already exact"
    out = DpOutcome(notes=_approximation_notes(p))
    res = fifo_sweep(p, deadline, incumbent_s * (1.0 - gap), max_labels=max_labels, queue=queue)
    out.timed_out, out.cap_hit, out.peak_labels = res.timed_out, res.cap_hit, res.peak_labels
    if res.finished:
        out.schedules = _decode_finals(trace, p, res, budget_bytes)
    else:
        out.stopped_at = res.boundary_reached
        out.notes.append(
            f"the FIFO sweep stopped at layer {res.boundary_reached} of {p.n} "
            f"({'its label cap' if res.cap_hit else 'its time share'})"
        )
    if res.bound_s is not None and np.isfinite(res.bound_s):
        root = float(p.future[0, 0])
        out.bound_s = max(res.bound_s, root) if p.offload_complete else root
    out.wall_s = time.perf_counter() - t0
    return out


def _sweep_with_cap(
    p: DpProblem,
    out: DpOutcome,
    deadline: float,
    threshold: float,
    max_labels: int,
    quantum: int = 1,
    backlog_quantum: int | None = None,
    pace: float | None = None,
    pace_profile: np.ndarray | None = None,
    finish_by: float | None = None,
) -> SweepResult:
    """One exact sweep; where the label cap stops it, again at coarser byte quanta (each still a relaxation).
    `backlog_quantum`: the backlogs' own quantum, never coarser than `quantum` (None: `quantum`); `pace`:
    SweepConfig.pace and its pace_profile; `finish_by`: SweepConfig.finish_by."""
    while True:
        cfg = SweepConfig(
            deadline=deadline,
            threshold=threshold,
            quantum_bytes=quantum,
            backlog_quantum_bytes=None if backlog_quantum is None else min(backlog_quantum, quantum),
            max_labels=max_labels,
            pace=pace,
            pace_profile=pace_profile,
            finish_by=finish_by,
        )
        res = run_sweep(p, cfg)
        out.peak_labels, out.quantum_bytes = max(out.peak_labels, res.peak_labels), quantum
        out.timed_out = res.timed_out
        if not res.cap_hit:
            return res
        out.cap_hit = True
        coarser = max(quantum * 16, 1, p.limit >> 14)
        if coarser > max(1, p.limit) or time.perf_counter() > cfg.stop_at:
            out.notes.append(f"label cap hit even at {quantum}-byte resolution: the bound is the partial sweep's")
            return res
        log.info("dp: %d labels at quantum %d bytes hit the cap; retrying at %d", res.total_labels, quantum, coarser)
        out.notes.append(f"label cap hit at {quantum}-byte resolution; retried at {coarser} bytes")
        quantum = coarser


__all__ = [
    "QUEUE",
    "BeamRank",
    "DpOutcome",
    "DpProblem",
    "beam_search",
    "build_problem",
    "exact_search",
    "fifo_beam_search",
    "fifo_search",
    "near_exact_cells",
    "next_threshold",
    "predicted_s",
    "relaxed_problem",
]
