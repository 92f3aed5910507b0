"""Local search over the per-layer actions ("polish"), judged by the simulator itself.

The greedy heuristic commits layer by layer and never revisits a choice; the MILP revisits everything but
its LP relaxation is weak where offload is divisible, so within a short time limit it often keeps its warm
start. This search sits between them: it starts from the best schedule known and changes one layer at a
time (keep / offload any subset of its tensors / recompute, starting or extending a segment), with offload
timing from `default_timing`, and every candidate is scored by `simulate` (so no model error is possible).

Plain descent stalls quickly: most improving changes need memory freed somewhere else first. So the
score is `overhead + lambda * (bytes over budget, summed over the stages)` and lambda oscillates from small
(over-budget schedules are cheap to pass through) to huge (only feasible ones count), a few times; the best
*feasible* schedule seen is kept (strategic oscillation). Measured on the 20-layer synthetic chain at 40%:
the greedy's 0.0314 s overhead becomes 0.0019 s (the proven optimum is 0.0017 s); plain descent stops at
0.0037 s.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from dataclasses import dataclass, replace

from memsched.optimizer.heuristic import fix_prefetch_order
from memsched.optimizer.plan import KEEP, Decision, group_start, offload_subset, recompute
from memsched.optimizer.simulate import SimResult, default_timing, simulate
from memsched.schema import Action, Trace

log = logging.getLogger(__name__)

Gene = str | tuple[int, ...]
"""One layer's action: 'K' keep, 'S' recompute starting a segment, 'R' recompute continuing the segment of
the layer before, or the tuple of offloaded tensor indices."""

# Lambda multipliers of one oscillation cycle (times the median recompute cost per byte, see _lambda0).
_CYCLE = (1e-3, 1e-2, 0.1, 1.0, 10.0, 1e4)
_MAX_SUBSET_TENSORS = 3  # up to this many positive tensors, every subset is a move; beyond, all or one


@dataclass
class PolishResult:
    """What the search found."""

    sim: SimResult
    """The best feasible schedule seen (the start's own, if nothing beat it), simulated under the budget."""
    evaluations: int
    """Schedules simulated."""
    improved: bool
    """Whether it beats the start."""


def _genes(decisions: list[Decision]) -> list[Gene]:
    out: list[Gene] = []
    for i, d in enumerate(decisions):
        if d.action == Action.KEEP:
            out.append("K")
        elif d.action == Action.OFFLOAD:
            out.append(tuple(d.offload_tensors))
        else:
            out.append("S" if group_start(decisions, i) == i else "R")
    return out


def _decisions(trace: Trace, genes: list[Gene]) -> list[Decision]:
    """Decisions (offload timing unset) for genes; an 'R' after a non-recompute layer starts a segment."""
    out: list[Decision] = []
    start = -1
    for i, g in enumerate(genes):
        if g == "K":
            out.append(KEEP)
            start = -1
        elif isinstance(g, tuple):
            out.append(offload_subset(trace, i, g))
            start = -1
        else:
            if g == "S" or start < 0:
                start = i
            out.append(recompute(group=start))
    return out


def _options(trace: Trace) -> list[list[Gene]]:
    """The genes each layer may take. The last layer is never offloaded (its interior is empty)."""
    out: list[list[Gene]] = []
    for i, layer in enumerate(trace.layers):
        pos = [q for q, b in enumerate(layer.tensors) if b > 0]
        opts: list[Gene] = ["K", "S", "R"] if i > 0 else ["K", "S"]
        if pos and i < trace.n - 1:
            if len(pos) <= _MAX_SUBSET_TENSORS:
                opts += [tuple(s) for r in range(1, len(pos) + 1) for s in itertools.combinations(pos, r)]
            else:
                opts += [tuple(pos)] + [(q,) for q in pos]
        out.append(opts)
    return out


def _lambda0(trace: Trace) -> float:
    """Seconds per byte: the median forward time per saved byte (what recomputing a byte roughly costs)."""
    rates = sorted(x.forward_s / x.saved_bytes for x in trace.layers if x.saved_bytes > 0 and x.forward_s > 0)
    return rates[len(rates) // 2] if rates else 1e-12


class _Evaluator:
    """Simulates gene lists (memoised): (overhead seconds, bytes over budget summed over stages)."""

    def __init__(self, trace: Trace, budget_bytes: int) -> None:
        self.trace = trace
        self.budget = budget_bytes
        self.limit = budget_bytes - trace.static.total
        self.cache: dict[tuple[Gene, ...], tuple[float, int]] = {}
        self.best: SimResult | None = None

    @property
    def best_overhead_s(self) -> float:
        """Overhead of the best feasible schedule simulated so far (inf before the first)."""
        return self.best.overhead_s if self.best is not None else float("inf")

    def __call__(self, genes: list[Gene]) -> tuple[float, int]:
        key = tuple(genes)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        decisions = default_timing(self.trace, _decisions(self.trace, genes), self.budget)
        # Valid by construction (segments from genes, prefetch order from default_timing); the schedule
        # polish returns is simulated again with the checks.
        sim = simulate(self.trace, decisions, self.budget, with_events=False, validate=False)
        excess = sum(b - self.limit for b in sim.stage_bytes if b > self.limit)
        if excess == 0 and (self.best is None or sim.overhead_s < self.best.overhead_s):
            self.best = sim
        self.cache[key] = (sim.overhead_s, excess)
        return self.cache[key]


_TIMING_STEPS = (-1, 1, -4, 4)  # stages by which one move shifts a done-by or a prefetch-at


def _shift(trace: Trace, decisions: list[Decision], i: int, done_step: int, prefetch_step: int) -> list[Decision]:
    """Decisions with layer i's done-by / prefetch-at moved by the steps (clamped to [i, n-1]); offloads
    above i whose prefetch would now come first are pushed along, so the need order still holds."""
    n = trace.n
    out = list(decisions)
    d = out[i]
    p = min(max(d.prefetch_at + prefetch_step, i), n - 1)
    out[i] = replace(d, done_by=min(max(d.done_by + done_step, i), n - 1), prefetch_at=p)
    for j in range(i + 1, n):
        if out[j].action == Action.OFFLOAD and out[j].prefetch_at < p:
            out[j] = replace(out[j], prefetch_at=p)
    return fix_prefetch_order(out)


def _retime(trace: Trace, budget_bytes: int, sim: SimResult, deadline: float) -> SimResult:
    """Descent on offload timing alone (the action search keeps `default_timing`'s): shift one layer's
    done-by or prefetch-at at a time while that lowers the overhead within the budget."""
    best = sim
    moved = True
    while moved and time.perf_counter() < deadline:
        moved = False
        for i, d in enumerate(best.decisions):
            if d.action != Action.OFFLOAD:
                continue
            for done_step, prefetch_step in [(s, 0) for s in _TIMING_STEPS] + [(0, s) for s in _TIMING_STEPS]:
                if time.perf_counter() >= deadline:
                    return best
                cand = _shift(trace, best.decisions, i, done_step, prefetch_step)
                if cand == best.decisions:
                    continue
                res = simulate(trace, cand, budget_bytes, with_events=False)
                if res.feasible and res.overhead_s < best.overhead_s - 1e-15:
                    best, moved = res, True
                    break
    return best


def polish(trace: Trace, budget_bytes: int, start: list[Decision], time_limit_s: float,
           seed: int = 0) -> PolishResult:
    """Improve a feasible schedule by one-layer changes within `time_limit_s` (see the module docstring).
    `start` keeps its own timing as the reference; the search re-times every candidate with
    `default_timing`. Deterministic for a given seed, up to where the time limit cuts it."""
    end = time.perf_counter() + max(0.0, time_limit_s)
    ref = simulate(trace, start, budget_bytes, with_events=False)
    if not ref.feasible:
        raise ValueError("polish needs a feasible start schedule")
    evaluate = _Evaluator(trace, budget_bytes)
    options = _options(trace)
    rng = random.Random(seed)
    genes = _genes(start)
    t0 = time.perf_counter()
    evaluate(genes)
    # The loop checks the clock between evaluations, and a checked simulation follows it: stop early enough
    # for about two more evaluations (one is ~0.1 s on a 1,000-layer trace), so the call ends in its limit.
    deadline = end - 2 * (time.perf_counter() - t0)
    lam0 = _lambda0(trace)
    while time.perf_counter() < deadline:
        before = evaluate.best_overhead_s
        for mult in _CYCLE:
            lam = lam0 * mult
            ovh, exc = evaluate(genes)
            score = ovh + lam * exc
            moved = True
            while moved and time.perf_counter() < deadline:
                moved = False
                order = list(range(trace.n))
                rng.shuffle(order)
                for i in order:
                    if time.perf_counter() >= deadline:
                        break
                    for g in options[i]:
                        if time.perf_counter() >= deadline:
                            break
                        if g == genes[i] or (g == "R" and genes[i - 1] not in ("S", "R")):
                            continue  # unchanged, or the same schedule as 'S'
                        cand = [*genes[:i], g, *genes[i + 1 :]]
                        ovh, exc = evaluate(cand)
                        if ovh + lam * exc < score - 1e-15:
                            genes, score, moved = cand, ovh + lam * exc, True
        if evaluate.best_overhead_s >= before - 1e-15:
            break  # a whole cycle found nothing better: it would repeat itself
    found = evaluate.best
    if found is not None and time.perf_counter() < deadline:
        found = _retime(trace, budget_bytes, found, deadline)
    if found is not None:
        found = simulate(trace, found.decisions, budget_bytes, with_events=False)  # with the checks
    if found is not None and found.overhead_s < ref.overhead_s - 1e-15:
        log.debug("polish: %.6g s -> %.6g s overhead in %d evaluations", ref.overhead_s, found.overhead_s,
                  len(evaluate.cache))
        return PolishResult(found, len(evaluate.cache), True)
    return PolishResult(ref, len(evaluate.cache), False)


__all__ = ["PolishResult", "polish"]
