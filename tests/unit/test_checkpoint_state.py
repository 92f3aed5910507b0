"""A recompute segment's checkpoint stashes the RNG state for its recomputation: on the CPU a 5,056-byte tensor
in device (= host) memory, held from F_a through B_a (issue 25, the 50% GPT-2 plan measured 15,168 bytes =
3 segments x 5,056 above its prediction). The simulator prices it; the DP and the MILP price it identically."""

from __future__ import annotations

import itertools
import random
import time

import pytest

from helpers import tiny_trace
from memsched.optimizer.actions import dp_verdict
from memsched.optimizer.budget import budget_between
from memsched.optimizer.decisions import KEEP, Decision, recompute
from memsched.optimizer.dp import exact_search
from memsched.optimizer.ilp.model import build_model
from memsched.optimizer.ilp.pulp_backend import solve_pulp
from memsched.optimizer.simulate import CPU_RNG_STATE_BYTES, checkpoint_state_bytes, simulate
from memsched.schema import Action, SolverStatus, Trace

FAR = time.perf_counter() + 10**6


def _cpu_trace(n: int, seed: int) -> Trace:
    """Bytes of the order of the RNG state, so that it decides plans; measured on the CPU (serial copies)."""
    rng = random.Random(seed)
    out = [rng.randint(500, 4000) for _ in range(n)]
    tr = tiny_trace(
        [rng.uniform(0.1, 1.0) for _ in range(n)],
        [rng.uniform(0.1, 2.0) for _ in range(n)],
        [rng.randint(2000, 20000) for _ in range(n)],
        output=out,
        inputs=[out[i - 1] if i else rng.randint(0, 3000) for i in range(n)],
        workspace=[rng.randint(0, 3000) for _ in range(n)],
        static=1000,
        bandwidth=1e5,
    )
    tr.device.name = "cpu (test)"
    tr.device.concurrent_copies = False
    return tr


def _keep_recompute_plans(n: int) -> list[list[Decision]]:
    plans = []
    for combo in itertools.product("KSC", repeat=n):
        ds: list[Decision] = []
        start = -1
        for i, c in enumerate(combo):
            if c == "K":
                ds.append(KEEP)
                start = -1
            else:
                start = i if c == "S" or start < 0 else start
                ds.append(recompute(group=start))
        plans.append(ds)
    return plans


def test_each_segment_holds_the_state_from_its_forward_through_its_backward() -> None:
    tr = _cpu_trace(4, 1)
    assert checkpoint_state_bytes(tr) == CPU_RNG_STATE_BYTES == 5056
    plan = [recompute(), KEEP, recompute(group=2), recompute(group=2)]  # segments [0..0] and [2..3]
    on_cpu = simulate(tr, plan).stage_bytes
    tr.device.name = "test"  # a GPU's stashed states are host tensors: no device bytes
    assert checkpoint_state_bytes(tr) == 0
    elsewhere = simulate(tr, plan).stage_bytes
    # Stages F0..F3, B3..B0: segment [0..0] holds it at every stage, [2..3] from F2 through B2.
    assert [a - b for a, b in zip(on_cpu, elsewhere, strict=True)] == [
        5056,
        5056,
        10112,
        10112,
        10112,
        10112,
        5056,
        5056,
    ]


@pytest.mark.parametrize("seed", range(6))
def test_dp_and_milp_price_the_state_like_the_simulator(seed: int) -> None:
    n = 3 + seed % 3
    tr = _cpu_trace(n, seed)
    allowed = frozenset({Action.KEEP, Action.RECOMPUTE})
    plans = _keep_recompute_plans(n)
    for frac in (0.05, 0.2, 0.35, 0.5, 0.7):
        budget = budget_between(tr, frac)
        sims = [simulate(tr, ds, budget, with_events=False) for ds in plans]
        best = min((s.overhead_s for s in sims if s.feasible), default=None)
        # Keep and recompute only (the CPU default): the exact DP against brute force.
        verdict = dp_verdict(tr, budget, allowed, FAR)
        if best is None:
            assert verdict.feasible is False
        else:
            assert verdict.sim is not None and verdict.sim.feasible
            assert verdict.sim.overhead_s == pytest.approx(best, rel=1e-9, abs=1e-12)
        # Every action: the DP (exact on a serial device) and the MILP agree, and their plans fit.
        out = exact_search(tr, budget, FAR, incumbent_s=None, gap=0.0)
        milp = solve_pulp(build_model(tr, budget, window=n, max_segment=n), "cbc", 120, 0.0, None)
        if not out.schedules:
            assert milp.status != SolverStatus.OPTIMAL or milp.decisions is None
            continue
        assert out.schedules[0].feasible
        assert milp.status == SolverStatus.OPTIMAL and milp.decisions is not None
        ilp = simulate(tr, milp.decisions, budget)
        assert ilp.feasible
        assert ilp.overhead_s == pytest.approx(out.schedules[0].overhead_s, rel=1e-9, abs=1e-12)
