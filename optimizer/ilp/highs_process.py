"""HiGHS in a child process, killed where it runs past its limit (as CBC is: optimizer/ilp/cbc.py).

HiGHS 1.12 does not read its time limit, or call its interrupt callbacks, everywhere: on an 80-layer synthetic DAG's
exact-window model (510k nonzeros) with 5 s, its first root LP ran to 21.5 s, and nothing in-process could stop it.
A child process can be killed. It runs `highs_child.py` as a script in isolated mode (`python -I`), so it imports
only the standard library and highspy, never the caller's `__main__` (as a `multiprocessing` spawn would).
"""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CHILD = Path(__file__).with_name("highs_child.py")
"""The script the child runs."""


@dataclass
class HighsJob:
    """One HiGHS run: the model as one row-wise matrix, HiGHS' options and a start."""

    col_cost: list[float]
    """Objective coefficient per column."""
    col_lower: list[float]
    """Lower bound per column."""
    col_upper: list[float]
    """Upper bound per column (math.inf: none)."""
    row_lower: list[float]
    """Lower bound per row (-math.inf: none)."""
    row_upper: list[float]
    """Upper bound per row (math.inf: none)."""
    start: list[int]
    """Row-wise matrix: row r's entries are index / value[start[r]:start[r + 1]]."""
    index: list[int]
    """Row-wise matrix: the column of each entry."""
    value: list[float]
    """Row-wise matrix: the coefficient of each entry."""
    binary: list[bool]
    """Per column: integral (a binary, by its bounds) or continuous."""
    options: dict[str, float | int]
    """HiGHS options by name (the time limit is set from the run's)."""
    start_values: list[float] | None
    """A start, one value per column (None: none)."""


@dataclass
class HighsRun:
    """What the child reported, or that it was killed."""

    killed: bool
    """It ran past its limit and grace and was killed: nothing was read."""
    status: str = ""
    """HiGHS' model status, in its words."""
    optimal: bool = False
    """HiGHS proved its incumbent optimal within mip_rel_gap."""
    infeasible: bool = False
    """HiGHS proved the model infeasible."""
    dual_bound: float | None = None
    """The MIP's dual bound, in the model's units (None: none)."""
    objective: float | None = None
    """The incumbent's objective, in the model's units (None: no incumbent)."""
    values: list[float] | None = None
    """The incumbent, one value per column (None: no incumbent)."""
    error: str | None = None
    """HiGHS failed: why."""
    warning: str | None = None
    """Something worth a warning that did not stop it (a rejected start)."""


def run_highs(job: HighsJob, limit_s: float, grace_s: float) -> HighsRun:
    """HiGHS on `job` for `limit_s` seconds from now, its start-up included; killed `grace_s` after that."""
    end = time.perf_counter() + limit_s
    payload = pickle.dumps({**asdict(job), "end": end}, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError as e:  # no interpreter to start (an embedded one: sys.executable is empty), or no process left
        return HighsRun(killed=False, error=f"its process did not start ({e}); ask for another solver (--solver cbc)")
    try:
        out, err = proc.communicate(payload, timeout=max(end + grace_s - time.perf_counter(), 0.0))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        log.warning("highs ignored its %.3g s limit; killed", limit_s)
        return HighsRun(killed=True)
    if proc.returncode != 0 or not out:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        return HighsRun(killed=False, error=f"its process failed ({tail[0]})")
    result = pickle.loads(out)
    return HighsRun(killed=False, **result)
