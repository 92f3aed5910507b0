"""HiGHS in a process of its own: reads one pickled `HighsJob` dict from stdin, writes one pickled result dict to
stdout (optimizer/ilp/highs_process.py starts it, and kills it at its deadline).

Run as a script (`python -I highs_child.py`), so that it imports only the standard library and highspy: neither
memsched nor the caller's own `__main__`.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from typing import Any


def solve(job: dict[str, Any]) -> dict[str, Any]:
    """One HiGHS run of the job's matrix, options and start; the fields highs_process.HighsRun reads."""
    import highspy

    lp = highspy.HighsLp()
    lp.num_col_ = len(job["col_cost"])
    lp.num_row_ = len(job["row_lower"])
    lp.col_cost_ = job["col_cost"]
    # Unbounded sides are math.inf, which is highspy.kHighsInf.
    lp.col_lower_ = job["col_lower"]
    lp.col_upper_ = job["col_upper"]
    lp.row_lower_ = job["row_lower"]
    lp.row_upper_ = job["row_upper"]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = job["start"]
    lp.a_matrix_.index_ = job["index"]
    lp.a_matrix_.value_ = job["value"]
    lp.integrality_ = [highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous for b in job["binary"]]
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    for name, value in job["options"].items():
        h.setOptionValue(name, value)
    if h.passModel(lp) != highspy.HighsStatus.kOk:
        return {"error": "the model was rejected (passModel failed)"}
    warning = None
    if job["start_values"] is not None:
        sol = highspy.HighsSolution()
        sol.col_value = job["start_values"]
        sol.value_valid = True
        if h.setSolution(sol) != highspy.HighsStatus.kOk:
            warning = "highs rejected the warm start"
    # `end` is the parent's time.perf_counter() (one monotonic clock for every process of the machine).
    end = float(job["end"])
    h.setOptionValue("time_limit", max(end - time.perf_counter(), 0.01))

    def stop(event: Any) -> None:
        # HiGHS does not read its time limit everywhere; its callbacks, where it calls them, stop it too.
        if time.perf_counter() >= end:
            event.interrupt()

    for callback in (h.cbSimplexInterrupt, h.cbIpmInterrupt, h.cbMipInterrupt):
        callback.subscribe(stop)
    run_status = h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    feasible = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    failed = run_status == highspy.HighsStatus.kError
    return {
        "error": f"highs failed ({h.modelStatusToString(status)})" if failed else None,
        "warning": warning,
        "status": h.modelStatusToString(status),
        "optimal": status == highspy.HighsModelStatus.kOptimal,
        "infeasible": status == highspy.HighsModelStatus.kInfeasible,
        "dual_bound": float(info.mip_dual_bound),
        "objective": float(info.objective_function_value) if feasible else None,
        "values": list(h.getSolution().col_value) if feasible else None,
    }


def main() -> None:
    job = pickle.load(sys.stdin.buffer)
    # The result goes out on a copy of stdout; stdout itself now points at stderr, so that nothing HiGHS prints from
    # its C++ side can come before the pickle.
    result_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    result = solve(job)
    pickle.dump(result, result_out, protocol=pickle.HIGHEST_PROTOCOL)
    result_out.flush()


if __name__ == "__main__":
    main()
