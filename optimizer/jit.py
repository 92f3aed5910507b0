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
before they take jobs. A file lock makes concurrent first runs take turns (one compiles and writes the cache, the
others load it), and time-limit signals are held back until the kernels are whole.

A solve has a time limit that the compile (20-45 s from an empty cache: a `pip install` that skipped `make
install`'s warm-up) must not break, so `solve()` calls `kernels_by(deadline)` instead: the kernels are loaded or
compiled in a thread of their own (no time-limit signal reaches it) and the solve waits for them until its deadline
at most, then answers with its greedy plans where they are not ready. A process that exits while that thread is
still compiling (a short CLI solve) hands the rest to a detached `python -m memsched.optimizer.jit`, so that the
next solve finds them; numba's cache keeps every kernel finished before.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)


class _Kernels:
    """This process's kernels: whether they are ready, and the thread that `kernels_by` starts (once) to load or
    compile them."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        """Set once this process has every kernel compiled or loaded."""
        self.lock = threading.Lock()
        """Held by whoever loads or compiles them (prepare_kernels, the thread)."""
        self.thread: threading.Thread | None = None
        """`kernels_by`'s thread (None: not started)."""
        self.done = threading.Event()
        """Set when that thread has ended, with the kernels ready or with `error`."""
        self.error: Exception | None = None
        """What the thread raised, raised again where a caller waits for it."""
        self.starting = threading.Lock()
        """Held while a caller checks for the thread and starts it (not `lock`: the thread holds that throughout)."""

    def forget_a_lost_thread(self) -> None:
        """In a forked child: the thread did not come along, and the locks it held stay held there, so a compile
        it had not finished starts again from a fresh state."""
        if self.thread is not None and not self.done.is_set():
            self.__init__()  # type: ignore[misc]


_state = _Kernels()


def _after_fork_in_child() -> None:
    _state.forget_a_lost_thread()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

# The time-limit signals of the worker pools (api/runners/solve_process.py: SIGALRM; Celery's prefork soft
# limit: SIGUSR1).
_DEFERRED_SIGNALS = tuple(
    s for s in (getattr(signal, "SIGALRM", None), getattr(signal, "SIGUSR1", None)) if s is not None
)


def kernels_ready() -> bool:
    """Whether this process has already compiled or loaded every kernel."""
    return _state.ready.is_set()


def prepare_kernels() -> float:
    """Compile (first run on a machine) or load (from numba's cache) every kernel; a no-op after the
    first call in a process. Returns the seconds it took."""
    if _state.ready.is_set():
        return 0.0
    t0 = time.perf_counter()
    if _state.thread is not None:
        _state.done.wait()
        _raise_background_error()
    with _state.lock, _deferred_signals(), _cache_lock():
        if not _state.ready.is_set():
            _exercise_every_kernel()
            _state.ready.set()
    wall = time.perf_counter() - t0
    log.info("optimizer: kernels ready in %.2f s", wall)
    return wall


def kernels_by(deadline: float, unless_compiling_at: float | None = None) -> bool:
    """Whether every kernel is ready by `deadline` (time.perf_counter()): loads or compiles them in a daemon thread
    (started once per process) and waits for it until then. False leaves the thread running: a later call finds
    them ready, and a process that exits first hands the compile to a process of its own (`_finish_after_exit`).
    `unless_compiling_at`: from then on, stop waiting as soon as a kernel has missed numba's cache (a compile of
    20-45 s is under way, `cache_missed`); while every kernel so far came from the cache, a load of about a second
    on a slow machine, wait on (up to `deadline`)."""
    if _state.ready.is_set():
        return True
    with _state.starting:
        if _state.thread is None and not _state.ready.is_set():
            _state.thread = threading.Thread(
                target=_prepare_in_background, args=(_state,), name="memsched-kernels", daemon=True
            )
            atexit.register(_finish_after_exit)
            _state.thread.start()
    cutoff = deadline if unless_compiling_at is None else min(unless_compiling_at, deadline)
    _state.done.wait(max(0.0, cutoff - time.perf_counter()))
    while not _state.done.is_set() and time.perf_counter() < deadline and not cache_missed():
        _state.done.wait(min(_POLL_S, max(0.0, deadline - time.perf_counter())))
    _raise_background_error()
    return _state.ready.is_set()


_POLL_S = 0.02
"""How often `kernels_by` looks for a cache miss once past `unless_compiling_at`."""

_KERNEL_MODULES = (
    "memsched.optimizer.fastsim",
    "memsched.optimizer.dp.fifo_kernels",
    "memsched.optimizer.dp.future",
    "memsched.optimizer.dp.kernels",
    "memsched.optimizer.dp.labels",
    "memsched.optimizer.dp.lagrange",
)
"""The modules whose numba kernels are cached (`cache=True`)."""


def cache_missed() -> bool:
    """Whether a kernel of this process has missed numba's cache so far: it is compiled, not loaded. (numba counts
    the miss before it compiles.) Only the modules already imported are looked at: the others have not begun."""
    from numba.core.registry import CPUDispatcher

    for name in _KERNEL_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        for obj in list(vars(module).values()):
            if isinstance(obj, CPUDispatcher) and sum(obj.stats.cache_misses.values()) > 0:
                return True
    return False


def compiling() -> bool:
    """Whether `kernels_by`'s thread is still loading or compiling the kernels."""
    return _state.thread is not None and not _state.done.is_set()


class KernelsPending(Enum):
    """What `kernels_by`'s thread was doing when a solve stopped waiting for it."""

    LOADING = "loading"
    """Every kernel so far came from numba's cache: a load of 0.2-1.3 s once per process, which a CLI solve of a
    second or so (most of it the interpreter's start) does not cover."""
    COMPILING = "compiling"
    """A kernel missed numba's cache: the first solve in an environment compiles them (20-45 s)."""


def pending() -> KernelsPending | None:
    """Whether the kernels are still on their way, and how (None: ready, or never asked for)."""
    if not compiling():
        return None
    return KernelsPending.COMPILING if cache_missed() else KernelsPending.LOADING


def _prepare_in_background(state: _Kernels) -> None:
    t0 = time.perf_counter()
    try:
        with state.lock, _cache_lock():
            if not state.ready.is_set():
                _exercise_every_kernel()
                state.ready.set()
        log.info("optimizer: kernels ready in %.2f s", time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - re-raised in the thread that waits for it (kernels_by, prepare_kernels)
        state.error = e
    finally:
        state.done.set()


def _raise_background_error() -> None:
    if _state.error is not None:
        raise RuntimeError(f"optimizer: preparing the compiled kernels failed: {_state.error}") from _state.error


def _finish_after_exit() -> None:
    """At exit, where `kernels_by`'s thread is still compiling (a solve shorter than the first compile): start a
    detached `python -m memsched.optimizer.jit` that finishes the compile into numba's cache after this process has
    gone (it waits on the cache lock this process holds until then), so the next solve finds the kernels ready.
    Not where every kernel so far came from numba's cache: the thread was loading them (a CLI solve of a second or
    less), and the next process loads them as well."""
    if not compiling() or not cache_missed():
        return
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "memsched.optimizer.jit"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # outlives this process and its terminal's signals
            close_fds=True,
        )
    except OSError as e:
        log.warning("optimizer: the compiled kernels are not finished, and no process could finish them (%s)", e)
        return
    log.warning(
        "optimizer: the compiled kernels are not finished; process %d finishes them in the background for the next "
        "solve (once per environment; `make install` or `python -m memsched.optimizer.jit` does it ahead)",
        child.pid,
    )


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
    """An exclusive lock shared by every process of this user on this machine that uses the same numba cache
    (NUMBA_CACHE_DIR; POSIX; elsewhere none): processes with caches of their own do not wait for each other."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: compiles may race; numba then recompiles on a bad entry
        yield
        return
    with open(_lock_path(), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _lock_path() -> Path:
    """Inside NUMBA_CACHE_DIR where one is set (the lock goes with its cache), else in the temporary folder, named
    after the cache: NUMBA_CACHE_DIR's path, or without one this install's sources (`_sources_dir`), beside which
    numba keeps its cache (or in its user-wide folder, under their path). One lock per user for every install made
    a second environment's first compile (30 s) hold back the solves of an install whose kernels were ready: they
    answered with the greedy plans ('still compiling', 2026-12-06, a fresh clone's `make install` beside a running
    benchmark)."""
    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    if cache_dir:
        try:
            Path(cache_dir).mkdir(parents=True, exist_ok=True)  # numba makes it too, on its first write
            return Path(cache_dir) / "memsched-compile.lock"
        except OSError:  # not ours to create: the temporary folder, named after the cache
            pass
    cache = cache_dir or str(_sources_dir())
    digest = hashlib.sha256(cache.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"memsched-numba-{os.getuid()}-{digest}.lock"


def _sources_dir() -> Path:
    """The folder of the optimizer's sources in this install: every kernel lives under it."""
    return Path(__file__).resolve().parent


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
