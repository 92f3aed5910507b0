"""The host budget in the replay (CPU, offload emulated): the pinned pool's measured peak is the simulator's host
peak to the byte, and a pool limited below it refuses the offload that would pass it, naming why."""

from __future__ import annotations

import pytest
from test_runtime_support import grads, tiny

from memsched.options import SolveOptions
from memsched.runtime import HostBudgetExceeded, apply_schedule, trace
from memsched.schema import Action
from memsched.service import solve_trace

EMULATE = [Action.KEEP, Action.OFFLOAD, Action.RECOMPUTE]


@pytest.fixture(scope="module")
def gpt2():
    w = tiny("gpt2", layers=4)
    tr = trace(w.model, w.step, steps=1, warmup=1, batch_size=2, seq_len=32, measure_bandwidth=False)
    return w, tr


def test_pool_peak_is_the_predicted_host_peak(gpt2):
    w, tr = gpt2
    free = solve_trace(tr, "40%", SolveOptions(actions=EMULATE, time_limit_s=5))
    assert free.prediction.host_peak_bytes
    host = free.prediction.host_peak_bytes // 2
    sched = solve_trace(tr, "40%", SolveOptions(actions=EMULATE, time_limit_s=5, host_budget=host))
    assert sched.host_budget_bytes == host and sched.prediction.host_peak_bytes <= host
    for plan in (free, sched):
        with apply_schedule(w.model, plan, trace=tr) as sm:
            grads(w, sm)
            grads(w, sm)  # a second step reuses the buffers: the peak does not grow
            st = sm.pool_stats()
        assert st.limit_bytes == plan.host_budget_bytes
        assert st.peak_in_use_bytes == plan.prediction.host_peak_bytes
        assert st.allocated_bytes == plan.prediction.host_peak_bytes and st.in_use_bytes == 0


def test_replay_under_a_smaller_host_budget_refuses_and_says_why(gpt2):
    w, tr = gpt2
    sched = solve_trace(tr, "40%", SolveOptions(actions=EMULATE, time_limit_s=5))
    need = sched.prediction.host_peak_bytes
    assert need
    refused = pytest.raises(HostBudgetExceeded, match=rf"limit of .* \({need - 1} bytes\).*--host-budget")
    with apply_schedule(w.model, sched, trace=tr, host_budget=need - 1) as sm, refused:
        grads(w, sm)
    with apply_schedule(w.model, sched, trace=tr, host_budget=need) as sm:
        grads(w, sm)  # exactly the plan's host peak is enough
        assert sm.pool_stats().peak_in_use_bytes == need
