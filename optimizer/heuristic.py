"""The greedy heuristic: fast (well under 1 s for 5,000 layers), always feasible when the budget is, used as
the ILP's warm start and as its fallback.

Greedy by memory freed per second of estimated overhead, starting from keep-all, until every stage fits:

- *offload* a layer whose copy can hide behind compute: its estimated cost is the part of the copy that the
  D2H (forward) and H2D (backward) channels cannot overlap, given the copy time already committed to each
  channel, so cheap offloads come first and the channels' saturation makes further ones expensive;
- *recompute* a segment of up to 8 layers where copies cannot hide: cost = its forward time, and the
  checkpoint inputs it adds (what enters the segment) are charged against the bytes it frees.

Memory is tracked incrementally in one array of the 2n stages (numpy range updates), never re-simulated
per candidate. A candidate is applied only if it lowers a stage that is still over budget. A reverse pass
then undoes the most expensive choices that turned out unnecessary. Offload timing is the simulator's
default (copy done when it would finish unstalled, pulled earlier where the budget needs it; prefetch as
early as the budget allows), which is feasible whenever synchronous copies would be.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass, replace

import numpy as np

from memsched.optimizer.budget import min_feasible_decisions
from memsched.optimizer.decisions import ALL_ACTIONS, KEEP, Decision, group_start, offload_all, recompute
from memsched.optimizer.simulate import (
    D2H,
    H2D,
    SimResult,
    checkpoint_state_bytes,
    copy_seconds,
    default_timing,
    host_peak_bytes,
    segment_external_bytes,
    segment_outside_deps,
    simulate,
    stage_memory,
)
from memsched.schema import Action, Trace

log = logging.getLogger(__name__)

_EPS_S = 1e-9  # a free (fully hidden) offload still costs a little, so larger ones go first


@dataclass
class HeuristicResult:
    """The heuristic's schedule and the simulator's verdict on it."""

    decisions: list[Decision]
    """Decisions with offload timing filled in."""
    sim: SimResult
    """The simulator's result for them under the budget."""


def _checkpoint_delta(
    trace: Trace, a: int, deps: set[int], held_from: dict[int, int], last: int
) -> list[tuple[int, int, int]]:
    """(lo, hi, bytes) ranges that a recompute segment starting at `a` adds by holding `deps` (producers
    before `a` that its layers consume) from stage a+1 to last-a-1, given what is already held."""
    out = []
    for j in deps:
        nbytes = trace.layers[j].output_bytes
        old = held_from.get(j)
        if not nbytes or (old is not None and old <= a):
            continue
        if old is None:
            out.append((a + 1, last - a - 1, nbytes))
        else:  # extend the held interval [old+1, last-old-1] to [a+1, last-a-1]
            out += [(a + 1, old, nbytes), (last - old, last - a - 1, nbytes)]
    return out


def greedy_decisions(
    trace: Trace, budget_bytes: int, allowed: frozenset[Action] = ALL_ACTIONS, host_budget: int | None = None
) -> list[Decision]:
    """Action choice of the greedy among the `allowed` actions (timing unset), offloading at most `host_budget`
    bytes in all (None: no limit; an offload past it is skipped, and a recompute segment frees the memory
    instead). May leave the budget exceeded; see `heuristic`."""
    n = trace.n
    last = 2 * n - 1
    limit = budget_bytes - trace.static.total
    mem = np.asarray(stage_memory(trace, [KEEP] * n), dtype=np.int64)
    decisions: list[Decision] = [KEEP] * n
    if mem.max() <= limit:
        return decisions
    fwd = np.array([x.forward_s for x in trace.layers])
    bwd = np.array([x.backward_s for x in trace.layers])
    fwd_after = fwd[::-1].cumsum()[::-1] - fwd  # forward compute after F_i (hides the D2H copy)
    bwd_before = bwd[::-1].cumsum()[::-1] - bwd  # backward compute before B_i (hides the prefetch)
    load = {D2H: 0.0, H2D: 0.0}  # copy seconds committed to each channel
    total = {D2H: float(fwd.sum()), H2D: float(bwd.sum())}

    def offload_cost(i: int) -> float:
        s = trace.layers[i].saved_bytes
        cost = 0.0
        for ch, window in ((D2H, fwd_after[i]), (H2D, bwd_before[i])):
            c = copy_seconds(trace, s, ch)
            cost += max(0.0, c - window) + max(0.0, load[ch] + c - total[ch])
        return cost

    sizes = [x.saved_bytes for x in trace.layers]
    # Heap entries: (-score, first layer, kind, last layer). Offloads are single layers; recomputes are
    # segments [a, b] of up to `seg_max` layers (a singleton often frees nothing: a layer that saves its
    # input must hold that same input as its checkpoint; a segment holds only what enters it).
    seg_max = 8 if n <= 2000 else 3
    heap: list[tuple[float, int, str, int]] = []
    for i in range(n - 1 if Action.OFFLOAD in allowed else 0):
        if sizes[i] > 0:
            heapq.heappush(heap, (-sizes[i] / (offload_cost(i) + _EPS_S), i, "offload", i))
    seg_last = trace.segment_last()
    for a in range(n - 1 if Action.RECOMPUTE in allowed else 0):
        freed, before = 0, 0.0  # before: the whole re-runs of a..b-1 (forwards and their machinery share)
        for b in range(a, min(a + seg_max, n - 1, seg_last[a] + 1)):
            freed += sizes[b]
            cost = before + trace.layers[b].rerun_s + trace.rerun_segment_s  # Trace.segment_rerun_s, incrementally
            before += trace.layers[b].forward_s + trace.rerun_layer_s
            cost += trace.rerun_layer_s
            if sizes[b] <= 0:
                continue  # a segment ending at a layer that saves nothing is dominated by a shorter one
            net = freed - sum(trace.layers[j].output_bytes for j in segment_outside_deps(trace, a, b))
            net -= segment_external_bytes(trace, a, b) + checkpoint_state_bytes(trace)
            if net > 0:
                heapq.heappush(heap, (-net / (cost + _EPS_S), a, "recompute", b))
    held_from: dict[int, int] = {}
    applied: list[tuple[float, int]] = []  # (cost, layer) of the offloads, in application order
    host_left = host_budget  # bytes the host may still take (None: no limit)
    while heap and mem.max() > limit:
        _neg, a, kind, b = heapq.heappop(heap)
        if any(decisions[i].action != Action.KEEP for i in range(a, b + 1)):
            continue
        lo, hi = a + 1, last - b - 1  # the stages where the whole choice frees its bytes
        if lo > hi or mem[lo : hi + 1].max() <= limit:
            continue  # frees nothing where memory is short
        if kind == "offload":
            if host_left is not None and sizes[a] > host_left:
                continue  # past the host budget: the recompute candidates free the memory instead
            cost = offload_cost(a)
            score = -sizes[a] / (cost + _EPS_S)
            if heap and score > heap[0][0] + 1e-12:  # stale: the channels filled up since it was pushed
                heapq.heappush(heap, (score, a, kind, b))
                continue
            decisions[a] = offload_all(trace, a)
            if host_left is not None:
                host_left -= decisions[a].offload_bytes
            for ch in (D2H, H2D):
                load[ch] += copy_seconds(trace, sizes[a], ch)
            mem[lo : hi + 1] -= sizes[a]
            applied.append((cost, a))
            continue
        for i in range(a, b + 1):
            decisions[i] = recompute(group=a)
            mem[i + 1 : last - b] -= sizes[i]  # s_i is back from B_b on (the segment re-runs there)
        deps = segment_outside_deps(trace, a, b)
        for lo2, hi2, nbytes in _checkpoint_delta(trace, a, deps, held_from, last):
            mem[lo2 : hi2 + 1] += nbytes
        for j in deps:
            held_from[j] = min(held_from.get(j, a), a)
        ext = segment_external_bytes(trace, a, b)
        if ext:
            mem[a + 1 : last - a] += ext  # inputs no traced layer produced: held by this checkpoint
        mem[a : last - a + 1] += checkpoint_state_bytes(trace)  # its stashed RNG state, F_a through B_a
    # Reverse pass: undo expensive choices that later ones made unnecessary (recompute undo is skipped:
    # its checkpoint bookkeeping is not reversible incrementally, and it is rarely the expensive one).
    for cost, i in sorted(applied, reverse=True):
        if cost <= _EPS_S or decisions[i].action != Action.OFFLOAD:
            continue
        lo, hi = i + 1, last - i - 1
        if mem[lo : hi + 1].max() + trace.layers[i].saved_bytes <= limit:
            mem[lo : hi + 1] += trace.layers[i].saved_bytes
            decisions[i] = KEEP
    return decisions


def fix_prefetch_order(decisions: list[Decision]) -> list[Decision]:
    """Lower (never raise) prefetch stages so they are non-decreasing in the layer index, as
    validate_actions requires. A lower prefetch stage is a later, smaller prefetch window: less memory."""
    out = list(decisions)
    cap = len(out)
    for i in range(len(out) - 1, -1, -1):
        d = out[i]
        if d.action == Action.OFFLOAD and d.prefetch_at >= 0:
            if d.prefetch_at > cap:
                out[i] = replace(d, prefetch_at=cap)
            cap = out[i].prefetch_at
    return out


def heuristic(
    trace: Trace, budget_bytes: int, allowed: frozenset[Action] = ALL_ACTIONS, host_budget: int | None = None
) -> HeuristicResult:
    """A feasible schedule for any feasible budget (callers check feasibility first), of the `allowed` actions,
    offloading at most `host_budget` bytes (None: no limit). Without offload, or where the host budget stops the
    tightening below, the schedule may be over budget, and the caller judges it by its simulation; it never
    offloads past the host budget."""
    decisions = default_timing(trace, greedy_decisions(trace, budget_bytes, allowed, host_budget), budget_bytes)
    sim = simulate(trace, decisions, budget_bytes, with_events=False)
    if not sim.feasible and Action.OFFLOAD in allowed:
        # The greedy's recomputes can hold more inputs than they free; make every layer whose
        # interior covers an over-budget stage a synchronous offload (the pointwise memory minimum).
        log.debug("greedy schedule over budget (%d > %d); tightening", sim.peak_bytes, budget_bytes)
        sync = min_feasible_decisions(trace)
        limit = budget_bytes - trace.static.total
        decisions = list(sim.decisions)
        batch = max(1, trace.n // 128)  # tight budgets on long traces need many conversions
        mem = sim.stage_bytes
        rounds = 0
        while True:
            over = [t for t, b in enumerate(mem) if b > limit]
            if not over:
                break
            rounds += 1
            layer_of = [min(t, 2 * trace.n - 1 - t) for t in over]
            if rounds <= 8:  # the layers just below the earliest overflowing stage, in growing batches
                k = min(layer_of)
                todo = [i for i in range(k - 1, -1, -1) if decisions[i] != sync[i]][:batch]
            else:  # then everything below the last one: bounded rounds, each one O(n)
                todo = [i for i in range(max(layer_of) - 1, -1, -1) if decisions[i] != sync[i]]
            if not todo:
                if host_budget is None or host_peak_bytes(sync) <= host_budget:
                    decisions = sync  # cannot happen for a feasible budget; sync is the memory minimum
                break
            before = decisions
            decisions = list(decisions)
            for i in todo:
                if decisions[i].action == Action.RECOMPUTE:  # dissolve its whole segment
                    a = group_start(decisions, i)
                    b = i
                    while (
                        b + 1 < trace.n
                        and decisions[b + 1].action == Action.RECOMPUTE
                        and group_start(decisions, b + 1) == a
                    ):
                        b += 1
                    for j in range(a, b + 1):
                        decisions[j] = sync[j]
                decisions[i] = sync[i]
            if host_budget is not None and host_peak_bytes(decisions) > host_budget:
                decisions = before  # no more offload fits the host: stop, over budget (the caller judges it)
                break
            decisions = fix_prefetch_order(decisions)
            batch *= 2  # doubling keeps the number of memory evaluations logarithmic
            mem = stage_memory(trace, decisions)  # timing is set: memory alone decides feasibility
        sim = simulate(trace, decisions, budget_bytes, with_events=False)
    return HeuristicResult(sim.decisions, sim)


__all__ = ["HeuristicResult", "fix_prefetch_order", "greedy_decisions", "heuristic"]
