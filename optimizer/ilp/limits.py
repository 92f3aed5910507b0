"""How long a MILP solver may run: its limit, cut so that it ends by the solve's deadline with CBC's kill grace
(optimizer/ilp/cbc.py) after it, read right before the solver's own clock starts."""

from __future__ import annotations

import time


def grace_s(time_limit_s: float) -> float:
    """How long past its limit CBC may run before it is killed (the caller's whole-solve limit includes it)."""
    return min(2.0, max(0.5, 0.05 * time_limit_s))


MIN_SEARCH_S = 0.1
"""A MILP solver is not started with less than this limit: what is left goes to the solve's last phases."""
NO_TIME = "no time left to search once its model was built"
"""The outcome's message where a solver was not started for want of time."""


def limit_within(seconds_left: float) -> float:
    """The limit to hand a MILP solver so that it, and CBC's kill grace after it, end within `seconds_left`."""
    return min(seconds_left - grace_s(seconds_left), seconds_left / 1.05)


def solver_limit(time_limit_s: float, deadline: float | None) -> float | None:
    """`time_limit_s`, cut so that a solver whose clock starts now ends by `deadline` (perf_counter), kill grace
    included; None where that leaves less than MIN_SEARCH_S. Read right before the solver starts: building its
    model takes seconds on a few hundred layers (a 100-layer DAG's exact-window model, 1.1 s to build and 2 s
    into PuLP: a limit taken before them let CBC run 1.9 s past the solve's deadline)."""
    limit = time_limit_s if deadline is None else min(time_limit_s, limit_within(deadline - time.perf_counter()))
    return limit if limit >= MIN_SEARCH_S else None


BUILD_S_PER_CELL = 1e-4
"""Building a model takes about this long per layer and step of its widest window (max(W, L)), or longer: 0.9-1.5 s
for 100-layer synthetic chains and DAGs with exact windows (W = L = 100) on a 2-core machine, 2026-11-30. A build
whose hand-over could not fit in the time left is not started (predicted_build_s)."""


def predicted_build_s(n: int, window: int, max_segment: int) -> float:
    """The least time a model of `n` layers with windows of `window` stages and segments of `max_segment` layers
    takes to build (BUILD_S_PER_CELL): a floor, so that a build skipped for it would not have fit."""
    return BUILD_S_PER_CELL * n * max(window, max_segment, 1)


MPS_PER_PROBLEM = 2.0
"""Writing a PuLP problem's MPS file (and its MIP start) takes up to this many times as long as building the
PuLP problem did: 1.3-1.9x measured on 40- to 100-layer synthetic chains and DAGs with exact windows (a 100-layer
DAG: to_pulp 1.4 s, MPS 2.5 s, 2026-11-30)."""


def worth_handing_over(built_s: float, seconds_left: float, setup_per_build: float) -> bool:
    """Whether a model that took `built_s` to build can still be handed over, its backend's set-up taking up to
    `setup_per_build` times the build (Backend.setup_per_build), and searched within `seconds_left` (its solver's
    limit at least MIN_SEARCH_S, CBC's kill grace after it)."""
    return limit_within(seconds_left - setup_per_build * built_s) >= MIN_SEARCH_S
