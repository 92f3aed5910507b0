"""Running PuLP's bundled CBC with a hard wall-clock deadline.

PuLP's own `PULP_CBC_CMD.solve` waits for CBC without a timeout, and CBC 2.10.3 does not always honour
`-sec`: processing a MIP start, and on models of a few hundred layers its preprocessing, can run well past
it (measured: 77 s for a 10 s limit on a 500-layer DAG). This runner writes the same files PuLP writes,
runs the same command, and kills CBC at `time_limit + grace`. It also re-runs once without the MIP start
when CBC segfaults processing it (another 2.10.3 fault), and says so.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pulp

from memsched.errors import SolverError
from memsched.optimizer.ilp.limits import MIN_SEARCH_S, grace_s

log = logging.getLogger(__name__)


@dataclass
class CbcRun:
    """What one call of `run_cbc` did."""

    log_text: str
    """CBC's output (empty if it was killed before writing any)."""
    retried: bool
    """CBC crashed with the MIP start and was re-run without it."""
    killed: bool
    """CBC ran past the hard deadline and was killed: no solution was read."""
    started: bool = True
    """False where writing its files left it less than MIN_SEARCH_S: CBC was not run and no solution was read."""


def run_cbc(prob: pulp.LpProblem, time_limit_s: float, gap: float, warm: bool, threads: int | None) -> CbcRun:
    """Solve `prob` with CBC (variables' initial values as the MIP start if `warm`); the solution, if any,
    is assigned to `prob` as PuLP would. Raises SolverError if CBC fails other than by the two faults above."""
    with warnings.catch_warnings():
        # PuLP 3.3 deprecates PULP_CBC_CMD in favour of COIN_CMD with a separately installed CBC; the
        # bundled binary is the one memsched relies on, so that one warning is silenced here.
        warnings.filterwarnings("ignore", message="PULP_CBC_CMD is deprecated", category=DeprecationWarning)
        solver = pulp.PULP_CBC_CMD(msg=False, gapRel=gap, threads=threads)
    if not solver.available():
        raise SolverError(f"cbc: the CBC binary bundled with PuLP is not executable ({solver.path})")
    retried = False
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memsched-cbc-") as tmp:
        mps, mst, sol, logp = (os.path.join(tmp, f"model.{ext}") for ext in ("mps", "mst", "sol", "log"))
        vs, var_names, con_names, _ = prob.writeMPS(mps, rename=1)
        if warm:
            solver.writesol(mst, prob, vs, var_names, con_names)
        while True:
            limit = time_limit_s - (time.perf_counter() - t0)  # a re-run gets what is left
            if limit < MIN_SEARCH_S:  # writing the files took its time (a 100-layer DAG's MPS: seconds)
                return CbcRun("", retried, killed=False, started=False)
            args = [solver.path, mps]
            if warm:
                args += ["-mips", mst]
            args += ["-sec", f"{limit:g}", "-timeMode", "elapsed"]
            args += [tok for opt in solver.getOptions() for tok in ("-" + opt).split()]
            args += ["-solve", "-printingOptions", "all", "-solution", sol]
            Path(sol).unlink(missing_ok=True)
            with open(logp, "w") as out:
                proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                try:
                    rc = proc.wait(timeout=limit + grace_s(time_limit_s))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    log.warning("cbc ignored its %g s limit; killed", time_limit_s)
                    return CbcRun(Path(logp).read_text(errors="replace"), retried, killed=True)
            text = Path(logp).read_text(errors="replace")
            if rc != 0 or not os.path.exists(sol):
                if warm and not retried:
                    log.warning("cbc exited with %d processing the warm start; re-running without it", rc)
                    warm, retried = False, True
                    continue
                raise SolverError(f"cbc failed (exit status {rc}); its last output: {text[-600:].strip() or '(none)'}")
            status, values, _, _, _, sol_status = solver.readsol_MPS(sol, prob, vs, var_names, con_names)
            prob.assignVarsVals(values)
            prob.assignStatus(status, sol_status)
            return CbcRun(text, retried, killed=False)
