"""The memory-state DP (optimizer/dp/): its bound never exceeds the exact optimum, its decoded schedules
are feasible and cost what the simulator says, timing by default_timing is optimal for fixed actions, and
solve()'s reported bound is true on every path."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from helpers.pricing import best_timing_overhead
from memsched.optimizer.budget import budget_between, keepall_activation_peak, resolve_budget
from memsched.optimizer.decisions import KEEP, offload_all, recompute
from memsched.optimizer.dp import build_problem, exact_search
from memsched.optimizer.dp.sweep import SweepConfig, run_sweep
from memsched.optimizer.ilp.model import build_model
from memsched.optimizer.ilp.pulp_backend import solve_pulp
from memsched.optimizer.simulate import simulate, unattributed_bytes
from memsched.optimizer.solve import solve_report
from memsched.optimizer.synthetic import make_trace
from memsched.options import SolveOptions
from memsched.schema import Action, SolverStatus, Trace

FAR = time.perf_counter() + 10**6  # a deadline that never comes
SMALL_TRACES = {
    "n": st.integers(2, 8),
    "seed": st.integers(0, 10**6),
    "dag": st.booleans(),
    "frac": st.floats(0.0, 0.9),
}
"""The property tests' random traces: layers, make_trace's seed, skip connections, budget between min and keep-all."""


def _random_trace(n: int, seed: int, dag: bool, serial: bool, latency: bool, loss: float = 0.0) -> Trace:
    """`loss`: the loss's own bytes (simulate.unattributed_bytes), as a share of every saved byte: the measured
    keep-all peak is raised by that much above the modelled one, as a language model's logits raise it."""
    trace = make_trace(n, seed, dag=dag, copy_latency_s=20e-6 if latency else 0.0)
    trace.device.concurrent_copies = not serial
    saved = sum(x.saved_bytes for x in trace.layers)
    if loss > 0.0 and saved > 0:
        modelled = trace.static.total + keepall_activation_peak(trace)
        trace.baseline.peak_bytes = modelled + round(loss * saved)
        assert unattributed_bytes(trace) > 0
    return trace


def exact_optimum(trace: Trace, budget: int) -> float:
    """The MILP with windows covering every timing and segment (W = L = n), solved to gap 0: the exact
    optimum under the cost model (tests/unit/test_ilp_exact.py checks it against brute force)."""
    opt = exact_optimum_within(trace, budget, 120)
    assert opt is not None, "CBC did not prove the exact optimum in 120 s"
    return opt


def exact_optimum_within(trace: Trace, budget: int, limit_s: float) -> float | None:
    """exact_optimum, or None where CBC does not prove it within `limit_s` (no yardstick for that case)."""
    m = build_model(trace, budget, window=trace.n, max_segment=trace.n)
    out = solve_pulp(m, "cbc", limit_s, 0.0, None)
    if out.status != SolverStatus.OPTIMAL or out.decisions is None:
        return None
    return simulate(trace, out.decisions, budget).overhead_s


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    **SMALL_TRACES,
    serial=st.booleans(),
    latency=st.booleans(),
)
def test_dp_bound_is_below_the_exact_optimum(
    n: int, seed: int, dag: bool, frac: float, serial: bool, latency: bool
) -> None:
    trace = _random_trace(n, seed, dag, serial, latency)
    budget = budget_between(trace, frac)
    out = exact_search(trace, budget, FAR, incumbent_s=None, gap=0.0)
    assert out.fluid_optimum and out.bound_s is not None
    opt = exact_optimum(trace, budget)
    assert out.bound_s <= opt * (1 + 1e-9) + 1e-12
    # Decoded plans fit the budget, and none is cheaper than the optimum or the bound (the relaxation).
    assert out.schedules, "the DP's best plan decodes into a feasible schedule"
    best = out.schedules[0]
    assert best.feasible and best.peak_bytes <= budget
    assert best.overhead_s >= opt * (1 - 1e-9) - 1e-12
    assert best.overhead_s >= out.bound_s * (1 - 1e-9) - 1e-12
    if serial:
        # Copies on the compute thread: the DP's model is exact, so it finds the optimum outright.
        assert best.overhead_s == pytest.approx(opt, rel=1e-9, abs=1e-12)
        assert out.bound_s == pytest.approx(opt, rel=1e-9, abs=1e-12)
    elif not latency:
        # Without copy latency the fluid bound can still be below the FIFO optimum, never above.
        assert out.bound_s <= best.overhead_s + 1e-12


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    **SMALL_TRACES,
    latency_s=st.sampled_from([2e-4, 1e-3, 5e-3]),
)
def test_fluid_link_slowed_by_latency_still_bounds_the_exact_optimum(
    n: int, seed: int, dag: bool, frac: float, latency_s: float
) -> None:
    """With a copy latency as long as copying a layer's tensors or longer (0.2-5 ms against MiB tensors at 12 GB/s),
    the fluid sweep drains its backlogs at fluid_bandwidth(): still below the exact optimum (the MILP with
    every timing, which prices whole copies with their latency), and no lower than the same sweep on the
    latency-free link, which it tightens."""
    from memsched.optimizer.dp.problem import fluid_bandwidth

    trace = make_trace(n, seed, dag=dag, copy_latency_s=latency_s)
    budget = budget_between(trace, frac)
    p = build_problem(trace, budget)
    largest = max((sum(x.tensors) for x in trace.layers[:-1]), default=0)
    assert p.fluid_d2h_bw == pytest.approx(fluid_bandwidth(p.d2h_bw, latency_s, largest))
    assert largest == 0 or p.fluid_d2h_bw < p.d2h_bw
    out = exact_search(trace, budget, FAR, incumbent_s=None, gap=0.0, problem=p)
    assert out.fluid_optimum and out.bound_s is not None
    opt = exact_optimum(trace, budget)
    assert out.bound_s <= opt * (1 + 1e-9) + 1e-12
    free = exact_search(
        trace,
        budget,
        FAR,
        incumbent_s=None,
        gap=0.0,
        problem=replace(
            p,
            fluid_d2h_bw=p.d2h_bw,
            fluid_h2d_bw=p.h2d_bw,
            future=np.zeros_like(p.future),
            future_pending=np.zeros_like(p.future_pending),
            _remaps={},
        ),
    )
    assert free.bound_s is not None and out.bound_s >= free.bound_s * (1 - 1e-9) - 1e-12


def test_fluid_bandwidth() -> None:
    """A copy of b <= L bytes takes latency + b / bw >= b / fluid_bandwidth(bw, latency, L): equal at b = L."""
    from memsched.optimizer.dp.problem import fluid_bandwidth

    bw, lat, largest = 12e9, 1e-3, 24_000_000
    eff = fluid_bandwidth(bw, lat, largest)
    assert largest / eff == pytest.approx(lat + largest / bw)
    for b in (1, 1000, 10**6, largest):
        assert lat + b / bw >= b / eff
    assert fluid_bandwidth(bw, 0.0, largest) == bw and fluid_bandwidth(bw, lat, 0) == bw
    # Under a 1% slowdown the link keeps its own bandwidth (PipeDream's 10 us against 100 MB copies).
    assert fluid_bandwidth(bw, 10e-6, 100_000_000) == bw


@pytest.mark.parametrize("seed", range(40))
def test_default_timing_is_optimal_for_fixed_actions(seed: int) -> None:
    """For fixed actions, default_timing's done-by / prefetch-at are as good as the best of all timings
    (brute force): this is what lets the DP and the local search search actions only."""
    rng = random.Random(seed)
    n = rng.randint(3, 6)
    trace = make_trace(n, seed, dag=seed % 2 == 0)
    budget = budget_between(trace, rng.uniform(0.0, 0.9))
    offloaded: list[int] = []
    while not offloaded:  # draw until some layer is offloaded: that is what gets timed
        acts = [rng.choice("KKOOR") for _ in range(n)]
        decisions = [
            KEEP if a == "K" else offload_all(trace, i) if a == "O" else recompute() for i, a in enumerate(acts)
        ]
        offloaded = [i for i, d in enumerate(decisions) if d.action == Action.OFFLOAD]
    best = best_timing_overhead(trace, decisions, budget)
    default = simulate(trace, decisions, budget, with_events=False)
    if best is None:
        assert not default.feasible
        return
    assert default.feasible and default.overhead_s <= best * (1 + 1e-9) + 1e-12


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(8, 11),
    seed=st.integers(0, 10**6),
    dag=st.booleans(),
    frac=st.floats(0.0, 0.8),
    solver=st.sampled_from(["auto", "dp", "cbc"]),
)
def test_reported_bound_is_true_on_every_path(n: int, seed: int, dag: bool, frac: float, solver: str) -> None:
    trace = make_trace(n, seed, dag=dag)
    budget = budget_between(trace, frac)
    report = solve_report(trace, budget, SolveOptions(solver=solver, time_limit_s=5, gap=0.0))
    rec = report.schedule.solver
    assert rec.best_bound_s is not None and rec.gap is not None
    # The yardstick: CBC's exact optimum. Some random 8-11-layer draws take it past minutes (a 10-layer chain,
    # seed 19338 at 729,616,895 B: not proven in 120 s, and hypothesis then spent 580 s shrinking); those draws have
    # no yardstick and are discarded rather than failed.
    opt = exact_optimum_within(trace, budget, 30)
    assume(opt is not None)
    assert opt is not None
    assert rec.best_bound_s <= opt * (1 + 1e-9) + 1e-12
    assert rec.objective_s >= opt * (1 - 1e-9) - 1e-12
    if rec.status == SolverStatus.OPTIMAL:
        assert rec.objective_s == pytest.approx(opt, rel=1e-6, abs=1e-9)


def test_label_cap_gives_a_true_bound_and_says_so() -> None:
    trace = make_trace(40, 3)
    budget = budget_between(trace, 0.3)
    full = exact_search(trace, budget, FAR, incumbent_s=None, gap=0.0)
    capped = exact_search(trace, budget, FAR, incumbent_s=None, gap=0.0, max_labels=60)
    assert full.fluid_optimum and full.bound_s is not None
    assert capped.cap_hit and "label cap" in capped.message
    assert capped.bound_s is not None and capped.bound_s <= full.bound_s * (1 + 1e-9) + 1e-12


def test_windowed_milp_bound_is_not_reported_as_a_bound() -> None:
    trace = make_trace(40, 5, dag=True)
    budget = budget_between(trace, 0.2)
    report = solve_report(trace, budget, SolveOptions(solver="cbc", time_limit_s=6, window=3, max_segment=3))
    rec = report.schedule.solver
    assert rec.best_bound_s is not None
    if report.outcome is not None and report.outcome.bound_s is not None:
        assert "not reported as a bound" in " ".join(rec.details)
    assert "from cbc" not in " ".join(rec.details)  # the bound's source is the DP (or none), never the windowed MILP


def test_time_limit_bounds_the_whole_call() -> None:
    solve_report(make_trace(8, 1), budget_between(make_trace(8, 1), 0.2), SolveOptions(time_limit_s=2))  # warm
    trace = make_trace(1000, 11)
    budget = budget_between(trace, 0.2)
    t0 = time.perf_counter()
    report = solve_report(trace, budget, SolveOptions(time_limit_s=3))
    wall = time.perf_counter() - t0
    assert wall <= 3 * 1.1 + 0.5, wall
    rec = report.schedule.solver
    assert rec.best_bound_s is not None and rec.status in (SolverStatus.OPTIMAL, SolverStatus.FEASIBLE)
    assert simulate(trace, report.schedule).feasible


@pytest.mark.slow
def test_resnet50_at_25_percent_is_proven() -> None:
    from helpers import require_pipedream
    from memsched.service.importers import import_pipedream

    trace = import_pipedream(require_pipedream() / "resnet50.graph.txt", 128)
    budget = resolve_budget("25%", trace)
    # The default time limit (30 s), which is what a user gets (it proves at about 7 s on one core alone; before
    # PRICED_EXACTLY was 5e-3 the test asked for 150 s, as the phases' shares of the limit delayed the proof).
    report = solve_report(trace, budget, SolveOptions())
    rec = report.schedule.solver
    assert rec.objective_s <= 0.0896
    # optimal means within the requested gap up to 1e-6 relative (solve.py: backends round)
    assert rec.status == SolverStatus.OPTIMAL and rec.gap is not None and rec.gap <= 0.01 + 1e-6, rec.message


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    **SMALL_TRACES,
    serial=st.booleans(),
    latency=st.booleans(),
    loss=st.sampled_from([0.0, 0.0, 0.3, 1.0]),
)
def test_future_bound_never_cuts_the_fluid_optimum(
    n: int, seed: int, dag: bool, frac: float, serial: bool, latency: bool, loss: float
) -> None:
    """The future-cost table (optimizer/dp/future.py) is a lower bound: the empty plan's entry is below the
    exact optimum and the fluid optimum, and pruning by it changes neither the fluid optimum nor its proof; also
    where the loss's own bytes make the loss point the peak (its row). There the yardstick is the fluid optimum
    alone: the MILP charges the loss's bytes at B_{n-1} too (conservative, optimizer/ilp/model.py), so it is no
    exact optimum."""
    trace = _random_trace(n, seed, dag, serial, latency, loss)
    budget = budget_between(trace, frac)
    p = build_problem(trace, budget)
    assert np.array_equal(np.maximum.accumulate(p.future, axis=1), p.future), (
        "nondecreasing in retained bytes (the lookup rounds down)"
    )
    if unattributed_bytes(trace) == 0:
        opt = exact_optimum(trace, budget)
        assert p.future[0, 0] <= opt * (1 + 1e-9) + 1e-12
    root = float(p.future[0, 0])
    pruned = run_sweep(p, SweepConfig(deadline=FAR))
    p.future[:] = 0.0
    plain = run_sweep(p, SweepConfig(deadline=FAR))
    assert pruned.finished and plain.finished and pruned.bound_s is not None and plain.bound_s is not None
    assert pruned.bound_s == pytest.approx(plain.bound_s, rel=1e-9, abs=1e-12)
    assert root <= plain.bound_s * (1 + 1e-9) + 1e-12


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    **SMALL_TRACES,
    latency=st.booleans(),
    slow=st.sampled_from([1.0, 0.1, 0.02]),
)
def test_backlog_bound_never_cuts_the_fluid_optimum(
    n: int, seed: int, dag: bool, frac: float, latency: bool, slow: float
) -> None:
    """The stalls a label's backlogs force (DpProblem.backlog_bound) bound its cost to come: a sweep pruned at a
    threshold just above the fluid optimum still finds it, one just below proves its threshold and no more,
    and at the last boundary the bound is the final wait itself. `slow` divides the links' bandwidth, so
    that backlogs outlast the compute left (where the bound prunes)."""
    trace = _random_trace(n, seed, dag, False, latency)
    trace.device.d2h_bytes_per_s *= slow
    trace.device.h2d_bytes_per_s *= slow
    budget = budget_between(trace, frac)
    p = build_problem(trace, budget)
    plain = run_sweep(p, SweepConfig(deadline=FAR))
    assert plain.finished and plain.finals
    opt = plain.finals[0][0]
    assert p.backlog_bound(p.n, np.array([3e9]), np.array([5e9]))[0] == pytest.approx(
        3e9 / p.fluid_d2h_bw + 5e9 / p.fluid_h2d_bw
    )
    if opt <= 0.0:
        return
    above = run_sweep(p, SweepConfig(deadline=FAR, threshold=opt * (1 + 1e-6) + 1e-12))
    assert above.finished and above.finals
    assert above.finals[0][0] == pytest.approx(opt, rel=1e-9, abs=1e-12)
    below = run_sweep(p, SweepConfig(deadline=FAR, threshold=opt * (1 - 1e-6)))
    assert below.finished and below.bound_s is not None and below.bound_s <= opt


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    **SMALL_TRACES,
    serial=st.booleans(),
)
def test_root_only_future_bound_beyond_the_table_limit(n: int, seed: int, dag: bool, frac: float, serial: bool) -> None:
    """Past FUTURE_MAX_LAYERS only the root row is built (every row m from boundary 0): its entry is the full
    table's root, below the exact optimum, and every other boundary's is 0 (a valid bound that prunes nothing)."""
    import memsched.optimizer.dp.problem as problem_module

    trace = _random_trace(n, seed, dag, serial, False)
    budget = budget_between(trace, frac)
    full = build_problem(trace, budget)
    saved_limit = problem_module.FUTURE_MAX_LAYERS
    problem_module.FUTURE_MAX_LAYERS = 1
    try:
        root = build_problem(trace, budget, deadline=time.perf_counter() + 60)
    finally:
        problem_module.FUTURE_MAX_LAYERS = saved_limit
    assert root.future[0] == pytest.approx(full.future[0], rel=1e-12, abs=1e-15)
    assert not root.future[1:].any()
    assert root.future[0, 0] <= exact_optimum(trace, budget) * (1 + 1e-9) + 1e-12


def test_future_root_sees_every_row_on_a_long_trace() -> None:
    """Over 300 layers the table reads the next 96 rows and then every stride-th from each boundary; its root
    reads every row (one boundary costs little), so it is at least the strided root, and it is what a solve
    reports where no sweep finishes. Past FUTURE_MAX_LAYERS the root row is built alone (bound > 0, not 0)."""
    import memsched.optimizer.dp.problem as problem_module
    from memsched.optimizer.dp.future import GRID_POINTS, future_table

    trace = make_trace(1000, 1, dag=True)
    budget = budget_between(trace, 0.2)
    p = build_problem(trace, budget)
    window, stride = problem_module._future_rows(trace.n)
    assert window < trace.n
    strided = future_table(
        p.saved,
        p.fwd,
        p.rerun,
        p.bwd,
        p.trans_f_rec,
        p.trans_b,
        p.limit,
        p.serial,
        p.d2h_bw,
        p.h2d_bw,
        p.future_step,
        GRID_POINTS,
        window,
        stride,
        np.zeros(1, np.int64),
        False,
        np.zeros(trace.n, np.int64),
        np.full(trace.n, -1, np.int64),
    )[0]
    assert p.future[0, 0] >= strided[0, 0] and p.future[0, 0] > 0.0
    saved_limit = problem_module.FUTURE_MAX_LAYERS
    problem_module.FUTURE_MAX_LAYERS = 500
    try:
        root = build_problem(trace, budget, deadline=time.perf_counter() + 60)
        out = exact_search(trace, budget, time.perf_counter() + 0.3, incumbent_s=None, gap=0.0, problem=root)
    finally:
        problem_module.FUTURE_MAX_LAYERS = saved_limit
    assert root.future[0, 0] == pytest.approx(p.future[0, 0], rel=1e-12) and not root.future[1:].any()
    assert out.bound_s is not None and out.bound_s >= root.future[0, 0] * (1 - 1e-12)


def test_future_bound_is_a_bound_where_no_sweep_finishes() -> None:
    """On a long trace the exact sweep cannot finish in a short limit; the empty plan's future bound is still
    reported (a true bound above 0), and it is below what the solver returns."""
    trace = make_trace(600, 2)
    budget = budget_between(trace, 0.2)
    out = exact_search(trace, budget, time.perf_counter() + 0.5, incumbent_s=None, gap=0.0)
    assert out.bound_s is not None and out.bound_s > 0.0
    # 8 s: the solve builds the future-cost table only when its estimated cost fits a quarter of the time left
    # after the candidates, which on a loaded 2-core machine a 4 s limit sometimes did not leave (bound 0).
    report = solve_report(trace, budget, SolveOptions(time_limit_s=8))
    rec = report.schedule.solver
    assert rec.best_bound_s is not None and rec.best_bound_s >= out.bound_s * (1 - 1e-9)
    assert rec.objective_s >= rec.best_bound_s


@pytest.mark.parametrize("labels", [5, 20_000])  # one array op over labels x bits; one op per bit
def test_remap_held_moves_each_producer_bit_to_its_place_at_the_later_boundary(labels: int) -> None:
    from memsched.optimizer.dp.problem import _REMAP_AT_ONCE, AFTER_SEGMENT_BIT

    trace = make_trace(80, 5, dag=True)
    p = build_problem(trace, budget_between(trace, 0.3))
    rng = np.random.default_rng(labels)
    checked, per_bit = 0, 0
    for src in range(p.n):
        for dst in range(src + 1, min(p.n, src + 12) + 1):
            a, b = p.crossing[src], p.crossing[dst]
            if not a:
                continue
            held = rng.integers(0, 1 << len(a), size=labels, dtype=np.int64)
            held[::2] |= AFTER_SEGMENT_BIT  # the flag never reaches the next boundary
            want = np.zeros(labels, dtype=np.int64)
            for q, j in enumerate(b):
                if j in a:
                    want |= ((held >> a.index(j)) & 1) << q
            got = p.remap_held(held, src, dst)
            assert got.dtype == held.dtype and np.array_equal(got, want), (src, dst)
            checked += 1
            per_bit += labels * len(a) > _REMAP_AT_ONCE
    assert checked > 100
    assert (per_bit > 50) == (labels > 1000)  # both paths are exercised


def test_remap_to_ends_is_remap_held_then_after_segment_per_destination() -> None:
    # The segments' batch form (one compiled pass over labels bound for many boundaries) against the per-destination
    # calls it replaces, with layers that hold shared bytes so that the after-segment flag is exercised too.
    from memsched.optimizer.dp.problem import AFTER_SEGMENT_BIT

    trace = make_trace(80, 5, dag=True)
    base = build_problem(trace, budget_between(trace, 0.3))
    rng = np.random.default_rng(7)
    p = replace(base, shared_hold=np.where(rng.random(base.n) < 0.3, 4096, 0).astype(np.int64))
    flagged = 0
    for src in range(p.n):
        if not p.crossing[src]:
            continue
        dst = np.sort(rng.integers(src + 1, min(p.n, src + 12) + 1, size=200))
        held = rng.integers(0, 1 << len(p.crossing[src]), size=200, dtype=np.int64)
        held[::3] |= AFTER_SEGMENT_BIT
        want = np.concatenate(
            [p.after_segment(p.remap_held(held[dst == b], src, int(b)), int(b)) for b in np.unique(dst)]
        )
        got = p.remap_to_ends(held, src, dst)
        assert np.array_equal(got, want), src
        flagged += int((got & AFTER_SEGMENT_BIT).astype(bool).sum())
    assert flagged > 100


def test_future_bound_sees_the_loss_point() -> None:
    """Where the loss's own bytes make the loss point the peak (a language model's logits), the table's loss row
    raises the empty plan's entry (no F or B row holds those bytes; `beam_future` is the table without it), and it
    stays below the fluid optimum."""
    trace = _random_trace(6, 3, dag=False, serial=False, latency=True, loss=1.0)
    budget = budget_between(trace, 0.3)
    p = build_problem(trace, budget)
    without = p.beam_future[0]
    root = float(p.future[0, 0])
    fluid = run_sweep(p, SweepConfig(deadline=FAR))  # the fluid optimum: below every schedule's overhead
    assert fluid.finished and fluid.bound_s is not None
    assert without[0, 0] < root <= fluid.bound_s * (1 + 1e-9) + 1e-12


def _outputs_held(trace: Trace, seed: int) -> Trace:
    """`trace` with every layer saving its own output alone and the code holding it through its reader's forward,
    and some layers' outputs further (a skip), as PipeDream's ResNet-50 with every node output saved has them."""
    rng = random.Random(seed)
    doc = trace.model_dump(mode="json")
    for j, layer in enumerate(doc["layers"]):
        layer["output_bytes"] = layer["saved_bytes"] = max(layer["saved_bytes"], 1)
        layer["saved_tensor_bytes"] = []
        layer["output_saved_bytes"] = layer["saved_bytes"]
        layer["input_saved_bytes"] = layer["shared_input_bytes"] = None
        if j + 2 < len(doc["layers"]) and rng.random() < 0.5:
            layer["output_held_until"] = j + 2
    return Trace.model_validate(doc)


@pytest.mark.parametrize("seed", range(24))
def test_future_rows_see_when_bytes_exist_and_what_the_code_holds(seed: int) -> None:
    """The forward rows of the future table let the link drain a layer's bytes only after its forward, and leave
    on the device what the model's code holds of a layer's own output (simulate.skip_holds) whatever the layer
    does: the empty plan's entry stays below the exact optimum (brute force over every action, the simulator's
    default timing) on traces with every memory rule and with every output held, with copy latency and slow links."""
    from helpers.pricing import every_action_plan, every_rule_trace

    rng = random.Random(seed)
    n = rng.randint(2, 4)
    tr = make_trace(n, 500 + seed, dag=seed % 2 == 0, copy_latency_s=rng.choice([0.0, 2e-4, 5e-3]))
    tr.device.d2h_bytes_per_s = tr.device.h2d_bytes_per_s = rng.choice([12e9, 3e9, 0.5e9])
    tr = every_rule_trace(tr, seed) if seed % 2 else _outputs_held(tr, seed)
    plans = every_action_plan(tr)
    for frac in (0.05, 0.3, 0.6):
        budget = budget_between(tr, frac)
        fits = [s.overhead_s for s in (simulate(tr, ds, budget, with_events=False) for ds in plans) if s.feasible]
        if fits:
            assert build_problem(tr, budget).future[0, 0] <= min(fits) * (1 + 1e-9) + 1e-12


def test_future_forward_rows_drain_a_layer_after_its_forward() -> None:
    """Three layers whose last forward row needs one layer's bytes gone: the link has only layer 1's forward for
    layer 0's bytes (they exist from the end of layer 0's long forward) and none for layer 1's, so the table's root
    recomputes what the link cannot drain, where counting every forward as drain time priced it at nothing."""
    from helpers.pricing import every_action_plan

    doc = make_trace(3, 7, dag=False).model_dump(mode="json")
    for layer, fwd in zip(doc["layers"], (0.5, 0.05, 0.05), strict=True):
        layer["saved_bytes"] = layer["output_bytes"] = 10**9
        layer["saved_tensor_bytes"] = []
        layer["forward_s"], layer["backward_s"], layer["recompute_s"] = fwd, 0.5, None
    doc["baseline"]["step_s"] = 2.2
    tr = Trace.model_validate(doc)
    tr.device.d2h_bytes_per_s = tr.device.h2d_bytes_per_s = 10e9
    probe = build_problem(tr, tr.static.total + 3 * 10**9)
    budget = tr.static.total + 2 * 10**9 + int(probe.trans_f_rec[2])
    root = float(build_problem(tr, budget).future[0, 0])
    # F_2: layer 1's 0.05 s forward drains 0.5 GB of layer 0's; the other 0.5 GB cheapest by recomputing layer 1
    # (0.05 s a GB).
    assert root == pytest.approx(0.5 * 0.05, rel=1e-3)
    sims = (simulate(tr, ds, budget, with_events=False) for ds in every_action_plan(tr))
    fits = [s.overhead_s for s in sims if s.feasible]
    assert fits and root <= min(fits)
