"""The optimizer's front door: trace + budget + options -> Schedule.

Flow (docs/formulation.md, 'How solve() proceeds'): check the budget (InfeasibleBudgetError with the smallest
feasible budget); keep-all if it fits; the greedy heuristic and the baselines give candidates (one with zero
overhead is optimal as it stands); then

1. the beam DP (optimizer/dp/) adds a strong candidate, fast;
2. the local search (optimizer/polish.py) improves the best candidate;
3. the exact DP, pruned by the best candidate, proves a lower bound that holds for every schedule;
4. a MILP backend (optimizer/ilp/) when asked for by name, or, under `auto`, on small traces where its
   windows cover every schedule and the DP left a gap.

Each solver's phases and their shares of the time limit are data (`plan_for`); each MILP backend is an entry of
`BACKENDS`; one loop runs any plan.

Every schedule is judged by the simulator and the best is returned, so the result is never worse than a
baseline. The reported bound is the best *true* bound found: the DP's, or a MILP's only where the MILP's
windows cover the whole problem (a windowed MILP's bound is mentioned in the message, never reported as a
bound). `optimal` means that bound proves the requested gap. The time limit bounds the whole call.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from memsched.errors import InfeasibleBudgetError, InfeasibleHostBudgetError, MemschedError, SolverError
from memsched.optimizer.actions import check_feasible, restrict
from memsched.optimizer.baselines import evaluate_baselines
from memsched.optimizer.budget import min_feasible_budget, min_feasible_decisions
from memsched.optimizer.decisions import ALL_ACTIONS, KEEP, Decision, decisions_from_schedule, uses_only
from memsched.optimizer.heuristic import heuristic
from memsched.optimizer.host import (
    MAX_PRICES,
    HostNeed,
    fits_host,
    host_binds,
    min_host_bytes,
    next_price,
    price_scale,
    priced_sweep,
)
from memsched.optimizer.ilp.cbc import grace_s
from memsched.optimizer.ilp.model import MilpModel, build_model
from memsched.optimizer.ilp.outcome import Outcome
from memsched.optimizer.ilp.warm import representable
from memsched.optimizer.polish import LocalSearch
from memsched.optimizer.ratio import ratio_plan
from memsched.optimizer.simulate import SimResult, make_schedule, simulate, stage_memory
from memsched.options import SolveOptions, SolveResources, SolverName
from memsched.schema import Action, Schedule, SolverRecord, SolverStatus, Trace, check_schedule

if TYPE_CHECKING:
    import numpy as np

    from memsched.optimizer.dp import DpOutcome, DpProblem
    from memsched.optimizer.dp.lagrange import LagrangeArrays, LinkLagrangian

log = logging.getLogger(__name__)

SweepKey = tuple[int, int | None, int | None]
"""An exact DP sweep: byte ranges per relaxed layer, and the coarse ladder's retained-bytes and backlog quanta as
limit >> shift (None: exact bytes)."""

AUTO_BACKEND = SolverName.CBC  # measured fastest on our 2-core machine (bench/results/solver_bench.md)
_REL_TOL = 1e-9


@dataclass
class Candidate:
    """A schedule someone proposed, as judged by the simulator."""

    name: str
    """Where it came from: 'heuristic', 'ratio' (optimizer/ratio.py), a baseline policy, 'dp-beam', 'dp-fifo-beam',
    'dp', 'dp-fifo', 'dp-lagrangian', 'local-search' or 'ilp'."""
    sim: SimResult
    """Simulated under the budget (timing filled in)."""


@dataclass
class SolveReport:
    """The returned schedule and how it came about (for tests and benchmarks)."""

    schedule: Schedule
    """What solve() returns."""
    outcome: Outcome | None
    """The MILP backend's raw result (None where no backend ran)."""
    ilp_sim: SimResult | None
    """The simulator's verdict on the backend's incumbent, if there was one."""
    dp: DpOutcome | None = None
    """The exact DP's result (None where it did not run)."""


# Shares of the time limit (upper bounds: each phase stops early when it has nothing left to do).
_RATIO_SHARE = 0.05
"""The ratio plan (optimizer/ratio.py), right after the beam, stops its scans at this share of the limit: about
2,000 plans scored by the compiled simulator, 0.33 s on the 1,000-layer synthetic chain, 3.9 s on a 5,000-layer
one (cut there, it keeps the best member scanned)."""
_BEAM_SHARE = 0.2
_POLISH_SHARE = 0.15
_BEAM_FIRST_SHARE = 0.25
"""The beam's first fluid round (24 labels) may run past the beam's share, up to this share of the limit: a cut
round decodes no plan, and the local search's answer depends on where it starts. DenseNet-121 at 25%, 10 s: the
first round needs 1.9 s of the long trace's 1 s share; cut, the local search started from the best baseline
(0.170 s) and ended at 0.0590 s; from the round's plan (0.107 s), at 0.0531 s (5 s of search from each: 0.0575-0.0590
against 0.0525-0.0531 s)."""
_LONG_TRACE = 300
"""Above this many layers (where the memory rows' Lagrangian does not prune it) the exact DP often cannot finish
its sweep at the incumbent in a time limit of minutes, so there it climbs (each sweep's threshold sized by the
last one's time: one cut by the clock has proved its last step) and gives up as soon as its pace says a sweep
cannot finish (_LONG_PACE): the local search, which improves the answer, gets the time back."""
_POLISH_SHARE_LONG = 0.3
"""On long traces: the local search's first share (less the link-window Lagrangian's where that runs), before
the exact DP, whose climb starts at 0.7 of its answer (the beam's can lie 3x above the optimum: DenseNet-121 at
25%). The exact DP then has until _DP_UNTIL_LONG of the limit and the same local search goes on after it
(optimizer/polish.py's LocalSearch resumes where it stopped). Measured on one core (2026-11-28), against a
local search of 75% first and the exact DP's two sweeps after it: DenseNet-121 at 75%, 10 s: gap 30.7% ->
proven (the climb passes the fluid optimum, 0.002594 s, in 1.6-3 s; after the long local search it had 0.8 s
for one sweep at the incumbent, which needs more); at 30 s proven in 17 s; at 50%, 30 s: 22.0 -> 9.0%; the
answers the same (bench/results/solver_bench_issue22.md). Before the local search resumed, splitting it around the
DP lost 2-10% on the 1,000-layer chain at 20%, 10 s (a new search re-begins the oscillation, whose cycles take
seconds there)."""
_DP_UNTIL_LONG = 0.7
"""On long traces the exact DP stops at this fraction of the limit (when its pace has not stopped it sooner): the
local search after it improves the answers there (_POLISH_SHARE_LONG)."""
_LONG_PACE = 3.0
"""On long traces each exact sweep stops where its time per layer so far, times the layers left, exceeds this many
times its time left (SweepConfig.pace). The margin covers the bias of a linear projection: labels pile up where
many tensors are live (DenseNet-121 at 50%: 2.4 s to layer 84 of 428, 6.05 s in all, where the projection said
12 s); the 1,000-layer chain's sweep at 20% projects 20 s at layer 15 with 4.8 s left, and stops there (before:
it ran to its deadline, 5 s of a 10 s limit, at layer 36)."""
_PACED_MIN_LAYERS = 150
"""From this many layers, where the memory rows' Lagrangian does not prune it (copies beside compute), the exact DP
phase's sweeps stop at their pace too (_LONG_PACE), not only above _LONG_TRACE: their labels grow as n^2 x labels,
and a sweep cut by the clock proves no more than the bound it had (its anytime bound), while the local search after
it improves the answer. On the synthetic 200-layer chain at 20% (10 s) the sweep was cut at layer 64-66 of 200
after 4.4-4.7 s, its bound 0.0208 s below the link windows' 0.0263 s; with 240 s it hit the label cap three times
and finished only at a quantum of 20 MB, its bound 0.0185 s. Paced, it stops at layer 55 after 2.6 s and the
answer is 0.030913 s instead of 0.031164-0.032097 s. On PipeDream ResNet-50 (176 layers) at 12-56% the sweep
finishes in 0.3-3 s and is not stopped (bench/results/solver_bench_stalls.md, 2026-11-29). From this many layers
the sweeps also climb from the bound held (_MID_CLIMB_PACE)."""
_MID_CLIMB_PACE = 1.5
"""From _PACED_MIN_LAYERS up to _LONG_TRACE layers with copies beside compute, the exact DP climbs from the bound held
(exact_search's climb_from_proven, as on long traces), each sweep stopped at this pace (_LONG_PACE's rule). A sweep
at the top threshold that the clock cuts proves only its frontier, where a finished lower step proves its threshold:
PipeDream ResNet-50 with every node output saved at 25%, 10 s, the top sweep needed 5.9 s and had 4.3 s (bound
0.0577 s, gap 10.5%); the climb proves 0.0604 s (gap 6.3%), with 100 us copy latency 0.0572 -> 0.0605 s. At _LONG_PACE
the climb's first step on the synthetic 200-layer DAG at 20% (which no sweep finishes) ran 2.9 s where the top sweep
stopped after 1.3 s, and the local search lost that time (answer 0.0285 -> 0.0294-0.0301 s); at this pace it stops
as soon and the answer is the same. The cost: where the top sweep finishes, the lower steps come first (PipeDream
ResNet-50 at 25-34%, 10 s: proven in 7.6-7.8 s instead of 6.1-6.3 s; at 26%, 5 s: 4.5 instead of 3.9 s)."""
_LAGRANGE_SHARE = 0.1
_LAGRANGE_SHARE_LONG = 0.25
"""The Lagrangian bound on the memory rows (optimizer/dp/lagrange.py) runs right after the beam for up to this
share of the limit (25% over 300 layers), where it is strong: plans without offload, or copies on the compute
thread (each copy's whole time is a stall, which it prices exactly). It stops sooner when it proves the gap or its
steps stall. Its prices also bound every completion of a partial plan, which the exact DP then prunes with: on
long traces that is what lets the DP finish (keep / recompute on the 1,000-layer synthetic chain at 20%, 30 s:
proven optimal, 0.9599 s, where before the answer was 0.980 s and the DP's bound 0.115 s). With copies beside
compute it prices each copy as if it had the link to itself, so offload looks nearly free and the bound stays
weak: it is skipped there."""
_LAGRANGE_MIXED_SHARE = 0.15
"""Where the exact DP left the gap open on the memory rows, the Lagrangian with the mixed rule for checkpoint inputs
read by several layers runs after it for up to this share (`lagrange_mixed`), from the first rule's prices: on the
synthetic 1,000-layer DAG at 20%, keep / recompute, 2 s raised the bound 0.9377 -> 1.0065 s (the same as 4.5 s from
zero). On long traces the DP stops at its pace there to leave it the time (`exact_dp`)."""
_LAGRANGE_MIN_S = 0.05
_LINK_MIN_LAYERS = 150
"""Copies beside compute: from this many layers the Lagrangian of the fluid link windows runs in the same phase.
Below it the exact sweeps finish or come close, and their fluid bound is at least as strong (the Lagrangian's best
is the LP relaxation of the same fluid model): on a 60-layer chain 0.937 of the optimum, on PipeDream ResNet-50 at
50% 0 where the fluid sweep proves the optimum. Above it: the 200-layer synthetic chain at 20%, 0.0263 s against
an answer of 0.0312 s (the sweeps' bound: 0.0185 s); DenseNet-121 at 50% / 25%, 0.0143 / 0.0326 s against
0.0209 / 0.0511 s (before: 0.0102 / 0.0232 s)."""
_LINK_MAX_LAYERS = 2000
"""Beyond this many layers its O(n^2) path per step leaves too few steps in a time limit of minutes."""
_DP_FIRST_SHARE = 0.25
"""On traces of up to _LONG_TRACE layers, the exact DP runs before the local search for up to this share (`dp_first`)
where its sweeps are what proves and finish fast, so that its optimum or bound usually ends the solve: on the memory
rows (`LagrangeKind.ROWS`: the fluid model is exact there, and the Lagrangian's prices prune the sweep at the beam's
answer) and where some layer offloads relaxed byte ranges (many saved tensors: the relaxed sweeps, coarse first,
prove there). Before, the local search's share (_POLISH_SHARE) came first and rarely moved the answer. One core,
10 s (2026-11-28), proven at: PipeDream ResNet-50, keep / recompute, 75 / 50%: 2.6 / 2.2 s -> 1.2 / 0.7 s; the
tracer's CPU decoders (offload emulated: serial copies), Llama of 16 / 48 blocks at 75 / 50% 2.2 / 3.0 s -> 0.7 /
1.4 s, GPT-2 of 96 blocks per sub-module 4.0 / 4.6 s -> 2.6 / 3.1 s; GPT-2 medium on an H100 at 75 / 50% 5.1 / 3.4 s
-> 2.8 / 1.6 s (bench/results/solver_bench_stalls.md). A quarter, not 15%: at 15% GPT-2 medium's 64-range sweep
(1.3 s) was cut with 0.9 s left, and the exact DP phase ran it again after the local search (5.6 -> 6.9 s). Not on
long traces: the 1,000-layer chain at 20% (60 s) needs the local search's answer (0.980 s, the beam's 1.222 s) for the
DP to finish (7.5 s); at the beam's it was cut at its share, and the solve was proven at 40.3 s instead of 33.8 s. Not
where copies run beside compute and every offload subset is tried (one tensor a layer): where stalls decide there,
the FIFO probe and climb prove and need the time (PipeDream ResNet-50 at 19%: gap 1.7 -> 4.6%). The share holds
the coarser steps; the finest relaxed step may run on to where the exact DP phase ends (`Phase.last_until`), since a
cut one starts again from scratch: on a machine 1.9x slower than the figures above, GPT-2 medium's near-exact sweep
took 2.3-2.7 s, was cut here and often again after the local search (gap 14.3% at 10 s), and now proves at 5.6 s."""
_DP_SHARE_BEFORE_MILP = 0.3
_DP_UNTIL_RELAXED = 0.7
"""Under auto, where some layer has too many saved tensors to try every offload subset (the DP's sweeps run on
relaxed byte ranges: `_COARSE_LADDER`) and the exact-window MILP follows, the DP stops here instead of at
_DP_UNTIL, so that the MILP gets the last 30% of the limit. There the DP's finer steps rarely move its bound,
while the MILP's (whole copies on their stream, with latency) lies above it and the MILP's own plans can beat
the local search's. Measured on the H100 decoders at 10 s (2026-11-25), gap at _DP_UNTIL -> here: gpt2-medium
75 / 50% 14.3 / 6.3 -> 11.0 / 7.4%, bert-large 75 / 50 / 25% 23.9 / 7.9 / 4.9 -> 16.8 / 4.3 / 4.9%. Not where the
ranges are near exact (_NEAR_EXACT_CELLS): a finished sweep on them proves more than the MILP (_relaxed_offload)."""
_DP_UNTIL = 0.95
"""Under auto, the exact DP stops at this fraction of the limit if it has not finished. Where it finishes
early with a gap (a loose fluid bound: stall-heavy traces) the rest goes to the exact-window MILP, so a late
stop only takes time from traces whose final sweep is still running, and there finishing is what proves."""
_MILP_MIN_LEFT_S = 1.0
"""A MILP phase runs only with this many seconds left: building, warm-starting and CBC's kill grace need about
that much. _DP_UNTIL_RELAXED applies only where its share of the limit is half again as much, so that short limits
do not leave time unused."""
_FIFO_SHARE = 0.1
"""The FIFO sweep (tier 2) runs first for this share of the limit (at least _FIFO_MIN_S): where stalls matter
it finishes in well under a second and is exact (PipeDream ResNet-18, VGG-16, AlexNet: 0.1 s); where they do
not (ResNet-50) its labels multiply and the fluid sweep, which is exact there, gets the rest of the time."""
_FIFO_MIN_S = 0.3
_FIFO_LABELS_PER_S = 200_000
"""The FIFO sweep's label cap per second of its time: its dominance filter handles about 150,000 labels a second
on one core (more where few labels dominate others), so a sweep that holds more than its time can filter would
not have finished in that time anyway; the cap stops it before it fills memory. (The filter also stops at the
work budget the sweep's clock gives it: SweepClock.work_budget.)"""
_FIFO_MAX_LABELS = 2_000_000
"""At most this many FIFO labels (~660 MB)."""
_FIFO_CLIMB_FIRST = 0.15
"""The FIFO climb's first threshold: the proven bound plus this share of the way to incumbent x (1 - gap).
PipeDream ResNet-50 at 2.25 GiB (fluid bound 0.166 s, incumbent 0.2 s): the FIFO sweep at 0.17 s finishes in
1.5 s with 60,000 labels at one boundary, at 0.18 s it passes 4 million."""
_FIFO_CLIMB_FIRST_SHARE = 0.5
"""The FIFO climb's first step takes at most this share of the climb's time: it has no timing to be sized by.
Where the FIFO sweep cannot finish just above the fluid bound (a synthetic 40-layer chain at 20% with copy latency,
2026-11-26: labels past 58,000 at layer 16), the step the clock cuts proves nothing, and with the whole share it
left the local search and the MILP 1 s of a 10 s solve."""
_FIFO_CLIMB_STEP_SHARE = 0.7
"""Every later step takes at most this share of the time left. next_threshold's predictions come from the steps
before, whose times near the fluid bound are held by fixed costs and can look flat (PipeDream ResNet-50 at 2.27
GiB, one core, 2026-11-26: 0.24 / 0.27 / 0.48 / 1.05 / 2.54 / 5.56 s at 0.163 / 0.167 / 0.172 / 0.177 / 0.182 /
0.187 s): from 0.167 s it went straight to the top, where the clock cut it with the climb's whole time, its bound
still 0.167 s. Where the growth is as measured (1.97-2.06 GiB) the bold step is right; so it stays, and a cut one
falls back (_FIFO_CLIMB_RETRIES)."""
_FIFO_CLIMB_TOP_SHARE = 1.0
"""The FIFO climb goes straight to its top threshold (incumbent x (1 - gap)) wherever that sweep is predicted to
take at most this share of the climb's time left, however many times the last step's time that is
(dp.next_threshold's `top_share`), and the top step may run past the share of the other steps
(_FIFO_CLIMB_TOP_MARGIN). Only the top sweep proves the gap or finds the optimum below it; a step below it raises
the bound a little and, sized to 4x the last step's time, takes the time the top needs. Measured 2026-11-29, one
core a side, 3 runs of each row (10 s), against the climb before (growth cap on every step, each at most 0.7 of
the time left): PipeDream ResNet-50 at 19% proven in 3 of 3 runs (1 of 3 before; there a step of 4x to 0.1832 s
and the next one, cut by its share, left 2.3-4.5%), ResNet-50 on an H100 at 50% proven in 3 of 3 (0 of 3: gaps
2.9-4.2%), its top sweep finding the optimum, 0.015299 s against the 0.015698 s answer (-2.5%); ResNet-50 at 17%
proven at 6.4-6.5 s (7.2-7.6 s); 22.5% (10 s) and 19% (5 s) the same. At 0.7 of the time left, 1 of 3 and 1 of 3."""
_FIFO_CLIMB_TOP_MARGIN = 2.0
"""The climb's top step may run to this many times its predicted time (dp.predicted_s), within the climb's end,
where that is more than _FIFO_CLIMB_STEP_SHARE of the time left: the predictions are off by up to 1.3x, and a top
sweep cut at its share proves nothing (ResNet-50 on an H100 at 50%: the top sweep needs 2.9 s of the 4 s left).
Not more: where the steps near the fluid bound were flat, a top predicted to be cheap can take many times more
(_FIFO_CLIMB_STEP_SHARE), and then the share stops it and the fallback steps get the rest as before. (The whole
time left instead: the same proofs in the runs above.)"""
_FIFO_CLIMB_RETRIES = 2
"""Steps cut by the clock (or the label cap) after which the climb stops; after each, it falls back to a third of
the way from the last proven threshold to the one that failed."""
_FIFO_CLIMB_SHARE = 0.85
"""The FIFO climb takes at most this share of the time left: the local search after it gets the rest. Measured on
PipeDream ResNet-50 at 10 s a solve (2026-11-26), 0.5 -> 0.85: gaps at 2.06 / 2.25 GiB 3.1 / 7.1% -> 1.5 / 5.1%, the
same answers (the FIFO beam's, which the local search did not improve)."""
FIFO_MAX_LAYERS = _LONG_TRACE
"""Longer traces skip the FIFO probe, as they defer the exact DP: its sweep does not finish there in a limit of
minutes (DenseNet-121, 428 layers: stopped at layer 28-37 in 3 s), and the local search uses the time better."""
_RELAXED_LADDER = (4, 12, 32, 128, 512)
"""Byte ranges per layer of the exact DP's successive sweeps where some layer has too many saved tensors to try
every offload subset (optimizer/dp/problem.py, relaxed_problem): each finished sweep proves a bound, a finer
one a tighter bound. Measured on bert-large at 25%: 4 ranges finish in 0.1 s at a 11% gap, 12 in 0.3 s at
4.9%; where copies are serial (no backlogs: few labels) 512 ranges finish too (a 16-block Llama: 0.13 s for
4 to 32). The FIFO sweep, whose labels cost more, runs on the coarsest."""
_FIFO_RELAXED_CELLS = 32
"""The FIFO climb's byte ranges per relaxed layer: the finest the fluid ladder finished, at most this many
(fifo_again). ResNet-50 (H100, 16 layers of many tensors) at 50%, one core: the FIFO optimum on 4 ranges (0.0048
s) lies below the fluid bound on 512 (0.0074 s), so a climb there proves nothing; on 32 ranges a FIFO sweep
proves 0.008 s in 0.6 s and 0.009 s in 6.5 s (128 ranges: the same)."""
_LADDER_STEP_SHARE = 0.5
"""Each exact-resolution step of _RELAXED_LADDER but the last takes at most this share of the DP's time left. Their
cost is not monotone in the ranges: on the H100 ResNet-50 trace at 75% (12-16 tensors a block) 4 ranges finish in
0.4 s with a bound of 0, 12 need 28 s (6 million labels) and 32 finish in 0.35 s with the best bound (0.00348
s); on a CPU Llama of 48 blocks 12 / 32 / 128 / 512 take 0.05 / 0.2 / 0.8 / 7 s, and 128 proves the gap."""
_NEAR_EXACT_CELLS = (8, 16, 32, 64, 128)
"""Byte ranges tried for a near-exact relaxation (relaxed_ladder). Where one is, the ladder is the coarsest step
and that one: the steps between prove less and cost as much (gpt2-medium on an H100 at 75%, one core: 4 / 12 /
32 / 64 ranges 0.04 / 0.44 / 0.95 / 2.5 s, bounds 0.0023 / 0.0116 / 0.0139 / 0.0160 s; its 64 ranges span at most
1.6 MiB of a 1.2 GB block each). Beyond 128, options are as many as the ranges and the sweep as costly as any."""
_COARSE_LADDER = ((16, 8, 8), (32, 10, 10), (64, 10, 10), (64, 10, 14), (64, 12, 12))
"""(byte ranges per relaxed layer, retained-bytes quantum as limit >> shift, backlog quantum as limit >> shift) of
the coarse sweeps run, coarsest first, before _RELAXED_LADDER where some layer has too many saved tensors:
rounding retained bytes and backlogs down (a relaxation) keeps the labels few enough for many ranges, whose
options are nearly exact, to finish. Each finer step proves more and costs more; the first one the clock stops
ends the ladder. Measured on one core (2026-11-25), fluid bound and time of the sweep at the top threshold:
gpt2-medium at 75%: 0.0116 s with 32 ranges at 2^10, 0.0138 s with 64 (2 s), answer 0.0161 s; at 50%: 0.0301
s at 2^8, 0.0347 s at 2^10 (4 s), answer 0.0370 s. The number of ranges matters as much as the quantum:
gpt2-medium's blocks have about 68 distinct sums of their large tensors, which 32 ranges pair up. The backlogs'
quantum matters most where copies are a large part of the cost: each rounding takes bytes off the link's work.
bert-large at 75% (answer 0.0067 s): 0.0045 s with 64 ranges at 2^10 (0.8 s), 0.0051 s with its backlogs at
2^14 (2.2 s), 0.0056 s at 2^12 (7-10 s); elsewhere the finer backlogs cost 2-4x the time for the same bound."""
_DP_SEED_SHARE = 0.3
"""Share of a local search's time spent from the exact DP's decoded optimum where that is not the best plan
(`_Flow.polish`); the rest goes on from the best plan, as before."""
_MAX_BEAM_WIDTH = 1536
_LATE_BEAM_SHARE = 0.25
"""The late beam's share of the limit (`_Flow.late_beam`), taken from the last local search."""
_LATE_BEAM_MIN_LAYERS = 150
"""The late beam runs on traces of at least this many layers: below, the exact DP or the MILP closes the gap."""
_LATE_BEAM_MAX_LAYERS = 500
"""Nor above this many: there the widths that fit the share are too narrow to find a plan below the local
search's (the 1,000-layer synthetic chain at 20%, 60 s: 983 labels in 9.8 s, none), and the local search, still
improving, loses the time (+2% on the 1,000-layer rows)."""
_LATE_BEAM_MIN_WIDTH = 512
"""Nor where fewer labels fit its share: `beam` has run that wide already."""
_LATE_BEAM_MIN_GROWTH = 3
"""The late beam runs only where its share allows at least this many times its probe's width (`beam`'s widest)."""
_LATE_BEAM_MAX_WIDTH = 24_576
"""At most this many labels per boundary (the 200-layer synthetic chain at 20%: 17 s)."""
_LATE_BEAM_SAFETY = 0.8
"""The late beam's width is sized to end within this share of its time (the probe's time is noisy)."""
_MAX_FRUITLESS_RESTARTS = 3
"""Local searches started again in the solve's last time, in a row, that find nothing better before the restarts
stop (`_Flow._polish_from`): the first search's stop counts as one."""
_SHARE_TURN_S = 0.5
"""Seconds per turn of the local search or the link windows' Lagrangian in the solve's last time
(`_Flow._polish_and_bound`)."""
_SHARE_MAX_TURNS = 4
"""At most this many turns in a row to the Lagrangian there, then one to the search, to measure it again."""
_SHARE_STALE_S = 2.0
"""Seconds of local search without a better plan after which the Lagrangian may take more of the last time than
the search (`_Flow._polish_and_bound`): a search on 1,000 layers gains in bursts (its kicks' cycles take seconds),
so a turn without a gain alone does not say it has stopped."""
_RACE_TURN_S = 0.5
"""Seconds per turn of each local search in a race (`_Flow._race`)."""
_RACE_PATIENCE = 2
"""Turns in a row without a better plan after which a late beam's search that trails the other leaves the race
(the 200-layer synthetic chain at 20%, 10 s: a beam plan at 0.0357 s against the incumbent's 0.0333 s; raced to
the end, the answer was 1.3% worse)."""
_MISPRICED = 0.02
"""A fluid beam's plans are mispriced where the simulator's cost of the best is this much above the sweep's own: then
stalls shape the plans and a FIFO beam runs after that fluid beam. Measured (2026-11-26, widths 24 / 96 / 384):
the synthetic 200-layer chain and DAG at 20% 1.00-1.01x; PipeDream ResNet-50 at 12 / 19 / 22.5% 1.10 / 1.28-1.36 /
1.15-1.23x, at 34% 1.09x at width 24 and 1.00x wider; the H100 decoders at 50% 1.07-1.45x."""
_STALLS_DECIDE = 0.05
"""Where every fluid beam's best plan simulates more than this much above the sweep's own cost, stalls decide the
plans (`_Flow.stalls_decide`), and on traces of up to 300 layers the link windows' Lagrangian is skipped: the fluid
sweep finds its own optimum fast there, above that LP, and the FIFO climb gets the time. Measured (10 s, 2026-11-26):
PipeDream ResNet-50 at 12 / 19 / 22.5% 1.10-1.36x at every width; at 26% 1.11 / 1.01 / 1.02 / 1.00x; the synthetic
200-layer DAG at 20% 1.00 / 1.08x and the chain 1.00x, where the link windows are the bound (a rule on any one
beam, as _MISPRICED, skipped them there: gaps 15 / 31% -> 40 / 54%)."""
_PRICED_EXACTLY = 5e-3
"""Where every fluid beam's best plan simulates within this share of its sweep cost, the FIFO probe is skipped
(`_Flow.fifo_probe`; docs/formulation.md, 'How solve() uses it', step 4) and the exact DP probes first
(`_Flow.dp_probe`). Stalls worth half the default gap do not decide the plans; the FIFO machinery is for those
that do (PipeDream ResNet-50 at 12-22.5%, the H100 decoders at 50%: 1.07-1.45x, _MISPRICED). Was 1e-3: PipeDream
ResNet-50 at 25% (1.0018x on the narrowest beam, exact on the wider ones) then ran a Lagrangian, a local search
and a FIFO probe, each a share of the limit, before the fluid sweep that proves it. One core, 10 / 30 / 60 / 150 s
limits: proven at 7.2 / 13.2 / 23.2 / 37.6 s, now 7.9 / 6.8 / 8.2 / 6.8 s (2026-11-28; every other row that moved
in the side-by-side --stalls, --issue22 and --conventions runs has a largest ratio of 1 or above 1.02: timing)."""
_DP_PROBE_SHARE = 0.15
"""Where the fluid beams priced their plans exactly, the exact DP runs right after the beam for up to this share of
the limit (`_Flow.dp_probe`): the fluid optimum is then the answer, and the sweep often finishes in a fraction of
the time that the link windows' Lagrangian and the local search before it took. PipeDream ResNet-50 at 7.46 GiB,
12 s, one core (2026-11-28): the DP's sweep 0.5 s, proven at 7.4 s of the solve, after 6.5 s of beam, Lagrangian
and local search."""
_PROBE_PACE = 1.0
"""The probe climbs (each sweep's threshold sized by the last one's time, as on long traces) and its sweeps stop as
soon as their pace says they cannot finish within its share (SweepConfig.pace): the probe is a bet on the beam's
incumbent, which can lie far above the optimum, and a cut sweep's time is lost to the phases after it. ResNet-50
at 56%, 10 s, one core: one sweep at 0.7 of the beam's incumbent and one at all of it: the second cut at its
share (1.5 s), proven at 7.0 s of the solve; climbing: 0.0223 / 0.0261 / 0.0278 s in 0.13 / 0.41 / 0.64 s, the
last finds the optimum (0.026937 s), proven at 3.3 s (5.3 s before the probe). At 41% the climb proves 0.0434 s
in 1 s and stops (its next step would not fit): proven at 7.0 s (6.0 s before the probe)."""
_FIFO_BEAM_FIRST = 16
"""The first FIFO beam's width, after the first fluid beam's (24); each later one is 4x wider, as the fluid
beam's. Its labels carry whole copy queues and it expands every segment, so a label costs several times a fluid
one: PipeDream ResNet-50 at 2.25 GiB, one core, widths 16 / 64 / 256 in 0.11 / 0.30 / 0.92 s against the
fluid beam's 24 / 96 / 384 in 0.15 / 0.21 / 0.36 s."""
_PROVE_SHARE = 0.6
"""A solve started from an earlier answer (solve_report's `start`: a sweep solving an open point again) first runs
the exact sweep at that answer's threshold for up to this share of its limit (`_Flow.prove_start`): the answer is
known, what it lacks is the bound, and that one sweep proves the gap or finds the optimum below it (PipeDream
ResNet-50 at 2.62 GiB: the FIFO sweep at 0.99 x 0.11035 s ends in 10.8 s on one core, where a solve from scratch
took 39 s to prove the point, 7 s of them in a probe cut by its share)."""

_PROVE_TOP_SHARE = 0.5
"""The share of _PROVE_SHARE the FIFO sweep at the start's threshold may take before the FIFO climb takes over."""

_RESERVE_S = 0.05
"""Kept back at the end for building and simulating the returned schedule, plus _RESERVE_PER_LAYER_S per layer
(a simulation with events of a 5,000-layer trace takes about 0.3 s)."""
_RESERVE_PER_LAYER_S = 1e-4
AUTO_MILP_MAX_LAYERS = 100
"""Under `auto`, when the DP leaves a gap (its fluid bound is loose where stalls matter), the MILP with windows
covering every schedule (W = L = n: an exact model, so its bound is true) gets the time left, up to this many
layers (its size grows as n^3)."""


def _record(
    backend: str,
    status: SolverStatus,
    objective: float,
    wall: float,
    message: str,
    bound: float | None = None,
    details: list[str] | None = None,
) -> SolverRecord:
    gap = None
    if bound is not None:
        bound = max(0.0, min(bound, objective))
        gap = (objective - bound) / objective if objective > 0 else 0.0
    return SolverRecord(
        backend=backend,
        status=status,
        objective_s=objective,
        best_bound_s=bound,
        gap=gap,
        wall_s=wall,
        message=message,
        details=details or [],
    )


_BOUND_SOURCES = {
    "dp": "the exact dynamic program",
    "dp-fifo": "the exact dynamic program with FIFO copies",
    "dp-lagrangian": "the exact dynamic program with the host budget priced (a Lagrangian bound)",
    "lagrangian": "the Lagrangian bound on the memory rows",
    "lagrangian-link": "the Lagrangian bound on the copy links' windows",
    "cbc": "the CBC MILP",
    "highs": "the HiGHS MILP",
    "cpsat": "the CP-SAT model",
    "start": "an earlier solve of this budget (with the schedule this one started from)",
}
"""Where a proven bound came from, in words (solve()'s plain sentence)."""


def plain_summary(
    status: SolverStatus,
    objective_s: float,
    bound_s: float,
    bound_source: str,
    gap: float,
    requested_gap: float,
    time_limit_s: float,
    wall_s: float,
    kernels_s: float = 0.0,
) -> str:
    """One sentence for the user: what was proven about the answer, and what limited the proof."""
    source = _BOUND_SOURCES.get(bound_source, bound_source)
    if status == SolverStatus.OPTIMAL:
        if objective_s <= 0:
            return "Optimal: the schedule has no overhead."
        within = "exactly" if gap <= 1e-9 else f"within {100 * requested_gap:.3g}%"
        return (
            f"Optimal {within}: {source} proves that no schedule has less than {bound_s:.4g} s of overhead "
            f"(this one: {objective_s:.4g} s)."
        )
    limited = (
        f"the time limit of {time_limit_s:g} s ran out"
        if wall_s >= 0.9 * time_limit_s
        else "the solver's searches ended"
    )
    if bound_source == "none":
        sentence = (
            f"Not proven: no lower bound above 0 was found before {limited}, so this schedule "
            f"({objective_s:.4g} s of overhead) may be far from the best."
        )
    else:
        sentence = (
            f"Not proven optimal: a better schedule could save at most {100 * gap:.3g}% of this one's "
            f"{objective_s:.4g} s of overhead ({source} proves at least {bound_s:.4g} s), and {limited} "
            f"before that gap closed to {100 * requested_gap:.3g}%."
        )
    if wall_s > 1.1 * time_limit_s + 0.5:
        sentence += f" The solve took {wall_s:.3g} s, past its time limit of {time_limit_s:g} s"
        if kernels_s > 0.25 * time_limit_s:
            sentence += (
                f", {kernels_s:.2g} s of it preparing the optimizer's compiled kernels (the first solve in "
                "an environment compiles them; `make install` does it ahead)"
            )
        sentence += "."
    return sentence


def _candidates(
    trace: Trace, budget_bytes: int, allowed: frozenset[Action], host_budget: int | None = None
) -> list[Candidate]:
    """The heuristic's and the baselines' schedules that fit (the device budget and the host budget) and use
    only the `allowed` actions."""
    out = [Candidate("heuristic", heuristic(trace, budget_bytes, allowed, host_budget).sim)]
    out += [Candidate(r.policy, r.sim) for r in evaluate_baselines(trace, budget_bytes) if r.feasible]
    ok = (c for c in out if c.sim.feasible and uses_only(c.sim.decisions, allowed) and fits_host(c.sim, host_budget))
    return sorted(ok, key=lambda c: c.sim.overhead_s)


def _best_start(m: MilpModel, starts: list[list[Decision]]) -> list[Decision] | None:
    """The start that is best *in the model's terms*: each is pulled into the model's windows
    (warm.representable, which can cost a lot: a done-by clipped to W stages makes the forward wait), and
    the best of those that still fit the budget, by the simulator, warm-starts the backend."""
    best: tuple[float, list[Decision]] | None = None
    for start in starts:
        rep = representable(m, start)
        if rep is None:
            continue
        sim = simulate(m.trace, rep, m.budget_bytes, with_events=False)
        if sim.feasible and (best is None or sim.overhead_s < best[0]):
            best = (sim.overhead_s, rep)
    return best[1] if best is not None else None


def _model_is_exact(m: MilpModel, offload: bool) -> bool:
    """Whether the MILP's windows cover every schedule of its trace (then its bound is a true bound)."""
    n = m.trace.n
    timing_free = m.window >= n - 1 or not m.trace.device.concurrent_copies or not offload
    return timing_free and m.max_segment >= n


def _solve_pulp_backend(name: str) -> Callable[..., Outcome]:
    def run(m: MilpModel, limit_s: float, gap: float, warm: list[Decision] | None, threads: int | None) -> Outcome:
        from memsched.optimizer.ilp.pulp_backend import solve_pulp

        return solve_pulp(m, name, limit_s, gap, warm, threads)

    return run


def _solve_cpsat(m: MilpModel, limit_s: float, gap: float, warm: list[Decision] | None, threads: int | None) -> Outcome:
    from memsched.optimizer.ilp.cpsat_backend import solve_cpsat

    return solve_cpsat(m, limit_s, gap, warm, threads)


def _export_pulp(m: MilpModel, path: Path) -> None:
    from memsched.optimizer.ilp.pulp_backend import export_pulp

    export_pulp(m, path)


def _export_cpsat(m: MilpModel, path: Path) -> None:
    from memsched.optimizer.ilp.cpsat_backend import export_cpsat

    export_cpsat(m, path)


@dataclass(frozen=True)
class Backend:
    """A MILP backend: how it solves a built model and how it writes the model out."""

    solve: Callable[[MilpModel, float, float, list[Decision] | None, int | None], Outcome]
    """(model, time limit s, gap, warm start, threads) -> outcome; imports its library on first use."""
    export: Callable[[MilpModel, Path], None]
    """Writes the model for reproduction (LP/MPS, or the CP-SAT proto)."""
    objective_is_simulated: bool
    """Whether its objective equals the simulator's overhead to rounding (CP-SAT scales times to integers)."""


BACKENDS: dict[SolverName, Backend] = {
    SolverName.CBC: Backend(_solve_pulp_backend("cbc"), _export_pulp, objective_is_simulated=True),
    SolverName.HIGHS: Backend(_solve_pulp_backend("highs"), _export_pulp, objective_is_simulated=True),
    SolverName.CPSAT: Backend(_solve_cpsat, _export_cpsat, objective_is_simulated=False),
}
"""Every MILP backend, by the solver name that asks for it."""


def _run_backend(
    trace: Trace,
    budget_bytes: int,
    options: SolveOptions,
    backend: SolverName,
    starts: list[list[Decision]],
    deadline: float,
    resources: SolveResources,
    offload: bool = True,
) -> tuple[Outcome, bool]:
    """One MILP run (windows from `options`; `offload=False`: the recompute-only model) that ends by `deadline`
    (perf_counter), model building included; returns its outcome and whether its model is exact (windows
    cover everything)."""
    m = build_model(
        trace, budget_bytes, options.window, options.max_segment, offload=offload, host_budget=options.host_budget
    )
    warm = _best_start(m, starts)
    time_limit_s = backend_limit(deadline - time.perf_counter())
    entry = BACKENDS[backend]
    if resources.export_model is not None:
        entry.export(m, resources.export_model)
    return entry.solve(m, time_limit_s, options.gap, warm, resources.threads), _model_is_exact(m, offload)


class _Flow:
    """One solve: the candidates found so far, the best true bound, and what each phase said."""

    def __init__(
        self,
        trace: Trace,
        budget_bytes: int,
        options: SolveOptions,
        resources: SolveResources,
        t0: float,
        allowed: frozenset[Action],
        found: SimResult | None = None,
        cands: list[Candidate] | None = None,
    ) -> None:
        self.trace, self.budget, self.options, self.resources, self.t0 = trace, budget_bytes, options, resources, t0
        self.allowed = allowed
        """The actions plans may use (SolveOptions.allowed_actions)."""
        self.deadline = t0 + options.time_limit_s
        self.reserve = _RESERVE_S + _RESERVE_PER_LAYER_S * trace.n
        self.host = options.host_budget
        """The host budget (SolveOptions.host_budget): every candidate fits it (`add`)."""
        self.cands = _candidates(trace, budget_bytes, allowed, self.host) if cands is None else cands
        if found is not None:  # the DP's plan from the feasibility check (keep / recompute plans), or the host one
            self.add("dp", found)
        assert self.cands, "a feasible budget admits the heuristic's schedule, a baseline or the DP's"
        self.bound = 0.0
        """Best lower bound on every schedule's overhead proved so far (0 always holds)."""
        self.bound_source = "none"
        self.notes: list[str] = []
        self.outcome: Outcome | None = None
        self.ilp_sim: SimResult | None = None
        self.dp: DpOutcome | None = None
        self.fifo_timed_out = False
        """The FIFO probe stopped at its time share (fifo_again then climbs from the proven bound)."""
        self.fifo_capped = False
        """The FIFO probe stopped at its label cap (fifo_again then climbs from the proven bound)."""
        self.stalls_decide = False
        """Every fluid beam's best plan was mispriced by more than _STALLS_DECIDE: stalls decide the plans, and the
        FIFO sweep, not the fluid model, holds the bound (set by `beam` where the FIFO beam applies)."""
        self.priced_exactly = False
        """Every fluid beam's best plan cost in the simulator what the sweep said (within _PRICED_EXACTLY): the
        fluid model prices the plans that matter, and the FIFO probe is skipped (set by `beam`)."""
        self.fifo_note: str | None = None
        """Where the last FIFO sweep stopped, said in the answer only if the gap stays open."""
        self.fluid_cells: int | None = None
        """Byte ranges per relaxed layer of the finest exact DP sweep that finished (its bound is the fluid
        optimum of that relaxation; bound_problem); None: none finished."""
        self.finished_sweeps: dict[SweepKey, float] = {}
        """The exact DP's sweeps that finished (none cut by the clock or the label cap), with the bound each
        proved. Another run of one at a lower incumbent proves no more (a finished sweep's bound is the smaller of
        its fluid optimum and its threshold), so a later exact DP phase skips it (`exact_dp`, `_coarse_dp`). Not
        kept where the host budget binds: there the sweeps climb, and the priced sweeps after them start from the
        last one's outcome."""
        self.dp_seed: SimResult | None = None
        """The exact DP's decoded optimum where it is not the best plan (its copies' default timing made it
        dearer): the next local search starts from it first (`polish`)."""
        self.kernels_s = 0.0
        """Seconds spent loading (or, the first time, compiling) the compiled kernels."""
        self.host_binds = host_binds(trace, self.host, allowed)
        """Whether the host budget excludes some plan (else nothing below looks at it)."""
        self.price_scale = price_scale(trace)
        """The first Lagrangian price of the host budget, seconds per byte."""
        self._search: LocalSearch | None = None
        """The last local search (`_polish_from`), and the candidate it stands at (its best plan as returned)."""
        self._search_at: SimResult | None = None
        self._rival: LocalSearch | None = None
        """A second local search, from the late beam's plan (`late_beam`), that the last one races (`_race`)."""
        self._restarts = 0
        """Local searches started again after one stopped by itself (`_polish_from`): each one's seed."""
        self.improved_at = time.perf_counter()
        """When the best plan last improved (perf_counter)."""
        self._share_note = ""
        """The note that the Lagrangian bound stopped at its time share (`lagrange`), if it did."""
        self._link: LinkLagrangian | None = None
        """The link windows' Lagrangian where its share stopped it before it converged: the solve's last local
        search shares its time with it (`_polish_and_bound`)."""
        self.widest_beam = 0
        """Labels per boundary of the widest fluid beam round of `beam` that finished (0: none); `late_beam`'s
        probe runs this wide."""
        self._problem: DpProblem | None = None
        self._bound_problems: dict[int, DpProblem] = {}
        self._rows_prices: tuple[LagrangeArrays, np.ndarray] | None = None
        """The memory rows' Lagrangian arrays and best prices (first reader's rule), where it ran: the mixed rule's
        ascent after the exact DP starts there (`lagrange_mixed`)."""

    def problem(self) -> DpProblem:
        """The DP's arrays of this trace and budget, built once per solve (its future-cost table is the costly
        part on long traces)."""
        if self._problem is None:
            from memsched.optimizer.dp import build_problem  # numba loads here, not on every CLI start

            self._problem = restrict(build_problem(self.trace, self.budget, self.deadline), self.allowed)
        return self._problem

    def bound_problem(self, cells: int) -> DpProblem:
        """The problem the proving sweeps run on: problem(), with the offload choices of layers that have too
        many saved tensors to enumerate relaxed into `cells` byte ranges, so that their bounds hold (the beam
        keeps real subsets: its plans are what it finds). problem() itself where every layer's subsets are
        enumerated."""
        if cells not in self._bound_problems:
            from memsched.optimizer.dp import relaxed_problem

            self._bound_problems[cells] = relaxed_problem(self.problem(), self.trace, cells)
        return self._bound_problems[cells]

    @property
    def best(self) -> Candidate:
        return self.cands[0]

    def left(self) -> float:
        return self.deadline - self.reserve - time.perf_counter()

    def until(self, share: float) -> float:
        """A phase deadline: `share` of the limit from now, never past the overall deadline."""
        return min(time.perf_counter() + share * self.options.time_limit_s, self.deadline - self.reserve)

    def until_from_start(self, share: float) -> float:
        """A phase deadline: `share` of the limit from the solve's start, never past the overall deadline."""
        return min(self.t0 + share * self.options.time_limit_s, self.deadline - self.reserve)

    def add(self, name: str, sim: SimResult) -> None:
        # A plan over the host budget is never a candidate (the DP's relaxation and its priced sweeps decode them).
        if sim.feasible and fits_host(sim, self.host):
            if not self.cands or sim.overhead_s < self.best.sim.overhead_s:
                self.improved_at = time.perf_counter()
            self.cands.append(Candidate(name, sim))
            self.cands.sort(key=lambda c: c.sim.overhead_s)

    def prove(self, value: float | None, source: str) -> None:
        if value is not None and value > self.bound:
            self.bound, self.bound_source = value, source

    def _proven_below(self) -> float | None:
        """The overhead at or below which a plan is proven within the requested gap by the bound found so far (the
        local search's target; None where no bound or gap makes one)."""
        return self.bound / (1.0 - self.options.gap) if self.bound > 0.0 and self.options.gap < 1.0 else None

    def proven(self) -> bool:
        obj = self.best.sim.overhead_s
        # 1e-6 relative: backends round (CP-SAT scales times to integer nanoseconds).
        return obj <= 0.0 or (obj - self.bound) <= (self.options.gap + 1e-6) * obj + 1e-12

    # ---------------------------------------------------------------- phases
    def prepare_kernels(self) -> None:
        """The compiled kernels (DP, local search), before the phases that share the clock: loading them takes
        ~0.2 s, but the first run on a machine compiles them (3-4 s), which the time limit cannot shorten; say so."""
        from memsched.optimizer.jit import prepare_kernels

        took = prepare_kernels()
        self.kernels_s = took
        if took > 0.25 * self.options.time_limit_s:
            self.notes.append(
                f"{took:.2g} s of the limit went to loading the optimizer's compiled kernels (once per "
                "process; the first use in an environment also compiles them)"
            )

    def beam(self, until: float) -> None:
        """Beams of growing width within the share: an answer early, a better one if time allows. Where copies run
        beside compute and a fluid beam misprices its plans, a FIFO beam follows it (`_fifo_beam`), and in each
        later round goes first. A cut beam decodes no plan, so a round that its series' growth says will not
        finish in the time left is not started (`_beam_round_fits`): its time goes to the other series or the
        next phase."""
        from memsched.optimizer.dp import beam_search  # numba loads here, not on every CLI start

        width = 24
        fluid_on = True
        fifo_on = self.fifo_beam_ok()
        mispriced = False  # the last fluid beam's plans cost more than it said (_mispriced)
        fluid_s: list[float] = []  # each width's fluid beam time, widest last
        fifo_s: list[float] = []  # each width's FIFO beam time, widest last
        ratios: list[float] = []  # each fluid beam's mispricing (_mispricing)
        price = 0.0  # the host budget's price per offloaded byte (host.py), raised while no plan fits the host
        # The first fluid round may finish past the share, up to _BEAM_FIRST_SHARE: cut, it decodes no plan, and the
        # local search then starts from the baselines' (_BEAM_FIRST_SHARE).
        first_until = max(until, self.until(_BEAM_FIRST_SHARE))

        def fifo_round() -> bool:
            """The FIFO beam's next round, where it may finish; False once one did not (or would not)."""
            if not _beam_round_fits(fifo_s, until):
                return False
            began = time.perf_counter()
            finished = self._fifo_beam(until, _FIFO_BEAM_FIRST * 4 ** len(fifo_s))  # 16, 64, 256, ... labels
            fifo_s.append(time.perf_counter() - began)
            return finished

        # Rounds of 4x the width, up to _MAX_BEAM_WIDTH: in each the fluid beam and, where the fluid beam misprices
        # its plans, the FIFO beam. Once it has, the FIFO beam goes first: its plans are priced as the simulator
        # prices them, and the fluid beam's wider rounds rank plans by a cost the simulator does not charge
        # (GPT-2 medium on an H100 at 50%: the fluid beam's best plans cost 0.0370, 0.0403, 0.0435, 0.0415 s at
        # 24-1536 labels; the FIFO beam of 256 finds 0.0347 s when it is not cut by the share after them).
        while width <= _MAX_BEAM_WIDTH and time.perf_counter() < until and (fluid_on or (fifo_on and mispriced)):
            fifo_first = fifo_on and mispriced
            if fifo_first:
                fifo_on = fifo_round()
            fluid_on = fluid_on and _beam_round_fits(fluid_s, until)
            if fluid_on:
                p = self.problem() if not price else dataclasses.replace(self.problem(), host_price=price, _remaps={})
                # A plan within the host budget costs at most its overhead + price x H in the priced sweep.
                shift = price * self.host if price and self.host is not None else 0.0
                began = time.perf_counter()
                out = beam_search(
                    self.trace,
                    self.budget,
                    until if fluid_s else first_until,
                    width=width,
                    threshold=self.best.sim.overhead_s + shift,
                    problem=p,
                )
                fitted = [sim for sim in out.schedules if fits_host(sim, self.host)]
                if fitted:
                    self.add("dp-beam", fitted[0])
                if out.timed_out:
                    break
                if out.schedules and not fitted and self.host_binds and price < 1e6 * self.price_scale:
                    price = next_price(price, None, self.price_scale)  # the same width again, offloads dearer
                    continue
                fluid_s.append(time.perf_counter() - began)
                if not price:
                    self.widest_beam = width
                ratio = _mispricing(out)
                if ratio is not None:
                    ratios.append(ratio)
                # The FIFO beam where the fluid beam misprices its own plans: their stalls, which the fluid sweep
                # drains as it goes, decide them (synthetic 200-layer chain: priced exactly, the FIFO beam only
                # takes the fluid beam's time; PipeDream ResNet-50 at 19%: the simulator's cost 1.28-1.36x the
                # sweep's).
                mispriced = _mispriced(out)
            if not fifo_first and fifo_on and mispriced:
                fifo_on = fifo_round()
            width *= 4
        self.stalls_decide = self.fifo_beam_ok() and bool(ratios) and min(ratios) > 1.0 + _STALLS_DECIDE
        self.priced_exactly = bool(ratios) and max(ratios) <= 1.0 + _PRICED_EXACTLY

    def fifo_beam_ok(self) -> bool:
        """The FIFO beam applies: copies run beside compute (on the compute thread the fluid beam prices them
        exactly), offload is allowed, the trace is short enough for the FIFO sweep, and no host budget binds (the
        FIFO sweep does not price host bytes, so its plans would mostly be discarded)."""
        return (
            self.trace.device.concurrent_copies
            and Action.OFFLOAD in self.allowed
            and self.trace.n <= FIFO_MAX_LAYERS
            and not self.host_binds
        )

    def _fifo_beam(self, until: float, width: int) -> bool:
        """One FIFO beam (dp.fifo_beam_search) of `width` labels per boundary, pruned at the best plan known; its
        plans join the candidates. False where the clock stopped it (a wider one would not finish either)."""
        from memsched.optimizer.dp import fifo_beam_search

        out = fifo_beam_search(
            self.trace, self.budget, until, width, threshold=self.best.sim.overhead_s, problem=self.problem()
        )
        for sim in out.schedules[:1]:
            self.add("dp-fifo-beam", sim)
        log.info(
            "fifo beam %d: best %s, %.2f s",
            width,
            f"{out.schedules[0].overhead_s:.6g} s" if out.schedules else "none below the incumbent",
            out.wall_s,
        )
        return not out.timed_out

    def lagrange(self, until: float) -> None:
        """The Lagrangian bounds (optimizer/dp/lagrange.py): on the memory rows where it is strong
        (_LAGRANGE_SHARE), whose prices then also prune the exact DP; on the fluid link windows where copies run
        beside compute on a trace long enough that the exact sweep may not finish (_LINK_MIN_LAYERS)."""
        from memsched.optimizer.dp.lagrange import LinkLagrangian, lagrange_arrays, lagrangian_bound, raise_future

        kind = lagrange_kind(self.trace, self.allowed)
        if kind is None:
            return
        if kind == LagrangeKind.LINK and self.stalls_decide:  # (stalls_decide holds on <= FIFO_MAX_LAYERS)
            # The link windows' bound is the LP of the fluid model, looser than the fluid sweep's own optimum,
            # which the sweep finds fast where stalls decide the plans (ResNet-50 at 1.5-2.6 GiB: 0.5-1.6 s); there
            # the FIFO climb after it is what proves, and it gets this time.
            log.info("link windows' Lagrangian skipped: the fluid beam mispriced its plans (stalls decide them)")
            return
        if kind == LagrangeKind.LINK and self.dp is not None and self.dp.fluid_optimum:
            # The DP probe found the fluid optimum, which the LP of the same fluid model cannot pass.
            log.info("link windows' Lagrangian skipped: the exact DP found the fluid optimum")
            return
        strong = kind == LagrangeKind.ROWS
        until = min(until, self.deadline - self.reserve)
        if until - time.perf_counter() < _LAGRANGE_MIN_S:
            return
        obj = self.best.sim.overhead_s
        p = self.bound_problem(_RELAXED_LADDER[-2])
        arrays = lagrange_arrays(p, self.trace)
        target = obj * (1.0 - self.options.gap)
        if strong:
            # Checkpoint inputs by the first reader's rule alone, the completion tables' own: the path's mix of rules
            # (lagrange._span_charges) bounds DAGs higher, but its prices prune the exact DP less (keep / recompute:
            # the 1,000-layer DAG at 20%, 0.938 -> 1.007 s, but DenseNet-121 at 75% proven in 13.7 s, not 6.6 s).
            res = lagrangian_bound(arrays, obj, until, target_s=target, first_reader_only=True)
        else:
            link = LinkLagrangian(arrays, obj)
            res = link.run(until, target_s=target)
            if res.stopped_by == "deadline":
                self._link = link
        log.info(
            "lagrangian bound (%s) %.6g s after %d prices, %.2f s (%s)",
            "memory rows" if strong else "link windows",
            res.bound_s,
            res.iterations,
            res.wall_s,
            res.stopped_by,
        )
        self.prove(res.bound_s, "lagrangian" if strong else "lagrangian-link")
        if strong and res.bound_s > 0.0 and not self.proven():
            # The same prices bound every completion of a partial plan: the exact DP prunes with the larger of
            # this and its own future-cost table (shared by every problem of this solve, so updated in place).
            raise_future(p, arrays, res.prices)
        if strong:
            self._rows_prices = arrays, res.prices
        if res.stopped_by == "deadline" and not self.proven():
            self._share_note = f"the Lagrangian bound stopped at its time share after {res.iterations} prices"
            self.notes.append(self._share_note)

    def lagrange_mixed(self, until: float) -> None:
        """Where the exact DP left the gap open on a trace whose checkpoint inputs several layers read: the memory
        rows' Lagrangian again with the path's mix of rules for them (lagrange._span_charges), from the first
        reader's rule's best prices (`lagrange`). That rule alone leaves such bytes nearly free where a producer's
        first reader is seldom recomputed (DAGs with skips, DenseNet's blocks); its prices are the ones that prune
        the DP best, so it runs first and this one, for the bound alone, after the DP (_LAGRANGE_MIXED_SHARE)."""
        from memsched.optimizer.dp.lagrange import lagrangian_bound

        if self._rows_prices is None or self.proven():
            return
        arrays, prices = self._rows_prices
        until = min(until, self.deadline - self.reserve)
        if not len(arrays.span_at) or until - time.perf_counter() < _LAGRANGE_MIN_S:
            return  # no producer is read by several layers: the rules agree
        obj = self.best.sim.overhead_s
        res = lagrangian_bound(arrays, obj, until, target_s=obj * (1.0 - self.options.gap), start=prices)
        log.info(
            "lagrangian bound (memory rows, mixed rule) %.6g s after %d prices, %.2f s (%s)",
            res.bound_s,
            res.iterations,
            res.wall_s,
            res.stopped_by,
        )
        self.prove(res.bound_s, "lagrangian")

    def polish(self, until: float) -> None:
        limit = until - time.perf_counter()
        if limit <= 0.05:
            return
        target = self._proven_below()
        seed, self.dp_seed = self.dp_seed, None
        if seed is not None and not self.proven():
            # The exact DP's optimum has the actions the bound says are best; where its copies' timing made it
            # simulate dearer than the incumbent, the local search (which re-times every candidate) starts there
            # for a share of its time (PipeDream ResNet-50 at 56%: the sweep's optimum 0.026937 s decoded to
            # 0.027509 s, polished back to 0.026937 s in under 0.5 s, where the incumbent's search ended at 0.027356 s).
            incumbent = self.best.sim
            self._polish_from(seed, _DP_SEED_SHARE * limit, target)
            limit = until - time.perf_counter()
            if self.proven() or limit <= 0.05:
                return
            if self.best.sim is not incumbent and self._rival is None:
                # The seed's search passed the incumbent, whose own basin would be left unsearched from here on:
                # a search from the incumbent races it (`_race`), and leaves once it trails and finds nothing.
                # (The H100 ResNet-50 at 75%, 10 s: the seed's search reached 0.004724 s, past the FIFO beam's
                # 0.004941 s, and stayed there; from the beam's plan the search finds 0.003892 s.)
                self._rival = self._local_search(incumbent.decisions)
        # The solve's last time (no phase after this one): a search that stops by itself leaves it to new ones.
        last = until >= self.deadline - self.reserve - 1e-3
        if self._rival is not None:
            self._race(until, target, last)
        elif last and self._link is not None and not self._link.done:
            self._polish_and_bound(until)
        else:
            self._polish_from(self.best.sim, limit, target, last)

    def _polish_and_bound(self, until: float) -> None:
        """The solve's last time where the link windows' Lagrangian stopped at its share (`lagrange`): it shares
        that time with the local search in turns of _SHARE_TURN_S, the answer first. A turn goes to the Lagrangian
        (resumed where it stopped) where it raised the bound faster in its last turn than the search lowered the
        answer in its own, but while the search keeps finding better plans the Lagrangian has at most as much of
        the time as the search; once the search has found nothing for _SHARE_STALE_S of its turns (or of the time
        since the best plan last improved), the Lagrangian may take up to _SHARE_MAX_TURNS turns in a row, and the
        search then gets one to measure it again. On the 1,000-layer chain at 20%, 10 s, the search from the ratio
        plan stops gaining at about 5 s, and the bound, cut at 10%, had 0.0884 s of the 0.097 s it reaches."""
        link = self._link
        assert link is not None
        try:
            self._share_turns(until, link)
        finally:
            log.info("link windows' Lagrangian resumed: bound %.6g s after %d prices", link.best, link.iterations)
            # Its share's note no longer says where it stopped.
            if self._share_note in self.notes:
                self.notes.remove(self._share_note)
            if not link.done and not self.proven():
                self.notes.append(f"the Lagrangian bound stopped at the time limit after {link.iterations} prices")

    def _share_turns(self, until: float, link: LinkLagrangian) -> None:
        """`_polish_and_bound`'s turns."""
        search_rate: float | None = None  # seconds of answer per second in its last turn (None: none yet)
        bound_rate = link.recent_rate(_SHARE_TURN_S)  # seconds of bound per second in its last turn
        stale = time.perf_counter() - self.improved_at  # search time without a better plan (at first: wall time)
        search_s = bound_s = 0.0  # seconds each side has had
        in_a_row, last_side = 0, ""
        while not self.proven():
            left = until - time.perf_counter()
            if left <= 0.05:
                return
            target = self._proven_below()
            if link.done:
                self._polish_from(self.best.sim, left, target, restart=True)
                return
            stuck = stale >= _SHARE_STALE_S
            bound_turn = (
                search_rate is not None
                and bound_rate > search_rate
                and (stuck or bound_s < search_s)
                and not (last_side == "bound" and in_a_row >= _SHARE_MAX_TURNS)
            )
            side = "bound" if bound_turn else "search"
            in_a_row = in_a_row + 1 if side == last_side else 1
            last_side = side
            turn = min(_SHARE_TURN_S, left)
            began = time.perf_counter()
            if side == "search":
                before = self.best.sim.overhead_s
                self._polish_from(self.best.sim, turn, target, restart=True)
                took = time.perf_counter() - began
                search_s += took
                search_rate = (before - self.best.sim.overhead_s) / max(took, 1e-6)
                stale = 0.0 if search_rate > 0.0 else stale + took
            else:
                before = link.best
                res = link.run(began + turn, target_s=self.best.sim.overhead_s * (1.0 - self.options.gap))
                self.prove(res.bound_s, "lagrangian-link")
                took = time.perf_counter() - began
                bound_s += took
                bound_rate = (link.best - before) / max(took, 1e-6)
            log.debug("last time, %s turn: search %s s/s, bound %.3g s/s", side, search_rate, bound_rate)

    def late_beam(self, until: float) -> None:
        """Where the gap is still open on a long trace: one fluid beam much wider than `beam`'s, pruned at the best
        plan known, its width sized by a probe's time to end by `until` (_LATE_BEAM_SAFETY, _LATE_BEAM_MIN_WIDTH,
        _LATE_BEAM_MIN_GROWTH). Its plan joins the candidates and seeds a second local search, which the last one
        races (`_race`): a local search's answer depends on its start, and a wide beam's plan lies in another basin
        of the same problem (the 200-layer synthetic chain at 20%: 0.0336 s after 9 s from the incumbent, 0.0286 s
        from a 6,144-label beam's plan). The incumbent's own search goes on beside it, so a beam plan that polishes
        worse costs time, not the answer."""
        from memsched.optimizer.dp import beam_search

        if self.proven() or not self.widest_beam:
            log.info("late beam skipped: %s", "proven" if self.proven() else "no beam round finished")
            return
        if self.stalls_decide:
            # The fluid beams mispriced every plan they found: a wider one ranks plans by the same wrong costs.
            log.info("late beam skipped: stalls decide the plans (the fluid beams mispriced them)")
            return
        if self.dp_seed is not None or (self.dp is not None and self.dp.fluid_optimum):
            # The exact DP found the fluid optimum: the local search from its plan (`polish`) is what closes the
            # gap, and needs the time (DenseNet-121 at 75%, 10 s: proven at 9.9 s, not proven with a late beam).
            log.info("late beam skipped: the exact DP found the fluid optimum")
            return
        until = min(until, self.deadline - self.reserve)
        # Pruned at a better incumbent than `beam`'s, a beam of the same width is several times faster (DenseNet-121
        # at 50%: 192 labels in 0.36 s); so a probe at `beam`'s widest width times it, and the wide one is sized by
        # that, its time about linear in the width.
        probe_width = self.widest_beam
        began = time.perf_counter()
        out = beam_search(
            self.trace,
            self.budget,
            until,
            width=probe_width,
            threshold=self.best.sim.overhead_s,
            problem=self.problem(),
        )
        probe_s = time.perf_counter() - began
        # The probe's plan is a candidate but seeds no search: `beam` ran as wide, so its basin is one `beam` found.
        # As the best plan, though, it is where the last local search starts, so a probe that can only lead to a skip
        # is still run whole (cut where it could no longer leave room for the late beam, PipeDream ResNet-50 with
        # every node output saved at 25%, 10 s, ended at 0.065503 s instead of 0.064151 s, twice; 2026-11-30).
        for sim in out.schedules[:1]:
            self.add("dp-beam", sim)
        width = min(
            _LATE_BEAM_MAX_WIDTH, int(probe_width * _LATE_BEAM_SAFETY * (until - time.perf_counter()) / probe_s)
        )
        if out.timed_out or width < max(_LATE_BEAM_MIN_WIDTH, _LATE_BEAM_MIN_GROWTH * probe_width):
            log.info("late beam skipped: %d labels fit its share (probe: %d in %.2f s)", width, probe_width, probe_s)
            return
        out = beam_search(
            self.trace, self.budget, until, width=width, threshold=self.best.sim.overhead_s, problem=self.problem()
        )
        wide = [sim for sim in out.schedules[:1] if fits_host(sim, self.host)]
        log.info(
            "late beam %d (probe %d in %.2f s): best %s, %.2f s%s",
            width,
            probe_width,
            probe_s,
            f"{wide[0].overhead_s:.6g} s" if wide else "none below the incumbent",
            out.wall_s,
            " (cut)" if out.timed_out else "",
        )
        if wide:
            self.add("dp-beam", wide[0])
            self._rival = self._local_search(wide[0].decisions)

    def _race(self, until: float, target: float | None, restart: bool = False) -> None:
        """The last local search (going on where it stopped) and a rival from another basin: the late beam's plan
        (`late_beam`), or the incumbent that the exact DP's seed's search passed (`polish`), taking turns of
        _RACE_TURN_S until `until`. The rival leaves the race once it trails the other and has found nothing better
        in _RACE_PATIENCE turns in a row; a search that stops by itself leaves the other the rest."""
        if self._search is None:
            self._search = self._local_search(self.best.sim.decisions)
        main, rival = self._search, self._rival
        assert rival is not None
        racers = [main, rival]
        turn = 0
        stale = 0  # the rival's turns in a row without a better plan
        while racers and not self.proven():
            left = until - time.perf_counter()
            if left <= 0.05:
                break
            search = racers[turn % len(racers)]
            found = search.found_s
            res = search.run(min(left, _RACE_TURN_S), target)
            if res.improved:
                self.add("local-search", res.sim)
            if search is rival:
                stale = 0 if search.found_s < found else stale + 1
            if search.finished or (search is rival and stale >= _RACE_PATIENCE and rival.found_s > main.found_s):
                log.debug(
                    "race: the %s search leaves at %.6g s", "rival" if search is rival else "main", search.found_s
                )
                racers.remove(search)
            else:
                turn += 1
        self._search_at = self._search.best
        left = until - time.perf_counter()
        if restart and left > 0.05 and not self.proven():
            # Both searches stopped by themselves: new ones from the best plan get the rest (`_polish_from`).
            self._polish_from(self.best.sim, left, target, restart)

    def _polish_from(self, start: SimResult, limit: float, target: float | None, restart: bool = False) -> None:
        """The local search from `start` for `limit` seconds; a better plan than `start` joins the candidates.
        Where `start` is where the last local search stands (its result, or its start if it found nothing
        better), that search goes on where it stopped instead of starting again (LocalSearch)."""
        end = time.perf_counter() + limit
        if self._search is None or start is not self._search_at:
            self._search = self._local_search(start.decisions)
        fruitless = 0  # restarts in a row that found nothing better
        while True:
            best = self.best.sim.overhead_s
            res = self._search.run(end - time.perf_counter(), target)
            self._search_at = res.sim if res.improved else start
            if res.improved:
                self.add("local-search", res.sim)
            fruitless = 0 if self.best.sim.overhead_s < best else fruitless + 1
            # With `restart` (the solve's last time), a search that stopped by itself (its kicks found nothing for
            # _MAX_STALE_RESTARTS in a row) leaves the time the user gave to an open gap: a new one from the best
            # plan, with its own seed, kicks elsewhere, until _MAX_FRUITLESS_RESTARTS in a row find nothing (a
            # small trace's searches then stop in milliseconds: its plans are exhausted). Earlier, the phases that
            # follow get that time.
            if not restart or not self._search.finished or self.proven() or end - time.perf_counter() <= 0.05:
                return
            if fruitless > _MAX_FRUITLESS_RESTARTS:
                return
            start = self.best.sim
            self._restarts += 1
            self._search = self._local_search(start.decisions, seed=self._restarts)

    def _local_search(self, start: list[Decision], seed: int = 0) -> LocalSearch:
        """A local search from `start`, with this solve's actions and host budget."""
        return LocalSearch(self.trace, self.budget, start, seed=seed, allowed=self.allowed, host_budget=self.host)

    def fifo_applies(self) -> bool:
        """Whether the FIFO sweep runs here: concurrent copies (with serial ones the fluid sweep is exact already)
        and at most FIFO_MAX_LAYERS layers."""
        return self.trace.n <= FIFO_MAX_LAYERS and self.trace.device.concurrent_copies

    def _fifo_sweep(self, until: float, incumbent_s: float, gap: float, cells: int, max_labels: int) -> DpOutcome:
        """One FIFO sweep (dp.fifo_search) pruned at incumbent x (1 - gap), on `cells` byte ranges per relaxed
        layer: its best plan joins the candidates, its bound is proved."""
        from memsched.optimizer.dp import fifo_search

        out = fifo_search(
            self.trace,
            self.budget,
            until,
            incumbent_s,
            gap,
            problem=self.bound_problem(cells),
            max_labels=max_labels,
        )
        for sim in out.schedules[:1]:
            self.add("dp-fifo", sim)
        self.prove(out.bound_s, "dp-fifo")
        return out

    def fifo_dp(self, until: float) -> None:
        """Tier 2: the exact sweep with FIFO copy queues until `until`; a proof where it finishes."""
        if not self.fifo_applies():
            return
        until = min(until, self.deadline - self.reserve)
        seconds = until - time.perf_counter()
        if seconds < 0.05:
            return
        cap = max(20_000, min(_FIFO_MAX_LABELS, int(_FIFO_LABELS_PER_S * seconds)))
        out = self._fifo_sweep(until, self.best.sim.overhead_s, self.options.gap, _RELAXED_LADDER[0], cap)
        self.fifo_timed_out = out.timed_out
        self.fifo_capped = out.cap_hit
        if out.schedules or self.proven():
            self.dp = out
        self.fifo_note = out.message or None
        log.info(
            "fifo sweep: bound %s, peak %d labels, %.2f s (%s)",
            out.bound_s,
            out.peak_labels,
            out.wall_s,
            out.message or "finished",
        )

    def prove_start(self, until: float) -> None:
        """Where the solve starts from an earlier answer (the best candidate then, its bound proved): the exact
        sweeps up to its threshold, incumbent x (1 - gap), until `until` (_PROVE_SHARE). The fluid sweep first
        (stopped at its pace where it cannot finish): finished, it proves the gap, or finds its optimum, which
        proves the gap where the simulator prices that plan as the sweep does. Where the simulator prices it
        dearer (by over _MISPRICED: stalls decide) and the FIFO sweep applies, the FIFO sweep at the threshold
        with up to _PROVE_TOP_SHARE of the time: an answer that a whole solve left is near the optimum, and this
        one sweep proves it or finds the optimum below it. Cut, FIFO sweeps climb from the bound proven so far
        (`fifo_climb`) with the rest; what they leave open, the rest of the plan takes up as usual."""
        until = min(until, self.deadline - self.reserve)
        fluid = self._fluid_sweep(until, _RELAXED_LADDER[0], pace=_LONG_PACE)
        # The simulator's cost of the sweep's best plan over its bound (None: cut, or no plan below the threshold).
        ratio = None
        if fluid.schedules and fluid.bound_s and not (fluid.timed_out or fluid.cap_hit):
            ratio = fluid.schedules[0].overhead_s / fluid.bound_s
        log.info("prove from the start: exact DP, bound %s, %.2f s, its plan x%s", fluid.bound_s, fluid.wall_s, ratio)
        fifo = self.fifo_applies() and self.allowed == ALL_ACTIONS and not self.host_binds
        if self.proven() or not fifo or ratio is None or ratio <= 1.0 + _MISPRICED:
            return
        now = time.perf_counter()
        top_until = now + _PROVE_TOP_SHARE * (until - now)
        out = self._fifo_sweep(
            top_until, self.best.sim.overhead_s, self.options.gap, _RELAXED_LADDER[0], _FIFO_MAX_LABELS
        )
        log.info("prove from the start: FIFO sweep at the threshold, bound %s, %.2f s", out.bound_s, out.wall_s)
        if not self.proven() and not out.schedules:
            self.fifo_climb(until, _RELAXED_LADDER[0])

    def ratio(self, until: float) -> None:
        """The ratio plan (optimizer/ratio.py) joins the candidates. After the beam, whose rounds are pruned at the
        best plan known: a strong start there leaves them nothing to decode, and then nothing to judge their own
        pricing by (`priced_exactly`, `stalls_decide`), which the phases after them read."""
        began = time.perf_counter()
        sim = ratio_plan(self.trace, self.budget, self.allowed, self.host, until)
        if sim is not None:
            self.add("ratio", sim)
        log.info(
            "ratio plan: %s, %.2f s",
            "none fits" if sim is None else f"{sim.overhead_s:.6g} s",
            time.perf_counter() - began,
        )

    def dp_probe(self, until: float) -> None:
        """The exact DP before the bounds and the local search, where the fluid beams priced their plans exactly
        (`priced_exactly`), every layer's offload subsets are enumerated and no host budget binds: its optimum is
        then what the simulator says, so a finished sweep ends the solve (_DP_PROBE_SHARE). Cut by its share, it has
        proved what it can; the exact DP phase runs again later, pruned by a better incumbent."""
        if not self.priced_exactly or self.host_binds or not self.problem().offload_complete:
            return
        out = self._fluid_sweep(until, _RELAXED_LADDER[0], climb=True, pace=_PROBE_PACE)
        log.info("exact DP probe: bound %s, %.2f s%s", out.bound_s, out.wall_s, " (cut)" * out.timed_out)

    def dp_first(self, until: float, last_until: float | None = None) -> None:
        """The exact DP before the local search (_DP_FIRST_SHARE), where the fluid sweeps finish fast and prove: on
        the memory rows (no copies beside compute: the fluid model is exact, and the Lagrangian's prices prune it),
        and where some layer has too many saved tensors to try every offload subset (its relaxed sweeps, coarse
        first, are what proves there; the FIFO probe runs on their coarsest ranges). Not on the other traces with
        copies beside compute: where stalls decide, the FIFO probe and climb prove, and need the time.
        `last_until`: the exact DP phase's own end, to which the finest relaxed step may run (_DP_FIRST_SHARE)."""
        rows = lagrange_kind(self.trace, self.allowed) == LagrangeKind.ROWS
        if rows or not self.problem().offload_complete:
            self.exact_dp(until, last_until)

    def _fluid_sweep(
        self, until: float, cells: int, climb: bool = False, pace: float | None = None, from_proven: bool = False
    ) -> DpOutcome:
        """The exact DP's sweeps (exact_search) on `cells` byte ranges per relaxed layer, pruned at the best
        candidate; its plan joins the candidates (and seeds the next local search where it simulates dearer than
        the best), its bound is proved. `from_proven`: a climb starts just above the bound proven so far
        (exact_search's climb_from_proven)."""
        from memsched.optimizer.dp import exact_search

        out = exact_search(
            self.trace,
            self.budget,
            until,
            self.best.sim.overhead_s,
            self.options.gap,
            problem=self.bound_problem(cells),
            climb=climb,
            proven_s=self.bound,
            pace=pace,
            climb_from_proven=from_proven,
        )
        self.dp = out
        if not out.timed_out and not out.cap_hit:
            self.fluid_cells = cells
            self._finished((cells, None, None), out)
        if out.schedules:
            self.add("dp", out.schedules[0])
            if self.best.sim is not out.schedules[0] and fits_host(out.schedules[0], self.host):
                self.dp_seed = out.schedules[0]
        self.prove(out.bound_s, "dp")
        return out

    def fifo_probe(self) -> None:
        """The FIFO sweep first, for a share of the limit (see _FIFO_SHARE), unless the fluid beams priced their
        plans exactly (`priced_exactly`): the FIFO sweep stops at its label cap far below the fluid bound there,
        and the climb it would start finds nothing (ResNet-50 at 6.7 GiB: 3 s)."""
        if self.priced_exactly:
            log.info("fifo probe skipped: every fluid beam's plan cost what the fluid sweep said")
            return
        share = max(_FIFO_SHARE * self.options.time_limit_s, _FIFO_MIN_S)
        self.fifo_dp(time.perf_counter() + share)

    def fifo_again(self, until: float) -> None:
        """Where the FIFO probe stopped (its time share or its label cap) and the fluid sweep then finished with
        the gap open, FIFO sweeps climb from the proven bound (`fifo_climb`): a loose fluid bound is what the FIFO
        sweep exists to replace, and each finished step proves its threshold, where one sweep at the incumbent
        proves nothing until it ends (PipeDream ResNet-50 at 2.25 GiB: 22 s at the incumbent on one core, 0.6 s
        at 0.169 s, 1.15 s at 0.174 s). Where layers offload relaxed byte ranges, the probe ran on the coarsest
        (_RELAXED_LADDER[0]), whose FIFO optimum can lie below the fluid bound of finer ranges; the climb then runs
        on the finest ranges the fluid ladder finished, up to _FIFO_RELAXED_CELLS, whether the probe stopped or not."""
        if not self.fifo_applies() or self.fluid_cells is None or self.proven() or self.left() <= 1.0:
            return
        cells = min(self.fluid_cells, _FIFO_RELAXED_CELLS)
        if self.fifo_capped or self.fifo_timed_out or cells > _RELAXED_LADDER[0]:
            self.fifo_climb(min(until, time.perf_counter() + _FIFO_CLIMB_SHARE * self.left()), cells)

    def fifo_climb(self, until: float, cells: int = _RELAXED_LADDER[0]) -> None:
        """FIFO sweeps at thresholds climbing from the proven bound towards incumbent x (1 - gap), each step sized
        by its predicted time (dp.next_threshold). Each one that finishes proves its threshold, or finds the
        exact optimum below it. A step the clock or the label cap stops proves nothing new; the climb then falls
        back to a third of the way from the last proven threshold to the one that failed (_FIFO_CLIMB_RETRIES
        times), so a prediction that was too bold costs one step's share, not the rest of the climb. The top step,
        which alone proves the gap, comes as soon as it is predicted to fit (_FIFO_CLIMB_TOP_SHARE) and may run
        to twice its prediction (_FIFO_CLIMB_TOP_MARGIN)."""
        from memsched.optimizer.dp import next_threshold, predicted_s

        start = self.bound
        top = self.best.sim.overhead_s * (1.0 - self.options.gap)
        if top <= start:
            return
        span = top - start
        threshold: float | None = start + _FIFO_CLIMB_FIRST * span
        timed: list[tuple[float, float]] = []
        ceiling = float("inf")  # the lowest threshold whose sweep did not finish
        retries = 0
        while threshold is not None and not self.proven():
            seconds = until - time.perf_counter()
            if seconds < 0.05:
                break
            began = time.perf_counter()
            # No step below the top takes all the time left: the first has no timing to be sized by, and a later
            # one's prediction may be off; what a cut step leaves goes to the fallback or the phases after the climb.
            share = _FIFO_CLIMB_STEP_SHARE if timed else _FIFO_CLIMB_FIRST_SHARE
            step_s = share * seconds
            if timed and threshold >= top:  # the top alone ends the search: a margin over its prediction
                step_s = max(step_s, min(seconds, _FIFO_CLIMB_TOP_MARGIN * predicted_s(timed, top, span)))
            # Labels are bounded by memory only: the sweep's clock keeps it within its share, and a step that
            # would pass the cap is one that failed.
            out = self._fifo_sweep(began + step_s, threshold, 0.0, cells, _FIFO_MAX_LABELS)
            log.info("fifo climb: threshold %.6g s, bound %s, %.2f s", threshold, out.bound_s, out.wall_s)
            if out.schedules:
                break  # the exact optimum lies below this threshold: found
            if out.timed_out or out.cap_hit:
                proven = timed[-1][0] if timed else start
                ceiling = threshold
                retries += 1
                fallback = proven + (threshold - proven) / 3.0
                threshold = fallback if retries <= _FIFO_CLIMB_RETRIES and fallback > self.bound else None
                continue
            if threshold >= top:
                break
            timed.append((threshold, time.perf_counter() - began))
            threshold = next_threshold(timed, top, until - time.perf_counter(), span, _FIFO_CLIMB_TOP_SHARE)
            if threshold is not None and threshold >= ceiling:
                threshold = (timed[-1][0] + ceiling) / 2.0  # below the step that failed
        if timed:
            self.fifo_note = (
                f"the FIFO sweep proved {self.bound:.6g} s, climbing from the fluid bound {start:.6g} s; its next "
                "step would pass its label cap or its time"
            )

    def exact_dp(self, until: float, last_until: float | None = None) -> None:
        """The exact DP's sweeps. Where layers have too many saved tensors to enumerate, they run on relaxed byte
        ranges, coarse first (they finish fast and prove a bound), then finer while the gap is open and time
        remains; `last_until`: there the finest step may run to this time instead of `until` (`dp_first`)."""
        if self.dp is not None and self.dp.fluid_optimum:
            return  # an earlier run found the fluid optimum: another would prove no more
        relaxed = not self.problem().offload_complete
        # Where the memory rows' prices do not prune the DP: from _PACED_MIN_LAYERS its sweeps stop at their pace.
        rows = lagrange_kind(self.trace, self.allowed) == LagrangeKind.ROWS
        long_trace = self.trace.n > _LONG_TRACE and not rows
        # Over _LONG_TRACE layers on the memory rows too: there the prices let most sweeps finish, and a pace that
        # says one cannot gives its time to the mixed rule's bound and the local search (the 1,000-layer DAG at
        # 20%, keep / recompute, 10 s: the sweep spent 4.8 s to reach layer 17 of 1,000).
        paced = self.trace.n >= _PACED_MIN_LAYERS and (not rows or self.trace.n > _LONG_TRACE)
        # From _PACED_MIN_LAYERS with copies beside compute they climb from the bound held (_MID_CLIMB_PACE).
        climbs = long_trace or (paced and not rows)
        if relaxed:
            self._coarse_dp(until)
        ladder = self.relaxed_ladder() if relaxed else _RELAXED_LADDER[:1]
        for i, cells in enumerate(ladder):
            last = i == len(ladder) - 1
            end = max(until, last_until) if relaxed and last and last_until is not None else until
            if self.proven() or (i > 0 and end - time.perf_counter() < 0.05):
                break
            if (cells, None, None) in self.finished_sweeps:
                continue  # an earlier run finished it (finished_sweeps)
            # A relaxed step's cost does not grow with its ranges (fewer ranges free more bytes per copy, so
            # fewer labels are pruned): each but the last gets at most _LADDER_STEP_SHARE of the time left, and
            # one cut by that share makes way for the next.
            capped = relaxed and not last
            now = time.perf_counter()
            step_until = now + _LADDER_STEP_SHARE * (until - now) if capped else end
            out = self._fluid_sweep(
                step_until,
                cells,
                climb=self.host_binds or climbs,
                pace=None if not paced else _MID_CLIMB_PACE if climbs and not long_trace else _LONG_PACE,
                from_proven=climbs,
            )
            log.info(
                "exact DP: %d ranges: bound %s, %.2f s%s", cells, out.bound_s, out.wall_s, " (cut)" * out.timed_out
            )
            if not self.bound_problem(cells).relaxed or out.cap_hit or (out.timed_out and not capped):
                break
        if self.dp is not None and self.dp.message and self.dp.message not in self.notes:
            self.notes.append(self.dp.message)
        if self.host_binds and not self.proven() and self.dp is not None and not self.dp.timed_out:
            self.lagrangian(until, cells)

    def _finished(self, key: SweepKey, out: DpOutcome) -> None:
        """Record a finished sweep (finished_sweeps)."""
        if not self.host_binds:
            self.finished_sweeps[key] = out.bound_s or 0.0

    def relaxed_ladder(self) -> tuple[int, ...]:
        """The byte ranges of the exact DP's successive relaxed sweeps: the coarsest, then the fewest ranges at
        which the relaxation is near exact (_near_exact_cells) as the last step; _RELAXED_LADDER where no
        number of ranges up to _NEAR_EXACT_CELLS' largest is."""
        near = self.near_exact_cells
        return _RELAXED_LADDER if near is None else (_RELAXED_LADDER[0], near)

    @functools.cached_property
    def near_exact_cells(self) -> int | None:
        """_near_exact_cells of this trace (computed once)."""
        return _near_exact_cells(self.trace)

    def lagrangian(self, until: float, cells: int) -> None:
        """The host budget priced into the exact DP (optimizer/host.py): each price lambda gives the bound
        DP(lambda) - lambda x H on every plan within the host budget, and its minimiser, a candidate where it fits.
        The price is bisected on the sign of (minimiser's host bytes - H), the subgradient of that concave bound."""
        assert self.host is not None
        lo, hi = 0.0, None
        over: tuple[float, int] | None = None  # (overhead, host bytes) of the last minimiser over H, and within
        within: tuple[float, int] | None = None
        tried: set[float] = set()
        for _ in range(MAX_PRICES):
            if self.proven() or until - time.perf_counter() < 0.05:
                return
            price = next_price(lo, hi, self.price_scale, over, within)
            if price in tried:
                return  # the cutting plane repeats itself: this bound is the best these plans give
            tried.add(price)
            res = priced_sweep(
                self.trace,
                self.budget,
                self.bound_problem(cells),
                self.host,
                price,
                self.best.sim.overhead_s,
                self.options.gap,
                until,
            )
            self.prove(res.bound_s, "dp-lagrangian")
            for sim in res.dp.schedules:
                self.add("dp-lagrangian", sim)
            if res.dp.timed_out or res.dp.cap_hit or not res.dp.schedules:
                return  # the clock, or nothing left below the threshold: its bound closes the gap then
            chosen = min(res.dp.schedules, key=lambda sim: sim.overhead_s + price * sim.host_peak_bytes)
            if chosen.host_peak_bytes > self.host:
                lo, over = price, (chosen.overhead_s, chosen.host_peak_bytes)
            else:
                hi, within = price, (chosen.overhead_s, chosen.host_peak_bytes)

    def _coarse_dp(self, until: float) -> None:
        """Coarse relaxed sweeps first (_COARSE_LADDER), coarsest first, each with the time left: each finished
        one proves a bound (the best is kept: every step is a relaxation of the real problem), and the first that
        the clock stops ends the ladder, as a finer one would not finish either; so does, where the ranges are
        near exact, a finished step that proves no more than the one before. A step whose first threshold lies at
        or below the bound proven so far starts at the top threshold (exact_search's proven_s)."""
        from memsched.optimizer.dp import exact_search

        previous: float | None = None  # the last finished step's bound
        near_exact = self.near_exact_cells is not None
        steps: tuple[tuple[int, int, int], ...] = _COARSE_LADDER
        if self.problem().serial:
            # Copies on the compute thread leave no backlogs, so a step that only refines their quantum is the step
            # before it again (a CPU Llama of 48 blocks at 50%: 0.4-0.7 s for the same bound).
            steps = tuple(dict.fromkeys((cells, shift, shift) for cells, shift, _ in _COARSE_LADDER))
        for cells, shift, backlog_shift in steps:
            if until - time.perf_counter() < 0.05 or self.proven():
                return
            done = self.finished_sweeps.get((cells, shift, backlog_shift))
            if done is not None:  # an earlier run finished it (finished_sweeps): where its ladder went on, go on
                if near_exact and previous is not None and done <= previous:
                    return
                previous = done
                continue
            p = self.bound_problem(cells)
            out = exact_search(
                self.trace,
                self.budget,
                until,
                self.best.sim.overhead_s,
                self.options.gap,
                problem=p,
                quantum_bytes=max(1, p.limit >> shift),
                climb=self.host_binds,
                proven_s=self.bound,
                backlog_quantum_bytes=max(1, p.limit >> backlog_shift),
            )
            if out.schedules:
                self.add("dp", out.schedules[0])
            self.prove(out.bound_s, "dp")
            log.info(
                "coarse DP: %d ranges at limit / 2^%d (backlogs 2^%d): bound %s, %.2f s",
                cells,
                shift,
                backlog_shift,
                out.bound_s,
                out.wall_s,
            )
            if out.timed_out or out.cap_hit:
                return
            self._finished((cells, shift, backlog_shift), out)
            bound = out.bound_s or 0.0
            if near_exact and previous is not None and bound <= previous:
                # A finer step that proves no more than the one before, where the exact sweeps after the ladder
                # run on near-exact ranges: they prove more than the rounding lets any coarse step prove, and get
                # the time (gpt2-medium on an H100 at 75%: 0.0138 s at 32 and at 64 ranges, then 0.0143 s at
                # limit / 2^12 in 1.7 s, where the near-exact sweep proves 0.0160 s in 2-2.5 s). Elsewhere the
                # finer quanta still pay (a CPU Llama of 48 blocks at 50%: 0.0303 s twice, then 0.0308 s).
                return
            previous = bound

    def milp(self, backend: SolverName, exact_windows: bool = False) -> None:
        """A MILP backend with what is left; `exact_windows`: W = L = n, so the model covers every schedule."""
        if self.left() < _MILP_MIN_LEFT_S:
            self.notes.append(f"no time left for {backend}")
            return
        options = self.options
        if exact_windows:
            options = options.model_copy(update={"window": self.trace.n, "max_segment": self.trace.n})
        starts = [c.sim.decisions for c in self.cands]
        outcome, exact = _run_backend(
            self.trace,
            self.budget,
            options,
            backend,
            starts,
            self.deadline - self.reserve,
            self.resources,
            offload=Action.OFFLOAD in self.allowed,
        )
        self.outcome = outcome
        if outcome.status == SolverStatus.INFEASIBLE:
            raise SolverError(
                f"{backend} reported the model infeasible although the budget is feasible "
                f"({outcome.message}); this is a bug: please report it with --export-model output"
            )
        if outcome.decisions is None:
            self.notes.append(f"{backend} found no schedule ({outcome.message})")
        else:
            sim = simulate(self.trace, outcome.decisions, self.budget, with_events=False)
            if sim.feasible and not fits_host(sim, self.host):
                # The MILP's host row holds its solution within the budget up to the solver's tolerance.
                self.notes.append(f"{backend} returned a schedule over the host budget (discarded)")
            elif not sim.feasible:
                # The MILP's memory leaves out the last layer's saved-twice hold at the loss point
                # (docs/formulation.md, 'Saved twice') and relaxes a few holds (DpProblem.output_relaxed's);
                # else the solver's tolerance.
                log.info(
                    "%s incumbent simulates over budget (%d > %d bytes): a hold the MILP's memory leaves out, or "
                    "its tolerance; discarded",
                    backend,
                    sim.peak_bytes,
                    self.budget,
                )
                self.notes.append(f"{backend} returned a schedule over budget (discarded)")
            else:
                self.ilp_sim = sim
                if outcome.objective_s is not None and BACKENDS[backend].objective_is_simulated:
                    diff = abs(outcome.objective_s - sim.overhead_s)
                    if diff > 1e-6 * max(sim.overhead_s, 1e-6):
                        log.warning(
                            "%s objective %.9g s differs from the simulated %.9g s",
                            backend,
                            outcome.objective_s,
                            sim.overhead_s,
                        )
                self.add("ilp", sim)
                self.notes.append(f"{backend}: {outcome.message}")
        if outcome.bound_s is not None:
            if exact:
                self.prove(outcome.bound_s, backend)
            else:
                self.notes.append(
                    f"{backend}'s bound within its windows (W={self.options.window or 'default'}, "
                    f"L={self.options.max_segment or 'default'}) is {outcome.bound_s:.6g} s; it does not bound "
                    "schedules outside them, so it is not reported as a bound"
                )

    # ---------------------------------------------------------------- the answer
    def report(self) -> SolveReport:
        best = self.best
        obj = best.sim.overhead_s
        wall = time.perf_counter() - self.t0
        status = SolverStatus.OPTIMAL if self.proven() else SolverStatus.FEASIBLE
        # The plain sentence for the user; the phases' own words go to `details`.
        details = [f"best schedule from {best.name}"]
        if self.bound_source != "none":
            details.append(f"lower bound {self.bound:.6g} s from {self.bound_source}")
        if self.host_binds:
            note = f"host budget {self.host} bytes: plans over it discarded"
            if self.bound_source in ("dp", "dp-fifo"):
                note += "; the bound leaves it out (a relaxation: still a true bound)"
            elif self.bound_source != "none":
                note += "; the bound accounts for it"
            details.append(note)
        notes = [*self.notes, self.fifo_note] if self.fifo_note and status != SolverStatus.OPTIMAL else self.notes
        details += notes
        gap = (obj - min(self.bound, obj)) / obj if obj > 0 else 0.0
        msg = plain_summary(
            status,
            obj,
            self.bound,
            self.bound_source,
            gap,
            self.options.gap,
            self.options.time_limit_s,
            wall,
            self.kernels_s,
        )
        rec = _record(best.name, status, obj, wall, msg, bound=self.bound, details=details)
        schedule = make_schedule(self.trace, best.sim.decisions, self.budget, best.name, rec)
        return SolveReport(schedule, self.outcome, self.ilp_sim, self.dp)


def _mispricing(out: DpOutcome) -> float | None:
    """The simulator's cost of a fluid beam's best plan over the sweep's own (None: no plan, or a free one)."""
    if out.swept_s is None or not out.schedules or out.swept_s <= 0.0:
        return None
    return out.schedules[0].overhead_s / out.swept_s


def _mispriced(out: DpOutcome) -> bool:
    """Whether the simulator prices a fluid beam's best plan at least _MISPRICED above the sweep's own cost."""
    ratio = _mispricing(out)
    return ratio is not None and ratio > 1.0 + _MISPRICED


def _beam_round_fits(times: list[float], until: float) -> bool:
    """Whether a beam's next round (4x the width of the last) may finish by `until`: its time predicted as the
    last round's times the growth between the last two (at least 1). That growth rises with the width (2.0-3.6x
    from 384 to 1536 labels on the H100 decoders and a CPU Llama of 48 blocks), so the prediction errs low: it
    rarely skips a round that would finish, while a cut beam decodes no plan (the fluid beam of 1536 labels on
    that Llama at 50%: 1.25 s of a 2 s share, for nothing). Fewer than two rounds: it may."""
    if len(times) < 2:
        return True
    growth = max(1.0, times[-1] / max(times[-2], 1e-9))
    return time.perf_counter() + growth * times[-1] <= until


def backend_limit(seconds_left: float) -> float:
    """The limit to hand a MILP backend so that it, and CBC's kill grace after it, end within what is left."""
    return max(0.1, min(seconds_left - grace_s(seconds_left), seconds_left / 1.05))


def _zero_overhead(trace: Trace, budget_bytes: int, best: Candidate, wall: float) -> SolveReport:
    """No stall and no recompute: nothing can do better, so nothing has to be proved."""
    rec = _record(
        best.name,
        SolverStatus.OPTIMAL,
        0.0,
        wall,
        f"the {best.name} schedule fits the budget with no overhead: optimal",
        bound=0.0,
    )
    return SolveReport(make_schedule(trace, best.sim.decisions, budget_bytes, best.name, rec), None, None)


def _heuristic_only(trace: Trace, budget_bytes: int, flow: _Flow) -> SolveReport:
    best = flow.best
    heur = next((c for c in flow.cands if c.name == "heuristic"), None)
    msg = "greedy heuristic"
    if heur is None:
        msg = f"the {best.name} schedule (the greedy heuristic's did not fit with these actions)"
    elif best.name != "heuristic" and best.sim.overhead_s < heur.sim.overhead_s * (1 - _REL_TOL):
        what = (
            "ratio plan (recompute the cheapest layers per byte, offload the rest)"
            if best.name == "ratio"
            else f"{best.name} baseline"
        )
        msg = (
            f"the {what} beats the greedy heuristic ({best.sim.overhead_s:.6g} s vs "
            f"{heur.sim.overhead_s:.6g} s overhead)"
        )
    rec = _record(
        best.name, SolverStatus.HEURISTIC, best.sim.overhead_s, time.perf_counter() - flow.t0, msg, details=flow.notes
    )
    return SolveReport(make_schedule(trace, best.sim.decisions, budget_bytes, best.name, rec), None, None)


_FEASIBILITY_SHARE = 0.5
"""Without offload, the DP that settles a budget below the best baseline gets up to this share of the limit."""
_HOST_NOTE = (
    "planned keep and recompute only: this trace was measured on the CPU, where host memory is the "
    "device's memory and an offload lowers no peak (--actions keep,offload,recompute emulates offload)"
)
"""Said with every plan whose actions the CPU default restricted."""


class Step(StrEnum):
    """What a phase of the solve runs (the _Flow method of the same name)."""

    PROVE = "prove"
    BEAM = "beam"
    RATIO = "ratio"
    DP_PROBE = "dp_probe"
    DP_FIRST = "dp_first"
    LAGRANGE = "lagrange"
    LAGRANGE_MIXED = "lagrange_mixed"
    POLISH = "polish"
    FIFO_PROBE = "fifo_probe"
    EXACT_DP = "exact_dp"
    FIFO_AGAIN = "fifo_again"
    LATE_BEAM = "late_beam"
    MILP = "milp"


@dataclass(frozen=True)
class Phase:
    """One phase of a solver's plan and its share of the time limit."""

    step: Step
    """What runs."""
    share: float | None = None
    """Its time: this share of the limit (None: up to the deadline; the FIFO steps size their own)."""
    from_start: bool = False
    """The share ends at that fraction of the limit counted from the solve's start, not from the phase's."""
    only_if_open: bool = True
    """Skipped once the best answer is proven within the gap."""
    min_left_s: float = 0.0
    """Skipped unless at least this many seconds are left."""
    backend: SolverName | None = None
    """MILP phases: the backend."""
    exact_windows: bool = False
    """MILP phases: windows W = L = n, so the model covers every schedule and its bound is a true bound."""
    last_until: float | None = None
    """DP_FIRST: the fraction of the limit, from the solve's start, to which the finest relaxed step may run (the
    exact DP phase's own end; None: its share's)."""


class LagrangeKind(StrEnum):
    """Which Lagrangian bound a solve runs (optimizer/dp/lagrange.py)."""

    ROWS = "rows"
    """On the memory rows: plans without offload, or copies on the compute thread; its prices also prune the DP."""
    LINK = "link"
    """On the fluid link windows: copies beside compute, on traces of _LINK_MIN_LAYERS to _LINK_MAX_LAYERS."""


def lagrange_kind(trace: Trace, allowed: frozenset[Action]) -> LagrangeKind | None:
    """The Lagrangian bound worth running on this trace, if any (_LAGRANGE_SHARE, _LINK_MIN_LAYERS)."""
    if Action.OFFLOAD not in allowed or not trace.device.concurrent_copies:
        return LagrangeKind.ROWS
    if _LINK_MIN_LAYERS <= trace.n <= _LINK_MAX_LAYERS:
        return LagrangeKind.LINK
    return None


def _near_exact_cells(trace: Trace) -> int | None:
    """The fewest byte ranges of _NEAR_EXACT_CELLS at which the relaxed offload options are near exact
    (optimizer/dp/problem.py, near_exact_cells), if any."""
    from memsched.optimizer.dp.problem import near_exact_cells

    return near_exact_cells(trace, [c for c in _NEAR_EXACT_CELLS if c > _RELAXED_LADDER[0]])


def _relaxed_offload(options: SolveOptions, trace: Trace, allowed: frozenset[Action]) -> bool:
    """Whether plan_for's `relaxed` matters and holds: auto on a trace short enough for the exact-window MILP, with
    offload allowed, a limit that leaves the MILP time to run (_MILP_MIN_LEFT_S), and some layer whose offload
    subsets are too many to try (asked only there: it loads the DP)."""
    milp_s = (1.0 - _DP_UNTIL_RELAXED) * options.time_limit_s
    if options.solver != SolverName.AUTO or trace.n > AUTO_MILP_MAX_LAYERS or Action.OFFLOAD not in allowed:
        return False
    if milp_s < 1.5 * _MILP_MIN_LEFT_S:
        return False
    from memsched.optimizer.dp.problem import offload_enumerable

    # A near-exact relaxation's sweep proves more than the MILP's bound where it finishes (gpt2-medium on an
    # H100 at 75%: 0.0160 s against CBC's 0.0144 s), so there the DP keeps _DP_UNTIL.
    return not offload_enumerable(trace) and _near_exact_cells(trace) is None


def plan_for(
    solver: SolverName,
    n_layers: int,
    allowed: frozenset[Action] = ALL_ACTIONS,
    lagrange: LagrangeKind | None = None,
    relaxed: bool = False,
) -> list[Phase]:
    """The phases `solver` runs on a trace of `n_layers` layers, in order (docs/formulation.md, 'How solve()
    proceeds'). Candidates first (beam DP, local search; long traces give the local search the larger share,
    as the exact DP rarely finishes there), then the FIFO sweep's probe, then what proves the bound. On short traces
    the exact DP runs before the local search where its sweeps are what proves (`Step.DP_FIRST`, _DP_FIRST_SHARE).
    `lagrange`: the Lagrangian bound to run (`lagrange_kind`). On the memory rows its prices bound every
    completion and the exact DP finishes on long traces too, so they keep the local search's short share; the
    link windows' share comes out of the local search's long share, so the exact DP keeps its time.
    `relaxed`: some layer has too many saved tensors to try every offload subset (`_relaxed_offload`): where
    the exact-window MILP follows, the DP leaves it a larger share (_DP_UNTIL_RELAXED). On traces of
    _LATE_BEAM_MIN_LAYERS to _LATE_BEAM_MAX_LAYERS a late, wider beam comes before the last local search, whose
    plan's own search that one races (`_Flow.late_beam`).

    With some actions left out (`allowed`): the FIFO sweep only matters where copies and recompute meet (with
    no offload there are no copies, and the fluid sweep is exact); the MILP always models recompute, so
    without it the local search takes its place (a MILP asked for by name is refused up front)."""
    if solver == SolverName.HEURISTIC:
        return []
    long_trace = n_layers > _LONG_TRACE
    searches = [
        Phase(Step.BEAM, _BEAM_SHARE / 2 if long_trace else _BEAM_SHARE, only_if_open=False),
        Phase(Step.RATIO, _RATIO_SHARE),
    ]
    if not long_trace and lagrange != LagrangeKind.ROWS:
        searches.append(Phase(Step.DP_PROBE, _DP_PROBE_SHARE))
    if lagrange == LagrangeKind.ROWS:
        searches.append(Phase(Step.LAGRANGE, _LAGRANGE_SHARE_LONG if long_trace else _LAGRANGE_SHARE))
    elif lagrange == LagrangeKind.LINK:
        searches.append(Phase(Step.LAGRANGE, _LAGRANGE_SHARE))
    if not long_trace:  # the exact DP before any local search, where its sweeps are what proves (dp_first)
        searches.append(Phase(Step.DP_FIRST, _DP_FIRST_SHARE))
    # On long traces the exact DP, after this local search, climbs and stops at its pace where it cannot finish
    # (_DP_UNTIL_LONG); the local search then goes on where it stopped. Where the memory rows' prices prune
    # the DP it finishes, as on short traces.
    dp_long = long_trace and lagrange != LagrangeKind.ROWS
    polish_share = _POLISH_SHARE
    if dp_long:
        polish_share = _POLISH_SHARE_LONG - (_LAGRANGE_SHARE if lagrange == LagrangeKind.LINK else 0.0)
    # Before it a Lagrangian or (short traces) the exact DP can prove the requested gap; when one has, the answer is
    # what was asked for.
    searches.append(Phase(Step.POLISH, polish_share, only_if_open=lagrange is not None or not long_trace))
    if allowed == ALL_ACTIONS:
        searches.append(Phase(Step.FIFO_PROBE))
    if solver in BACKENDS:
        if Action.RECOMPUTE not in allowed:
            raise MemschedError(
                f"solver: {solver} solves a model that always includes recompute, so it cannot plan without it; "
                "use --solver auto or dp with these --actions"
            )
        # A true bound first (the DP), then the backend asked for by name with the rest of the time.
        return [
            *searches,
            Phase(Step.EXACT_DP, _DP_SHARE_BEFORE_MILP),
            Phase(Step.MILP, only_if_open=False, backend=solver),
        ]
    # The exact DP gets most of what is left; where it cannot finish, the FIFO sweep may run again, and the
    # last part goes to the exact-window MILP (auto, small traces) and the local search.
    milp_ok = solver == SolverName.AUTO and n_layers <= AUTO_MILP_MAX_LAYERS and Action.RECOMPUTE in allowed
    # The local search takes what is left at the end (after the MILP too: CBC stops short of the deadline to
    # leave room for its kill grace, and on a relaxed trace the MILP's share is large).
    polish = Phase(Step.POLISH, 1.0, min_left_s=0.2)
    last = [Phase(Step.MILP, min_left_s=0.2, backend=AUTO_BACKEND, exact_windows=True), polish] if milp_ok else [polish]
    if _LATE_BEAM_MIN_LAYERS <= n_layers <= _LATE_BEAM_MAX_LAYERS:
        last.insert(0, Phase(Step.LATE_BEAM, _LATE_BEAM_SHARE))
    dp_until = _DP_UNTIL_LONG if dp_long else _DP_UNTIL_RELAXED if relaxed and milp_ok else _DP_UNTIL
    dp = Phase(Step.EXACT_DP) if solver == SolverName.DP else Phase(Step.EXACT_DP, dp_until, from_start=True)
    # The early DP's finest relaxed step may run to where the exact DP phase ends: cut at its share, it would run
    # again from the start after the local search (_DP_FIRST_SHARE).
    first_until = 1.0 if solver == SolverName.DP else dp_until
    searches = [dataclasses.replace(p, last_until=first_until) if p.step == Step.DP_FIRST else p for p in searches]
    # The FIFO climb, where the fluid sweep finished with the gap open, has up to where the DP would have stopped.
    fifo_until = None if solver == SolverName.DP else dp_until
    fifo_again = [Phase(Step.FIFO_AGAIN, fifo_until, from_start=True)] if allowed == ALL_ACTIONS else []
    # The memory rows' bound again with the mixed rule for checkpoint inputs, where the DP left the gap open.
    mixed = [Phase(Step.LAGRANGE_MIXED, _LAGRANGE_MIXED_SHARE)] if lagrange == LagrangeKind.ROWS else []
    return [*searches, dp, *mixed, *fifo_again, *last]


def _run_phase(flow: _Flow, phase: Phase) -> None:
    if phase.share is None:
        until = flow.deadline - flow.reserve
    elif phase.from_start:
        until = flow.until_from_start(phase.share)
    else:
        until = flow.until(phase.share)
    if phase.step == Step.PROVE:
        flow.prove_start(until)
    elif phase.step == Step.BEAM:
        flow.beam(until)
    elif phase.step == Step.RATIO:
        flow.ratio(until)
    elif phase.step == Step.DP_FIRST:
        last = phase.last_until
        flow.dp_first(until, None if last is None else flow.until_from_start(last))
    elif phase.step == Step.DP_PROBE:
        flow.dp_probe(until)
    elif phase.step == Step.LAGRANGE:
        flow.lagrange(until)
    elif phase.step == Step.LAGRANGE_MIXED:
        flow.lagrange_mixed(until)
    elif phase.step == Step.POLISH:
        flow.polish(until)
    elif phase.step == Step.FIFO_PROBE:
        flow.fifo_probe()
    elif phase.step == Step.EXACT_DP:
        flow.exact_dp(until)
    elif phase.step == Step.LATE_BEAM:
        flow.late_beam(until)
    elif phase.step == Step.FIFO_AGAIN:
        flow.fifo_again(until)
    else:
        assert phase.step == Step.MILP and phase.backend is not None
        flow.milp(phase.backend, exact_windows=phase.exact_windows)


def solve_report(
    trace: Trace,
    budget_bytes: int,
    options: SolveOptions | None = None,
    resources: SolveResources | None = None,
    start: Schedule | None = None,
) -> SolveReport:
    """solve(), with the phases' raw results kept."""
    options = options or SolveOptions()
    report = _with_host_note(_solve_report(trace, budget_bytes, options, resources, start), options, trace)
    if options.host_budget is not None:  # the replay's pinned pool reads its limit from here
        report.schedule = report.schedule.model_copy(update={"host_budget_bytes": options.host_budget})
    return report


def _solve_report(
    trace: Trace, budget_bytes: int, options: SolveOptions, resources: SolveResources | None, start: Schedule | None
) -> SolveReport:
    now = time.perf_counter()
    # The limit counts from the caller's start where it gives one (the CLI: its process's start).
    started = resources.started_at if resources is not None else None
    t0 = now if started is None else min(started, now)
    allowed = options.allowed_actions(trace)
    # Refuses a combination it cannot plan, up front.
    phases = plan_for(
        options.solver, trace.n, allowed, lagrange_kind(trace, allowed), _relaxed_offload(options, trace, allowed)
    )
    # Without offload, a budget below the best baseline is settled by the exact DP (optimizer/actions.py),
    # whose plan, where one fits, joins the candidates.
    feasibility_deadline = t0 + _FEASIBILITY_SHARE * options.time_limit_s
    try:
        found = check_feasible(trace, budget_bytes, allowed, feasibility_deadline)
    except InfeasibleBudgetError as e:
        _host_zero_answer(trace, budget_bytes, options, e, feasibility_deadline)
        raise
    if max(stage_memory(trace, [KEEP] * trace.n)) + trace.static.total <= budget_bytes:
        rec = _record(
            "keep-all",
            SolverStatus.OPTIMAL,
            0.0,
            time.perf_counter() - t0,
            "keep-all fits the budget: no overhead",
            bound=0.0,
        )
        return SolveReport(make_schedule(trace, [KEEP] * trace.n, budget_bytes, "keep-all", rec), None, None)
    cands = _candidates(trace, budget_bytes, allowed, options.host_budget)
    if not cands and found is None and options.host_budget is not None:
        found = _host_feasible_plan(trace, budget_bytes, allowed, options.host_budget, feasibility_deadline)
    flow = _Flow(trace, budget_bytes, options, resources or SolveResources(), t0, allowed, found, cands)
    if start is not None:
        phases = _from_start(flow, start, phases)
    if flow.best.sim.overhead_s <= 0.0:
        return _zero_overhead(trace, budget_bytes, flow.best, time.perf_counter() - t0)
    # Every solve's compiled kernels (the heuristic-only one's ratio plan scores with one too): loaded, or compiled
    # first in an environment, with the time-limit signals held (optimizer/jit.py), never mid-call.
    flow.prepare_kernels()
    if not phases:
        flow.ratio(flow.until(_RATIO_SHARE))
        return _heuristic_only(trace, budget_bytes, flow)
    for phase in phases:
        if (phase.only_if_open and flow.proven()) or flow.left() < phase.min_left_s:
            continue
        _run_phase(flow, phase)
        if flow.best.sim.overhead_s <= 0.0:
            return _zero_overhead(trace, budget_bytes, flow.best, time.perf_counter() - t0)
    return flow.report()


def _from_start(flow: _Flow, start: Schedule, phases: list[Phase]) -> list[Phase]:
    """An earlier answer joins the candidates (it must be this trace's, and fit this budget and host budget), with
    its bound where it was solved for this budget and host budget (the caller vouches for the rest of the
    options: solve()'s `start` is an earlier answer of the same solve); the plan proves the best candidate first
    (Step.PROVE). A heuristic-only plan stays as it is."""
    check_schedule(start, flow.trace)
    sim = simulate(flow.trace, decisions_from_schedule(start), flow.budget)
    if not sim.feasible or not fits_host(sim, flow.host):
        raise MemschedError(
            f"start: the schedule to start from does not fit this budget ({flow.budget} bytes) or host budget; "
            "give one solved for this budget or a smaller one"
        )
    flow.add("the schedule it started from", sim)
    if start.budget_bytes == flow.budget and start.host_budget_bytes == flow.host:
        flow.prove(start.solver.best_bound_s, "start")  # proved for this same problem before: it holds now
    if not phases:
        return phases
    # Once the best is proven there is nothing to add: even the phases that otherwise always run (the beam) wait.
    return [Phase(Step.PROVE, _PROVE_SHARE), *(dataclasses.replace(ph, only_if_open=True) for ph in phases)]


def _host_feasible_plan(
    trace: Trace, budget_bytes: int, allowed: frozenset[Action], host_budget: int, deadline: float
) -> SimResult:
    """A plan within both budgets where no heuristic or baseline plan is: the least-host plan (host.py), or
    InfeasibleHostBudgetError with the smallest host budget that works at this device budget."""
    known = [heuristic(trace, budget_bytes, allowed).sim]
    known += [r.sim for r in evaluate_baselines(trace, budget_bytes) if uses_only(r.sim.decisions, allowed)]
    need = min_host_bytes(trace, budget_bytes, allowed, deadline, known)
    if need.upper <= host_budget and need.sim is not None:
        return need.sim
    raise InfeasibleHostBudgetError(host_budget, budget_bytes, need.upper, need.proven, _need_detail(need))


def _need_detail(need: HostNeed) -> str:
    """How the smallest host budget was established, in words."""
    if need.proven:
        return "the exact DP over every plan proved it"
    return (
        f"the search for it was cut short: the least lies between {need.lower} bytes and that; a longer "
        "--time-limit narrows it"
    )


def _host_zero_answer(
    trace: Trace, budget_bytes: int, options: SolveOptions, e: InfeasibleBudgetError, deadline: float
) -> None:
    """A host budget of 0 left offload out and no keep / recompute plan fits: where an offload plan would fit,
    the answer is the host budget it needs (raised here); else the caller re-raises `e`."""
    if options.host_budget != 0:
        return
    base = options.model_copy(update={"host_budget": None}).allowed_actions(trace)
    if Action.OFFLOAD not in base or budget_bytes < min_feasible_budget(trace):
        return
    known = [simulate(trace, min_feasible_decisions(trace), budget_bytes, with_events=False)]
    need = min_host_bytes(trace, budget_bytes, base, max(deadline, time.perf_counter() + 1.0), known)
    raise InfeasibleHostBudgetError(
        0,
        budget_bytes,
        need.upper,
        need.proven,
        f"{_need_detail(need)}; keep and recompute alone need a budget of at least "
        f"{e.min_feasible_bytes} bytes" + ("" if e.proven else " (or a little less: that search ran out of time)"),
    )


def _with_host_note(report: SolveReport, options: SolveOptions, trace: Trace) -> SolveReport:
    """Say so in the answer when the CPU default, not the user, left offload out."""
    if options.actions is None and options.allowed_actions(trace) != ALL_ACTIONS:
        rec = report.schedule.solver
        sentence = _HOST_NOTE[0].upper() + _HOST_NOTE[1:] + "."
        report.schedule.solver = rec.model_copy(update={"message": f"{rec.message} {sentence}".strip()})
    return report


def solve(
    trace: Trace,
    budget_bytes: int,
    options: SolveOptions | None = None,
    resources: SolveResources | None = None,
    start: Schedule | None = None,
) -> Schedule:
    """Return the best schedule found for the budget; InfeasibleBudgetError if none can fit. `start`: an earlier
    answer of the same solve (trace, budget and options: a sweep's point solved again), a candidate from the
    start with its bound, which the solve first tries to prove (_PROVE_SHARE)."""
    return solve_report(trace, budget_bytes, options, resources, start).schedule
