"""The host-memory budget (SolveOptions.host_budget): the smallest host budget a device budget needs, and the
Lagrangian bound of the DP under a host budget (docs/formulation.md, 'Host budget').

A plan's host peak is the sum of its offloaded bytes (simulate.host_stage_bytes: every offloaded layer holds
its host buffers from its forward through its backward, so all of them at the loss point). The host budget is
then one knapsack row over the offload choices, `sum_i x_i <= H`:

- the MILP writes it as a row (optimizer/ilp/model.py, `_add_host_budget_row`);
- the DP cannot hold it in its labels without a new state, but its cost can price it: with `host_price` =
  lambda >= 0 seconds per offloaded byte, DP(lambda) - lambda * H is a lower bound on every plan within the host
  budget (Lagrangian relaxation), and lambda = 0 is the plain DP (a relaxation: its bound holds too);
- the smallest host budget at a device budget is the DP with every time zeroed and a price of one per byte:
  its optimum is the least number of offloaded bytes of any plan that fits (copies synchronous, the memory
  minimum of each plan).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from memsched.optimizer.simulate import SimResult, host_peak_bytes
from memsched.schema import Action, Trace

if TYPE_CHECKING:
    from memsched.optimizer.dp import DpOutcome
    from memsched.optimizer.dp.problem import DpProblem

log = logging.getLogger(__name__)

MAX_PRICES = 8
"""Lagrangian prices tried per solve at most (each is one exact sweep)."""


def fits_host(sim: SimResult, host_budget: int | None) -> bool:
    """Whether the plan's offloaded copies fit the host budget (None: no limit)."""
    return host_budget is None or sim.host_peak_bytes <= host_budget


def offloadable_bytes(trace: Trace) -> int:
    """The most any plan can offload: every saved byte of every layer but the last (whose interior is empty)."""
    return sum(x.saved_bytes for x in trace.layers[:-1])


def host_binds(trace: Trace, host_budget: int | None, allowed: frozenset[Action]) -> bool:
    """Whether the host budget can exclude any plan at all (else it changes nothing)."""
    return host_budget is not None and Action.OFFLOAD in allowed and host_budget < offloadable_bytes(trace)


def price_scale(trace: Trace) -> float:
    """Seconds per byte that recomputing a byte roughly costs (the median forward time per saved byte): the
    first Lagrangian price, on the scale where an offload and a recompute trade places."""
    rates = sorted(x.forward_s / x.saved_bytes for x in trace.layers if x.saved_bytes > 0 and x.forward_s > 0)
    return rates[len(rates) // 2] if rates else 1e-12


@dataclass
class HostNeed:
    """The smallest host budget at one device budget."""

    lower: int
    """No plan that fits the device budget offloads fewer bytes (a proven lower bound)."""
    upper: int
    """A plan that fits the device budget offloads this many bytes (the least found)."""
    sim: SimResult | None
    """That plan, where the search found it (None: it is one of the plans the caller gave)."""

    @property
    def proven(self) -> bool:
        return self.lower >= self.upper


def _byte_problem(p: DpProblem) -> DpProblem:
    """`p` with every time zeroed, synchronous copies and a price of one per copied byte: its optimum is the least
    number of bytes offloaded by a plan that fits (its memory rows are `p`'s; synchronous copies are each plan's
    memory minimum, so nothing that fits at any timing is lost)."""
    z = np.zeros_like(p.fwd)
    zp = np.zeros_like(p.fwd_prefix)
    return dataclasses.replace(
        p,
        fwd=z,
        rerun=z,
        rerun_fwd_prefix=zp,
        rerun_least=z,
        bwd=z,
        fwd_prefix=zp,
        bwd_prefix=zp,
        serial=True,
        latency=0.0,
        d2h_bw=math.inf,
        h2d_bw=math.inf,
        fluid_d2h_bw=math.inf,
        fluid_h2d_bw=math.inf,
        future=np.zeros_like(p.future),
        future_pending=np.zeros_like(p.future_pending),
        host_price=1.0,
        _remaps={},
    )


def min_host_bytes(
    trace: Trace,
    budget_bytes: int,
    allowed: frozenset[Action],
    deadline: float,
    known: list[SimResult],
) -> HostNeed:
    """The least offloaded bytes of any plan of the `allowed` actions that fits `budget_bytes` (which some plan
    fits): the exact DP on the byte problem (`_byte_problem`). `known`: plans that fit the device budget (their
    host peaks bound the answer from above; offload-all synchronously is always among the plans that fit).
    Where the clock or a relaxation stops the DP short of the optimum, `lower` < `upper`."""
    from memsched.optimizer.actions import restricted_problem
    from memsched.optimizer.dp import exact_search, relaxed_problem
    from memsched.optimizer.jit import kernels_by

    upper_sims = [s for s in known if s.feasible]
    upper = min((s.host_peak_bytes for s in upper_sims), default=offloadable_bytes(trace))
    best: SimResult | None = None
    t0 = time.perf_counter()
    if not kernels_by(deadline):  # the first run in an environment: the DP's kernels still compiling
        return HostNeed(0, upper, None)
    p = restricted_problem(trace, budget_bytes, allowed, deadline)
    p = relaxed_problem(p, trace)  # a relaxation where some layer has too many subsets: its bound holds
    out = exact_search(trace, budget_bytes, deadline, None, 0.0, problem=_byte_problem(p))
    for sim in out.schedules:
        if sim.feasible and sim.host_peak_bytes < upper:
            upper, best = sim.host_peak_bytes, sim
    lower = 0 if out.bound_s is None else min(upper, math.ceil(out.bound_s - 1e-6))
    log.info(
        "smallest host budget at %d bytes: %d..%d bytes in %.2f s", budget_bytes, lower, upper, time.perf_counter() - t0
    )
    return HostNeed(max(0, lower), upper, best)


@dataclass
class PricedOutcome:
    """One sweep of the DP with the host budget priced."""

    price: float
    """Seconds per offloaded byte."""
    bound_s: float | None
    """DP(price) - price x H: a lower bound on the overhead of every plan within the host budget."""
    dp: DpOutcome
    """The sweep's own outcome (its plans are its minimisers, which may exceed the host budget)."""


def priced_sweep(
    trace: Trace,
    budget_bytes: int,
    problem: DpProblem,
    host_budget: int,
    price: float,
    incumbent_s: float,
    gap: float,
    deadline: float,
    climb: bool = True,
) -> PricedOutcome:
    """The exact DP with `price` seconds per offloaded byte, pruned where even its Lagrangian bound would prove
    the incumbent within the gap: a label that costs incumbent x (1 - gap) + price x H or more cannot lower the
    bound below what closes the gap. `climb`: the sweep's thresholds climb from below (exact_search), as the
    priced optimum may lie far below the shifted incumbent."""
    from memsched.optimizer.dp import exact_search

    shift = price * host_budget
    p = dataclasses.replace(problem, host_price=price, _remaps={})
    # exact_search prunes at incumbent x (1 - gap); give it the incumbent whose threshold is shifted by price x H.
    out = exact_search(trace, budget_bytes, deadline, incumbent_s + shift / (1.0 - gap), gap, problem=p, climb=climb)
    bound = None if out.bound_s is None else out.bound_s - shift
    return PricedOutcome(price, bound, out)


def next_price(
    lo: float,
    hi: float | None,
    scale: float,
    over: tuple[float, int] | None = None,
    within: tuple[float, int] | None = None,
) -> float:
    """The next Lagrangian price: `lo` a price whose minimiser exceeded the host budget (0 at first), `hi` one
    whose minimiser fitted (None: none yet). With both minimisers known as (overhead s, host bytes), `over` and
    `within`, the price at which they cost the same (where the bound of these two plans peaks: a cutting-plane
    step) where it lies strictly between; else bisection on a log scale, growing by 8 until one fits."""
    if hi is None:
        return scale if lo <= 0 else lo * 8
    if over is not None and within is not None and over[1] > within[1]:
        even = (within[0] - over[0]) / (over[1] - within[1])
        if lo < even < hi and even not in (lo, hi):
            return even
    if lo <= 0:
        return hi / 8
    return math.sqrt(lo * hi)


__all__ = [
    "HostNeed",
    "PricedOutcome",
    "fits_host",
    "host_binds",
    "host_peak_bytes",
    "min_host_bytes",
    "next_price",
    "offloadable_bytes",
    "price_scale",
    "priced_sweep",
]
