"""Every keep / recompute plan of a short trace, each priced by the simulator: the exact optimum, proven by
enumeration (docs/formulation.md, 'Every plan of a short trace').

The proving searches (the DP, the MILP, the Lagrangian bounds) relax some of the simulator's memory rules: the DP
leaves out the side inputs a checkpoint keeps after the forward (`simulate.side_input_hold`: masks, rotary
tables). Where the cheapest plan of a relaxation exceeds the budget by those bytes, its bound stays below the real
optimum and nothing closes the gap. A 4-layer `nn.TransformerEncoder` traced on the CPU, at a budget 1.7 KB below
the fit of the DP's plan, ended `feasible` with a 23.6% gap after 1.4 s, where checkpoint-all was optimal
(2026-12-07). Without offload a plan is its layers' actions and its segments' cuts, with no timing to choose,
so a short trace has few plans (fewer than 3^n). All of them, priced by `fastsim` (the simulator's rules, compiled),
give the optimum and its proof at once.

With offload, the copies' timing and the tensor subsets multiply the plans, and `default_timing` is optimal for
fixed actions only on the cases tested (`test_default_timing_is_optimal_for_fixed_actions`), not in general: no
proof, so those solves are not enumerated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from memsched.optimizer.fastsim import KIND_CONTINUE, KIND_KEEP, KIND_START, FastSim
from memsched.optimizer.polish import decisions_of
from memsched.optimizer.simulate import SimResult, simulate
from memsched.schema import Action, Trace

log = logging.getLogger(__name__)

MAX_PLANS = 20_000
"""Enumerate only where the trace has at most this many plans (10 layers with keep and recompute: 10,946; the
count grows as the Fibonacci numbers, 2.6x a layer): about 5 us each in `fastsim` (28,657 plans of an 11-layer
synthetic DAG in 0.14 s on one core), so the enumeration costs a solve at most 0.1 s."""

_GENE = {KIND_KEEP: "K", KIND_START: "S", KIND_CONTINUE: "R"}
"""A plan's kind (fastsim) as the local search's gene (polish.decisions_of)."""

_CLOCK_EVERY = 1024
"""Plans between two looks at the clock."""


@dataclass
class Enumerated:
    """What the enumeration established."""

    best: SimResult | None
    """The cheapest plan that fits, simulated; None where none fits."""
    plans: int
    """Plans priced."""
    finished: bool
    """Every plan was priced (else the clock stopped it, and nothing is proven)."""


def plan_count(trace: Trace, allowed: frozenset[Action]) -> int:
    """How many distinct plans of the `allowed` actions (keep and recompute; no offload) the trace has: per layer
    keep, or recompute starting a segment, or recompute continuing the segment of the layer before (not across
    code that saves between the two layers: Layer.code_after_saves)."""
    assert Action.OFFLOAD not in allowed
    keep = Action.KEEP in allowed
    rec = Action.RECOMPUTE in allowed
    ends_kept, ends_rec = 1, 0  # plans of the layers so far, by the last layer's action (the empty plan: "kept")
    for i in range(trace.n):
        can_continue = i > 0 and not trace.layers[i - 1].code_after_saves
        kept = (ends_kept + ends_rec) if keep else 0
        recomputed = ((ends_kept + ends_rec) + (ends_rec if can_continue else 0)) if rec else 0
        ends_kept, ends_rec = kept, recomputed
        if ends_kept + ends_rec > MAX_PLANS:
            return ends_kept + ends_rec
    return ends_kept + ends_rec


def applies(trace: Trace, allowed: frozenset[Action]) -> bool:
    """Whether the solve's plans can be enumerated and proven so: no offload, and at most MAX_PLANS of them."""
    return Action.OFFLOAD not in allowed and plan_count(trace, allowed) <= MAX_PLANS


def _kinds(trace: Trace, allowed: frozenset[Action]) -> Iterator[np.ndarray]:
    """Every plan as fastsim's `kind` array (one array, rewritten in place: copy what is kept)."""
    n = trace.n
    kind = np.full(n, KIND_KEEP, dtype=np.int64)
    choices: list[list[int]] = []
    for i in range(n):
        c = [KIND_KEEP] if Action.KEEP in allowed else []
        if Action.RECOMPUTE in allowed:
            c.append(KIND_START)
            if i > 0 and not trace.layers[i - 1].code_after_saves:
                c.append(KIND_CONTINUE)
        choices.append(c)

    def fill(i: int) -> Iterator[np.ndarray]:
        if i == n:
            yield kind
            return
        for k in choices[i]:
            if k == KIND_CONTINUE and kind[i - 1] == KIND_KEEP:
                continue  # continues nothing: the same plan as starting a segment here
            kind[i] = k
            yield from fill(i + 1)

    yield from fill(0)


def enumerate_plans(trace: Trace, budget_bytes: int, allowed: frozenset[Action], deadline: float) -> Enumerated:
    """Every plan of the `allowed` actions (no offload) priced by fastsim, until `deadline`; the cheapest that
    fits, simulated by `simulate` (the answer's own pricing)."""
    assert Action.OFFLOAD not in allowed
    fast = FastSim(trace, budget_bytes)
    best_s, best_kind = np.inf, None
    plans = 0
    for kind in _kinds(trace, allowed):
        plans += 1
        if plans % _CLOCK_EVERY == 0 and time.perf_counter() > deadline:
            return Enumerated(None, plans, finished=False)
        overhead, over = fast(kind, np.zeros(trace.n, dtype=np.int64))
        if over <= 0 and overhead < best_s:
            best_s, best_kind = overhead, kind.copy()
    if best_kind is None:
        return Enumerated(None, plans, finished=True)
    best = decisions_of(trace, [_GENE[k] for k in best_kind.tolist()])
    return Enumerated(simulate(trace, best, budget_bytes, with_events=False), plans, finished=True)
