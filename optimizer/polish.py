"""Local search over the per-layer actions ("polish"), judged by the simulator itself.

The greedy heuristic commits layer by layer and never revisits a choice; the MILP revisits everything but
its LP relaxation is weak where offload is divisible, so within a short time limit it often keeps its warm
start. This search sits between them: it starts from the best schedule known and changes one layer at a
time (keep / offload any subset of its tensors / recompute, starting or extending a segment), with offload
timing from `default_timing`, and every candidate is scored by `simulate` (so no model error is possible).

Plain descent stalls quickly: most improving changes need memory freed somewhere else first. So the
score is `overhead + lambda * (bytes over budget, summed over the stages)` and lambda oscillates from small
(over-budget schedules are cheap to pass through) to huge (only feasible ones count), a few times; the best
*feasible* schedule seen is kept (strategic oscillation). Measured on the 20-layer synthetic chain at 40%:
the greedy's 0.0314 s overhead becomes 0.0019 s (the proven optimum is 0.0017 s); plain descent stops at
0.0037 s.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from memsched.optimizer.decisions import ALL_ACTIONS, KEEP, Decision, group_start, offload_subset, recompute
from memsched.optimizer.fastsim import KIND_CONTINUE, KIND_KEEP, KIND_OFFLOAD, KIND_START, FastSim, descend
from memsched.optimizer.heuristic import fix_prefetch_order
from memsched.optimizer.host import fits_host
from memsched.optimizer.simulate import SimResult, simulate
from memsched.schema import Action, Trace

log = logging.getLogger(__name__)

Gene = str | tuple[int, ...]
"""One layer's action: 'K' keep, 'S' recompute starting a segment, 'R' recompute continuing the segment of
the layer before, or the tuple of offloaded tensor indices."""

# Lambda multipliers of one oscillation cycle (times the median recompute cost per byte, see _lambda0).
_CYCLE = (1e-3, 1e-2, 0.1, 1.0, 10.0, 1e4)
_MAX_STALE_RESTARTS = 200  # iterated local search: kicks in a row that find nothing better before it stops
_MAX_KICK_LAYERS = 24  # the longest stretch of layers one kick re-draws
_MAX_SUBSET_TENSORS = 3  # up to this many positive tensors, every subset is a move; beyond, all or one
_PART_S = 0.002  # seconds of compiled descent between two looks at the clock


@dataclass
class PolishResult:
    """What the search found."""

    sim: SimResult
    """The best feasible schedule seen (the start's own, if nothing beat it), simulated under the budget."""
    evaluations: int
    """Schedules simulated."""
    improved: bool
    """Whether it beats the start."""


def _genes(decisions: list[Decision]) -> list[Gene]:
    out: list[Gene] = []
    for i, d in enumerate(decisions):
        if d.action == Action.KEEP:
            out.append("K")
        elif d.action == Action.OFFLOAD:
            out.append(tuple(d.offload_tensors))
        else:
            out.append("S" if group_start(decisions, i) == i else "R")
    return out


def decisions_of(trace: Trace, genes: list[Gene]) -> list[Decision]:
    """Decisions (offload timing unset) for genes; an 'R' after a non-recompute layer starts a segment."""
    out: list[Decision] = []
    start = -1
    for i, g in enumerate(genes):
        if g == "K":
            out.append(KEEP)
            start = -1
        elif isinstance(g, tuple):
            out.append(offload_subset(trace, i, g))
            start = -1
        else:
            if g == "S" or start < 0:
                start = i
            out.append(recompute(group=start))
    return out


def _options(trace: Trace, allowed: frozenset[Action] = ALL_ACTIONS) -> list[list[Gene]]:
    """The genes each layer may take, of the `allowed` actions. The last layer is never offloaded (its interior
    is empty)."""
    out: list[list[Gene]] = []
    recompute_ok = Action.RECOMPUTE in allowed
    for i, layer in enumerate(trace.layers):
        pos = [q for q, b in enumerate(layer.tensors) if b > 0]
        opts: list[Gene] = ["K"]
        if recompute_ok:
            # 'R' continues the segment of layer i - 1: not past code that saves between the two (segment_last).
            opts += ["S", "R"] if i > 0 and not trace.layers[i - 1].code_after_saves else ["S"]
        if pos and i < trace.n - 1 and Action.OFFLOAD in allowed:
            if len(pos) <= _MAX_SUBSET_TENSORS:
                opts += [tuple(s) for r in range(1, len(pos) + 1) for s in itertools.combinations(pos, r)]
            else:
                opts += [tuple(pos)] + [(q,) for q in pos]
        out.append(opts)
    return out


def _perturb(genes: list[Gene], options: list[list[Gene]], rng: random.Random) -> list[Gene]:
    """`genes` with a random stretch of consecutive layers given random genes: a kick out of a local optimum
    that keeps the rest of the plan (most of a good plan is right)."""
    n = len(genes)
    width = rng.randint(2, max(2, min(_MAX_KICK_LAYERS, n // 8)))
    lo = rng.randrange(max(1, n - width + 1))
    out = list(genes)
    for i in range(lo, min(n, lo + width)):
        out[i] = rng.choice(options[i])
    return out


def _lambda0(trace: Trace) -> float:
    """Seconds per byte: the median forward time per saved byte (what recomputing a byte roughly costs)."""
    rates = sorted(x.forward_s / x.saved_bytes for x in trace.layers if x.saved_bytes > 0 and x.forward_s > 0)
    return rates[len(rates) // 2] if rates else 1e-12


class _Evaluator:
    """Scores plans with the compiled simulator (optimizer/fastsim.py): (overhead seconds, bytes over budget summed
    over the stages); runs the descent passes (`fastsim.descend`) on the current plan. Keeps the best feasible plan
    seen. Genes are held as indices into each layer's table: its moves (`options[i]`, in order) first, then any
    gene a start held outside them (an offload subset of a layer with many tensors), which is never a move."""

    def __init__(
        self,
        trace: Trace,
        budget_bytes: int,
        options: list[list[Gene]],
        genes: list[Gene],
        host_budget: int | None = None,
    ) -> None:
        self.fast = FastSim(trace, budget_bytes)
        self.host_budget = host_budget
        """Offloaded bytes past it count as bytes over budget (None: no host limit)."""
        self.tensors = [layer.tensors for layer in trace.layers]
        self.table: list[list[Gene]] = [list(o) for o in options]
        """Each layer's genes: its moves, then the genes starts held outside them."""
        self._index: list[dict[Gene, int]] = [{g: j for j, g in enumerate(o)} for o in options]
        self._n_moves = np.array([len(o) for o in options], dtype=np.int64)
        self._code_table()
        self.cur = np.zeros(trace.n, dtype=np.int64)
        """The current plan: each layer's gene, an index into its row of `table`."""
        self.kind = np.zeros(trace.n, dtype=np.int64)
        self.nbytes = np.zeros(trace.n, dtype=np.int64)
        self._best = np.array([np.inf])
        self._best_cur = np.zeros(trace.n, dtype=np.int64)
        self._seen_best = False
        self.evaluations = 0
        self.excess = 0
        """The current plan's bytes over budget (and over the host budget)."""
        self.reset(genes)

    @property
    def best_overhead_s(self) -> float:
        """Overhead of the best feasible plan seen so far (inf before the first)."""
        return float(self._best[0])

    @property
    def best_genes(self) -> list[Gene] | None:
        """The best feasible plan seen so far (None before the first)."""
        if not self._seen_best:
            return None
        return [self.table[i][j] for i, j in enumerate(self._best_cur)]

    def genes(self) -> list[Gene]:
        """The current plan."""
        return [self.table[i][j] for i, j in enumerate(self.cur)]

    def reset(self, genes: list[Gene]) -> tuple[float, int]:
        """Make `genes` the current plan; its score."""
        for i, g in enumerate(genes):
            j = self._index[i].get(g)
            if j is None:  # a start's gene outside the moves: kept after them
                j = self._index[i][g] = len(self.table[i])
                self.table[i].append(g)
                self._code_table()
            self.cur[i] = j
            self.kind[i], self.nbytes[i] = self._kind[i, j], self._bytes[i, j]
        self.evaluations += 1
        overhead, excess = self.fast(self.kind, self.nbytes)
        excess += self._host_excess()
        self.excess = excess
        if excess == 0 and overhead < self._best[0]:
            self._best[0] = overhead
            self._best_cur[:] = self.cur
            self._seen_best = True
        return overhead, excess

    def descend(
        self, order: np.ndarray, pos: int, lam: float, score: float, target: float, evaluations: int
    ) -> tuple[int, float, bool]:
        """Descent moves of the layers `order[pos:]` until `evaluations` plans are scored or the best feasible
        plan costs at most `target` (`fastsim.descend`); (where it stopped, score, whether a move was taken).
        `excess` follows the plan."""
        before = self._best[0]
        pos, score, self.excess, moved, done = descend(
            order,
            pos,
            self.cur,
            self._kind,
            self._bytes,
            self._n_moves,
            self.kind,
            self.nbytes,
            lam,
            score,
            self.excess,
            target,
            evaluations,
            -1 if self.host_budget is None else self.host_budget,
            self._best,
            self._best_cur,
            self.fast.args,
        )
        self.evaluations += done
        self._seen_best |= self._best[0] < before
        return pos, score, moved

    def _host_excess(self) -> int:
        if self.host_budget is None:
            return 0
        # The host holds every offloaded byte at the loss point (simulate.host_stage_bytes).
        return max(0, int(self.nbytes[self.kind == KIND_OFFLOAD].sum()) - self.host_budget)

    def _code_table(self) -> None:
        """Each layer's genes as FastSim codes: `_kind[i, j]`, `_bytes[i, j]` (offloaded bytes) of `table[i][j]`."""
        width = max(len(t) for t in self.table)
        self._kind = np.full((len(self.table), width), KIND_KEEP, dtype=np.int64)
        self._bytes = np.zeros((len(self.table), width), dtype=np.int64)
        for i, row in enumerate(self.table):
            for j, g in enumerate(row):
                self._kind[i, j], self._bytes[i, j] = _code(self.tensors[i], g)


def _code(tensors: list[int], g: Gene) -> tuple[int, int]:
    if g == "K":
        return KIND_KEEP, 0
    if g == "S":
        return KIND_START, 0
    if g == "R":
        return KIND_CONTINUE, 0
    assert isinstance(g, tuple)
    return KIND_OFFLOAD, sum(tensors[q] for q in g)


_TIMING_STEPS = (-1, 1, -4, 4)  # stages by which one move shifts a done-by or a prefetch-at


def _shift(trace: Trace, decisions: list[Decision], i: int, done_step: int, prefetch_step: int) -> list[Decision]:
    """Decisions with layer i's done-by / prefetch-at moved by the steps (clamped to [i, n-1]); offloads
    above i whose prefetch would now come first are pushed along, so the need order still holds."""
    n = trace.n
    out = list(decisions)
    d = out[i]
    p = min(max(d.prefetch_at + prefetch_step, i), n - 1)
    out[i] = replace(d, done_by=min(max(d.done_by + done_step, i), n - 1), prefetch_at=p)
    for j in range(i + 1, n):
        if out[j].action == Action.OFFLOAD and out[j].prefetch_at < p:
            out[j] = replace(out[j], prefetch_at=p)
    return fix_prefetch_order(out)


def _retime(trace: Trace, budget_bytes: int, sim: SimResult, deadline: float) -> SimResult:
    """Descent on offload timing alone (the action search keeps `default_timing`'s): shift one layer's
    done-by or prefetch-at at a time while that lowers the overhead within the budget."""
    best = sim
    moved = True
    while moved and time.perf_counter() < deadline:
        moved = False
        for i, d in enumerate(best.decisions):
            if d.action != Action.OFFLOAD:
                continue
            for done_step, prefetch_step in [(s, 0) for s in _TIMING_STEPS] + [(0, s) for s in _TIMING_STEPS]:
                if time.perf_counter() >= deadline:
                    return best
                cand = _shift(trace, best.decisions, i, done_step, prefetch_step)
                if cand == best.decisions:
                    continue
                res = simulate(trace, cand, budget_bytes, with_events=False)
                if res.feasible and res.overhead_s < best.overhead_s - 1e-15:
                    best, moved = res, True
                    break
    return best


class LocalSearch:
    """The local search from one start, resumable: each `run` searches until its limit and returns the best plan
    so far, and the next `run` goes on where the last one stopped (mid-cycle: the current plan, its lambda and
    the random stream are kept). A solve that splits its local search around other phases then loses nothing to
    the split; restarting from the best plan instead re-begins the oscillation, whose cycles take seconds on a
    1,000-layer trace. Deterministic for a given seed, up to where the time limits cut it."""

    def __init__(
        self,
        trace: Trace,
        budget_bytes: int,
        start: list[Decision],
        seed: int = 0,
        allowed: frozenset[Action] = ALL_ACTIONS,
        host_budget: int | None = None,
    ) -> None:
        t0 = time.perf_counter()
        self.trace, self.budget, self.host_budget = trace, budget_bytes, host_budget
        self.ref = simulate(trace, start, budget_bytes, with_events=False)
        """The start as simulated: the reference every result improves on."""
        if not self.ref.feasible or not fits_host(self.ref, host_budget):
            raise ValueError("polish needs a feasible start schedule (within the budget and the host budget)")
        self._sim_s = time.perf_counter() - t0
        """One Python simulation of this trace (the closing steps of a run simulate twice)."""
        self.best = self.ref
        """The best plan returned so far (the start until a run improves on it)."""
        self.evaluations = 0
        self.finished = False
        """The search stopped by itself (_MAX_STALE_RESTARTS kicks in a row found nothing better)."""
        self._options = _options(trace, allowed)
        self._rng = random.Random(seed)
        self._genes = _genes(self.ref.decisions)  # as simulated: segments cut where the replay needs (split_at_breaks)
        self._evaluate = _Evaluator(trace, budget_bytes, self._options, self._genes, host_budget)
        self._deadline = 0.0
        self._target: float | None = None
        self._steps = self._search()
        self._simulated_s = float("inf")
        """The compiled simulator's cost of the last plan `_found` simulated."""

    def run(self, time_limit_s: float, target_s: float | None = None) -> PolishResult:
        """Search for `time_limit_s` more seconds, or until a plan costs at most `target_s` (what a known lower
        bound proves good enough); `improved`: the result beats the best that the runs before returned."""
        end = time.perf_counter() + max(0.0, time_limit_s)
        # The loop checks the clock between evaluations; what follows it simulates twice with the Python
        # simulator (timed on the start: ~16 ms on a 1,000-layer trace), so stop early enough for that.
        self._deadline, self._target = end - 3 * self._sim_s, target_s
        if not self.finished:
            try:
                next(self._steps)
            except StopIteration:
                self.finished = True
        self.evaluations = self._evaluate.evaluations
        found = self._found()
        if found is not None and time.perf_counter() < self._deadline:
            found = _retime(self.trace, self.budget, found, self._deadline)
        if found is not None and found.overhead_s < self.best.overhead_s - 1e-15:
            log.debug(
                "polish: %.6g s -> %.6g s overhead in %d evaluations",
                self.ref.overhead_s,
                found.overhead_s,
                self.evaluations,
            )
            self.best = found
            return PolishResult(found, self.evaluations, True)
        return PolishResult(self.best, self.evaluations, False)

    @property
    def found_s(self) -> float:
        """The least overhead of a feasible plan the search has seen, with default_timing (inf: none yet)."""
        return self._evaluate.best_overhead_s

    def _paused(self) -> bool:
        if self._target is not None and self._evaluate.best_overhead_s <= self._target:
            return True
        return time.perf_counter() >= self._deadline

    def _search(self) -> Iterator[None]:
        """The search (module docstring); it yields, pausing, wherever the run's deadline or target is reached,
        and resumes there on the next run's next(). The descent passes run compiled (`_Evaluator.descend`) in
        parts of about `_PART_S`, between which the clock is read: the same moves in the same order as one pass."""
        evaluate, options, rng = self._evaluate, self._options, self._rng
        genes = self._genes
        lam0 = _lambda0(self.trace)
        stale = 0
        part = 8  # plans scored per compiled part, sized by the time each one takes
        while True:
            before = evaluate.best_overhead_s
            settled = False
            for mult in _CYCLE:
                lam = lam0 * mult
                while self._paused():
                    yield
                if settled:
                    # The plan fits and no move lowered its score at a smaller lambda, so none lowers it at this one
                    # (a move's score only grows with lambda; a plan that fits scores its overhead at any). The
                    # pass is skipped; its order is still drawn, so the random stream (every later kick) is the
                    # one the pass would have left.
                    rng.shuffle(list(range(self.trace.n)))
                    continue
                ovh, exc = evaluate.reset(genes)
                score = ovh + lam * exc
                moved = True
                while moved:
                    moved = False
                    order = list(range(self.trace.n))
                    rng.shuffle(order)
                    layers = np.array(order, dtype=np.int64)
                    pos = 0
                    while pos < len(layers):
                        while self._paused():
                            yield
                        t0, done = time.perf_counter(), evaluate.evaluations
                        target = -np.inf if self._target is None else self._target
                        pos, score, took = evaluate.descend(layers, pos, lam, score, target, part)
                        moved |= took
                        spent, done = time.perf_counter() - t0, evaluate.evaluations - done
                        if done > 0:
                            part = max(1, min(1_000_000, int(done * _PART_S / max(spent, 1e-6))))
                genes = evaluate.genes()
                settled = evaluate.excess == 0
            if evaluate.best_overhead_s < before - 1e-15:
                stale = 0
                continue
            # A whole cycle found nothing better: it would repeat itself. Iterated local search: restart from the
            # best plan with a random stretch of layers re-drawn, until that stops paying.
            stale += 1
            best = evaluate.best_genes
            if best is None or stale > _MAX_STALE_RESTARTS:
                return
            genes = _perturb(best, options, rng)

    def _found(self) -> SimResult | None:
        """The best feasible plan the search has seen, simulated (None: none, or none new since the last run)."""
        evaluate = self._evaluate
        if evaluate.best_genes is None or evaluate.best_overhead_s >= self._simulated_s:
            return None
        self._simulated_s = evaluate.best_overhead_s
        found = simulate(self.trace, decisions_of(self.trace, evaluate.best_genes), self.budget, with_events=False)
        if abs(found.overhead_s - evaluate.best_overhead_s) > 1e-9 * max(1.0, found.overhead_s):
            log.warning(
                "polish: the compiled simulator said %.9g s, the simulator %.9g s; the simulator's verdict stands",
                evaluate.best_overhead_s,
                found.overhead_s,
            )
        if not found.feasible or not fits_host(found, self.host_budget):
            return None
        return found


def polish(
    trace: Trace,
    budget_bytes: int,
    start: list[Decision],
    time_limit_s: float,
    seed: int = 0,
    allowed: frozenset[Action] = ALL_ACTIONS,
    host_budget: int | None = None,
    target_s: float | None = None,
) -> PolishResult:
    """Improve a feasible schedule by one-layer changes within `time_limit_s` (see the module docstring), or
    until a plan costs at most `target_s` (what a known lower bound proves good enough).
    `start` keeps its own timing as the reference; the search re-times every candidate with
    `default_timing`. Deterministic for a given seed, up to where the time limit cuts it. Moves use only the
    `allowed` actions (the start must too); with a `host_budget`, only plans that offload at most that many bytes
    count as feasible (the start must too). One run of a LocalSearch."""
    t0 = time.perf_counter()
    search = LocalSearch(trace, budget_bytes, start, seed, allowed, host_budget)
    return search.run(time_limit_s - (time.perf_counter() - t0), target_s)


__all__ = ["LocalSearch", "PolishResult", "polish"]
