"""PuLP backends: CBC (bundled with PuLP) and HiGHS (through highspy). Big-M form of the indicator rows.

Scaling: the MILP solvers work to absolute tolerances of about 1e-7 to 1e-6, so rows are scaled to keep
numbers near 1: time rows in milliseconds, memory rows in MiB. Every term of a row is in the row's unit,
so scaling a row multiplies its binaries' coefficients and its constant; time and byte variables are
simply measured in the scaled unit.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import re
import time
from pathlib import Path

import pulp

from memsched.errors import SolverError
from memsched.optimizer.decisions import Decision
from memsched.optimizer.ilp.cbc import run_cbc
from memsched.optimizer.ilp.limits import MPS_PER_PROBLEM, NO_TIME, grace_s, solver_limit
from memsched.optimizer.ilp.model import BIN, BYTE_UNIT, BYTES, FRAC, SECONDS, TIME, MilpModel
from memsched.optimizer.ilp.outcome import Outcome
from memsched.optimizer.ilp.warm import ScaledRow, complete, decode, hint
from memsched.schema import SolverStatus

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


def _check_finite(m: MilpModel, rows: list[ScaledRow]) -> None:
    """SolverError naming the first row or bound that is NaN or infinite (e.g. from a trace with a zero
    bandwidth): PuLP would raise a bare PulpError, or write it into the model file unchecked."""
    for v in m.vars:
        for what, x in (("lower", v.lb), ("upper", v.ub)):
            if x is not None and not math.isfinite(x):
                raise SolverError(f"model: variable {v.name} has a non-finite {what} bound ({x})")
    for row, (coef, const) in zip(m.rows, rows, strict=True):
        bad = [(m.vars[j].name, c) for j, c in coef.items() if not math.isfinite(c)]
        if not math.isfinite(const) or not math.isfinite(row.big_m) or bad:
            what = f"coefficient of {bad[0][0]} = {bad[0][1]}" if bad else f"constant {const}, big-M {row.big_m}"
            raise SolverError(
                f"model: row {row.name} has a non-finite {what}; check the trace's timings, sizes and bandwidths"
            )


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
        # prob.add_variable (PuLP >= 3.3): constructing LpVariable directly is deprecated there.
        cols.append(
            prob.add_variable(
                v.name,
                lowBound=lb if cat != pulp.LpBinary else None,
                upBound=ub if cat != pulp.LpBinary else None,
                cat=cat,
            )
        )
    rows = scaled_rows(m)
    for row, (coef, const) in zip(m.rows, big_m_rows(m, rows), strict=True):
        expr = pulp.LpAffineExpression([(cols[j], c) for j, c in coef.items() if c != 0.0], constant=const)
        prob += pulp.LpConstraint(expr, _SENSE[row.sense], name=row.name)
    prob += pulp.LpAffineExpression([(cols[j], c) for j, c in m.objective])
    return prob, cols, rows


def big_m_rows(m: MilpModel, rows: list[ScaledRow]) -> list[ScaledRow]:
    """The scaled rows with every indicator written as a big-M row (`expr + const (sense) 0`); checks
    that every number is finite first."""
    _check_finite(m, rows)
    out: list[ScaledRow] = []
    for row, (base, const) in zip(m.rows, rows, strict=True):
        coef = dict(base)
        if row.lit >= 0:
            big = row.big_m * _row_scale(row.unit)
            if row.lit_value == 1:  # holds when lit = 1: expr + M (1 - lit) >= 0
                coef[row.lit] = coef.get(row.lit, 0.0) - big
                const += big
            else:  # holds when lit = 0: expr + M lit >= 0
                coef[row.lit] = coef.get(row.lit, 0.0) + big
        out.append((coef, const))
    return out


def _col_bounds(m: MilpModel) -> tuple[list[float], list[float]]:
    """Column bounds in the scaled units (binaries 0..1; None = +inf)."""
    lo: list[float] = []
    hi: list[float] = []
    for v in m.vars:
        scale = TIME_SCALE if v.kind == TIME else BYTE_SCALE if v.kind == BYTES else 1.0
        if v.kind == BIN:
            lo.append(0.0)
            hi.append(1.0)
        else:
            lo.append(v.lb * scale)
            hi.append(math.inf if v.ub is None else v.ub * scale)
    return lo, hi


def _values(m: MilpModel, cols: list[pulp.LpVariable]) -> list[float]:
    return [0.0 if c.varValue is None else float(c.varValue) for c in cols]


def export_pulp(m: MilpModel, path: Path) -> None:
    """Write the model as MPS (suffix .mps) or CPLEX LP (anything else)."""
    try:
        prob, _, _ = to_pulp(m)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix.lower() == ".mps":
            prob.writeMPS(str(path))
        else:
            prob.writeLP(str(path))
    except pulp.PulpError as exc:
        raise SolverError(f"pulp: could not write the model to {path}: {exc}") from exc


_CBC_OBJ = re.compile(r"^Objective value:\s+(\S+)", re.M)
_CBC_BOUND = re.compile(r"^Lower bound:\s+(\S+)", re.M)
_CBC_RESULT = re.compile(r"^Result - (.+)$", re.M)


def _float(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def _printed_bound(text: str | None) -> float | None:
    """A bound CBC printed, made safe: it rounds to the digits it prints (e.g. 2.078 for 2.0775951), which can
    lift a bound above the optimum, so half a unit of the last printed digit is taken off."""
    value = _float(text)
    if value is None or text is None:
        return None
    mantissa = text.lower().split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(text.lower().split("e")[1]) if "e" in text.lower() else 0
    return value - 0.5 * 10.0 ** (exponent - decimals)


def _seconds(scaled: float | None, m: MilpModel) -> float | None:
    return None if scaled is None else scaled / TIME_SCALE


def solve_pulp(
    m: MilpModel,
    backend: str,
    time_limit_s: float,
    gap: float,
    warm: list[Decision] | None,
    threads: int | None = None,
    deadline: float | None = None,
) -> Outcome:
    """Solve with 'cbc' or 'highs' for up to `time_limit_s` and, where given, ending by `deadline` (perf_counter)
    however long the model took to build (`solver_limit`). Raises SolverError when the solver itself fails, and
    for any PulpError (PuLP's own checks, e.g. a non-finite coefficient), with its reason."""
    try:
        return _solve_pulp(m, backend, time_limit_s, gap, warm, threads, deadline)
    except pulp.PulpError as exc:
        raise SolverError(f"{backend}: PuLP failed: {exc}") from exc


def _solve_pulp(
    m: MilpModel,
    backend: str,
    time_limit_s: float,
    gap: float,
    warm: list[Decision] | None,
    threads: int | None,
    deadline: float | None,
) -> Outcome:
    if backend == "highs":
        return _solve_highs(m, time_limit_s, gap, warm, threads, deadline)
    began = time.perf_counter()
    prob, cols, rows = to_pulp(m)
    problem_s = time.perf_counter() - began
    # Greedy hint: the binaries of the warm schedule, every other variable at its least value (complete).
    start = complete(m, hint(m, warm), rows, integral=False) if warm is not None else {}
    for j, val in start.items():
        cols[j].setInitialValue(val)
    t0 = time.perf_counter()
    bound: float | None = None
    message = ""
    if backend == "cbc":  # (HiGHS is handled above)
        limit = solver_limit(time_limit_s, deadline)
        # CBC's files take up to MPS_PER_PROBLEM times PuLP's problem to write, before CBC's clock starts: where
        # that leaves no search, they are not written (a 100-layer DAG's MPS: 1.9 s, past the deadline).
        writing_s = MPS_PER_PROBLEM * problem_s
        if limit is None or (deadline is not None and solver_limit(time_limit_s, deadline - writing_s) is None):
            return Outcome(backend, None, None, None, None, 0.0, f"{backend}: {NO_TIME}")
        time_limit_s = limit
        run = run_cbc(prob, time_limit_s, gap, bool(start), threads)
        if not run.started:
            return Outcome(backend, None, None, None, None, time.perf_counter() - t0, f"{backend}: {NO_TIME}")
        text = run.log_text
        if run.killed:
            message = (
                f"cbc: did not stop at its {time_limit_s:g} s limit; killed after "
                f"{time_limit_s + grace_s(time_limit_s):g} s"
            )
            return Outcome(backend, None, None, None, None, time.perf_counter() - t0, message)
        result = _CBC_RESULT.search(text)
        message = f"cbc: {result.group(1).strip() if result else pulp.LpStatus[prob.status]}"
        if run.retried:
            message += " (cbc 2.10.3 crashed processing the warm start; re-run once without it)"
        bound = _seconds(_printed_bound(m_.group(1)) if (m_ := _CBC_BOUND.search(text)) else None, m)
    else:
        raise SolverError(f"unknown PuLP backend {backend!r}")
    wall = time.perf_counter() - t0
    sol = prob.sol_status
    if sol == pulp.LpSolutionInfeasible or prob.status == pulp.LpStatusInfeasible:
        if backend == "cbc":
            # The model is feasible whenever the budget is (callers check it first: synchronous offload
            # of every candidate is in the model), but CBC 2.10.3 sometimes prints "proven infeasible"
            # when its time limit strikes after it found incumbents. Report that, not a verdict.
            return Outcome(
                backend,
                None,
                None,
                None,
                None,
                wall,
                message + " (CBC 2.10 misreport at its time limit; the model is feasible)",
            )
        return Outcome(backend, SolverStatus.INFEASIBLE, None, None, None, wall, message)
    if sol not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        if prob.status == pulp.LpStatusNotSolved or sol == pulp.LpSolutionNoSolutionFound:
            return Outcome(backend, None, None, None, bound, wall, message)
        raise SolverError(f"{backend} returned status {pulp.LpStatus[prob.status]} ({message})")
    values = _values(m, cols)
    binaries = [values[j] for j, v in enumerate(m.vars) if v.kind == BIN]
    if binaries and max(abs(x - round(x)) for x in binaries) > 1e-4:
        # CBC 2.10.3 stopped by its time limit can write the LP point with a 'Stopped ... objective'
        # header, which PuLP reads as an integer solution. Not an incumbent.
        return Outcome(
            backend,
            None,
            None,
            None,
            bound,
            wall,
            message + " (the solver returned a fractional point, not an incumbent)",
        )
    objective = _seconds(pulp.value(prob.objective), m)
    found = SolverStatus.OPTIMAL if sol == pulp.LpSolutionOptimal else SolverStatus.FEASIBLE
    if found == SolverStatus.OPTIMAL and objective is not None:
        # Proven within the gap. CBC prints no bound line when it proves optimality outright and prints it
        # rounded to 1e-3 ms otherwise, so the bound is clamped into [objective * (1 - gap), objective].
        bound = objective * (1.0 - gap) if bound is None else min(max(bound, objective * (1.0 - gap)), objective)
    return Outcome(backend, found, decode(m, values), objective, bound, wall, message)


_HIGHS_PROBING = 1 << 15
"""HiGHS's presolve_rule_off bit for probing (kPresolveRuleProbing in HiGHS 1.12's presolve rules)."""


def _solve_highs(
    m: MilpModel,
    time_limit_s: float,
    gap: float,
    warm: list[Decision] | None,
    threads: int | None,
    deadline: float | None,
) -> Outcome:
    """HiGHS through highspy, in a process of its own that is killed where it runs past its limit
    (optimizer/ilp/highs_process.py): the same scaled big-M rows as CBC, passed as one row-wise matrix. (PuLP's HiGHS
    API adds the rows one by one, which took several seconds of a 10 s limit on ResNet-50, before HiGHS' own clock
    started.)"""
    from memsched.optimizer.ilp.highs_process import HighsJob, run_highs

    if importlib.util.find_spec("highspy") is None:  # (the child imports it; a missing one is said here)
        raise SolverError("highs: highspy is not installed (pip install highspy)")
    rows = scaled_rows(m)
    final = big_m_rows(m, rows)
    cost = [0.0] * len(m.vars)
    for j, c in m.objective:
        cost[j] += c
    lo, hi = _col_bounds(m)
    row_lo: list[float] = []
    row_hi: list[float] = []
    start, index, value = [0], [], []
    for row, (coef, const) in zip(m.rows, final, strict=True):
        for j, c in coef.items():
            if c != 0.0:
                index.append(j)
                value.append(c)
        start.append(len(index))
        # expr + const (sense) 0  ->  -const (sense) expr
        row_lo.append(-const if row.sense in (">=", "==") else -math.inf)
        row_hi.append(-const if row.sense in ("<=", "==") else math.inf)
    options: dict[str, float | int] = {
        "mip_rel_gap": float(gap),
        # Its presolve's probing does not stop at the time limit on these big-M rows, and costs far more than it
        # removes (exact windows, 10 s limit: the 100-layer synthetic chain's model, 556k nonzeros, probed for 26 s
        # and the call took 32 s; the 40-layer one probed for 4 s, and its presolve without probing removes 94 rows
        # instead of 101).
        "presolve_rule_off": _HIGHS_PROBING,
    }
    if threads is not None:
        options["threads"] = int(threads)
    start_values = None
    if warm is not None:
        values = complete(m, hint(m, warm), rows, integral=False)
        start_values = [float(values.get(j, 0.0)) for j in range(len(m.vars))]
    job = HighsJob(
        col_cost=cost,
        col_lower=lo,
        col_upper=hi,
        row_lower=row_lo,
        row_upper=row_hi,
        start=start,
        index=index,
        value=value,
        binary=[v.kind == BIN for v in m.vars],
        options=options,
        start_values=start_values,
    )
    t0 = time.perf_counter()
    limit = solver_limit(time_limit_s, deadline)
    if limit is None:
        return Outcome("highs", None, None, None, None, 0.0, f"highs: {NO_TIME}")
    run = run_highs(job, limit, grace_s(time_limit_s))
    wall = time.perf_counter() - t0
    if run.killed:
        return Outcome("highs", None, None, None, None, wall, f"highs: ran past its {limit:.3g} s limit; stopped")
    if run.error is not None:
        raise SolverError(f"highs: {run.error}")
    if run.warning is not None:
        log.warning("%s", run.warning)
    message = f"highs: {run.status}"
    bound = _seconds(run.dual_bound, m) if run.dual_bound is not None and math.isfinite(run.dual_bound) else None
    if run.infeasible:
        return Outcome("highs", SolverStatus.INFEASIBLE, None, None, None, wall, message)
    if run.values is None or run.objective is None:
        return Outcome("highs", None, None, None, bound, wall, message)
    objective = _seconds(run.objective, m)
    found = SolverStatus.OPTIMAL if run.optimal else SolverStatus.FEASIBLE
    if found == SolverStatus.OPTIMAL and objective is not None:
        bound = objective * (1.0 - gap) if bound is None else min(max(bound, objective * (1.0 - gap)), objective)
    return Outcome("highs", found, decode(m, run.values), objective, bound, wall, message)
