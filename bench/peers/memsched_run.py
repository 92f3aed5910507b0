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


NO_COPY_BYTES_PER_S = 1.0
"""Copy bandwidth written into the recompute-only variant's trace: any offload then costs more than any
recompute, so the solver only offloads where nothing else fits (and the prediction says so)."""


def recompute_only(tr: Any) -> Any:
    """The trace with copies made prohibitively slow. On a CPU-only machine host memory *is* the device memory,
    so offloading frees nothing; this variant shows what memsched does with recomputation alone."""
    out = tr.model_copy(deep=True)
    out.device.h2d_bytes_per_s = NO_COPY_BYTES_PER_S
    out.device.d2h_bytes_per_s = NO_COPY_BYTES_PER_S
    return out


@contextlib.contextmanager
def prepare_memsched(spec: ModelSpec, fraction: float, no_offload: bool = False) -> Iterator[Prepared]:
    rt = _runtime()
    from memsched.optimizer.budget import resolve_budget
    from memsched.optimizer.simulate import simulate
    from memsched.optimizer.solve import solve
    from memsched.options import SolveOptions

    tr = get_trace(spec)
    if no_offload:
        tr = spec.cache.setdefault("memsched_trace_recompute_only", recompute_only(tr))
    budget = resolve_budget(f"{round(fraction * 100)}%", tr)
    t0 = time.perf_counter()
    schedule = solve(tr, budget, SolveOptions(time_limit_s=spec.cache.get("solve_time_limit_s", 60.0)))
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
    with rt.apply_schedule(spec.model, schedule, trace=tr, ledger=ledger) as sm:

        def step() -> None:
            out: Any = sm(**spec.batch)
            backward(out.loss)

        def after() -> dict[str, Any]:
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
