"""The solve's phases that prove bounds (BoundPhases): the Lagrangians, the exact DP's fluid sweeps and
ladders, the FIFO probe and climb, the host budget's prices, and the MILP."""

from __future__ import annotations

import functools
import logging
import math
import time
from typing import TYPE_CHECKING

from memsched.errors import SolverError
from memsched.optimizer.flow import backends, shares
from memsched.optimizer.flow.state import FlowState, LagrangeKind, SweepKey, lagrange_kind, near_exact_ranges
from memsched.optimizer.host import MAX_PRICES, fits_host, next_price, priced_sweep
from memsched.optimizer.simulate import simulate
from memsched.options import SolverName
from memsched.schema import Action, SolverStatus

if TYPE_CHECKING:
    from memsched.optimizer.dp import DpOutcome

log = logging.getLogger(__name__)


class BoundPhases(FlowState):
    """The phases that prove bounds: the Lagrangians, the exact and FIFO sweeps, the host budget's prices and
    the MILP."""

    def stage_memory_bound(self) -> None:
        """The stage bound (optimizer/stage_bound.py): each stage's memory alone, every copy paying its latency.
        10-20 ms on short traces (0.2-0.3 s on 1,000 layers, within STAGE_BOUND_SHARE), so it runs first:
        where a few long-latency copies are all the link can make before the peak, it proves what the fluid sweeps
        cannot (bert-large on an H100)."""
        from memsched.optimizer.stage_bound import stage_bound

        began = time.perf_counter()
        res = stage_bound(self.trace, self.budget, self.allowed, until=self.until(shares.STAGE_BOUND_SHARE))
        self.stage_pass = (res, time.perf_counter() - began)
        log.info("stage bound: %.6g s at stage %d, %.3f s", res.bound_s, res.stage, self.stage_pass[1])
        self._prove_stage(res.bound_s)

    def _prove_stage(self, bound_s: float) -> None:
        best = self.best.sim.overhead_s
        if bound_s > best * (1.0 + 1e-9) + 1e-12:
            # A plan that fits costs less: the relaxation missed a way to free memory. Never claim it.
            log.warning("stage bound %.9g s is above a plan that fits (%.9g s): not claimed", bound_s, best)
            return
        self.prove(bound_s, "stage")

    def stage_refine(self, until: float, early: bool = False) -> None:
        """The stage bound again at 4x its knapsack's steps, then 4x again, up to STAGE_BOUND_MAX_CELLS, while the
        gap is open, the stage bound is within STAGE_REFINE_REACH of the bound held (where it is not, a finer pass
        would not pass the other bound) and the next pass is predicted (STAGE_BOUND_REFINE_GROWTH x the last one's
        time) to end by `until`. Each layer's bytes are rounded up to a step, so finer steps can only lose less;
        stages that cannot pass the bound held are skipped (`stage_bound`'s floor). In one slot: `early` (the
        slot before the exact DP's first sweeps) where some layer has too many saved tensors to try every subset,
        whose relaxed sweeps take the rest of a short limit (GPT-2 medium on the H200 at 65%, 2 s); else the later
        slot, after the first local search, whose time it would take (ResNet-50 with every output saved and 100 us
        copies at 50%, 10 s: before that search, its answer came out 0.021903-0.022002 s against 0.021832-0.021836
        s, and the finer bound, 0.021698 s, proves only the first). Where the early slot ran no pass, the later may."""
        from memsched.optimizer.stage_bound import stage_bound

        if self.stage_pass is None or self.stage_refined:
            return
        if early and self.problem().offload_complete:
            return
        first, spent = self.stage_pass
        if first.bound_s < (1.0 - shares.STAGE_REFINE_REACH) * self.bound:
            return
        cells, complete = first.cells, first.complete
        while (
            not self.proven()
            and complete
            and 0 < 4 * cells <= shares.STAGE_BOUND_MAX_CELLS  # (a first pass of 14,285 steps went on to 914,240)
            and time.perf_counter() + shares.STAGE_BOUND_REFINE_GROWTH * spent <= until
        ):
            cells *= 4
            self.stage_refined = True
            began = time.perf_counter()
            finer = stage_bound(self.trace, self.budget, self.allowed, cells=cells, until=until, floor=self.bound)
            spent = time.perf_counter() - began
            complete = finer.complete
            log.info("stage bound at %d steps: %.6g s at stage %d, %.3f s", cells, finer.bound_s, finer.stage, spent)
            if finer.stage >= 0:  # a stage passed the bound held (else its value is that floor)
                self._prove_stage(finer.bound_s)

    def lagrange(self, until: float) -> None:
        """The Lagrangian bounds (optimizer/dp/lagrange.py): on the memory rows where it is strong
        (LAGRANGE_SHARE), whose prices then also prune the exact DP; on the fluid link windows where copies run
        beside compute on a trace long enough that the exact sweep may not finish (LINK_MIN_LAYERS)."""
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
        if kind == LagrangeKind.LINK and self.fluid_optimum_known():
            # The DP probe found the fluid optimum, which the LP of the same fluid model cannot pass.
            log.info("link windows' Lagrangian skipped: the exact DP found the fluid optimum")
            return
        strong = kind == LagrangeKind.ROWS
        until = self.until_at(until)
        if until - time.perf_counter() < shares.LAGRANGE_MIN_S:
            return
        obj = self.best.sim.overhead_s
        p = self.bound_problem(shares.RELAXED_LADDER[-2])
        arrays = lagrange_arrays(p, self.trace)
        target = obj * (1.0 - self.options.gap)
        if strong:
            # Checkpoint inputs by the first reader's rule alone, the completion tables' own: the path's mix of rules
            # (lagrange._span_charges) bounds DAGs higher, but its prices prune the exact DP less (keep / recompute:
            # the 1,000-layer DAG at 20%, 0.938 -> 1.007 s, but DenseNet-121 at 75% proven in 13.7 s, not 6.6 s).
            res = lagrangian_bound(arrays, obj, until, target_s=target, first_reader_only=True)
        else:
            # Its steps are sized by the bounds known too (LinkLagrangian.scale): the plan found so far can cost
            # several times the optimum (DenseNet-121 at 25%: the beam's 0.107 s against a bound of 0.043 s).
            link = LinkLagrangian(arrays, obj, self.bound)
            res = link.run(until, target_s=target)
            self.link_shares = link.windows()
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
        the DP best, so it runs first and this one, for the bound alone, after the DP (LAGRANGE_MIXED_SHARE)."""
        from memsched.optimizer.dp.lagrange import lagrangian_bound

        if self._rows_prices is None or self.proven():
            return
        arrays, prices = self._rows_prices
        until = self.until_at(until)
        if not len(arrays.span_at) or until - time.perf_counter() < shares.LAGRANGE_MIN_S:
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

    def fifo_applies(self) -> bool:
        """Whether the FIFO sweep runs here: concurrent copies (with serial ones the fluid sweep is exact already)
        and at most FIFO_MAX_LAYERS layers."""
        return self.trace.n <= shares.FIFO_MAX_LAYERS and self.trace.device.concurrent_copies

    def _fifo_sweep(
        self, until: float, incumbent_s: float, gap: float, cells: int, max_labels: int, queue: int | None = None
    ) -> DpOutcome:
        """One FIFO sweep (dp.fifo_search) pruned at incumbent x (1 - gap), on `cells` byte ranges per relaxed
        layer, with `queue` copies held exactly per queue (None: the sweep's own, QUEUE): its best plan joins the
        candidates, its bound is proved."""
        from memsched.optimizer.dp import QUEUE, fifo_search

        out = fifo_search(
            self.trace,
            self.budget,
            until,
            incumbent_s,
            gap,
            problem=self.bound_problem(cells),
            max_labels=max_labels,
            queue=QUEUE if queue is None else queue,
        )
        for sim in out.schedules[:1]:
            self.add("dp-fifo", sim)
        self.prove(out.bound_s, "dp-fifo")
        if out.stopped_at is not None:
            self.fifo_stopped_at = (cells, out.stopped_at)
        return out

    def fifo_dp(self, until: float) -> None:
        """Tier 2: the exact sweep with FIFO copy queues until `until`; a proof where it finishes."""
        if not self.fifo_applies():
            return
        until = self.until_at(until)
        seconds = until - time.perf_counter()
        if seconds < 0.05:
            return
        cap = max(20_000, min(shares.FIFO_MAX_LABELS, int(shares.FIFO_LABELS_PER_S * seconds)))
        out = self._fifo_sweep(until, self.best.sim.overhead_s, self.options.gap, shares.RELAXED_LADDER[0], cap)
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
        sweeps up to its threshold, incumbent x (1 - gap), until `until` (PROVE_SHARE). The fluid sweep first
        (stopped at its pace where it cannot finish): finished, it proves the gap, or finds its optimum, which
        proves the gap where the simulator prices that plan as the sweep does. Where the simulator prices it
        dearer (by over MISPRICED: stalls decide) and the FIFO sweep applies, the FIFO sweep at the threshold
        with up to PROVE_TOP_SHARE of the time: an answer that a whole solve left is near the optimum, and this
        one sweep proves it or finds the optimum below it. Cut, FIFO sweeps climb from the bound proven so far
        (`fifo_climb`) with the rest; what they leave open, the rest of the plan takes up as usual. Between the
        two, the link-work sweep where latency slows the fluid links (`link_work_early`)."""
        until = self.until_at(until)
        fluid = self._fluid_sweep(until, shares.RELAXED_LADDER[0], pace=shares.LONG_PACE)
        # The simulator's cost of the sweep's best plan over its bound (None: cut, or no plan below the threshold).
        ratio = None
        if fluid.schedules and fluid.bound_s and not (fluid.timed_out or fluid.cap_hit):
            ratio = fluid.schedules[0].overhead_s / fluid.bound_s
        log.info("prove from the start: exact DP, bound %s, %.2f s, its plan x%s", fluid.bound_s, fluid.wall_s, ratio)
        self.link_work_early(until, mispriced_only=False)  # (where latency slows the fluid links)
        fifo = self.fifo_applies() and Action.OFFLOAD in self.allowed and not self.host_binds
        if self.proven() or not fifo or ratio is None or ratio <= 1.0 + shares.MISPRICED:
            return
        now = time.perf_counter()
        top_until = now + shares.PROVE_TOP_SHARE * (until - now)
        out = self._fifo_sweep(
            top_until, self.best.sim.overhead_s, self.options.gap, shares.RELAXED_LADDER[0], shares.FIFO_MAX_LABELS
        )
        log.info("prove from the start: FIFO sweep at the threshold, bound %s, %.2f s", out.bound_s, out.wall_s)
        if not self.proven() and not out.schedules:
            self.fifo_climb(until, shares.RELAXED_LADDER[0])

    def dp_probe(self, until: float) -> None:
        """The exact DP before the bounds and the local search, where the fluid beams priced their plans exactly
        (`priced_exactly`), every layer's offload subsets are enumerated and no host budget binds: its optimum is
        then what the simulator says, so a finished sweep ends the solve (DP_PROBE_SHARE). Its sweeps stop at their
        pace (PROBE_PACE) towards the exact DP phase's own end, not at `until`: one that will finish by then is
        worth more now than the phases before that one, and a cut sweep's work is lost (PipeDream ResNet-50, batch
        256, at 25%, 10 s: cut at its 1.5 s share, then again at the DP phase's end, `feasible` with a 5.1% gap;
        running on, proven at 4.6-4.8 s, an answer 2.7% cheaper). Stopped by its pace, it has proved what it can;
        the exact DP phase runs again later, pruned by a better incumbent."""
        if not self.priced_exactly or self.host_binds or not self.problem().offload_complete:
            return
        if not self.options.is_milp:  # (a MILP asked for by name gets the time after its DP's share)
            until = max(until, self.until_from_start(shares.DP_UNTIL))
        out = self._fluid_sweep(until, shares.RELAXED_LADDER[0], climb=True, pace=shares.PROBE_PACE)
        log.info("exact DP probe: bound %s, %.2f s%s", out.bound_s, out.wall_s, " (cut)" * out.timed_out)

    def dp_first(self, until: float, last_until: float | None = None) -> None:
        """The exact DP before the local search (DP_FIRST_SHARE), where the fluid sweeps finish fast and prove: on
        the memory rows (no copies beside compute: the fluid model is exact, and the Lagrangian's prices prune it),
        and where some layer has too many saved tensors to try every offload subset (its relaxed sweeps, coarse
        first, are what proves there; the FIFO probe runs on their coarsest ranges). Not on the other traces with
        copies beside compute: where stalls decide, the FIFO probe and climb prove, and need the time.
        `last_until`: the exact DP phase's own end, to which the finest relaxed step may run (DP_FIRST_SHARE)."""
        rows = lagrange_kind(self.trace, self.allowed) == LagrangeKind.ROWS
        if rows or not self.problem().offload_complete:
            self.exact_dp(until, last_until)

    def _fluid_sweep(
        self,
        until: float,
        cells: int,
        climb: bool = False,
        pace: float | None = None,
        from_proven: bool = False,
        finish_by: float | None = None,
    ) -> DpOutcome:
        """The exact DP's sweeps (exact_search) on `cells` byte ranges per relaxed layer, pruned at the best
        candidate; its plan joins the candidates (and seeds the next local search where it simulates dearer than
        the best), its bound is proved. `from_proven`: a climb starts just above the bound proven so far
        (exact_search's climb_from_proven); `finish_by`: its last step may run on to this time (exact_search)."""
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
            finish_by=finish_by,
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
        """The FIFO sweep first, for a share of the limit (see FIFO_SHARE), unless the fluid beams priced their
        plans exactly (`priced_exactly`): the FIFO sweep stops at its label cap far below the fluid bound there,
        and the climb it would start finds nothing (ResNet-50 at 6.7 GiB: 3 s). Not where the exact DP found the
        fluid optimum and the gap is still open: no fluid sweep can prove more, and the beams' verdict may rest on
        the narrow rounds alone, whose plans do not stall (PipeDream ResNet-18 at 75%, 2 s, or 10 s on a busy
        host: the widest round, whose plans cost 7.8x their fluid price, did not run, and a 23.6% gap stayed open
        that a 0.01 s FIFO sweep closes)."""
        if self.priced_exactly and not self.fluid_optimum_known():
            log.info("fifo probe skipped: every fluid beam's plan cost what the fluid sweep said")
            return
        share = max(shares.FIFO_SHARE * self.options.time_limit_s, shares.FIFO_MIN_S)
        self.fifo_dp(time.perf_counter() + share)

    def fifo_early(self, until: float) -> None:
        """The FIFO sweep right after the beams, for FIFO_EARLY_SHARE of the limit, where some fluid beam mispriced
        its plans (`some_mispriced`): stalls decide plans there, the FIFO sweep is what proves, and it often
        finishes at once; the local search and the stage bound's finer passes that come before the FIFO probe
        take shares that grow with the limit, so a 10 s solve proved later than a 2 s one (PipeDream ResNet-18).
        Cut, the probe runs as before."""
        if self.some_mispriced and not self.proven():
            self.fifo_dp(until)

    def fifo_again(self, until: float) -> None:
        """Where the FIFO probe stopped (its time share or its label cap) and the fluid sweep then finished with
        the gap open, FIFO sweeps climb from the proven bound (`fifo_climb`): a loose fluid bound is what the FIFO
        sweep exists to replace, and each finished step proves its threshold, where one sweep at the incumbent
        proves nothing until it ends (PipeDream ResNet-50 at 2.25 GiB: 22 s at the incumbent on one core, 0.6 s
        at 0.169 s, 1.15 s at 0.174 s). Where layers offload relaxed byte ranges, the probe ran on the coarsest
        (RELAXED_LADDER[0]), whose FIFO optimum can lie below the fluid bound of finer ranges; the climb then runs
        on the finest ranges the fluid ladder finished, up to FIFO_RELAXED_CELLS, whether the probe stopped or not.
        Also where the probe did not run (the beams priced their plans exactly) and the exact DP then found the
        fluid optimum with the gap open: that optimum's plan stalls, so there too the FIFO sweep is what proves
        (PipeDream ResNet-18 at 75% with the widest beam round and the DP probe cut: no FIFO sweep ran, 23.6%
        short after the whole limit)."""
        if (
            not self.fifo_applies()
            or self.fluid_cells is None
            or self.proven()
            or self.left() <= shares.FIFO_AGAIN_MIN_LEFT_S
        ):
            return
        cells = min(self.fluid_cells, shares.FIFO_RELAXED_CELLS)
        if self.fifo_capped or self.fifo_timed_out or self.fluid_optimum_known() or cells > shares.RELAXED_LADDER[0]:
            end = min(until, time.perf_counter() + shares.FIFO_CLIMB_SHARE * self.left())
            if not self.problem().offload_complete:
                self.short_queue_sweep(end, cells)
            if not self.proven():
                self.fifo_climb(end, cells)

    def short_queue_sweep(self, until: float, cells: int) -> None:
        """Where layers offload relaxed byte ranges, FIFO sweeps at incumbent x (1 - gap) whose queues hold
        RELAXED_FIFO_QUEUE copies exactly (their merges keep the labels of many options few), then one copy more
        each (up to QUEUE - 1) while the gap is open, together for up to SHORT_QUEUE_SHARE of the time to `until`.
        Each that finishes proves the gap where it finds nothing below, or finds its own optimum: a bound, and
        plans that join the candidates; a longer queue merges later, so its optimum is usually nearer the exact
        one (docs/formulation.md, 'Short queues on relaxed ranges'). The next length runs only where it is
        predicted to finish (SHORT_QUEUE_GROWTH x the last one's time); the exact climb after them starts from
        the bound they proved."""
        from memsched.optimizer.dp import QUEUE

        now = time.perf_counter()
        end = now + shares.SHORT_QUEUE_SHARE * (until - now)
        last_s: float | None = None
        for queue in range(shares.RELAXED_FIFO_QUEUE, QUEUE):
            began = time.perf_counter()
            if self.proven() or (last_s is not None and shares.SHORT_QUEUE_GROWTH * last_s > end - began):
                break
            out = self._fifo_sweep(
                end, self.best.sim.overhead_s, self.options.gap, cells, shares.FIFO_MAX_LABELS, queue
            )
            log.info(
                "fifo sweep, %d copies a queue: bound %s, peak %d labels, %.2f s (%s)",
                queue,
                out.bound_s,
                out.peak_labels,
                out.wall_s,
                out.message or "finished",
            )
            if out.timed_out or out.cap_hit:
                break
            last_s = time.perf_counter() - began

    def fifo_climb(self, until: float, cells: int = shares.RELAXED_LADDER[0]) -> None:
        """FIFO sweeps at thresholds climbing from the proven bound towards incumbent x (1 - gap), each step sized
        by its predicted time (dp.next_threshold). Each one that finishes proves its threshold, or finds the
        exact optimum below it, which ends the climb (its plans real or not). A step the clock or the label cap
        stops proves nothing new; the climb then falls back to a third of the way from the last proven threshold
        to the one that failed (FIFO_CLIMB_RETRIES times), so a prediction that was too bold costs one step's
        share, not the rest of the climb. The top step, which alone proves the gap, comes as soon as it is
        predicted to fit (FIFO_CLIMB_TOP_SHARE) and may run to twice its prediction (FIFO_CLIMB_TOP_MARGIN)."""
        from memsched.optimizer.dp import next_threshold, predicted_s

        start = self.bound
        top = self.best.sim.overhead_s * (1.0 - self.options.gap)
        if top <= start:
            return
        span = top - start
        threshold: float | None = start + shares.FIFO_CLIMB_FIRST * span
        timed: list[tuple[float, float]] = []
        ceiling = float("inf")  # the lowest threshold whose sweep did not finish
        retries = 0
        while threshold is not None and not self.proven():
            seconds = until - time.perf_counter()
            if seconds < 0.05:
                break
            began = time.perf_counter()
            stopped_before = self.fifo_stopped_at
            # No step below the top takes all the time left: the first has no timing to be sized by, and a later
            # one's prediction may be off; what a cut step leaves goes to the fallback or the phases after the climb.
            share = shares.FIFO_CLIMB_STEP_SHARE if timed else shares.FIFO_CLIMB_FIRST_SHARE
            step_s = share * seconds
            if timed and threshold >= top:  # the top alone ends the search: a margin over its prediction
                step_s = max(step_s, min(seconds, shares.FIFO_CLIMB_TOP_MARGIN * predicted_s(timed, top, span)))
            # Labels are bounded by memory only: the sweep's clock keeps it within its share, and a step that
            # would pass the cap is one that failed.
            out = self._fifo_sweep(began + step_s, threshold, 0.0, cells, shares.FIFO_MAX_LABELS)
            finished = not (out.timed_out or out.cap_hit)
            log.info(
                "fifo climb: threshold %.6g s, bound %s, %.2f s%s",
                threshold,
                out.bound_s,
                out.wall_s,
                "" if finished else f" ({out.message})",
            )
            if out.schedules or (finished and out.bound_s is not None and out.bound_s < threshold):
                # The sweep's optimum lies below this threshold: found. Where its plans do not decode into real
                # ones that fit (relaxed ranges, parts of outputs priced as kept), a higher threshold finds the
                # same optimum again (the H200 ResNet-50 trace at its least feasible budget, before the DP priced
                # the snapshots of changed buffers: 0.15074 s at five thresholds, 12 s of a 60 s solve).
                break
            if not finished:
                if _fallback_futile(stopped_before, out, cells, self.trace.n):
                    log.info("fifo climb: no fallback (%s)", out.message)
                    break
                proven = timed[-1][0] if timed else start
                ceiling = threshold
                retries += 1
                fallback = proven + (threshold - proven) / 3.0
                threshold = fallback if retries <= shares.FIFO_CLIMB_RETRIES and fallback > self.bound else None
                continue
            if threshold >= top:
                break
            timed.append((threshold, time.perf_counter() - began))
            threshold = next_threshold(timed, top, until - time.perf_counter(), span, shares.FIFO_CLIMB_TOP_SHARE)
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
        remains; `last_until`: there the finest step may run to this time instead of `until` (`dp_first`). Then,
        where copy latency slows the fluid sweep's links, the link-work sweep (`link_work_dp`)."""
        if self.fluid_optimum_known():
            # An earlier run found the fluid optimum: another would prove no more, the link-work sweep may.
            self.link_work_dp(until)
            return
        relaxed = not self.problem().offload_complete
        # Where the memory rows' prices do not prune the DP: from PACED_MIN_LAYERS its sweeps stop at their pace.
        rows = lagrange_kind(self.trace, self.allowed) == LagrangeKind.ROWS
        long_trace = self.trace.n > shares.LONG_TRACE and not rows
        # Over LONG_TRACE layers on the memory rows too: there the prices let most sweeps finish, and a pace that
        # says one cannot gives its time to the mixed rule's bound and the local search (the 1,000-layer DAG at
        # 20%, keep / recompute, 10 s: the sweep spent 4.8 s to reach layer 17 of 1,000).
        paced = self.trace.n >= shares.PACED_MIN_LAYERS and (not rows or self.trace.n > shares.LONG_TRACE)
        # From PACED_MIN_LAYERS with copies beside compute they climb from the bound held (MID_CLIMB_PACE).
        climbs = long_trace or (paced and not rows)
        if relaxed:
            self._coarse_dp(until)
        ladder = self.relaxed_ladder() if relaxed else shares.RELAXED_LADDER[:1]
        for i, cells in enumerate(ladder):
            last = i == len(ladder) - 1
            end = max(until, last_until) if relaxed and last and last_until is not None else until
            if self.proven() or (i > 0 and end - time.perf_counter() < 0.05):
                break
            if (cells, None, None) in self.finished_sweeps:
                continue  # an earlier run finished it (finished_sweeps)
            # A relaxed step's cost does not grow with its ranges (fewer ranges free more bytes per copy, so
            # fewer labels are pruned): each but the last gets at most LADDER_STEP_SHARE of the time left, and
            # one cut by that share makes way for the next.
            capped = relaxed and not last
            now = time.perf_counter()
            step_until = now + shares.LADDER_STEP_SHARE * (until - now) if capped else end
            # On long traces the climb's last step may run past the phase's end (DP_GRACE_LONG).
            grace = long_trace and not capped
            out = self._fluid_sweep(
                step_until,
                cells,
                climb=self.host_binds or climbs,
                pace=None if not paced else shares.MID_CLIMB_PACE if climbs and not long_trace else shares.LONG_PACE,
                from_proven=climbs,
                finish_by=self.until_at(step_until + shares.DP_GRACE_LONG * self.options.time_limit_s)
                if grace
                else None,
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
        self.link_work_dp(until)

    def link_work_early(self, until: float, mispriced_only: bool = True) -> None:
        """The link-work sweep (`link_work_dp`) before the bounds and the local search, where some fluid beam
        mispriced its plans (`some_mispriced`: stalls decide), on the ranges at which the relaxation is near exact
        (near_exact_ranges; the problem's own options where every subset is tried), for LINK_WORK_EARLY_SHARE of
        the limit (LINK_WORK_EARLY_MIN_S at least): where latency decides the stalls it proves in a tenth of a
        second what the fluid sweeps cannot (bert-large on an H100 at 25%: 0.1 s), and the beams and finer passes
        before the exact DP's phase took all of a 2 s limit. Where the beams priced their plans right it would only
        take time from them (GPT-2 medium on an H200 at 45%, 2 s: 0.26 s, and the FIFO beam that finds the answer
        the stage bound proves was cut). Not on long traces (LONG_TRACE), whose sweeps do not finish.
        `mispriced_only` False: whatever the beams said (a solve from an earlier answer runs no beams first)."""
        if self.trace.n > shares.LONG_TRACE or (mispriced_only and not self.some_mispriced):
            return
        cells = self.near_exact_cells if not self.problem().offload_complete else shares.RELAXED_LADDER[0]
        if cells is not None:
            # At least LINK_WORK_EARLY_MIN_S: a share of a short limit is shorter than the sweep (its pace stops it
            # where it would not finish). The sweep with bytes in flight, which runs only where the first left the
            # gap open, gets IN_FLIGHT_EARLY_SHARE of the limit of its own: it keeps more labels.
            least = shares.LINK_WORK_EARLY_MIN_S
            spans = (
                max(until - time.perf_counter(), least),
                max(shares.IN_FLIGHT_EARLY_SHARE * self.options.time_limit_s, least),
            )
            self.link_work_dp(until, cells, spans)

    def link_work_dp(self, until: float, cells: int | None = None, spans: tuple[float, float] | None = None) -> None:
        """The exact DP on the link-work relaxation (DpProblem.link_work: each copy holds its link for its latency
        and its bytes, and frees its memory at once) where copies run beside compute and latency slows the fluid
        sweep's links by at least 1% (fluid_bandwidth), the gap open: the fluid sweep spreads latency over the
        largest copy's bytes, so a plan of a few partial copies stalls for latency that it prices at nothing
        (bert-large on an H100 at 25%: 0.9 ms of the answer's 23.5 ms, all of the gap). The two relaxations leave
        out different things, so the larger bound holds. On `cells` byte ranges per relaxed layer (None: those of
        the finest fluid sweep that finished, none where none did), for up to LINK_WORK_SHARE of the time left,
        at most to `until` (with `spans`: the plain sweep and the one with bytes in flight each for its span from
        its start instead), stopped at its pace (LONG_PACE); once per number of ranges (`link_work_cells`).

        Where its gap stays open, the same with the latest copy's bytes in flight (DpProblem.in_flight), which
        prices what the plain relaxation leaves out where a row is tight: the plain sweep's optimum often stalls
        on the bytes its copies hold (ResNet-50 on an H100 at 25%: 0.0647 s proven, 0.1573 s with them, the answer
        0.1589 s; bert-large on an H200 at 35%: its plan, 0.018289 s in the sweep, is the answer and proven). Its
        labels carry the copy's bytes, so it keeps more of them (GPT-2 medium on an H100 at 45%, the bytes in powers
        of two: 8.5 s against 2 s): it runs second, at its own pace, and only where the plain sweep finished with the
        gap open and its best plan cost over MISPRICED more in the simulator than the sweep said, or none fit
        (`in_flight_wanted`): where the plain sweep was cut, the other would be too (GPT-2 medium on an H100 at 65%
        and on an H200 at 45%, 2 s: 0.27 s each, and both lost their proofs)."""
        from memsched.optimizer.dp import exact_search
        from memsched.optimizer.dp.problem import link_work_problem

        cells = self.fluid_cells if cells is None else cells
        if self.proven() or cells is None or Action.OFFLOAD not in self.allowed:
            return
        fluid = self.bound_problem(cells)
        if fluid.serial or fluid.fluid_d2h_bw == fluid.d2h_bw:
            return  # (serial copies: priced exactly already; no slowdown: latency is small against the copies)
        for in_flight in (False, True):
            if self.proven() or (cells, in_flight) in self.link_work_cells:
                continue
            if in_flight and cells not in self.in_flight_wanted:
                return
            now = time.perf_counter()
            end = min(
                self.until_at(until if spans is None else now + spans[in_flight]),
                now + shares.LINK_WORK_SHARE * (self.deadline - self.reserve - now),
            )
            if end - now < 0.05:
                return
            source = "dp-in-flight" if in_flight else "dp-link-work"
            out = exact_search(
                self.trace,
                self.budget,
                end,
                self.best.sim.overhead_s,
                self.options.gap,
                problem=link_work_problem(fluid, in_flight),
                proven_s=self.bound,
                pace=shares.LONG_PACE,
            )
            if not out.timed_out and not out.cap_hit:
                self.link_work_cells.add((cells, in_flight))
                best = out.schedules[0].overhead_s if out.schedules else math.inf
                if not in_flight and out.found_plans and best > (out.bound_s or 0.0) * (1.0 + shares.MISPRICED):
                    self.in_flight_wanted.add(cells)
            for sim in out.schedules[:1]:
                self.add(source, sim)
            self.prove(out.bound_s, source)
            log.info(
                "%s DP: %d ranges: bound %s, %.2f s%s",
                source,
                cells,
                out.bound_s,
                out.wall_s,
                " (cut)" * out.timed_out,
            )

    def _finished(self, key: SweepKey, out: DpOutcome) -> None:
        """Record a finished sweep (finished_sweeps)."""
        if not self.host_binds:
            self.finished_sweeps[key] = out.bound_s or 0.0

    def relaxed_ladder(self) -> tuple[int, ...]:
        """The byte ranges of the exact DP's successive relaxed sweeps: the coarsest, then the fewest ranges at
        which the relaxation is near exact (near_exact_ranges) as the last step; RELAXED_LADDER where no
        number of ranges up to NEAR_EXACT_CELLS' largest is."""
        near = self.near_exact_cells
        return shares.RELAXED_LADDER if near is None else (shares.RELAXED_LADDER[0], near)

    @functools.cached_property
    def near_exact_cells(self) -> int | None:
        """near_exact_ranges of this trace (computed once)."""
        return near_exact_ranges(self.trace)

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
        """Coarse relaxed sweeps first (COARSE_LADDER), coarsest first, each with the time left: each finished
        one proves a bound (the best is kept: every step is a relaxation of the real problem), and the first that
        the clock stops ends the ladder, as a finer one would not finish either; so does, where the ranges are
        near exact, a finished step that proves no more than the one before. A step whose first threshold lies at
        or below the bound proven so far starts at the top threshold (exact_search's proven_s)."""
        from memsched.optimizer.dp import exact_search

        previous: float | None = None  # the last finished step's bound
        near_exact = self.near_exact_cells is not None
        steps: tuple[tuple[int, int, int], ...] = shares.COARSE_LADDER
        if self.problem().serial:
            # Copies on the compute thread leave no backlogs, so a step that only refines their quantum is the step
            # before it again (a CPU Llama of 48 blocks at 50%: 0.4-0.7 s for the same bound).
            steps = tuple(dict.fromkeys((cells, shift, shift) for cells, shift, _ in shares.COARSE_LADDER))
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
        if self.left() < shares.MILP_MIN_LEFT_S:
            self.notes.append(f"no time left for {backend}")
            return
        options = self.options
        if exact_windows:
            options = options.model_copy(update={"window": self.trace.n, "max_segment": self.trace.n})
        starts = [c.sim.decisions for c in self.cands]
        outcome, exact = backends.run_backend(
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
                if outcome.objective_s is not None and backends.BACKENDS[backend].objective_is_simulated:
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


def _fallback_futile(before: tuple[int, int] | None, out: DpOutcome, cells: int, layers: int) -> bool:
    """Whether the FIFO climb's fallback after a step that did not finish (`out`) would stop short too, so that its
    time is better left to the phases after the climb (the local search, the exact-window MILP): the step stopped
    no further on than the FIFO sweep before it on the same byte ranges (`before`: Flow.fifo_stopped_at as it
    was), which ran at a higher threshold, stopped by its label cap, or by the clock before
    FIFO_FALLBACK_MIN_REACH of the layers. There the labels pile up before any threshold prunes them, so a sweep
    at a lower one stops there too. A 24-layer DAG with up to 20 tensors a layer and 2 ms copies at 75%: at 60 s
    the probe and three steps each stopped at layer 4 of 24 (27 s that the exact-window MILP after them lacked);
    at 10 s the probe stopped at layer 3, the first step at 4, and two fallbacks at 4 again."""
    if out.stopped_at is None or before is None or before[0] != cells or out.stopped_at > before[1]:
        return False
    return out.cap_hit or out.stopped_at < shares.FIFO_FALLBACK_MIN_REACH * layers
