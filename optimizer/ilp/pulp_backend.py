"""PuLP backends: CBC (bundled with PuLP) and HiGHS (through highspy). Big-M form of the indicator rows.

Scaling: the MILP solvers work to absolute tolerances of about 1e-7 to 1e-6, so rows are scaled to keep
numbers near 1: time rows in milliseconds, memory rows in MiB. Every term of a row is in the row's unit,
so scaling a row multiplies its binaries' coefficients and its constant; time and byte variables are
simply measured in the scaled unit.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import pulp

from memsched.errors import SolverError
from memsched.optimizer.ilp.cbc import grace_s, run_cbc
from memsched.optimizer.ilp.model import BIN, BYTE_UNIT, BYTES, FRAC, SECONDS, TIME, MilpModel
from memsched.optimizer.ilp.outcome import Found, Outcome
from memsched.optimizer.ilp.warm import ScaledRow, complete, decode, hint
from memsched.optimizer.plan import Decision

log = logging.getLogger(__name__)

TIME_SCALE = 1e3  # seconds -> milliseconds
BYTE_SCALE = 1.0 / 2**20  # bytes -> MiB
_SENSE = {">=": pulp.LpConstraintGE, "<=": pulp.LpConstraintLE, "==": pulp.LpConstraintEQ}


def _row_scale(unit: str) -> float:
    return TIME_SCALE if unit == SECONDS else BYTE_SCALE if unit == BYTE_UNIT else 1.0


def scaled_rows(m: MilpModel) -> list[ScaledRow]:
    """Every row scaled to ms / MiB (indicator and big-M not applied)."""
    scaled = [v.kind in (BIN, FRAC) for v in m.vars]
    out: list[ScaledRow] = []
    for row in m.rows:
        s = _row_scale(row.unit)
        coef: dict[int, float] = {}
        for j, c in row.terms:  # a variable may occur twice (latency and bytes of a one-tensor copy)
            coef[j] = coef.get(j, 0.0) + (c * s if scaled[j] else c)
        out.append((coef, row.const * s))
    return out


def to_pulp(m: MilpModel) -> tuple[pulp.LpProblem, list[pulp.LpVariable], list[ScaledRow]]:
    """The model as a PuLP problem (indicators as big-M rows), its variables by model index, and the
    scaled rows."""
    prob = pulp.LpProblem("memsched", pulp.LpMinimize)
    cols: list[pulp.LpVariable] = []
    for v in m.vars:
        cat = pulp.LpBinary if v.kind == BIN else pulp.LpContinuous
        lb, ub = v.lb, v.ub
        if v.kind == TIME:
            lb, ub = lb * TIME_SCALE, None if ub is None else ub * TIME_SCALE
        elif v.kind == BYTES:
            lb, ub = lb * BYTE_SCALE, None if ub is None else ub * BYTE_SCALE
        cols.append(pulp.LpVariable(v.name, lowBound=lb if cat != pulp.LpBinary else None,
                                    upBound=ub if cat != pulp.LpBinary else None, cat=cat))
    rows = scaled_rows(m)
    for row, (base, const) in zip(m.rows, rows, strict=True):
        coef = dict(base)
        if row.lit >= 0:
            big = row.big_m * _row_scale(row.unit)
            if row.lit_value == 1:  # holds when lit = 1: expr + M (1 - lit) >= 0
                coef[row.lit] = coef.get(row.lit, 0.0) - big
                const += big
            else:  # holds when lit = 0: expr + M lit >= 0
                coef[row.lit] = coef.get(row.lit, 0.0) + big
        expr = pulp.LpAffineExpression([(cols[j], c) for j, c in coef.items() if c != 0.0], constant=const)
        prob += pulp.LpConstraint(expr, _SENSE[row.sense], name=row.name)
    prob += pulp.LpAffineExpression([(cols[j], c) for j, c in m.objective])
    return prob, cols, rows


def _values(m: MilpModel, cols: list[pulp.LpVariable]) -> list[float]:
    return [0.0 if c.varValue is None else float(c.varValue) for c in cols]


def export_pulp(m: MilpModel, path: Path) -> None:
    """Write the model as MPS (suffix .mps) or CPLEX LP (anything else)."""
    prob, _, _ = to_pulp(m)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".mps":
        prob.writeMPS(str(path))
    else:
        prob.writeLP(str(path))


_CBC_OBJ = re.compile(r"^Objective value:\s+(\S+)", re.M)
_CBC_BOUND = re.compile(r"^Lower bound:\s+(\S+)", re.M)
_CBC_RESULT = re.compile(r"^Result - (.+)$", re.M)


def _float(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def _seconds(scaled: float | None, m: MilpModel) -> float | None:
    return None if scaled is None else scaled / TIME_SCALE


class _HighsWithStart(pulp.HiGHS):
    """PuLP's HiGHS API with a MIP start: PuLP passes none to highspy itself."""

    def __init__(self, start: dict[str, float], **kw: Any) -> None:
        super().__init__(**kw)
        self._start = start

    def callSolver(self, lp: pulp.LpProblem) -> None:
        if self._start:
            import highspy

            # PuLP numbered the columns in lp.variables() order when it built the highspy model.
            sol = highspy.HighsSolution()
            sol.col_value = [float(self._start.get(v.name, 0.0)) for v in lp.variables()]
            sol.value_valid = True
            status = lp.solverModel.setSolution(sol)
            if status != highspy.HighsStatus.kOk:
                log.warning("highs rejected the warm start (%s)", status)
        lp.solverModel.run()


def solve_pulp(
    m: MilpModel,
    backend: str,
    time_limit_s: float,
    gap: float,
    warm: list[Decision] | None,
    threads: int | None = None,
) -> Outcome:
    """Solve with 'cbc' or 'highs'. Raises SolverError when the solver itself fails."""
    prob, cols, rows = to_pulp(m)
    # Greedy hint: the binaries of the warm schedule, every other variable at its least value (complete).
    start = complete(m, hint(m, warm), rows, integral=False) if warm is not None else {}
    for j, val in start.items():
        cols[j].setInitialValue(val)
    t0 = time.perf_counter()
    bound: float | None = None
    message = ""
    if backend == "cbc":
        run = run_cbc(prob, time_limit_s, gap, bool(start), threads)
        text = run.log_text
        if run.killed:
            message = (f"cbc: did not stop at its {time_limit_s:g} s limit; killed after "
                       f"{time_limit_s + grace_s(time_limit_s):g} s")
            return Outcome(backend, Found.NO_SOLUTION, None, None, None, time.perf_counter() - t0, message)
        result = _CBC_RESULT.search(text)
        message = f"cbc: {result.group(1).strip() if result else pulp.LpStatus[prob.status]}"
        if run.retried:
            message += " (cbc 2.10.3 crashed processing the warm start; re-run once without it)"
        bound = _seconds(_float(m_.group(1)) if (m_ := _CBC_BOUND.search(text)) else None, m)
    elif backend == "highs":
        opts: dict[str, Any] = {}
        if threads is not None:
            opts["threads"] = threads
        by_name = {cols[j].name: v for j, v in start.items()}
        solver = _HighsWithStart(by_name, msg=False, timeLimit=time_limit_s, gapRel=gap, **opts)
        try:
            prob.solve(solver)
        except pulp.PulpSolverError as exc:
            raise SolverError(f"highs failed: {exc}") from exc
        info = prob.solverModel.getInfo()
        bound = _seconds(float(info.mip_dual_bound), m)
        message = f"highs: {prob.solverModel.modelStatusToString(prob.solverModel.getModelStatus())}"
    else:
        raise SolverError(f"unknown PuLP backend {backend!r}")
    wall = time.perf_counter() - t0
    sol = prob.sol_status
    if sol == pulp.LpSolutionInfeasible or prob.status == pulp.LpStatusInfeasible:
        if backend == "cbc":
            # The model is feasible whenever the budget is (callers check it first: synchronous offload
            # of every candidate is in the model), but CBC 2.10.3 sometimes prints "proven infeasible"
            # when its time limit strikes after it found incumbents. Report that, not a verdict.
            return Outcome(backend, Found.NO_SOLUTION, None, None, None, wall,
                           message + " (CBC 2.10 misreport at its time limit; the model is feasible)")
        return Outcome(backend, Found.INFEASIBLE, None, None, None, wall, message)
    if sol not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        if prob.status == pulp.LpStatusNotSolved or sol == pulp.LpSolutionNoSolutionFound:
            return Outcome(backend, Found.NO_SOLUTION, None, None, bound, wall, message)
        raise SolverError(f"{backend} returned status {pulp.LpStatus[prob.status]} ({message})")
    values = _values(m, cols)
    binaries = [values[j] for j, v in enumerate(m.vars) if v.kind == BIN]
    if binaries and max(abs(x - round(x)) for x in binaries) > 1e-4:
        # CBC 2.10.3 stopped by its time limit can write the LP point with a 'Stopped ... objective'
        # header, which PuLP reads as an integer solution. Not an incumbent.
        return Outcome(backend, Found.NO_SOLUTION, None, None, bound, wall,
                       message + " (the solver returned a fractional point, not an incumbent)")
    objective = _seconds(pulp.value(prob.objective), m)
    found = Found.OPTIMAL if sol == pulp.LpSolutionOptimal else Found.FEASIBLE
    if found == Found.OPTIMAL and objective is not None:
        # Proven within the gap. CBC prints no bound line when it proves optimality outright and prints it
        # rounded to 1e-3 ms otherwise, so the bound is clamped into [objective * (1 - gap), objective].
        bound = objective * (1.0 - gap) if bound is None else min(max(bound, objective * (1.0 - gap)), objective)
    return Outcome(backend, found, decode(m, values), objective, bound, wall, message)
