"""OR-Tools CP-SAT backend: the same rows, on integers, with real indicator constraints (no big-M).

Scaling: CP-SAT needs integer coefficients. Bytes are exact: every byte quantity is divided by their
greatest common divisor (the budget side of a memory row is rounded down, which is exact because the
left side is a multiple of that unit). Times are rounded to 1 ns ( or coarser for very long
steps so the horizon stays below 2^40 units), so CP-SAT's objective is approximate: the solve
(optimizer/flow/bounds.py) re-evaluates its schedule with the simulator and reports the simulator's value.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

from ortools.sat.python import cp_model

from memsched.errors import SolverError
from memsched.optimizer.decisions import Decision
from memsched.optimizer.ilp.limits import NO_TIME, solver_limit
from memsched.optimizer.ilp.model import BIN, BYTE_UNIT, BYTES, FRAC, SECONDS, TIME, MilpModel
from memsched.optimizer.ilp.outcome import Outcome
from memsched.optimizer.ilp.warm import ScaledRow, complete, decode, hint
from memsched.schema import SolverStatus

log = logging.getLogger(__name__)


def _byte_unit(m: MilpModel) -> int:
    g = 0
    for row in m.rows:
        if row.unit != BYTE_UNIT:
            continue
        for _, c in row.terms:
            g = math.gcd(g, round(abs(c)))
    return max(g, 1)


def _time_unit(m: MilpModel) -> float:
    horizon = sum(x.forward_s * 2 + x.backward_s for x in m.trace.layers) + m.trace.baseline.step_s
    horizon += sum(max(0.0, r.big_m) for r in m.rows if r.lit >= 0) / max(1, len(m.rows))
    return max(1e-9, horizon / 2**40)


def to_cpsat(m: MilpModel) -> tuple[cp_model.CpModel, list[cp_model.IntVar], float, list[ScaledRow]]:
    """The model on integers: (model, variables by index, seconds per time unit, the integer rows)."""
    tu = _time_unit(m)
    bu = _byte_unit(m)
    model = cp_model.CpModel()
    # Time horizon: generous upper bound on any time variable (every copy serialised, everything re-run).
    lat = m.trace.device.copy_latency_s
    total_copy = sum(
        2 * lat + x.saved_bytes / m.trace.device.d2h_bytes_per_s + x.saved_bytes / m.trace.device.h2d_bytes_per_s
        for x in m.trace.layers
    )
    horizon_s = sum(2 * x.forward_s + x.backward_s for x in m.trace.layers) + m.trace.baseline.step_s + total_copy
    t_max = math.ceil(horizon_s / tu) + len(m.trace.layers) + 1
    b_max = sum(x.saved_bytes + x.output_bytes for x in m.trace.layers) // bu + 1
    cols: list[cp_model.IntVar] = []
    for v in m.vars:
        if v.kind in (BIN, FRAC):
            cols.append(model.new_bool_var(v.name))
        elif v.kind == TIME:
            cols.append(model.new_int_var(0, t_max, v.name))
        elif v.kind == BYTES:
            cols.append(model.new_int_var(0, b_max, v.name))
        else:
            raise AssertionError(v.kind)
    unit_var = [v.kind in (TIME, BYTES) for v in m.vars]
    int_rows: list[ScaledRow] = []
    for row in m.rows:
        scale = 1.0 / tu if row.unit == SECONDS else 1.0 / bu if row.unit == BYTE_UNIT else 1.0
        raw = row.const * scale
        if row.unit == BYTE_UNIT:
            # '<=' rows: the variable side is a multiple of the unit, so rounding the constant up is exact.
            const = math.ceil(raw - 1e-9) if row.sense == "<=" else math.floor(raw + 1e-9)
        else:
            const = round(raw)
        coef: dict[int, int] = {}
        for j, c in row.terms:
            coef[j] = coef.get(j, 0) + (round(c) if unit_var[j] else round(c * scale))
        expr = sum(c * cols[j] for j, c in coef.items() if c)
        int_rows.append(({j: float(c) for j, c in coef.items()}, float(const)))
        if row.sense == ">=":
            ct = model.add(expr + const >= 0)
        elif row.sense == "<=":
            ct = model.add(expr + const <= 0)
        else:
            ct = model.add(expr + const == 0)
        ct.with_name(row.name)
        if row.lit >= 0:
            lit = cols[row.lit]
            ct.only_enforce_if(lit if row.lit_value == 1 else ~lit)
    model.minimize(sum(round(c) * cols[j] for j, c in m.objective))
    return model, cols, tu, int_rows


def export_cpsat(m: MilpModel, path: Path) -> None:
    """Write the CP-SAT model proto as text."""
    model, _, _, _ = to_cpsat(m)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not model.export_to_file(str(path)):
        raise SolverError(f"cpsat: could not write the model to {path}")


def solve_cpsat(
    m: MilpModel,
    time_limit_s: float,
    gap: float,
    warm: list[Decision] | None,
    threads: int | None = None,
    deadline: float | None = None,
) -> Outcome:
    """Solve with CP-SAT for up to `time_limit_s` and, where given, ending by `deadline` (perf_counter) however
    long the model took to build (`solver_limit`)."""
    model, cols, tu, rows = to_cpsat(m)
    if warm is not None:
        # Greedy hint first (a complete one: continuous variables at their least values), then search.
        for j, val in complete(m, hint(m, warm), rows, integral=True).items():
            model.add_hint(cols[j], round(val))
    limit = solver_limit(time_limit_s, deadline)
    if limit is None:
        return Outcome("cpsat", None, None, None, None, 0.0, f"cpsat: {NO_TIME}")
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(limit)
    solver.parameters.relative_gap_limit = float(gap)
    solver.parameters.num_workers = threads if threads else 2
    t0 = time.perf_counter()
    status = solver.solve(model)
    wall = time.perf_counter() - t0
    name = solver.status_name(status)
    message = f"cpsat: {name}"
    if status == cp_model.INFEASIBLE:
        return Outcome("cpsat", SolverStatus.INFEASIBLE, None, None, None, wall, message)
    if status == cp_model.UNKNOWN:
        return Outcome("cpsat", None, None, None, solver.best_objective_bound * tu, wall, message)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SolverError(f"cpsat returned {name}: the model is invalid ({model.validate()})")
    values = [float(solver.value(c)) for c in cols]
    found = SolverStatus.OPTIMAL if status == cp_model.OPTIMAL else SolverStatus.FEASIBLE
    return Outcome(
        "cpsat", found, decode(m, values), solver.objective_value * tu, solver.best_objective_bound * tu, wall, message
    )
