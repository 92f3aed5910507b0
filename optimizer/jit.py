"""Getting the optimizer's compiled kernels (the DP's, optimizer/dp/; the local search's simulator,
optimizer/fastsim.py) ready before a clock runs, safely across processes.

numba compiles a kernel on its first call and caches the machine code beside its source (`__pycache__`). Two
things go wrong when that first call happens inside a job:

- the compile (1-2 s, several times that when the pool's processes compile at once on 2 cores) is charged to
  the job's time limit;
- a time-limit signal that lands mid-compile (the embedded pool's SIGALRM, Celery's soft limit on SIGUSR1)
  raises inside numba and leaves the kernel's dispatcher half-built: every later call in that process fails
  with "no compiled object yet" (seen in CI on a fresh clone, 2026-11-24).

`prepare_kernels()` runs the whole DP (problem, future table, beam and exact sweeps) and the local search on a
tiny built-in trace, so every kernel is compiled, or loaded from the cache, with the argument types the solver
uses. Workers call it
before they take jobs; `solve()` calls it before its clock-driven phases. A file lock makes concurrent first
runs take turns (one compiles and writes the cache, the others load it), and time-limit signals are held back
until the kernels are whole.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

_ready = threading.Event()
"""Set once this process has every kernel compiled or loaded."""
_lock = threading.Lock()

# The time-limit signals of the worker pools (api/runners/solve_process.py: SIGALRM; Celery's prefork soft
# limit: SIGUSR1).
_DEFERRED_SIGNALS = tuple(
    s for s in (getattr(signal, "SIGALRM", None), getattr(signal, "SIGUSR1", None)) if s is not None
)


def kernels_ready() -> bool:
    """Whether this process has already compiled or loaded every kernel."""
    return _ready.is_set()


def prepare_kernels() -> float:
    """Compile (first run on a machine) or load (from numba's cache) every kernel; a no-op after the
    first call in a process. Returns the seconds it took."""
    if _ready.is_set():
        return 0.0
    t0 = time.perf_counter()
    with _lock, _deferred_signals(), _cache_lock():
        if not _ready.is_set():
            _exercise_every_kernel()
            _ready.set()
    wall = time.perf_counter() - t0
    log.info("optimizer: kernels ready in %.2f s", wall)
    return wall


def _exercise_every_kernel() -> None:
    from memsched.optimizer.budget import budget_between
    from memsched.optimizer.dp import beam_search, build_problem, exact_search, fifo_search
    from memsched.optimizer.dp.lagrange import (
        lagrange_arrays,
        lagrangian_bound,
        link_lagrangian_bound,
        raise_future,
    )
    from memsched.optimizer.fastsim import descend
    from memsched.optimizer.heuristic import heuristic
    from memsched.optimizer.polish import polish
    from memsched.optimizer.synthetic import make_trace

    far = time.perf_counter() + 3600.0
    # A DAG (held checkpoint producers), tight enough that recompute segments and offloads are both chosen.
    trace = make_trace(10, seed=3, dag=True)
    budget = budget_between(trace, 0.2)
    problem = build_problem(trace, budget, far)
    beam = beam_search(trace, budget, far, width=8, problem=problem)
    incumbent = beam.schedules[0].overhead_s if beam.schedules else None
    exact_search(trace, budget, far, incumbent, 0.0, problem=problem)
    fifo_search(trace, budget, far, incumbent if incumbent is not None else float("inf"), 0.0, problem=problem)
    start = heuristic(trace, budget).decisions
    polish(trace, budget, start, 0.05)
    # The local search's descent passes (fastsim.descend) run only after its first moves: a polish that spent its
    # 0.05 s compiling the rest (the install's first run) never reached them, and the first solve after `make
    # install` then compiled them inside its limit (6-7 s of a 10 s solve). So it searches until they are compiled.
    until = time.perf_counter() + 600.0
    while not descend.signatures and time.perf_counter() < until:
        polish(trace, budget, start, 0.5)
    # Both Lagrangians (a few steps each compile every kernel they call) and the completion bound.
    arrays = lagrange_arrays(problem, trace)
    upper = incumbent if incumbent else 1.0
    rows = lagrangian_bound(arrays, upper, far, max_iterations=3)
    raise_future(problem, arrays, rows.prices)
    link_lagrangian_bound(arrays, upper, far, max_iterations=3)


@contextlib.contextmanager
def _cache_lock() -> Iterator[None]:
    """An exclusive lock shared by every process of this user on this machine (POSIX; elsewhere none)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: compiles may race; numba then recompiles on a bad entry
        yield
        return
    path = Path(tempfile.gettempdir()) / f"memsched-numba-{os.getuid()}.lock"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _deferred_signals() -> Iterator[None]:
    """Hold back time-limit signals until the block ends, then deliver them to the handlers they were meant for.
    Only the main thread may change handlers; elsewhere the block runs unprotected (no pool runs solves there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, FrameType | None]] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        pending.append((signum, frame))

    saved: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
    for s in _DEFERRED_SIGNALS:
        if signal.getsignal(s) is not None:  # None: a handler not installed from Python, which we cannot restore
            saved[s] = signal.signal(s, hold)
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        for signum, frame in pending:
            handler = saved[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


if __name__ == "__main__":  # `make install`: compile once, so that no first solve pays for it
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    prepare_kernels()
