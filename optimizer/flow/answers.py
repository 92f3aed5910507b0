"""The solve's phases that find plans (AnswerPhases): the fluid and FIFO beams, the ratio plan, the late beam
and the local searches, with the last time they share with the link windows' Lagrangian."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import TYPE_CHECKING

from memsched.optimizer.decisions import Decision
from memsched.optimizer.flow import shares
from memsched.optimizer.flow.state import FlowState
from memsched.optimizer.host import fits_host, next_price
from memsched.optimizer.link_plan import link_plan
from memsched.optimizer.polish import LocalSearch
from memsched.optimizer.ratio import ratio_plan
from memsched.optimizer.simulate import SimResult
from memsched.schema import Action

if TYPE_CHECKING:
    from memsched.optimizer.dp import DpOutcome, DpProblem
    from memsched.optimizer.dp.lagrange import LinkLagrangian

log = logging.getLogger(__name__)


class AnswerPhases(FlowState):
    """The phases that find plans: the beams, the ratio plan and the local searches."""

    def beam(self, until: float) -> None:
        """Beams of growing width within the share: an answer early, a better one if time allows. Where copies run
        beside compute and a fluid beam misprices its plans, a FIFO beam follows it (`_fifo_beam`), and in each
        later round goes first. Where layers have too many subsets to try, a FIFO beam on their relaxed ranges
        opens each round, whatever the fluid beam's pricing, and widens past the others to the share's end. A cut
        beam decodes no plan, so a round that its series' growth says will not finish in the time left is not
        started (`_beam_round_fits`): its time goes to the other series or the next phase.

        Each round's fluid beams are two series: one ranked by the lower bound on what is to come (BeamRank.BOUND)
        and one that also charges its backlogs as if they drained now (BeamRank.DRAINED, whose pricing steers the
        FIFO beams and the later phases: `_mispricing`). Neither wins everywhere (dp/sweep.py, BeamRank); the first
        round of the phase may run to BEAM_FIRST_SHARE, and `late_beam` ranks as the series whose plan was best."""
        from memsched.optimizer.dp import BeamRank, beam_search  # numba loads here, not on every CLI start
        from memsched.optimizer.dp.problem import offload_enumerable

        width = 24
        fluid_on = True
        fifo_on = self.fifo_beam_ok()
        mispriced = False  # the last fluid beam's plans cost more than it said (_mispriced)
        fluid_s: list[float] = []  # each width's fluid beam time, widest last
        drained_width = 0  # the width of the last DRAINED round that finished
        # Without concurrent copies (or offload) no label has a backlog and the two rankings are one.
        bound_on = self.trace.device.concurrent_copies and Action.OFFLOAD in self.allowed
        bound_s: list[float] = []  # each width's BeamRank.BOUND beam time, widest last
        series_best = {rank: math.inf for rank in BeamRank}  # each series' best plan, seconds
        # The BOUND series' plans (ids of their SimResults): the DRAINED beams are pruned at the best plan of the
        # others, so that their plans, and the pricing the later phases read from them, stay as they were.
        bound_plans: set[int] = set()
        # Which series goes first in a round: on traces of up to LONG_TRACE layers the DRAINED beam, whose pricing
        # steers the phases after this one (a BOUND beam first took the share of a 2 s solve on PipeDream ResNet-50
        # at 25%: no DRAINED round finished, so the DP probe gave way to the FIFO probe and the answer was 21%
        # dearer); on longer ones the BOUND beam, whose first round is the one worth running past the share.
        bound_first = self.trace.n > shares.LONG_TRACE

        def drained_threshold() -> float:
            return min((c.sim.overhead_s for c in self.cands if id(c.sim) not in bound_plans), default=math.inf)

        fifo_s: list[float] = []  # each width's FIFO beam time, widest last
        # The FIFO beam on relaxed ranges (`_fifo_beam`'s `relaxed`), where layers have too many subsets to try: the
        # fluid beam drains copies as a fluid and the real options are all near a whole offload, so neither sees a
        # plan that stalls a little to recompute a block less (bert-large on an H100 at 25%: its 1024 labels find
        # 0.023516 s, 20 blocks recomputed, against 0.023706 s from every other beam and the local search).
        # (Asked of the trace: building the problem here would spend the share before the first round's clock check.)
        relaxed_on = fifo_on and not offload_enumerable(self.trace)
        relaxed_s = self.relaxed_beam_s  # each finished round's time, widest last
        ratios: list[float] = []  # each fluid beam's mispricing (_mispricing)
        fluid_empty = 0  # fluid rounds in a row that decoded no plan below the incumbent (BEAM_EMPTY_ROUNDS)
        price = 0.0  # the host budget's price per offloaded byte (host.py), raised while no plan fits the host
        # The first fluid round may finish past the share, up to BEAM_FIRST_SHARE: cut, it decodes no plan, and the
        # local search then starts from the baselines' (BEAM_FIRST_SHARE).
        first_until = max(until, self.until(shares.BEAM_FIRST_SHARE))

        def fifo_round() -> bool:
            """The FIFO beam's next round, where it may finish; False once one did not (or would not)."""
            if not _beam_round_fits(fifo_s, until):
                return False
            began = time.perf_counter()
            finished = self._fifo_beam(until, shares.FIFO_BEAM_FIRST * 4 ** len(fifo_s))  # 16, 64, 256, ... labels
            fifo_s.append(time.perf_counter() - began)
            return finished

        def relaxed_round() -> bool:
            """The relaxed FIFO beam's next round (16, 64, ... labels), where it may finish; False once one did not
            (or would not: `late_fifo_beam` may run it), or past MAX_RELAXED_FIFO_BEAM."""
            labels = shares.FIFO_BEAM_FIRST * 4 ** len(relaxed_s)
            if labels > shares.MAX_RELAXED_FIFO_BEAM:
                return False
            if not _beam_round_fits(relaxed_s, until):
                self.relaxed_beam_left = labels
                return False
            return self._relaxed_beam(until, labels)

        def fluid_beam(
            rank: BeamRank, p: DpProblem, deadline: float, threshold: float
        ) -> tuple[DpOutcome, list[SimResult]]:
            """A fluid beam of `width` labels ranked as `rank` says; its best plan that fits the host joins the
            candidates. The beam's outcome, and its plans that fit."""
            out = beam_search(self.trace, self.budget, deadline, width=width, threshold=threshold, problem=p, rank=rank)
            fitted = [sim for sim in out.schedules if fits_host(sim, self.host)]
            if fitted:
                self.add("dp-beam", fitted[0])
                series_best[rank] = min(series_best[rank], fitted[0].overhead_s)
            return out, fitted

        def bound_round_s() -> float:
            """The BOUND round's predicted time at `width`: its series' next (_next_round_s), and at least the
            DRAINED beam's at that width (its last round's where that was as wide, else that one's next)."""
            own = _next_round_s(bound_s) if bound_s else 0.0
            if not fluid_s:
                return own
            return max(own, fluid_s[-1] if drained_width == width else _next_round_s(fluid_s))

        def bound_round(p: DpProblem, shift: float) -> None:
            """The BOUND series' round at `width` (its plans join the candidates), where it may finish."""
            nonlocal bound_on
            round_until = until if bound_s or fluid_s else first_until  # (only the phase's first beam runs past)
            # (_beam_round_fits's test, with the DRAINED round of this width as a floor: a cut beam finds no plan)
            bound_on = bound_on and time.perf_counter() + bound_round_s() <= round_until
            if not bound_on or self.proven() or time.perf_counter() >= round_until:
                return
            began = time.perf_counter()
            best_before = self.best.sim.overhead_s
            out, fitted = fluid_beam(BeamRank.BOUND, p, round_until, best_before + shift)
            bound_plans.update(id(sim) for sim in fitted[:1])
            # The series goes on while each round improves the best plan known: where the fluid drain misprices the
            # longer backlogs it keeps, its plans lose to the other beams' from the first round on (the tracer's GPU
            # traces: 1.0-3.6x the DRAINED beam's plan, bench/results/beam_rank.md), and its rounds only took time
            # (bert-large on an H100 at 75%: proven at 0.35 instead of 0.21 s).
            bound_on = not out.timed_out and bool(fitted) and fitted[0].overhead_s < best_before
            if not out.timed_out:
                bound_s.append(time.perf_counter() - began)
                if not price:
                    self.widest_beam = max(self.widest_beam, width)

        def bound_leaves_drained_its_round() -> bool:
            """Where the DRAINED beam goes first: whether a BOUND round now leaves the DRAINED series' next round
            (4x as wide) its predicted time, or that round will not run. Its wider rounds come first where the share
            does not hold both: on PipeDream ResNet-50 at 25%, 2 s (a share of 0.4 s), the BOUND round of 24 labels
            took the time of the DRAINED round of 96, whose plan the answer was (0.0909 -> 0.1061 s)."""
            if bound_first or not fluid_on or not fluid_s or width * 4 > shares.MAX_BEAM_WIDTH:
                return True
            if not _beam_round_fits(fluid_s, until):
                return True
            return time.perf_counter() + bound_round_s() + _next_round_s(fluid_s) <= until

        # Rounds of 4x the width, up to MAX_BEAM_WIDTH: in each the fluid beam and, where the fluid beam misprices
        # its plans, the FIFO beam. Once it has, the FIFO beam goes first: its plans are priced as the simulator
        # prices them, and the fluid beam's wider rounds rank plans by a cost the simulator does not charge
        # (GPT-2 medium on an H100 at 50%: the fluid beam's best plans cost 0.0370, 0.0403, 0.0435, 0.0415 s at
        # 24-1536 labels; the FIFO beam of 256 finds 0.0347 s when it is not cut by the share after them).
        # A round after the answer is proven (by the stage bound, which runs first) would find nothing it needs.
        while (
            width <= shares.MAX_BEAM_WIDTH
            and time.perf_counter() < until
            and (fluid_on or bound_on or (fifo_on and mispriced) or relaxed_on)
            and not self.proven()
        ):
            if relaxed_on:
                relaxed_on = relaxed_round()
            # Each series' round may prove the answer (with the stage bound): the rounds after it in this pass
            # would find nothing it needs either (bert-large on an H100 at 75%: the relaxed round of 1,024 labels
            # proves it, and the fluid round of 1,536 after it took 0.4 s of the 2.1 s solve).
            fifo_first = fifo_on and mispriced and not self.proven()
            if fifo_first:
                fifo_on = fifo_round()
            beams = self.problem().for_beams()
            p = beams if not price else dataclasses.replace(beams, host_price=price, _remaps={})
            # A plan within the host budget costs at most its overhead + price x H in the priced sweep.
            shift = price * self.host if price and self.host is not None else 0.0
            if bound_first:
                bound_round(p, shift)
            fluid_on = fluid_on and _beam_round_fits(fluid_s, until)
            if self.proven():
                break
            # Only the phase's first beam may run past the share (a BOUND beam that did leaves no time for this one).
            drained_until = until if fluid_s or bound_s else first_until
            if fluid_on and time.perf_counter() < drained_until:
                began = time.perf_counter()
                out, fitted = fluid_beam(BeamRank.DRAINED, p, drained_until, drained_threshold() + shift)
                if out.timed_out:
                    break
                if out.schedules and not fitted and self.host_binds and price < 1e6 * self.price_scale:
                    price = next_price(price, None, self.price_scale)  # the same width again, offloads dearer
                    continue
                fluid_s.append(time.perf_counter() - began)
                drained_width = width
                if not price:
                    self.widest_beam = max(self.widest_beam, width)
                fluid_empty = 0 if out.schedules else fluid_empty + 1
                fluid_on = fluid_empty < shares.BEAM_EMPTY_ROUNDS
                ratio = _mispricing(out)
                if ratio is not None:
                    ratios.append(ratio)
                # The FIFO beam where the fluid beam misprices its own plans: their stalls, which the fluid sweep
                # drains as it goes, decide them (synthetic 200-layer chain: priced exactly, the FIFO beam only
                # takes the fluid beam's time; PipeDream ResNet-50 at 19%: the simulator's cost 1.28-1.36x the
                # sweep's).
                mispriced = _mispriced(out)
            if not bound_first and bound_leaves_drained_its_round():
                bound_round(p, shift)
            if not fifo_first and fifo_on and mispriced and not self.proven():
                fifo_on = fifo_round()
            width *= 4
        # The relaxed FIFO beam widens on to the share's end (MAX_RELAXED_FIFO_BEAM); a round the share left out is
        # `late_fifo_beam`'s.
        while relaxed_on and not self.proven() and time.perf_counter() < until:
            relaxed_on = relaxed_round()
        if relaxed_on and self.relaxed_beam_left is None:
            self.relaxed_beam_left = shares.FIFO_BEAM_FIRST * 4 ** len(relaxed_s)
        self.beam_rank = min(BeamRank, key=lambda rank: series_best[rank])  # DRAINED on ties (first)
        log.info("fluid beams' mispricing (simulated / swept, narrowest first): %s", [round(r, 3) for r in ratios])
        self.stalls_decide = self.fifo_beam_ok() and bool(ratios) and min(ratios) > 1.0 + shares.STALLS_DECIDE
        self.priced_exactly = bool(ratios) and max(ratios) <= 1.0 + shares.PRICED_EXACTLY
        self.some_mispriced = self.fifo_beam_ok() and bool(ratios) and max(ratios) > 1.0 + shares.MISPRICED

    def late_fifo_beam(self, until: float) -> None:
        """The relaxed FIFO beam's round that `beam`'s share cut or left out (`relaxed_beam_left`), and the wider
        rounds after it (4x each, up to MAX_RELAXED_FIFO_BEAM), while the gap is still open, before the exact DP's
        first sweeps: on a slower or busier host, or at a short limit, the share ends before the round that finds
        the answer (gpt2-medium on an H100 at 50%: its 1,024 labels find 0.034801 s in 0.73 s, within 1% of the
        stage bound; cut at a 6 s limit, the answer stayed 0.036449 s, 4.9% above it. At 65% with a 2 s limit the
        share cut the round of 64 labels, and the round of 256 finds 0.023139 s, which the stage bound proves,
        against 0.025399 s from the ratio plan). A round is skipped where its time, predicted from the rounds that
        finished, would pass `until`."""
        width, self.relaxed_beam_left = self.relaxed_beam_left, None
        while width is not None and width <= shares.MAX_RELAXED_FIFO_BEAM and not self.proven():
            if not _beam_round_fits(self.relaxed_beam_s, until):
                log.info("late fifo beam %d skipped: predicted to pass its share", width)
                return
            if not self._relaxed_beam(self._round_end(self.relaxed_beam_s, until), width):
                self.relaxed_beam_left = None  # cut: the exact DP's sweeps have the time after it
                return
            width *= 4

    def _round_end(self, times: list[float], until: float) -> float:
        """Where a relaxed FIFO beam round that `_beam_round_fits` may run to: past its share's end `until`, up to
        LATE_ROUND_MARGIN x its predicted time (`_next_round_s` errs low, and a cut round decodes nothing), within
        the solve's deadline."""
        if len(times) < 2:
            return until
        return self.until_at(max(until, time.perf_counter() + shares.LATE_ROUND_MARGIN * _next_round_s(times)))

    def _relaxed_beam(self, until: float, width: int) -> bool:
        """One relaxed FIFO beam round (`_fifo_beam`'s `relaxed`): its time joins `relaxed_beam_s` where it finished,
        its width is left for `late_fifo_beam` where the clock cut it. Whether it finished."""
        began = time.perf_counter()
        if not self._fifo_beam(until, width, relaxed=True):
            self.relaxed_beam_left = width
            return False
        self.relaxed_beam_s.append(time.perf_counter() - began)
        return True

    def fifo_beam_ok(self) -> bool:
        """The FIFO beam applies: copies run beside compute (on the compute thread the fluid beam prices them
        exactly), offload is allowed, the trace is short enough for the FIFO sweep, and no host budget binds (the
        FIFO sweep does not price host bytes, so its plans would mostly be discarded)."""
        return (
            self.trace.device.concurrent_copies
            and Action.OFFLOAD in self.allowed
            and self.trace.n <= shares.FIFO_MAX_LAYERS
            and not self.host_binds
        )

    def loss_beam(self, until: float) -> None:
        """The relaxed FIFO beam's series once more, ranked and pruned with the future table's loss-point row, where
        that row decides (DpProblem.loss_row_decides: the loss's own bytes make the loss point the peak): 16, 64, ...
        labels, up to the widest round of the series without it (`beam`, `late_fifo_beam`), while each is predicted
        to end by `until` and the gap is open. A beam keeps a few labels per run of retained bytes, and a stronger
        table shifts which, so neither table's series wins everywhere (at 10 s, bert-large on an H100 at 55%:
        0.013276 s without the row, 0.012815 s with it, proven; on an H200 at 65% 0.00925 s without it, 0.00963 s
        with it): the series without it runs as before, and this one adds its plans."""
        if not self.relaxed_beam_s or self.proven() or not self.problem().loss_row_decides:
            return
        widest = shares.FIFO_BEAM_FIRST * 4 ** (len(self.relaxed_beam_s) - 1)
        times: list[float] = []
        width = shares.FIFO_BEAM_FIRST
        # Each round is pruned at the series' own best plan, not the incumbent: pruned at the other series' plans,
        # its beams keep other labels and lose what it finds (at 10 s, bert-large on an H100 at 55%: 0.013060 s
        # against 0.012815 s, on an H200 at 55% 0.012413 s against 0.011948 s).
        own = math.inf
        while width <= widest and not self.proven():
            if not _beam_round_fits(times, until):
                log.info("loss-row fifo beam %d skipped: predicted to pass its share", width)
                return
            began = time.perf_counter()
            if not self._fifo_beam(self._round_end(times, until), width, relaxed=True, loss_row=True, threshold=own):
                return
            own = min(own, self.fifo_beam_found_s)
            times.append(time.perf_counter() - began)
            width *= 4

    def _fifo_beam(
        self, until: float, width: int, relaxed: bool = False, loss_row: bool = False, threshold: float | None = None
    ) -> bool:
        """One FIFO beam (dp.fifo_beam_search) of `width` labels per boundary, pruned at the best plan known; its
        plans join the candidates. False where the clock stopped it (a wider one would not finish either).
        `relaxed`: on the relaxed byte ranges of the FIFO climb (FIFO_RELAXED_CELLS) with short queues
        (RELAXED_FIFO_QUEUE), where layers have too many subsets to try: the real options keep a layer's 64
        largest sums, all near a whole offload, while the ranges span every size (docs/formulation.md, 'Short
        queues on relaxed ranges'). `loss_row`: ranked and pruned with the future table's loss-point row
        (`loss_beam`). `threshold`: where plans are pruned (None: the incumbent's overhead). Its best plan's
        overhead goes to `fifo_beam_found_s`."""
        from memsched.optimizer.dp import fifo_beam_search

        problem, queue = self.problem(), None
        if relaxed:
            problem, queue = self.bound_problem(shares.FIFO_RELAXED_CELLS), shares.RELAXED_FIFO_QUEUE
        out = fifo_beam_search(
            self.trace,
            self.budget,
            until,
            width,
            threshold=self.best.sim.overhead_s if threshold is None else threshold,
            problem=problem.for_beams(loss_row),
            **({} if queue is None else {"queue": queue}),
        )
        for sim in out.schedules[:1]:
            self.add("dp-fifo-beam", sim)
        log.info(
            "fifo beam %d%s%s: best %s, %.2f s",
            width,
            " (relaxed ranges, short queues)" if relaxed else "",
            " with the loss row" if loss_row else "",
            f"{out.schedules[0].overhead_s:.6g} s"
            if out.schedules
            else "none: cut by the clock"
            if out.timed_out
            else "none below the incumbent",
            out.wall_s,
        )
        self.fifo_beam_found_s = out.schedules[0].overhead_s if out.schedules else math.inf
        return not out.timed_out

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

    def link_plan(self, until: float) -> None:
        """The link plan (optimizer/link_plan.py), the link windows' Lagrangian's steps rounded, joins the
        candidates: where the copy link is the bottleneck its segments are the LP's, which the local search from
        the greedy or the ratio plan does not reach (the 1,000-layer synthetic chain at 20%: 0.1035 s, where the
        ratio plan gives 0.1230 s and the local search from it ended at 0.1126 s in 60 s)."""
        if not self.link_shares:
            return
        began = time.perf_counter()
        sim = link_plan(self.trace, self.budget, self.link_shares, self.allowed, self.host, until)
        if sim is not None:
            self.add("link-plan", sim)
        log.info(
            "link plan (%d windows of %d steps): %s, %.2f s",
            len(self.link_shares),
            self.link_shares[0].since + self.link_shares[0].steps,
            "none fits" if sim is None else f"{sim.overhead_s:.6g} s",
            time.perf_counter() - began,
        )

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
            self._polish_from(seed, shares.DP_SEED_SHARE * limit, target)
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

    def seed_polish(self, until: float) -> None:
        """The local search from the exact DP's plan (`polish`), before the exact-window MILP, where the DP left one
        (its plan is not the best) and prices plans exactly (every offload subset enumerated, every output hold
        priced): that search is what closes the gap there, and the MILP would take the time it needs."""
        if self.dp_seed is None or self.proven() or not self.problem().exact_plans:
            return
        self.polish(until)

    def _polish_and_bound(self, until: float) -> None:
        """The solve's last time where the link windows' Lagrangian stopped at its share (`lagrange`): it shares
        that time with the local search in turns of SHARE_TURN_S, the answer first. A turn goes to the Lagrangian
        (resumed where it stopped) where it raised the bound faster in its last turn than the search lowered the
        answer in its own, or where it has run less than a turn in all (its rate is not measured yet), but while
        the search keeps finding better plans the Lagrangian has at most as much of the time as the search; once
        the search has found nothing for SHARE_STALE_S of its turns (or of the time since the best plan last
        improved), the Lagrangian may take up to SHARE_MAX_TURNS turns in a row, and the search then gets one to
        measure it again. On the 1,000-layer chain at 20%, 10 s, the search from the ratio
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
        bound_rate = link.recent_rate(shares.SHARE_TURN_S)  # seconds of bound per second in its last turn
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
            stuck = stale >= shares.SHARE_STALE_S
            # A Lagrangian that has run less than a turn in all has no rate to compare yet: its first prices leave
            # its value at 0 until they bite (a 400-layer chain at 20%: 0 s after 17 prices, 0.043 s after 50), so
            # it gets the turn after the search's first, to be measured.
            unmeasured = link.wall_s < shares.SHARE_TURN_S
            bound_turn = (
                search_rate is not None
                and (unmeasured or (bound_rate > search_rate and (stuck or bound_s < search_s)))
                and not (last_side == "bound" and in_a_row >= shares.SHARE_MAX_TURNS)
            )
            side = "bound" if bound_turn else "search"
            in_a_row = in_a_row + 1 if side == last_side else 1
            last_side = side
            turn = min(shares.SHARE_TURN_S, left)
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
        plan known, its width sized by a probe's time to end by `until` (LATE_BEAM_SAFETY, LATE_BEAM_MIN_WIDTH,
        LATE_BEAM_MIN_GROWTH). Its plan joins the candidates and seeds a second local search, which the last one
        races (`_race`): a local search's answer depends on its start, and a wide beam's plan lies in another basin
        of the same problem (the 200-layer synthetic chain at 20%: 0.0336 s after 9 s from the incumbent, 0.0286 s
        from a 6,144-label beam's plan). The incumbent's own search goes on beside it, so a beam plan that polishes
        worse costs time, not the answer."""
        from memsched.optimizer.dp import BeamRank, beam_search

        rank = self.beam_rank or BeamRank.DRAINED
        if self.proven() or not self.widest_beam:
            log.info("late beam skipped: %s", "proven" if self.proven() else "no beam round finished")
            return
        if self.stalls_decide:
            # The fluid beams mispriced every plan they found: a wider one ranks plans by the same wrong costs.
            log.info("late beam skipped: stalls decide the plans (the fluid beams mispriced them)")
            return
        # Where the DP's problem prices its plans as the simulator does, up to their copies' timing (every offload
        # subset enumerated, every output hold priced), its plan is the bound's: a search from it is what closes
        # the gap. Where it is a relaxation, its plan may simulate far dearer (ResNet-50 with every output saved and
        # 100 us copies at 50%: 0.0250 s against its sweep's 0.0215 s; from there the search ends at 0.0220 s, from
        # the late beam's plan at 0.02183 s), and the late beam runs as well.
        if (self.dp_seed is not None and self.problem().exact_plans) or self.fluid_optimum_known():
            # The exact DP found the fluid optimum: the local search from its plan (`polish`) is what closes the
            # gap, and needs the time (DenseNet-121 at 75%, 10 s: proven at 9.9 s, not proven with a late beam).
            log.info("late beam skipped: the exact DP found the fluid optimum")
            return
        until = self.until_at(until)

        # Pruned at a better incumbent than `beam`'s, a beam of the same width is several times faster (DenseNet-121
        # at 50%: 192 labels in 0.36 s); so probes at a quarter of `beam`'s widest width and at that width time it,
        # and the wide one is sized by them (beam_width_for).
        def pruned_beam(width: int) -> DpOutcome:
            """A beam of `width` labels to `until`, pruned at the best plan known, ranked as `beam`'s best series."""
            return beam_search(
                self.trace,
                self.budget,
                until,
                width=width,
                threshold=self.best.sim.overhead_s,
                problem=self.problem().for_beams(),
                rank=rank,
            )

        probes: list[tuple[int, float]] = []
        for probe_width in (max(self.widest_beam // 4, 8), self.widest_beam):
            began = time.perf_counter()
            out = pruned_beam(probe_width)
            probes.append((probe_width, time.perf_counter() - began))
            if out.timed_out:
                break
        probe_width, probe_s = probes[-1]
        # The probe's plan is a candidate but seeds no search: `beam` ran as wide, so its basin is one `beam` found.
        # As the best plan, though, it is where the last local search starts, so a probe that can only lead to a skip
        # is still run whole (cut where it could no longer leave room for the late beam, PipeDream ResNet-50 with
        # every node output saved at 25%, 10 s, ended at 0.065503 s instead of 0.064151 s, twice; 2026-11-30).
        for sim in out.schedules[:1]:
            self.add("dp-beam", sim)
        width = min(
            shares.LATE_BEAM_MAX_WIDTH,
            beam_width_for(probes, shares.LATE_BEAM_SAFETY * (until - time.perf_counter())),
        )
        if out.timed_out or width < max(shares.LATE_BEAM_MIN_WIDTH, shares.LATE_BEAM_MIN_GROWTH * probe_width):
            log.info("late beam skipped: %d labels fit its share (probe: %d in %.2f s)", width, probe_width, probe_s)
            return
        out = pruned_beam(width)
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
        RACE_TURN_S until `until`. The rival leaves the race once it trails the other and has found nothing better
        in RACE_PATIENCE turns in a row; a search that stops by itself leaves the other the rest."""
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
            res = search.run(min(left, shares.RACE_TURN_S), target)
            if res.improved:
                self.add("local-search", res.sim)
            if search is rival:
                stale = 0 if search.found_s < found else stale + 1
            if search.finished or (search is rival and stale >= shares.RACE_PATIENCE and rival.found_s > main.found_s):
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
            # plan, with its own seed, kicks elsewhere, until MAX_FRUITLESS_RESTARTS in a row find nothing (a
            # small trace's searches then stop in milliseconds: its plans are exhausted). Earlier, the phases that
            # follow get that time.
            if not restart or not self._search.finished or self.proven() or end - time.perf_counter() <= 0.05:
                return
            if fruitless > shares.MAX_FRUITLESS_RESTARTS:
                return
            start = self.best.sim
            self._restarts += 1
            self._search = self._local_search(start.decisions, seed=self._restarts)

    def _local_search(self, start: list[Decision], seed: int = 0) -> LocalSearch:
        """A local search from `start`, with this solve's actions and host budget."""
        return LocalSearch(self.trace, self.budget, start, seed=seed, allowed=self.allowed, host_budget=self.host)


def _mispricing(out: DpOutcome) -> float | None:
    """The simulator's cost of a fluid beam's best plan over the sweep's own (None: no plan, or a free one)."""
    if out.swept_s is None or not out.schedules or out.swept_s <= 0.0:
        return None
    return out.schedules[0].overhead_s / out.swept_s


def _mispriced(out: DpOutcome) -> bool:
    """Whether the simulator prices a fluid beam's best plan at least MISPRICED above the sweep's own cost."""
    ratio = _mispricing(out)
    return ratio is not None and ratio > 1.0 + shares.MISPRICED


def _next_round_s(times: list[float]) -> float:
    """A beam's next round's time (4x the width of the last): the last round's times the growth between the last
    two (at least 1; with one round, 1). That growth rises with the width (2.0-3.6x from 384 to 1536 labels on the
    H100 decoders and a CPU Llama of 48 blocks), so the prediction errs low."""
    growth = max(1.0, times[-1] / max(times[-2], 1e-9)) if len(times) >= 2 else 1.0
    return growth * times[-1]


def _beam_round_fits(times: list[float], until: float) -> bool:
    """Whether a beam's next round may finish by `until` (_next_round_s). The prediction errs low: it rarely skips
    a round that would finish, while a cut beam decodes no plan (the fluid beam of 1536 labels on a CPU Llama of 48
    blocks at 50%: 1.25 s of a 2 s share, for nothing). Fewer than two rounds: it may."""
    if len(times) < 2:
        return True
    return time.perf_counter() + _next_round_s(times) <= until


def beam_width_for(probes: list[tuple[int, float]], seconds: float) -> int:
    """The widest beam predicted to end within `seconds`, from timed probes (width, seconds; the widest last): a
    beam's time is modelled as a + b w ln w (each boundary sorts its labels; `a`, what any width pays, is fitted
    from the two widest probes, at most half the widest one's time, and 0 with one probe).

    Measured, one core, beams pruned at the best plan: DenseNet-121 at 50% 96 / 384 / 1,536 / 3,072 / 6,144 /
    12,288 labels in 0.15 / 0.30 / 1.02 / 2.17 / 4.76 / 9.89 s; the fit on 384 and 1,536 predicts 9.4 s for 12,288
    (linear in w from 1,536: 7.8 s, and a late beam so sized, 18,554 labels for a 14 s share, was cut at its end;
    w ln w from 384 alone: 15 s, a beam half as wide as fits). PipeDream ResNet-50 with every node output saved
    at 25%: 96 / 384 / 1,536 / 3,072 in 0.12 / 0.27 / 0.94 / 1.59 s; the fit predicts 1.94 s for 3,072."""
    assert probes, "a probe first"
    w2, t2 = probes[-1]
    x2 = w2 * math.log(max(w2, 2))
    fixed = 0.0
    if len(probes) >= 2:
        w1, t1 = probes[-2]
        x1 = w1 * math.log(max(w1, 2))
        if x2 > x1 and t2 > t1:
            fixed = min(max(t2 - (t2 - t1) / (x2 - x1) * x2, 0.0), 0.5 * t2)
    if seconds <= fixed:
        return 0
    if t2 <= 0.0:  # a probe too fast to time (fixed is then 0): as wide as itself
        return w2
    target = x2 * (seconds - fixed) / (t2 - fixed)  # w ln w that fits `seconds`
    # w ln w is increasing for w >= 2: bisect on integers.
    lo, hi = 1, max(2, int(target))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mid * math.log(max(mid, 2)) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo
