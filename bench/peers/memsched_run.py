"""memsched as a user runs it: trace the model once, solve per budget, replay under apply_schedule.

The trace and each schedule are kept on the spec's cache so the report can draw memsched's timeline.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

from bench.peers.approaches import NotAvailable, Prepared
from bench.peers.measure import backward
from bench.peers.models import ModelSpec

log = logging.getLogger(__name__)

TRACE_STEPS = 2
"""Steps the tracer times (it runs 2 * steps + 1 after warm-up); the model is already warm when it is traced."""


def _runtime() -> Any:
    try:
        import memsched.runtime as rt
    except ImportError as e:
        raise NotAvailable(f"memsched.runtime not yet available ({e})") from None
    for name in ("trace", "apply_schedule", "SavedLedger"):
        if not hasattr(rt, name):
            raise NotAvailable(f"memsched.runtime not yet available (no {name})")
    return rt


def get_trace(spec: ModelSpec) -> Any:
    """Trace once per model; every budget is solved on the same trace."""
    cached = spec.cache.get("memsched_trace")
    if cached is not None:
        return cached
    rt = _runtime()
    t0 = time.perf_counter()
    tr = rt.trace(
        spec.model,
        lambda: spec.loss().backward(),
        layers=[re.escape(p) for p in spec.block_paths],
        steps=TRACE_STEPS,
        warmup=0,
        model_id=spec.name,
        batch_size=spec.shape.get("batch_size", 1),
        seq_len=spec.shape.get("seq_len"),
    )
    spec.cache["memsched_trace"] = tr
    spec.cache["memsched_trace_s"] = time.perf_counter() - t0
    return tr


@contextlib.contextmanager
def prepare_memsched(spec: ModelSpec, fraction: float, no_offload: bool = False) -> Iterator[Prepared]:
    """Solve at `fraction` and yield the replayed step. `no_offload`: plan with keep and recompute only
    (SolveOptions.actions), the recompute side of memsched's trade. On a CPU trace that is already the
    default (host memory is device memory), so the variant is not run twice there."""
    rt = _runtime()
    from memsched.optimizer.budget import resolve_budget
    from memsched.optimizer.simulate import simulate
    from memsched.optimizer.solve import solve
    from memsched.options import SolveOptions
    from memsched.schema import Action

    tr = get_trace(spec)
    if no_offload and tr.device.is_host:
        raise NotAvailable("on a CPU trace memsched's default already plans keep + recompute only: see 'memsched'")
    actions = [Action.KEEP, Action.RECOMPUTE] if no_offload else None
    budget = resolve_budget(f"{round(fraction * 100)}%", tr)
    t0 = time.perf_counter()
    schedule = solve(tr, budget, SolveOptions(time_limit_s=spec.cache.get("solve_time_limit_s", 60.0), actions=actions))
    solve_s = time.perf_counter() - t0
    key = "memsched_schedules_recompute_only" if no_offload else "memsched_schedules"
    spec.cache.setdefault(key, {})[fraction] = schedule
    counts = schedule.action_counts()
    sim = simulate(tr, schedule)
    ledger = rt.SavedLedger()
    extra: dict[str, Any] = {
        "trace_s": spec.cache.get("memsched_trace_s"),
        "solve_s": solve_s,
        "budget_bytes": budget,
        "static_bytes": tr.static.total,
        "actions": counts,
        "policy": schedule.policy,
        "solver": schedule.solver.model_dump(mode="json"),
        "predicted_peak_bytes": schedule.prediction.peak_bytes,
        "predicted_activation_peak_bytes": sim.peak_bytes - tr.static.total,
        "predicted_overhead_pct": schedule.prediction.overhead_pct,
    }
    notes = [
        f"{schedule.policy} via {schedule.solver.backend} ({schedule.solver.status.value}): "
        + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    ]
    # No ledger on the measured steps: its per-tensor bookkeeping (a weakref finalizer per saved storage) is the
    # measurement's, not the user's loop's, and would slow memsched's steps alone (memsched.runtime.measure
    # keeps it off the timed steps for the same reason). One extra step with it attached reads the saved peak.
    with rt.apply_schedule(spec.model, schedule, trace=tr) as sm:

        def step() -> None:
            # The same step the trace timed (get_trace) and the peers run (approaches._plain_step): the model's
            # output object is dropped once the loss is out. Holding it (`out = sm(...)`) would keep the logits
            # alive through the backward, bytes the trace never saw (GPT-2's head: +77 MiB at b1 x 512).
            backward(sm(**spec.batch).loss)

        def after() -> dict[str, Any]:
            sm.ledger = ledger
            try:
                ledger.reset()
                step()
            finally:
                sm.ledger = None
            st = ledger.stats()
            pool = sm.pool_stats()
            # On the CPU, the host buffer pool is the same RAM the step uses: its buffers outlive the step (so
            # the profiler's step-relative peak does not see them) and must be added to be honest.
            return {
                "ledger_saved_peak_bytes": st.peak_bytes,
                "pool": dict(pool.__dict__),
                "pool_resident_bytes": pool.allocated_bytes,
            }

        yield Prepared(step, notes=notes, extra=extra, measure_fn=after)
