"""The solve's shares of the time limit and the sizes that steer its phases, each with the measurement
that set it (optimizer/flow/). Phases read them as `shares.NAME`, so that a test can change one in one place."""

from __future__ import annotations

# Shares of the time limit (upper bounds: each phase stops early when it has nothing left to do).
STAGE_BOUND_SHARE = 0.05
"""The stage bound (optimizer/stage_bound.py) stops at this share of the limit with the stages it has seen (its
stages of highest need, at the turn, come last): 10-20 ms on 24-layer transformer traces, 0.06-0.09 s on PipeDream
ResNet-50, 0.08-0.1 s on DenseNet-121, 0.2-0.3 s on the 1,000-layer chain and DAG, whose pass fits in 5% of 10 s."""
STAGE_REFINE_SHARE = 0.2
"""The share of the limit the stage bound's finer passes may take (`Flow.stage_refine`, after the answer phases)."""
STAGE_REFINE_REACH = 0.02
"""Those passes run only where the first pass's bound is within this share of the bound held: 4x the knapsack's
steps lifted it by at most 1.2% on the tracer's traces and PipeDream ResNet-50 (20-75%), 16x by 1.5%."""
STAGE_BOUND_MAX_CELLS = 1 << 18
"""The finest knapsack the stage bound's passes reach (4x the steps each). Measured on one core (the first pass's
steps, then 4x, then 16x): on the tracer's H100 / H200 decoders and ResNet-50 at 20-75% (16,384 steps, 0.02-0.05 s
a pass), 4x lifts 5 of 54 rows by 0.2-1.2% (GPT-2 medium on the H200 at 65%: 0.020032 -> 0.020265 s, which proves
its answer, 0.020356 s) in 0.03-0.10 s, and 16x one more by 0.01% in 0.2-0.7 s; on PipeDream ResNet-50 with every
output saved and 100 us copies (5,681 steps, 0.1-0.2 s), at 50% 16x proves 0.021698 s where 1x and 4x prove
0.021542 s (the answer: 0.021836 s) in 1.3 s, and at 75% 4x proves 0.000156 s where 1x proves nothing."""
STAGE_BOUND_REFINE_GROWTH = 5.0
"""A pass at 4x the steps takes up to this many times the last one's time (measured 1.4-4.9x: the knapsack's
tables grow with the steps, and the stages' values above the bound held are read at each)."""
RATIO_SHARE = 0.05
"""The ratio plan (optimizer/ratio.py), right after the beam, stops its scans at this share of the limit: about
2,000 plans scored by the compiled simulator, 0.33 s on the 1,000-layer synthetic chain, 3.9 s on a 5,000-layer
one (cut there, it keeps the best member scanned)."""
ENUMERATE_SHARE = 0.5
"""Of the limit, up to which every plan of a short keep / recompute trace is priced (optimizer/exhaustive.py: at
most MAX_PLANS, about 0.1 s on one core at most); one the clock stops proves nothing, the phases get the rest."""
LINK_PLAN_SHARE = 0.05
"""The link plan (optimizer/link_plan.py), right after the link windows' Lagrangian whose steps it rounds, stops its
scans at this share of the limit: about 1,400 plans scored by the compiled simulator per window of the ascent, 0.3 s
on the 1,000-layer synthetic chain; the later half first, then single blocks until three in a row beat nothing (cut
there, it keeps the best member scanned)."""
BEAM_SHARE = 0.2
POLISH_SHARE = 0.15
BEAM_FIRST_SHARE = 0.25
"""The beam's first fluid round (24 labels) may run past the beam's share, up to this share of the limit: a cut
round decodes no plan, and the local search's answer depends on where it starts. DenseNet-121 at 25%, 10 s: the
first round needs 1.9 s of the long trace's 1 s share; cut, the local search started from the best baseline
(0.170 s) and ended at 0.0590 s; from the round's plan (0.107 s), at 0.0531 s (5 s of search from each: 0.0575-0.0590
against 0.0525-0.0531 s)."""
LONG_TRACE = 300
"""Above this many layers (where the memory rows' Lagrangian does not prune it) the exact DP often cannot finish
its sweep at the incumbent in a time limit of minutes, so there it climbs (each sweep's threshold sized by the
last one's time: one cut by the clock has proved its last step) and gives up as soon as its pace says a sweep
cannot finish (LONG_PACE): the local search, which improves the answer, gets the time back."""
POLISH_SHARE_LONG = 0.3
"""On long traces: the local search's first share (less the link-window Lagrangian's and the link plan's where they
run), before the exact DP, whose climb starts at 0.7 of its answer (the beam's can lie 3x above the optimum:
DenseNet-121 at 25%). The exact DP then has until DP_UNTIL_LONG of the limit and the same local search goes on after it
(optimizer/polish.py's LocalSearch resumes where it stopped). Measured on one core (2026-11-28), against a
local search of 75% first and the exact DP's two sweeps after it: DenseNet-121 at 75%, 10 s: gap 30.7% ->
proven (the climb passes the fluid optimum, 0.002594 s, in 1.6-3 s; after the long local search it had 0.8 s
for one sweep at the incumbent, which needs more); at 30 s proven in 17 s; at 50%, 30 s: 22.0 -> 9.0%; the
answers the same (bench/results/solver_bench_issue22.md). Before the local search resumed, splitting it around the
DP lost 2-10% on the 1,000-layer chain at 20%, 10 s (a new search re-begins the oscillation, whose cycles take
seconds there)."""
DP_UNTIL_LONG = 0.7
"""On long traces the exact DP stops at this fraction of the limit (when its pace has not stopped it sooner): the
local search after it improves the answers there (POLISH_SHARE_LONG)."""
DP_GRACE_LONG = 0.1
"""On long traces a climbing step of the exact DP that started before the phase's end (DP_UNTIL_LONG) may run on
for up to this share of the limit where its projection (SweepConfig.finish_by: the pace's, with no margin) says it
ends by then, and no step starts after the end: a step cut by the clock proves no more than the bound held, so its
time would be lost. DenseNet-121 at 75%, 10 s (one core): the climb's steps at 0.00209 / 0.00227 / 0.00248 s took
0.19 / 0.35 / 0.57 s, and the one at 0.00263 s, which finds the fluid optimum (0.002594 s; 1.35 s alone), was cut
at 1.14 s by the phase's end, and the answer stayed the local search's 0.003012 s (+16%). Run alternately with the
code before, one core (2026-11-30): proven in 4 of 6 runs against 2 of 6; at 50% and 25% (10 s, 6 runs a side) and
on the 1,000-layer chain and DAG the answers within the rows' run-to-run spread (at 50%, 10 s: 0.0200-0.0229
against 0.0206-0.0227 s). Moving the end to 0.8 of the limit instead let the climb start more steps on the 30 s
rows, whose last local search then had less time (DenseNet-121 at 25%, 30 s: +0.7% in each run)."""
LONG_PACE = 3.0
"""On long traces each exact sweep stops where its time per layer so far, times the layers left, exceeds this many
times its time left (SweepConfig.pace). The margin covers the bias of a linear projection: labels pile up where
many tensors are live (DenseNet-121 at 50%: 2.4 s to layer 84 of 428, 6.05 s in all, where the projection said
12 s); the 1,000-layer chain's sweep at 20% projects 20 s at layer 15 with 4.8 s left, and stops there (before:
it ran to its deadline, 5 s of a 10 s limit, at layer 36)."""
PACED_MIN_LAYERS = 150
"""From this many layers, where the memory rows' Lagrangian does not prune it (copies beside compute), the exact DP
phase's sweeps stop at their pace too (LONG_PACE), not only above LONG_TRACE: their labels grow as n^2 x labels,
and a sweep cut by the clock proves no more than the bound it had (its anytime bound), while the local search after
it improves the answer. On the synthetic 200-layer chain at 20% (10 s) the sweep was cut at layer 64-66 of 200
after 4.4-4.7 s, its bound 0.0208 s below the link windows' 0.0263 s; with 240 s it hit the label cap three times
and finished only at a quantum of 20 MB, its bound 0.0185 s. Paced, it stops at layer 55 after 2.6 s and the
answer is 0.030913 s instead of 0.031164-0.032097 s. On PipeDream ResNet-50 (176 layers) at 12-56% the sweep
finishes in 0.3-3 s and is not stopped (bench/results/solver_bench_stalls.md, 2026-11-29). From this many layers
the sweeps also climb from the bound held (MID_CLIMB_PACE)."""
MID_CLIMB_PACE = 1.5
"""From PACED_MIN_LAYERS up to LONG_TRACE layers with copies beside compute, the exact DP climbs from the bound held
(exact_search's climb_from_proven, as on long traces), each sweep stopped at this pace (LONG_PACE's rule). A sweep
at the top threshold that the clock cuts proves only its frontier, where a finished lower step proves its threshold:
PipeDream ResNet-50 with every node output saved at 25%, 10 s, the top sweep needed 5.9 s and had 4.3 s (bound
0.0577 s, gap 10.5%); the climb proves 0.0604 s (gap 6.3%), with 100 us copy latency 0.0572 -> 0.0605 s. At LONG_PACE
the climb's first step on the synthetic 200-layer DAG at 20% (which no sweep finishes) ran 2.9 s where the top sweep
stopped after 1.3 s, and the local search lost that time (answer 0.0285 -> 0.0294-0.0301 s); at this pace it stops
as soon and the answer is the same. The cost: where the top sweep finishes, the lower steps come first (PipeDream
ResNet-50 at 25-34%, 10 s: proven in 7.6-7.8 s instead of 6.1-6.3 s; at 26%, 5 s: 4.5 instead of 3.9 s)."""
LAGRANGE_SHARE = 0.1
LAGRANGE_SHARE_LONG = 0.25
"""The Lagrangian bound on the memory rows (optimizer/dp/lagrange.py) runs right after the beam for up to this
share of the limit (25% over 300 layers), where it is strong: plans without offload, or copies on the compute
thread (each copy's whole time is a stall, which it prices exactly). It stops sooner when it proves the gap or its
steps stall. Its prices also bound every completion of a partial plan, which the exact DP then prunes with: on
long traces that is what lets the DP finish (keep / recompute on the 1,000-layer synthetic chain at 20%, 30 s:
proven optimal, 0.9599 s, where before the answer was 0.980 s and the DP's bound 0.115 s). With copies beside
compute it prices each copy as if it had the link to itself, so offload looks nearly free and the bound stays
weak: it is skipped there."""
LAGRANGE_MIXED_SHARE = 0.15
"""Where the exact DP left the gap open on the memory rows, the Lagrangian with the mixed rule for checkpoint inputs
read by several layers runs after it for up to this share (`lagrange_mixed`), from the first rule's prices: on the
synthetic 1,000-layer DAG at 20%, keep / recompute, 2 s raised the bound 0.9377 -> 1.0065 s (the same as 4.5 s from
zero). On long traces the DP stops at its pace there to leave it the time (`exact_dp`)."""
LAGRANGE_MIN_S = 0.05
LINK_MIN_LAYERS = 100
"""Copies beside compute: from this many layers the Lagrangian of the fluid link windows (and the link plan after it)
runs in the same phase. Below it the exact sweeps finish or come close, and their fluid bound is at least as strong
(the Lagrangian's best is the LP relaxation of the same fluid model): on a 60-layer chain 0.937 of the optimum, on
PipeDream ResNet-50 at 50% 0 where the fluid sweep proves the optimum. Above it: the 200-layer synthetic chain at
20%, 0.0263 s against an answer of 0.0312 s (the sweeps' bound: 0.0185 s); DenseNet-121 at 50% / 25%, 0.0143 /
0.0326 s against 0.0209 / 0.0511 s (before: 0.0102 / 0.0232 s). It was 150 until 2026-11-30 (stop 58); at 100, 10 s,
both sides at once on their own cores, on 13 synthetic chains and DAGs of 100-140 layers at 15-30%: no answer
worse, 9 of them 0.8-10% better (the link plan), and 10 of 13 bounds higher (the 120-layer chain at 20%, gap 30.7%
-> 2.9%; the 100-layer DAG 49.2% -> 29.4%; the 140-layer DAG at 25% 50.8% -> 19.0%). At 64 the 64-layer DAG at 20%
ended 4.3% dearer (the local search's time went to the Lagrangian) with the same gap, and the CPU Llama of 48
blocks per sub-module (96 layers), proven in about 1 s, keeps its flow at 100."""
LINK_MAX_LAYERS = 2000
"""Beyond this many layers its O(n^2) path per step leaves too few steps in a time limit of minutes."""
DP_FIRST_SHARE = 0.25
"""On traces of up to LONG_TRACE layers, the exact DP runs before the local search for up to this share (`dp_first`)
where its sweeps are what proves and finish fast, so that its optimum or bound usually ends the solve: on the memory
rows (`LagrangeKind.ROWS`: the fluid model is exact there, and the Lagrangian's prices prune the sweep at the beam's
answer) and where some layer offloads relaxed byte ranges (many saved tensors: the relaxed sweeps, coarse first,
prove there). Before, the local search's share (POLISH_SHARE) came first and rarely moved the answer. One core,
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
DP_SHARE_BEFORE_MILP = 0.3
DP_UNTIL_RELAXED = 0.7
"""Under auto, where some layer has too many saved tensors to try every offload subset (the DP's sweeps run on
relaxed byte ranges: `COARSE_LADDER`) and the exact-window MILP follows, the DP stops here instead of at
DP_UNTIL, so that the MILP gets the last 30% of the limit. There the DP's finer steps rarely move its bound,
while the MILP's (whole copies on their stream, with latency) lies above it and the MILP's own plans can beat
the local search's. Measured on the H100 decoders at 10 s (2026-11-25), gap at DP_UNTIL -> here: gpt2-medium
75 / 50% 14.3 / 6.3 -> 11.0 / 7.4%, bert-large 75 / 50 / 25% 23.9 / 7.9 / 4.9 -> 16.8 / 4.3 / 4.9%. Not where the
ranges are near exact (NEAR_EXACT_CELLS): a finished sweep on them proves more than the MILP (_relaxed_offload)."""
DP_UNTIL = 0.95
"""Under auto, the exact DP stops at this fraction of the limit if it has not finished. Where it finishes
early with a gap (a loose fluid bound: stall-heavy traces) the rest goes to the exact-window MILP, so a late
stop only takes time from traces whose final sweep is still running, and there finishing is what proves."""
KERNELS_BEFORE_MILP = 0.5
"""Where a MILP phase follows (a backend asked for by name; auto on short traces under COLD_COMPILE_S), a solve
whose compiled kernels are not ready (the first in an environment) waits for them until this share of the limit,
then gives the MILP, which needs none, the rest: its plans and bound, where the other phases would have given
none."""
COLD_COMPILE_S = 20.0
"""The least time compiling every kernel from an empty cache took (20 s on this 2-core machine, 22-25 s on the
H200's host, 45 s beside another compile). Under auto, only limits up to this give the MILP the rest where the
kernels are not ready at KERNELS_BEFORE_MILP: a longer limit waits for them, as the DP and the local search they
run prove more than the MILP where they arrive in time."""
MILP_MIN_LEFT_S = 1.0
"""A MILP phase runs only with this many seconds left: building, warm-starting and CBC's kill grace need about
that much. DP_UNTIL_RELAXED applies only where its share of the limit is half again as much, so that short limits
do not leave time unused."""
FIFO_SHARE = 0.1
"""The FIFO sweep (tier 2) runs first for this share of the limit (at least FIFO_MIN_S): where stalls matter
it finishes in well under a second and is exact (PipeDream ResNet-18, VGG-16, AlexNet: 0.1 s); where they do
not (ResNet-50) its labels multiply and the fluid sweep, which is exact there, gets the rest of the time."""
FIFO_MIN_S = 0.3
FIFO_EARLY_SHARE = 0.03
"""Where some fluid beam mispriced its plans (`Flow.some_mispriced`), the FIFO sweep runs right after the beams for
this share of the limit (`Flow.fifo_early`), before the local search and the stage bound's finer passes, whose
shares grow with the limit: where stalls decide it often finishes in hundredths of a second and proves (PipeDream
ResNet-18 at 25-75%, 10 s: 0.01-0.04 s, proven at 2.6-4.1 s of the solve after 1.2 s of local search and 1 s of
finer stage passes that proved nothing; at 2 s, where their shares are small, at 0.8 s). Cut, it has cost this share,
and the FIFO probe after the local search runs as before."""
FIFO_LABELS_PER_S = 200_000
"""The FIFO sweep's label cap per second of its time: its dominance filter handles about 150,000 labels a second
on one core (more where few labels dominate others), so a sweep that holds more than its time can filter would
not have finished in that time anyway; the cap stops it before it fills memory. (The filter also stops at the
work budget the sweep's clock gives it: SweepClock.work_budget.)"""
FIFO_MAX_LABELS = 2_000_000
"""At most this many FIFO labels (~660 MB)."""
FIFO_CLIMB_FIRST = 0.15
"""The FIFO climb's first threshold: the proven bound plus this share of the way to incumbent x (1 - gap).
PipeDream ResNet-50 at 2.25 GiB (fluid bound 0.166 s, incumbent 0.2 s): the FIFO sweep at 0.17 s finishes in
1.5 s with 60,000 labels at one boundary, at 0.18 s it passes 4 million."""
FIFO_CLIMB_FIRST_SHARE = 0.5
"""The FIFO climb's first step takes at most this share of the climb's time: it has no timing to be sized by.
Where the FIFO sweep cannot finish just above the fluid bound (a synthetic 40-layer chain at 20% with copy latency,
2026-11-26: labels past 58,000 at layer 16), the step the clock cuts proves nothing, and with the whole share it
left the local search and the MILP 1 s of a 10 s solve."""
FIFO_CLIMB_STEP_SHARE = 0.7
"""Every later step takes at most this share of the time left. next_threshold's predictions come from the steps
before, whose times near the fluid bound are held by fixed costs and can look flat (PipeDream ResNet-50 at 2.27
GiB, one core, 2026-11-26: 0.24 / 0.27 / 0.48 / 1.05 / 2.54 / 5.56 s at 0.163 / 0.167 / 0.172 / 0.177 / 0.182 /
0.187 s): from 0.167 s it went straight to the top, where the clock cut it with the climb's whole time, its bound
still 0.167 s. Where the growth is as measured (1.97-2.06 GiB) the bold step is right; so it stays, and a cut one
falls back (FIFO_CLIMB_RETRIES)."""
FIFO_CLIMB_TOP_SHARE = 1.0
"""The FIFO climb goes straight to its top threshold (incumbent x (1 - gap)) wherever that sweep is predicted to
take at most this share of the climb's time left, however many times the last step's time that is
(dp.next_threshold's `top_share`), and the top step may run past the share of the other steps
(FIFO_CLIMB_TOP_MARGIN). Only the top sweep proves the gap or finds the optimum below it; a step below it raises
the bound a little and, sized to 4x the last step's time, takes the time the top needs. Measured 2026-11-29, one
core a side, 3 runs of each row (10 s), against the climb before (growth cap on every step, each at most 0.7 of
the time left): PipeDream ResNet-50 at 19% proven in 3 of 3 runs (1 of 3 before; there a step of 4x to 0.1832 s
and the next one, cut by its share, left 2.3-4.5%), ResNet-50 on an H100 at 50% proven in 3 of 3 (0 of 3: gaps
2.9-4.2%), its top sweep finding the optimum, 0.015299 s against the 0.015698 s answer (-2.5%); ResNet-50 at 17%
proven at 6.4-6.5 s (7.2-7.6 s); 22.5% (10 s) and 19% (5 s) the same. At 0.7 of the time left, 1 of 3 and 1 of 3."""
FIFO_CLIMB_TOP_MARGIN = 2.0
"""The climb's top step may run to this many times its predicted time (dp.predicted_s), within the climb's end,
where that is more than FIFO_CLIMB_STEP_SHARE of the time left: the predictions are off by up to 1.3x, and a top
sweep cut at its share proves nothing (ResNet-50 on an H100 at 50%: the top sweep needs 2.9 s of the 4 s left).
Not more: where the steps near the fluid bound were flat, a top predicted to be cheap can take many times more
(FIFO_CLIMB_STEP_SHARE), and then the share stops it and the fallback steps get the rest as before. (The whole
time left instead: the same proofs in the runs above.)"""
FIFO_CLIMB_RETRIES = 2
"""Steps cut by the clock (or the label cap) after which the climb stops; after each, it falls back to a third of
the way from the last proven threshold to the one that failed."""
FIFO_FALLBACK_MIN_REACH = 0.5
"""A FIFO climb's step that the clock cut before this share of the layers, no further on than the FIFO sweep
before it (at a higher threshold) stopped, does not fall back (FIFO_CLIMB_RETRIES): there the labels pile up before
any threshold prunes them (`bounds._fallback_futile`). Later on, a fallback's lower threshold is what lets it
finish (FIFO_CLIMB_STEP_SHARE): the sweep's time grows steeply with its threshold, so a pace read off the cut step
says nothing of it."""
FIFO_AGAIN_MIN_LEFT_S = 0.3
"""`Flow.fifo_again` runs only with more than this many seconds left. Where its sweeps finish they take milliseconds
(gpt2-medium on an H200 at 30%: 2 copies a queue prove 0.5438 s in 0.01 s, against the exact DP's 0.5353 s), and a
sweep the clock cuts still proves its frontier; it was 1 s, which a 2 s solve never has there."""
FIFO_CLIMB_SHARE = 0.85
"""The FIFO climb takes at most this share of the time left: the local search after it gets the rest. Measured on
PipeDream ResNet-50 at 10 s a solve (2026-11-26), 0.5 -> 0.85: gaps at 2.06 / 2.25 GiB 3.1 / 7.1% -> 1.5 / 5.1%, the
same answers (the FIFO beam's, which the local search did not improve)."""
FIFO_MAX_LAYERS = LONG_TRACE
"""Longer traces skip the FIFO probe, as they defer the exact DP: its sweep does not finish there in a limit of
minutes (DenseNet-121, 428 layers: stopped at layer 28-37 in 3 s), and the local search uses the time better."""
RELAXED_LADDER = (4, 12, 32, 128, 512)
"""Byte ranges per layer of the exact DP's successive sweeps where some layer has too many saved tensors to try
every offload subset (optimizer/dp/problem.py, relaxed_problem): each finished sweep proves a bound, a finer
one a tighter bound. Measured on bert-large at 25%: 4 ranges finish in 0.1 s at a 11% gap, 12 in 0.3 s at
4.9%; where copies are serial (no backlogs: few labels) 512 ranges finish too (a 16-block Llama: 0.13 s for
4 to 32). The FIFO sweep, whose labels cost more, runs on the coarsest."""
FIFO_RELAXED_CELLS = 32
"""The FIFO climb's byte ranges per relaxed layer: the finest the fluid ladder finished, at most this many
(fifo_again). ResNet-50 (H100, 16 layers of many tensors) at 50%, one core: the FIFO optimum on 4 ranges (0.0048
s) lies below the fluid bound on 512 (0.0074 s), so a climb there proves nothing; on 32 ranges a FIFO sweep
proves 0.008 s in 0.6 s and 0.009 s in 6.5 s (128 ranges: the same)."""
RELAXED_FIFO_QUEUE = 2
"""Copies each FIFO queue holds exactly on relaxed byte ranges: in the sweep before the climb
(`short_queue_sweep`) and in the relaxed FIFO beam (`AnswerPhases._fifo_beam`); fifo_sweep's `queue`, QUEUE = 8
elsewhere. Beyond it the oldest copies merge, freeing
their bytes at the earlier time: optimistic, so every sweep stays a bound (docs/formulation.md, 'Short queues on
relaxed ranges'). Each relaxed layer offers up to `cells` options, and with 8 exact copies their queue states
multiply the labels past what the climb's time can filter. Measured on one core (2026-11-30), a FIFO sweep at
the threshold, 32 ranges: the H100 ResNet-50 trace at 75% (answer 0.003892 s) proves 0.003853 s with 2,068
labels in 0.06 s, against 86,704 labels in 3.2 s with 8; bert-large (H100) at 25% proves 0.0229 s (172,000
labels, 12 s) where 8 copies did not finish in 7 s. On the PipeDream profiles (one tensor per layer, offload
enumerated) it does not run: 2 did not reach layer 45 of ResNet-50 in 18 s. Where it finds its own optimum below
the threshold, that optimum is a merged queue's, below the exact one: the climb after it, with 8 copies, is what
finds the exact optimum (the retraced H100 ResNet-50 at 50%, proven by that climb, lost its proof when the climb
itself ran with 2)."""
SHORT_QUEUE_SHARE = 0.5
"""The short-queue sweeps' share of the FIFO climb's time (`short_queue_sweep`: 2 copies a queue, then more while
the gap is open); the climb gets the rest. Where the 2-copy sweep finishes it takes well under a second (the
H100 ResNet-50 traces: 0.05-0.19 s); where it does not, the climb with 8 copies after it has not finished a step
either (bert-large at 25%, 30 s: the sweep needs 15 s, cut at 5.2 s with a share of 0.3, and the climb's three
steps then took 11 s and proved nothing)."""
SHORT_QUEUE_GROWTH = 4.0
"""How many times the last short-queue sweep's time the next, one copy longer, is predicted to take
(`short_queue_sweep`): it runs only where that fits the share left. Measured on one core, 32 ranges, at the
answer less 1%: the retraced H100 ResNet-50 at 75% 0.26 / 1.09 / 5.6 / 14 s for 2 / 3 / 4 / 5 copies (x4.2, x5.2);
PipeDream ResNet-50 at 19% (not relaxed: no short sweeps there) 7.8 / 11.2 s for 2 / 3."""
LADDER_STEP_SHARE = 0.5
"""Each exact-resolution step of RELAXED_LADDER but the last takes at most this share of the DP's time left. Their
cost is not monotone in the ranges: on the H100 ResNet-50 trace at 75% (12-16 tensors a block) 4 ranges finish in
0.4 s with a bound of 0, 12 need 28 s (6 million labels) and 32 finish in 0.35 s with the best bound (0.00348
s); on a CPU Llama of 48 blocks 12 / 32 / 128 / 512 take 0.05 / 0.2 / 0.8 / 7 s, and 128 proves the gap."""
NEAR_EXACT_CELLS = (8, 16, 32, 64, 128)
"""Byte ranges tried for a near-exact relaxation (relaxed_ladder). Where one is, the ladder is the coarsest step
and that one: the steps between prove less and cost as much (gpt2-medium on an H100 at 75%, one core: 4 / 12 /
32 / 64 ranges 0.04 / 0.44 / 0.95 / 2.5 s, bounds 0.0023 / 0.0116 / 0.0139 / 0.0160 s; its 64 ranges span at most
1.6 MiB of a 1.2 GB block each). Beyond 128, options are as many as the ranges and the sweep as costly as any."""
COARSE_LADDER = ((16, 8, 8), (32, 10, 10), (64, 10, 10), (64, 10, 14), (64, 12, 12))
"""(byte ranges per relaxed layer, retained-bytes quantum as limit >> shift, backlog quantum as limit >> shift) of
the coarse sweeps run, coarsest first, before RELAXED_LADDER where some layer has too many saved tensors:
rounding retained bytes and backlogs down (a relaxation) keeps the labels few enough for many ranges, whose
options are nearly exact, to finish. Each finer step proves more and costs more; the first one the clock stops
ends the ladder. Measured on one core (2026-11-25), fluid bound and time of the sweep at the top threshold:
gpt2-medium at 75%: 0.0116 s with 32 ranges at 2^10, 0.0138 s with 64 (2 s), answer 0.0161 s; at 50%: 0.0301
s at 2^8, 0.0347 s at 2^10 (4 s), answer 0.0370 s. The number of ranges matters as much as the quantum:
gpt2-medium's blocks have about 68 distinct sums of their large tensors, which 32 ranges pair up. The backlogs'
quantum matters most where copies are a large part of the cost: each rounding takes bytes off the link's work.
bert-large at 75% (answer 0.0067 s): 0.0045 s with 64 ranges at 2^10 (0.8 s), 0.0051 s with its backlogs at
2^14 (2.2 s), 0.0056 s at 2^12 (7-10 s); elsewhere the finer backlogs cost 2-4x the time for the same bound."""
DP_SEED_SHARE = 0.3
"""Share of a local search's time spent from the exact DP's decoded optimum where that is not the best plan
(`Flow.polish`); the rest goes on from the best plan, as before."""
SEED_POLISH_SHARE = 0.15
"""Share of the limit for the local search from the exact DP's plan before the exact-window MILP
(`Flow.seed_polish`)."""
MAX_BEAM_WIDTH = 1536
BEAM_EMPTY_ROUNDS = 2
"""Fluid beam rounds in a row that decode no plan below the incumbent after which the fluid series stops widening
(the FIFO series go on). Measured on 36 rows (2026-12-01): where the first two rounds found nothing, neither did the
wider ones, which took 0.9-1.0 s of the 2.1-2.9 s it took to prove llama-small48's CPU trace (offload emulated) at
75 / 50%: the feasibility check's keep / recompute optimum is the incumbent there, and no fluid beam of up to 1,536
labels beats it. No row had two empty rounds and then a wider one that found a plan; one empty round is not enough
(the 200-layer synthetic chain at 20%: nothing at 24 labels, then 0.118 / 0.049 s at 96 / 384)."""
MAX_RELAXED_FIFO_BEAM = 4096
"""The widest FIFO beam on relaxed byte ranges that the beam phase widens to (`AnswerPhases.beam`). Measured on one
core, the best plan of widths 16-1,024 (0.4-1.7 s for the four): bert-large (H100) at 25% 0.023516 s at 1,024
against 0.023706 s on the real options; the H200 ResNet-50 at 50% 0.020699 s against 0.021636 s, at 75% 0.005257
against 0.006017 s. On gpt2-medium the real options' beam is the better one (H200 at 75%: 0.013814 against 0.01449
s): both run."""
LATE_BEAM_SHARE = 0.25
"""The late beam's share of the limit (`Flow.late_beam`), taken from the last local search."""
LATE_FIFO_BEAM_SHARE = 0.5
"""The share of the limit `Flow.late_fifo_beam` may take (short traces, before the exact DP's first sweeps): half,
since at 2 s its rounds of 256-1,024 labels find the H100 and H200 decoders' answers between 75 / 50 / 25%, where the
exact DP's relaxed sweeps after them are cut without a bound (docs/formulation.md, 'Wider, with half the limit')."""
LATE_ROUND_MARGIN = 2.5
"""A relaxed FIFO beam round of `Flow.late_fifo_beam` or `Flow.loss_beam` predicted to fit its share may run to this
many times its predicted time, within the solve's deadline (`Flow._round_end`)."""
LOSS_BEAM_SHARE = 0.4
"""The share of the limit `Flow.loss_beam` may take (short traces, after `late_fifo_beam`, where the future table's
loss-point row decides): at 10 s its series reaches 4,096 labels (16-1,024 in 0.9 s, 4,096 in 2.1-2.6 s on the
bert-large traces), at 2 s 256 or 1,024."""
LATE_BEAM_MIN_LAYERS = 150
"""The late beam runs on traces of at least this many layers: below, the exact DP or the MILP closes the gap."""
LATE_BEAM_MAX_LAYERS = 500
"""Nor above this many: there the widths that fit the share are too narrow to find a plan below the local
search's (the 1,000-layer synthetic chain at 20%, 60 s: 983 labels in 9.8 s, none), and the local search, still
improving, loses the time (+2% on the 1,000-layer rows)."""
LATE_BEAM_MIN_WIDTH = 512
"""Nor where fewer labels fit its share: `beam` has run that wide already."""
LATE_BEAM_MIN_GROWTH = 3
"""The late beam runs only where its share allows at least this many times its probe's width (`beam`'s widest)."""
LATE_BEAM_MAX_WIDTH = 24_576
"""At most this many labels per boundary (the 200-layer synthetic chain at 20%: 17 s)."""
LATE_BEAM_SAFETY = 0.8
"""The late beam's width is sized to end within this share of its time (the probe's time is noisy)."""
MAX_FRUITLESS_RESTARTS = 3
"""Local searches started again in the solve's last time, in a row, that find nothing better before the restarts
stop (`Flow._polish_from`): the first search's stop counts as one."""
SHARE_TURN_S = 0.5
"""Seconds per turn of the local search or the link windows' Lagrangian in the solve's last time
(`Flow._polish_and_bound`)."""
SHARE_MAX_TURNS = 4
"""At most this many turns in a row to the Lagrangian there, then one to the search, to measure it again."""
SHARE_STALE_S = 2.0
"""Seconds of local search without a better plan after which the Lagrangian may take more of the last time than
the search (`Flow._polish_and_bound`): a search on 1,000 layers gains in bursts (its kicks' cycles take seconds),
so a turn without a gain alone does not say it has stopped."""
RACE_TURN_S = 0.5
"""Seconds per turn of each local search in a race (`Flow._race`)."""
RACE_PATIENCE = 2
"""Turns in a row without a better plan after which a late beam's search that trails the other leaves the race
(the 200-layer synthetic chain at 20%, 10 s: a beam plan at 0.0357 s against the incumbent's 0.0333 s; raced to
the end, the answer was 1.3% worse)."""
MISPRICED = 0.02
"""A fluid beam's plans are mispriced where the simulator's cost of the best is this much above the sweep's own: then
stalls shape the plans and a FIFO beam runs after that fluid beam. Measured (2026-11-26, widths 24 / 96 / 384):
the synthetic 200-layer chain and DAG at 20% 1.00-1.01x; PipeDream ResNet-50 at 12 / 19 / 22.5% 1.10 / 1.28-1.36 /
1.15-1.23x, at 34% 1.09x at width 24 and 1.00x wider; the H100 decoders at 50% 1.07-1.45x."""
STALLS_DECIDE = 0.05
"""Where every fluid beam's best plan simulates more than this much above the sweep's own cost, stalls decide the
plans (`Flow.stalls_decide`), and on traces of up to 300 layers the link windows' Lagrangian is skipped: the fluid
sweep finds its own optimum fast there, above that LP, and the FIFO climb gets the time. Measured (10 s, 2026-11-26):
PipeDream ResNet-50 at 12 / 19 / 22.5% 1.10-1.36x at every width; at 26% 1.11 / 1.01 / 1.02 / 1.00x; the synthetic
200-layer DAG at 20% 1.00 / 1.08x and the chain 1.00x, where the link windows are the bound (a rule on any one
beam, as MISPRICED, skipped them there: gaps 15 / 31% -> 40 / 54%)."""
PRICED_EXACTLY = 5e-3
"""Where every fluid beam's best plan simulates within this share of its sweep cost, the FIFO probe is skipped
(`Flow.fifo_probe`; docs/formulation.md, 'How solve() uses it', step 4) and the exact DP probes first
(`Flow.dp_probe`). Stalls worth half the default gap do not decide the plans; the FIFO machinery is for those
that do (PipeDream ResNet-50 at 12-22.5%, the H100 decoders at 50%: 1.07-1.45x, MISPRICED). Was 1e-3: PipeDream
ResNet-50 at 25% (1.0018x on the narrowest beam, exact on the wider ones) then ran a Lagrangian, a local search
and a FIFO probe, each a share of the limit, before the fluid sweep that proves it. One core, 10 / 30 / 60 / 150 s
limits: proven at 7.2 / 13.2 / 23.2 / 37.6 s, now 7.9 / 6.8 / 8.2 / 6.8 s (2026-11-28; every other row that moved
in the side-by-side --stalls, --issue22 and --conventions runs has a largest ratio of 1 or above 1.02: timing)."""
DP_PROBE_SHARE = 0.15
"""Where the fluid beams priced their plans exactly, the exact DP runs right after the beam for this share of the limit,
and on where its pace says its sweep finishes before the exact DP phase would end (`Flow.dp_probe`): the fluid
optimum is then the answer, and the sweep often finishes in a fraction of the time that the link windows' Lagrangian
and the local search before it took. PipeDream ResNet-50 at 7.46 GiB, 12 s, one core (2026-11-28): the DP's sweep 0.5
s, proven at 7.4 s of the solve, after 6.5 s of beam, Lagrangian and local search."""
PROBE_PACE = 1.0
"""The probe climbs (each sweep's threshold sized by the last one's time, as on long traces) and its sweeps stop as
soon as their pace says they cannot finish within its share (SweepConfig.pace): the probe is a bet on the beam's
incumbent, which can lie far above the optimum, and a cut sweep's time is lost to the phases after it. ResNet-50
at 56%, 10 s, one core: one sweep at 0.7 of the beam's incumbent and one at all of it: the second cut at its
share (1.5 s), proven at 7.0 s of the solve; climbing: 0.0223 / 0.0261 / 0.0278 s in 0.13 / 0.41 / 0.64 s, the
last finds the optimum (0.026937 s), proven at 3.3 s (5.3 s before the probe). At 41% the climb proves 0.0434 s
in 1 s and stops (its next step would not fit): proven at 7.0 s (6.0 s before the probe)."""
FIFO_BEAM_FIRST = 16
"""The first FIFO beam's width, after the first fluid beam's (24); each later one is 4x wider, as the fluid
beam's. Its labels carry whole copy queues and it expands every segment, so a label costs several times a fluid
one: PipeDream ResNet-50 at 2.25 GiB, one core, widths 16 / 64 / 256 in 0.11 / 0.30 / 0.92 s against the
fluid beam's 24 / 96 / 384 in 0.15 / 0.21 / 0.36 s."""
PROVE_SHARE = 0.6
"""A solve started from an earlier answer (solve_report's `start`: a sweep solving an open point again) first runs
the exact sweep at that answer's threshold for up to this share of its limit (`Flow.prove_start`): the answer is
known, what it lacks is the bound, and that one sweep proves the gap or finds the optimum below it (PipeDream
ResNet-50 at 2.62 GiB: the FIFO sweep at 0.99 x 0.11035 s ends in 10.8 s on one core, where a solve from scratch
took 39 s to prove the point, 7 s of them in a probe cut by its share)."""

PROVE_TOP_SHARE = 0.5
"""The share of PROVE_SHARE the FIFO sweep at the start's threshold may take before the FIFO climb takes over."""

RESERVE_S = 0.05
"""Kept back at the end for building and simulating the returned schedule, plus RESERVE_PER_LAYER_S per layer
(a simulation with events of a 5,000-layer trace takes about 0.3 s)."""
RESERVE_PER_LAYER_S = 1e-4
AUTO_MILP_MAX_LAYERS = 100
"""Under `auto`, when the DP leaves a gap (its fluid bound is loose where stalls matter), the MILP with windows
covering every schedule (W = L = n: an exact model, so its bound is true) gets the time left, up to this many
layers (its size grows as n^3)."""

LINK_WORK_SHARE = 0.5
"""The link-work sweep's share of the solve's time left (Flow.link_work_dp), at most to its phase's end: on the H100
decoders it finishes in 0.1-0.5 s, where the FIFO sweeps that would price the same latency need minutes."""
LINK_WORK_EARLY_SHARE = 0.1
"""The early link-work sweep's share of the limit (Flow.link_work_early), right after the beams and the ratio plan."""
LINK_WORK_EARLY_MIN_S = 0.6
"""The early link-work sweep's least time (Flow.link_work_early), within LINK_WORK_SHARE of the time left."""
IN_FLIGHT_EARLY_SHARE = 0.3
"""The early link-work sweep with bytes in flight's share of the limit (Flow.link_work_early; at least
LINK_WORK_EARLY_MIN_S), where the plain one finished with its plan mispriced (Flow.in_flight_wanted): its labels
carry the latest copy's bytes, so it keeps more of them (bert-large on an H200 at 35%: 1.8-2.3 s to its optimum,
which its plan attains; at 20% of a 10 s limit its pace cut it at 1.46 s in one run of two)."""
