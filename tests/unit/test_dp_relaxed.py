"""Layers with many saved tensors (issue 22, item 1): their offload choices are relaxed into byte ranges
(optimizer/dp/problem.py, relaxed_problem), and the bound stays a proof: every subset is dominated by a
relaxed option, and on small random traces with 10-20 tensors per layer the relaxed sweeps' bounds (fluid
and FIFO) and solve()'s reported bound never exceed the exact optimum (the MILP with windows covering every
schedule, solved to gap 0)."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from helpers.pricing import many_tensor_trace
from memsched.optimizer.budget import budget_between
from memsched.optimizer.dp import build_problem, exact_search, fifo_search
from memsched.optimizer.dp.problem import MAX_OFFLOAD_OPTIONS, relaxed_options, relaxed_problem
from memsched.optimizer.ilp.model import build_model
from memsched.optimizer.ilp.pulp_backend import solve_pulp
from memsched.optimizer.simulate import simulate
from memsched.optimizer.solve import solve_report
from memsched.options import SolveOptions
from memsched.schema import SolverStatus, Trace

FAR = time.perf_counter() + 10**6  # a deadline that never comes


def exact_optimum(trace: Trace, budget: int) -> float:
    """The MILP with windows covering every timing and segment (W = L = n), to gap 0: the exact optimum."""
    m = build_model(trace, budget, window=trace.n, max_segment=trace.n)
    out = solve_pulp(m, "cbc", 120, 0.0, None)
    assert out.status == SolverStatus.OPTIMAL and out.decisions is not None
    return simulate(trace, out.decisions, budget).overhead_s


def _subset_sums(sizes: list[int]) -> np.ndarray:
    sums = np.zeros(1, dtype=np.int64)
    for t in sizes:
        sums = np.concatenate([sums, sums + t])
    return sums[1:]  # nonempty subsets


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("cells", [1, 4, 12, 32])
def test_every_subset_is_dominated_by_a_relaxed_option(seed: int, cells: int) -> None:
    rng = random.Random(seed)
    k = rng.randint(10, 22)  # beyond 16 tensors the smallest form the continuous tail
    sizes = [rng.randint(1, 10**6) * rng.choice([1, 1, 7, 1000]) for _ in range(k)]
    if seed % 4 == 0:
        sizes[rng.randrange(k)] = 0  # an empty tensor changes nothing
    opts = relaxed_options(tuple(sizes), cells)
    assert 1 <= len(opts) <= cells + 1
    lo = np.array([o.copy_bytes for o in opts])
    hi = np.array([o.nbytes for o in opts])
    sums = _subset_sums([t for t in sizes if t > 0])
    covered = np.zeros(len(sums), dtype=bool)
    for a, b in zip(lo, hi, strict=True):
        covered |= (sums >= a) & (sums <= b)
    assert covered.all(), f"{int((~covered).sum())} subset sums not dominated"
    for o in opts:  # each option's plan is a real subset whose sum lies in its range
        assert 0 < o.copy_bytes <= o.nbytes
        assert sum(sizes[q] for q in o.tensors) == o.nbytes


@pytest.mark.parametrize("seed", range(16))
def test_relaxed_bounds_never_exceed_the_exact_optimum(seed: int) -> None:
    rng = random.Random(1000 + seed)
    serial, latency = seed % 2 == 0, seed % 4 == 1
    draw = seed
    while True:  # a draw whose layers before the last all save nothing has nothing to relax: draw again
        trace = many_tensor_trace(rng.randint(2, 4), draw, serial, latency)
        budget = budget_between(trace, rng.uniform(0.0, 0.8))
        p = build_problem(trace, budget)
        if not p.offload_complete:
            break
        draw += 1000
    assert max(len(x) for x in p.offload) == MAX_OFFLOAD_OPTIONS
    opt = exact_optimum(trace, budget)
    for cells in (1, 4, 12):
        rp = relaxed_problem(p, trace, cells)
        assert rp.offload_complete and rp.relaxed
        out = exact_search(trace, budget, FAR, incumbent_s=None, gap=0.0, problem=rp)
        assert out.bound_s is not None and not out.fluid_optimum
        assert out.bound_s <= opt * (1 + 1e-9) + 1e-12, (cells, out.bound_s, opt)
        for sim in out.schedules:  # plans rounded to real subsets: feasible, never below the optimum
            assert sim.feasible and sim.overhead_s >= opt * (1 - 1e-9) - 1e-12
        # solve()'s coarse sweeps: bytes rounded down to a quantum as well (limit / 2^6 here: coarse indeed)
        coarse = exact_search(trace, budget, FAR, None, 0.0, problem=rp, quantum_bytes=max(1, rp.limit >> 6))
        assert coarse.bound_s is not None and coarse.bound_s <= opt * (1 + 1e-9) + 1e-12, (cells, coarse.bound_s)
        if not serial:
            fifo = fifo_search(trace, budget, FAR, opt * 1.5 + 1e-6, 0.0, problem=rp)
            assert fifo.bound_s is not None and fifo.bound_s <= opt * (1 + 1e-9) + 1e-12, (cells, fifo.bound_s, opt)
    # The flow's reported bound is true, and it now claims one beyond the root bound where it can.
    rec = solve_report(trace, budget, SolveOptions(time_limit_s=10)).schedule.solver
    assert rec.best_bound_s is not None and rec.best_bound_s <= opt * (1 + 1e-9) + 1e-12
    assert rec.objective_s >= opt * (1 - 1e-9) - 1e-12


def test_the_relaxation_tightens_with_more_ranges_and_is_exact_where_cells_split_every_sum() -> None:
    # Four tensors: 15 distinct sums; with enough ranges each holds one sum, so the options are exact.
    sizes = (1000, 2000, 4000, 8000)
    opts = relaxed_options(sizes, 15)
    assert all(o.copied == o.nbytes for o in opts)
    assert sorted(o.nbytes for o in opts) == list(range(1000, 15001, 1000))
    widths = {c: max(o.nbytes - o.copy_bytes for o in relaxed_options(sizes, c)) for c in (1, 2, 4, 15)}
    assert widths[1] >= widths[2] >= widths[4] >= widths[15] == 0
