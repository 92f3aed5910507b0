"""Reading schedules out of solutions and writing schedules into them (decode, warm starts)."""

from __future__ import annotations

import math
from collections import deque

from memsched.optimizer.decisions import KEEP, Decision, offload_subset, recompute, segment_ends
from memsched.optimizer.ilp.model import BIN, MilpModel
from memsched.schema import Action

ScaledRow = tuple[dict[int, float], float]
"""A row as a backend scaled it: (coefficient by variable, constant), indicator and big-M left out."""


def decode(m: MilpModel, value: list[float]) -> list[Decision]:
    """Read decisions (with done-by and prefetch-at) from a solution vector (index = variable index)."""
    trace = m.trace

    def on(v: int) -> bool:
        return value[v] > 0.5

    out: list[Decision] = [KEEP] * trace.n
    for (a, b), v in m.seg.items():
        if on(v):
            for i in range(a, b + 1):
                out[i] = recompute(group=a)
    for i, ov in m.o.items():
        if not on(ov):
            continue
        tensors = (m.single[i],) if i in m.single else tuple(q for q, v in m.y[i] if on(v))
        e = m.last_stage(i)
        d = next(k for k in range(i, e + 1) if on(m.z[i][k]))
        p = i + sum(1 for v in m.ev[i].values() if on(v))
        out[i] = offload_subset(trace, i, tensors, done_by=d, prefetch_at=p)
    return out


def segments_of(decisions: list[Decision]) -> list[tuple[int, int]]:
    """The recompute segments [a, b] of a decision list, in order."""
    return sorted(segment_ends(decisions).items())


def hint(m: MilpModel, decisions: list[Decision]) -> dict[int, int]:
    """Values of the binaries that encode `decisions` (representable: see `representable`)."""
    vals: dict[int, int] = dict.fromkeys(m.seg.values(), 0)
    for ab in segments_of(decisions):
        vals[m.seg[ab]] = 1
    prev_p = -1
    for i in sorted(m.o):
        d = decisions[i]
        is_off = d.action == Action.OFFLOAD
        vals[m.o[i]] = int(is_off)
        if i in m.y:
            for q, v in m.y[i]:
                vals[v] = int(is_off and q in d.offload_tensors)
        e = m.last_stage(i)
        for k in range(i, e):
            vals[m.z[i][k]] = int(is_off and d.done_by <= k)
        # Kept layers take the smallest virtual prefetch stage that keeps the order chain.
        p = d.prefetch_at if is_off else max(i, prev_p)
        prev_p = p
        for k, v in m.ev[i].items():
            vals[v] = int(p >= k)
    return vals


def representable(m: MilpModel, decisions: list[Decision]) -> list[Decision] | None:
    """`decisions` in the model's terms, never worse: offload timing pulled into the window (an earlier
    done-by or a later prefetch only lowers memory), empty tensors dropped, dominated segment tails kept;
    None if a segment is longer than the model's L or a layer outside the offload candidates is offloaded."""
    trace = m.trace
    decisions = list(decisions)
    for a, b in segments_of(decisions):
        # Trailing layers that save nothing are dropped from the segment: the model omits such segments
        # because the shorter one dominates them (see model.segments).
        end = max((i for i in range(a, b + 1) if trace.layers[i].saved_bytes > 0), default=-1)
        for i in range(a, b + 1):
            decisions[i] = recompute(group=a) if i <= end else KEEP
        if end >= 0 and (a, end) not in m.seg:
            return None
    out: list[Decision] = []
    for i, d in enumerate(decisions):
        if d.action != Action.OFFLOAD:
            out.append(d)
            continue
        tensors = tuple(q for q in d.offload_tensors if trace.layers[i].tensors[q] > 0)
        if not tensors:
            out.append(KEEP)
            continue
        if i not in m.o:
            out.append(KEEP)  # the last layer: offloading it frees nothing (its interior is empty)
            continue
        if d.done_by < 0 or d.prefetch_at < 0:
            return None
        e = m.last_stage(i)
        out.append(offload_subset(trace, i, tensors, done_by=min(d.done_by, e), prefetch_at=min(d.prefetch_at, e)))
    # Clipping can break the prefetch order; restore it by lowering (never raising) prefetch stages.
    cap = trace.n
    for i in range(len(out) - 1, -1, -1):
        d = out[i]
        if d.action == Action.OFFLOAD:
            if d.prefetch_at > cap:
                out[i] = offload_subset(trace, i, d.offload_tensors, done_by=d.done_by, prefetch_at=cap)
            cap = out[i].prefetch_at
    return out


def complete(m: MilpModel, binaries: dict[int, int], rows: list[ScaledRow], integral: bool) -> dict[int, float]:
    """Values for every variable, given the binaries: each continuous variable takes the least value its
    defining rows allow (the first term of a '>=' or '==' row is the variable it defines), evaluated in
    dependency order. That is the simulator's timing, so the start is feasible and tight. `rows` are the
    backend's scaled rows (so rounding matches the backend's own coefficients)."""
    vals: dict[int, float] = {j: float(binaries.get(j, 0)) for j, v in enumerate(m.vars) if v.kind == BIN}
    defs: dict[int, list[int]] = {}
    for r, row in enumerate(m.rows):
        if row.sense == "<=" or not row.terms:
            continue
        target = row.terms[0][0]
        if m.vars[target].kind == BIN or rows[r][0].get(target, 0.0) <= 0:
            continue
        if row.lit >= 0 and int(vals[row.lit]) != row.lit_value:
            continue  # an indicator that does not hold for these binaries
        defs.setdefault(target, []).append(r)
    # Kahn's order over the continuous variables (the time and byte recurrences are acyclic).
    needs: dict[int, set[int]] = {}
    users: dict[int, list[int]] = {}
    for target, rs in defs.items():
        deps = {j for r in rs for j in rows[r][0] if j != target and j not in vals}
        needs[target] = deps
        for j in deps:
            users.setdefault(j, []).append(target)
    ready = deque(t for t, d in needs.items() if not d)
    while ready:
        t = ready.popleft()
        best = m.vars[t].lb
        for r in defs[t]:
            coef, const = rows[r]
            rest = const + sum(c * vals[j] for j, c in coef.items() if j != t)
            value = -rest / coef[t]
            if integral:
                value = float(math.ceil(value - 1e-9))
            best = value if m.rows[r].sense == "==" else max(best, value)
        vals[t] = max(best, m.vars[t].lb)  # '==' rows can land a rounding error below the bound
        for u in users.get(t, ()):
            needs[u].discard(t)
            if not needs[u]:
                ready.append(u)
    for j, v in enumerate(m.vars):
        vals.setdefault(j, v.lb)  # a variable no row defines (none in practice)
    return vals
