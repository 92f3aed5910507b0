"""Checks that every pricer of a plan agrees: the simulator (by brute force over every keep / recompute plan),
the exact DP, the MILP and the FIFO sweep. Each cost-model rule's tests run them on traces that exercise it."""

from __future__ import annotations

import dataclasses
import itertools
import random
import time
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from helpers import tiny_trace
from memsched.optimizer.actions import dp_verdict
from memsched.optimizer.baselines import checkpoint_all
from memsched.optimizer.budget import budget_between, min_feasible_budget
from memsched.optimizer.decisions import KEEP, Decision, offload_subset, recompute
from memsched.optimizer.dp import build_problem, exact_search
from memsched.optimizer.dp.decode import decode
from memsched.optimizer.dp.fifo import fifo_sweep
from memsched.optimizer.ilp.model import build_model
from memsched.optimizer.ilp.pulp_backend import solve_pulp
from memsched.optimizer.simulate import forward_stage_memory, simulate
from memsched.optimizer.synthetic import make_trace
from memsched.schema import Action, SolverStatus, Trace

FAR = time.perf_counter() + 10**6
"""A deadline no test reaches."""
KEEP_RECOMPUTE = frozenset({Action.KEEP, Action.RECOMPUTE})


def cpu_trace(n: int, seed: int) -> Trace:
    """Bytes of the order of the CPU's RNG state, so that it decides plans; measured on the CPU (serial copies)."""
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


def plan_of(genes: Sequence[str | tuple[int, ...]], trace: Trace | None = None) -> list[Decision]:
    """A plan from one gene per layer: "K" keep, "S" start a recompute segment, "C" continue one (or start it), a
    tuple: offload that subset of the layer's saved tensors (needs `trace`)."""
    ds: list[Decision] = []
    start = -1
    for i, g in enumerate(genes):
        if g == "K":
            ds.append(KEEP)
            start = -1
        elif isinstance(g, tuple):
            assert trace is not None
            ds.append(offload_subset(trace, i, g))
            start = -1
        else:
            start = i if g == "S" or start < 0 else start
            ds.append(recompute(group=start))
    return ds


def keep_recompute_plans(n: int) -> list[list[Decision]]:
    """Every plan of keep and recompute over n layers (each layer: keep, start a segment, or continue one)."""
    plans = [plan_of(combo) for combo in itertools.product("KSC", repeat=n)]
    return plans


def milp_optimum(trace: Trace, budget: int) -> float | None:
    """The exact-window MILP's optimum at gap 0, re-simulated (None: no plan fits)."""
    out = solve_pulp(build_model(trace, budget, window=trace.n, max_segment=trace.n), "cbc", 120, 0.0, None)
    if out.decisions is None:
        assert out.status != SolverStatus.OPTIMAL
        return None
    assert out.status == SolverStatus.OPTIMAL
    sim = simulate(trace, out.decisions, budget)
    assert sim.feasible
    return sim.overhead_s


def assert_brute_force_dp_and_milp_agree(
    trace: Trace, fractions: tuple[float, ...] = (0.05, 0.2, 0.35, 0.5, 0.7)
) -> None:
    """On a serial-copy trace: keep / recompute plans, brute force against the DP; every action, the DP (exact
    there) against the MILP; at each budget fraction."""
    plans = keep_recompute_plans(trace.n)
    for frac in fractions:
        budget = budget_between(trace, frac)
        sims = [simulate(trace, ds, budget, with_events=False) for ds in plans]
        best = min((s.overhead_s for s in sims if s.feasible), default=None)
        verdict = dp_verdict(trace, budget, KEEP_RECOMPUTE, FAR)
        if best is None:
            assert verdict.feasible is False
        else:
            assert verdict.sim is not None and verdict.sim.feasible
            assert verdict.sim.overhead_s == pytest.approx(best, rel=1e-9, abs=1e-12)
        out = exact_search(trace, budget, FAR, incumbent_s=None, gap=0.0)
        milp = milp_optimum(trace, budget)
        if not out.schedules:
            assert milp is None
            continue
        assert milp is not None and out.schedules[0].feasible
        assert milp == pytest.approx(out.schedules[0].overhead_s, rel=1e-9, abs=1e-12)


def assert_fifo_sweep_equals_the_milp(trace: Trace, budget: int) -> float:
    """Concurrent copies: the FIFO sweep is exact for the simulator's timing, so it equals the MILP, and its
    plan simulates to its cost. Returns the optimum."""
    p = build_problem(trace, budget)
    res = fifo_sweep(p, FAR, np.inf)
    opt = milp_optimum(trace, budget)
    assert opt is not None and res.finished and res.finals and res.bound_s is not None
    assert res.bound_s == pytest.approx(opt, rel=1e-5, abs=1e-12)
    sim = simulate(trace, decode(trace, p, res, res.finals[0][1]), budget)
    assert sim.feasible and sim.overhead_s == pytest.approx(res.finals[0][0], rel=1e-9, abs=1e-12)
    return opt


def best_overhead(trace: Trace, budget: int, plans: Sequence[list[Decision]] | None = None) -> float | None:
    """The least overhead of the `plans` (default: every_action_plan) that fit, each simulated; None: none fits."""
    sims = [simulate(trace, plan, budget, with_events=False) for plan in plans or every_action_plan(trace)]
    return min((s.overhead_s for s in sims if s.feasible), default=None)


def spread_budgets(trace: Trace) -> list[int]:
    """The least budget any plan fits, a few bytes above it, and spread up to keep-all's."""
    least = min_feasible_budget(trace)
    return [least, least + 64, *(budget_between(trace, f) for f in (0.1, 0.3, 0.6))]


def assert_fluid_sweep_is_the_best_plan(trace: Trace, exact: bool) -> None:
    """At each of spread_budgets the fluid sweep's bound is at most the best plan's overhead (every_action_plan);
    `exact` (serial copies, where the sweep is exact): its plan is that best plan, and it finds one exactly where
    one fits."""
    for budget in spread_budgets(trace):
        best = best_overhead(trace, budget)
        out = exact_search(trace, budget, FAR, incumbent_s=None, gap=0.0)
        if best is None:
            assert not out.schedules
            continue
        assert out.bound_s is not None and out.bound_s <= best * (1 + 1e-9) + 1e-12
        if exact:
            assert out.schedules and out.schedules[0].feasible, (budget, best)
            assert out.schedules[0].overhead_s == pytest.approx(best, rel=1e-9, abs=1e-12)


def assert_fifo_sweep_is_the_best_plan(trace: Trace, budget: int, best: float | None) -> None:
    """Concurrent copies: the FIFO sweep finishes, finds a plan exactly where some plan fits, its optimum is
    `best` (the least overhead over every plan, or None), and its plan simulates to what it computed."""
    p = build_problem(trace, budget)
    res = fifo_sweep(p, FAR, np.inf)
    assert res.finished
    if best is None:
        assert not res.finals
        return
    assert res.finals and res.bound_s == pytest.approx(best, rel=1e-6, abs=1e-12)
    sim = simulate(trace, decode(trace, p, res, res.finals[0][1]), budget)
    assert sim.feasible and sim.overhead_s == pytest.approx(res.finals[0][0], rel=1e-9, abs=1e-12)


PRICER_CHECKS = ("fluid-serial", "fluid-concurrent", "fifo", "milp-fifo")
"""What `assert_a_term_is_priced` checks, one name per test case."""


def assert_a_term_is_priced(check: str, trace_of: Callable[[int, int, bool], Trace], seed: int) -> None:
    """One of the checks a memory term of the cost model gets in every pricer, on `trace_of(n, seed, serial)`
    (a random trace where the term decides plans): `fluid-serial`, the fluid sweep is the brute-force optimum on
    serial copies; `fluid-concurrent`, its bound stays below it on concurrent copies; `fifo`, the FIFO sweep is
    the brute-force optimum there and its plan fits; `milp-fifo`, the exact-window MILP equals the FIFO sweep."""
    if check == "fluid-serial":
        assert_fluid_sweep_is_the_best_plan(trace_of(3 + seed % 3, seed, True), exact=True)
    elif check == "fluid-concurrent":
        assert_fluid_sweep_is_the_best_plan(trace_of(3 + seed % 2, 200 + seed, False), exact=False)
    elif check == "fifo":
        trace = trace_of(3 + seed % 3, 100 + seed, False)
        for budget in spread_budgets(trace):
            assert_fifo_sweep_is_the_best_plan(trace, budget, best_overhead(trace, budget))
    else:
        assert check == "milp-fifo"
        trace = trace_of(3 + seed % 2, 300 + seed, False)
        for budget in (min_feasible_budget(trace), budget_between(trace, 0.2)):
            assert_fifo_sweep_equals_the_milp(trace, budget)


def _split(total: int, k: int, rng: random.Random) -> list[int]:
    """`total` bytes as k positive tensors of uneven sizes (so that their subset sums are nearly all distinct)."""
    weights = [rng.uniform(0.05, 1.0) ** 2 for _ in range(k)]
    sizes = [max(1, int(total * w / sum(weights))) for w in weights]
    sizes[0] += total - sum(sizes)
    if sizes[0] <= 0:  # rounding took too much from the first: move it to the largest
        sizes[sizes.index(max(sizes))] += sizes[0] - 1
        sizes[0] = 1
    return sizes


def many_tensor_trace(n: int, seed: int, serial: bool, latency: bool) -> Trace:
    """make_trace's layers, each one's saved bytes split into 10-20 tensors."""
    rng = random.Random(seed)
    base = make_trace(n, seed, dag=seed % 3 == 0, copy_latency_s=20e-6 if latency else 0.0)
    doc = base.model_dump()
    doc["device"]["concurrent_copies"] = not serial
    for layer in doc["layers"]:
        if layer["saved_bytes"] > 0:
            layer["saved_tensor_bytes"] = _split(layer["saved_bytes"], rng.randint(10, 20), rng)
    return Trace.model_validate(doc)


def block_tensor_trace(n: int, seed: int, serial: bool, latency: bool) -> Trace:
    """make_trace's layers, each one's saved bytes split as a transformer block's are: a few sizes repeated (two
    of 4 units, three of 2, four of 1) and a handful of tiny tensors (a mask, a scale). Their subset sums number
    in the hundreds but lie in 19 tight clusters, one per multiple of the unit."""
    rng = random.Random(seed)
    base = make_trace(n, seed, dag=seed % 3 == 0, copy_latency_s=20e-6 if latency else 0.0)
    doc = base.model_dump()
    doc["device"]["concurrent_copies"] = not serial
    for layer in doc["layers"]:
        total = layer["saved_bytes"]
        if total <= 0:
            continue
        tiny = [rng.randint(1, 64) * 8 for _ in range(rng.randint(3, 5))]
        unit = (total - sum(tiny)) // 18
        assert unit > 10 * sum(tiny), "make_trace's layers save megabytes"
        sizes = [4 * unit] * 2 + [2 * unit] * 3 + [unit] * 4 + tiny
        sizes[-1] += total - sum(sizes)
        layer["saved_tensor_bytes"] = sizes
    return Trace.model_validate(doc)


def every_action_plan(trace: Trace) -> list[list[Decision]]:
    """Every plan of whole-layer keep / recompute segments / offload of any tensor subset (timing: the
    simulator's default, which is optimal per action choice: tests/unit/test_dp.py checks it)."""
    n = trace.n
    genes: list[list[object]] = []
    for i, layer in enumerate(trace.layers):
        g: list[object] = ["K", "S"] + (["R"] if i else [])
        pos = [q for q, b in enumerate(layer.tensors) if b > 0]
        if i < n - 1:
            g += [c for r in range(1, len(pos) + 1) for c in itertools.combinations(pos, r)]
        genes.append(g)
    return [plan_of(combo, trace) for combo in itertools.product(*genes)]


def every_rule_trace(tr: Trace, seed: int) -> Trace:
    """`tr` with the fields that change stage memory set at random: saved inputs (the re-run overlap, which lowers
    B stages), self-saved outputs, saved-twice storages, side inputs, changed buffers, the code holding a skip,
    early-stopping re-runs, measured forward cuts (which lower F stages), bytes kept on a ctx and the recompute
    machinery's time (streams of their own, so that the others are drawn as before them)."""
    rng = random.Random(seed)
    ctx_rng = random.Random(seed + 7919)
    doc = tr.model_dump(mode="json")
    mean_f = sum(x["forward_s"] for x in doc["layers"]) / len(doc["layers"])
    doc["rerun_overhead"] = random.Random(seed + 104729).choice(
        [None, {"per_segment_s": 0.7 * mean_f, "per_layer_s": 0.2 * mean_f}, {"per_segment_s": 0.3 * mean_f}]
    )
    for j, layer in enumerate(doc["layers"]):
        saved, out, inp = layer["saved_bytes"], layer["output_bytes"], layer["input_bytes"]
        layer["input_saved_bytes"] = rng.choice([None, min(inp, saved), min(inp, saved) // 2])
        layer["output_saved_bytes"] = rng.choice([None, min(out, saved), min(out, saved) // 3])
        layer["shared_input_bytes"] = rng.choice([None, min(inp, saved) // 4])
        layer["side_input_bytes"] = rng.choice([None, 0, 500])
        layer["changed_buffer_bytes"] = rng.choice([None, 0, 300])
        layer["recompute_s"] = rng.choice([None, layer["forward_s"] * 0.6])
        layer["ctx_held_bytes"] = ctx_rng.choice([None, 0, 400])
        if j + 2 < len(doc["layers"]):
            layer["output_held_until"] = rng.choice([None, j + 2])
    out_tr = Trace.model_validate(doc)
    uncut = forward_stage_memory(out_tr, checkpoint_all(out_tr), cuts=[0] * out_tr.n)
    for layer, charged in zip(out_tr.layers, uncut, strict=True):
        layer.checkpointed_forward_bytes = rng.choice([None, charged - layer.saved_bytes // 2, charged])
    return out_tr


def best_timing_overhead(trace: Trace, decisions: list[Decision], budget: int) -> float | None:
    """The least overhead of these actions over every done-by and prefetch-at of their offloaded layers (brute
    force; None where no timing fits the budget)."""
    offloaded = [i for i, d in enumerate(decisions) if d.action == Action.OFFLOAD]
    n = trace.n
    best = None
    for combo in itertools.product(*[[(d, p) for d in range(i, n) for p in range(i, n)] for i in offloaded]):
        timed = list(decisions)
        for i, (done, pref) in zip(offloaded, combo, strict=True):
            timed[i] = dataclasses.replace(timed[i], done_by=done, prefetch_at=pref)
        try:
            sim = simulate(trace, timed, budget, with_events=False)
        except ValueError:  # prefetch order violated: not a valid timing
            continue
        if sim.feasible and (best is None or sim.overhead_s < best):
            best = sim.overhead_s
    return best
