"""The forward sweep of the memory-state dynamic program (docs/formulation.md, 'The memory-state DP').

Boundary k sits between layer k-1 and layer k. The labels at boundary k are partial plans for layers
0..k-1 (optimizer/dp/labels.py). Processing boundary k checks layer k's two memory rows, F_k and B_k, which
are the same for every action of layer k (its saved bytes are on the device at both, and a segment starting
at k holds no checkpoint there yet), then emits children: keep and each offload option to boundary k+1, and
every recompute segment [k, b] (one macro-step, stopped where a row fails for good) to boundary b+1.

Copies are fluid: the D2H backlog drains at the link's bandwidth while forwards run, and the H2D backlog is
swept in reverse time while backwards (and recomputations) run; a row that the backlog would overflow is met
by the smallest stall that drains enough, which is optimal for the fluid queue. Copy latency slows the fluid
link to DpProblem.fluid_d2h_bw / fluid_h2d_bw, which no real copy beats. On a device whose copies run on the
compute thread, offloads are synchronous and exact instead.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

import numpy as np

from memsched.optimizer.dp.clock import SweepClock
from memsched.optimizer.dp.kernels import segment_children
from memsched.optimizer.dp.labels import ACTION_KEEP, ACTION_SEGMENT, Labels, beam_select, pareto_filter
from memsched.optimizer.dp.problem import AFTER_SEGMENT_BIT, SIDE_HELD_BIT, DpProblem


class BeamRank(Enum):
    """How a beam (SweepConfig.beam) scores the labels it keeps: cost so far plus an estimate of what is to come."""

    DRAINED = "drained"
    """The future-cost table, plus the stalls of draining the label's backlogs now: the cost a plan is sure to pay
    where copies cannot overlap later compute. It favours plans with short backlogs, which the simulator's FIFO
    copies price close to the sweep's cost (the tracer's GPU traces, whose blocks offload many tensors at once)."""
    BOUND = "bound"
    """The proving sweeps' lower bound on what is to come (`_Sweep._to_come`: the table, the stalls the backlogs
    force and the table's rows with the backlogs held), as an A* search ranks. Backlogs that later compute drains
    cost nothing here, so offloads are not charged twice; where DRAINED's penalty steers the beam to recompute
    everything early it finds plans several times cheaper (the synthetic 200-layer chain at 20%, 24 labels:
    0.0399 against 0.2119 s; PipeDream DenseNet-121 at 75%, 96 labels: 0.0080 against 0.0380 s). Its plans
    carry longer backlogs, which the fluid drain misprices where blocks offload many tensors (bert-large on an H100
    at 75%, 24 labels: 0.0285 against 0.0079 s), so `Flow.beam` runs both."""


@dataclass(frozen=True)
class SweepConfig:
    """How one sweep runs."""

    deadline: float
    """time.perf_counter() value at which the sweep stops (it then reports a partial bound)."""
    threshold: float = np.inf
    """Labels whose cost reaches this are dropped (incumbent x (1 - gap)): only cheaper plans matter."""
    beam: int | None = None
    """Keep at most this many labels per boundary (a heuristic search; its bound is not valid)."""
    beam_rank: BeamRank = BeamRank.DRAINED
    """How the beam scores the labels it keeps (unused without `beam`)."""
    quantum_bytes: int = 1
    """Retained bytes and backlogs are rounded down to multiples of this (1 = exact). Rounding down keeps
    the sweep a relaxation, so its bound stays valid, while merging nearby states."""
    backlog_quantum_bytes: int | None = None
    """Backlogs are rounded down to multiples of this instead (None: `quantum_bytes`). Finer than
    `quantum_bytes`, it loses less: each rounding of a backlog takes its bytes off the link's work, so it lowers
    the bound by their copy time, where rounding retained bytes only loosens later rows."""
    max_labels: int = 30_000_000
    """Labels stored and pending together; past it the sweep stops with `cap_hit`."""
    pace: float | None = None
    """Stop early (`paced`) where the time the sweep is projected to need to its last boundary exceeds this many
    times the time left to the deadline: a sweep that cannot finish then gives its time to the phases after it
    (on long traces, the local search) at once instead of at its deadline. None: only the deadline stops it."""
    finish_by: float | None = None
    """Later than `deadline`: the sweep may run on to this time where its projection (as `pace`'s, with no margin)
    says it reaches its last boundary by then, and is stopped as soon as it says not (`_behind`); None: the
    deadline stops it. A sweep cut by the clock proves no more than its frontier, so the last one a climb started
    is worth a short overrun (solve's DP_GRACE_LONG)."""
    pace_profile: np.ndarray | None = None
    """The projection's shape: the share of a finished sweep's time (an earlier one of the same problem at a
    lower threshold) spent before each boundary, n + 1 values from 0 to 1 (SweepResult.profile). None: linear in
    the boundaries. Labels pile up where many tensors are live, at the same boundaries from one threshold to the
    next (DenseNet-121: its first dense blocks), which a linear projection overrates."""

    @property
    def stop_at(self) -> float:
        """When the clock stops the sweep: `finish_by` where it is later than `deadline`."""
        return self.deadline if self.finish_by is None else max(self.deadline, self.finish_by)


@dataclass
class SweepResult:
    """What one sweep established."""

    finished: bool
    """The sweep reached the last boundary (not stopped by the deadline or the label cap)."""
    bound_s: float | None
    """A lower bound on the fluid optimum (valid for the real problem when the sweep is not a beam, see
    DpProblem.offload_complete): the best final cost, or the least cost left on the frontier when stopped,
    capped by the threshold. None when the sweep is a beam."""
    finals: list[tuple[float, int]] = field(default_factory=list)
    """(final cost, label index at boundary n), cheapest first, at most 16."""
    stored: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    """Back-pointers per boundary: (parent, parent_boundary, action)."""
    cap_hit: bool = False
    """The label cap stopped the sweep."""
    timed_out: bool = False
    """The deadline stopped the sweep (or, with `paced`, its pace predicted that the deadline would)."""
    paced: bool = False
    """SweepConfig.pace stopped the sweep before its deadline (timed_out is set too)."""
    peak_labels: int = 0
    """Largest label count at one boundary after filtering."""
    total_labels: int = 0
    """Labels stored over all boundaries."""
    boundary_reached: int = 0
    """The last boundary processed."""
    profile: np.ndarray | None = None
    """Finished sweeps: the share of the sweep's time spent before each boundary, n + 1 values from 0 to 1
    (SweepConfig.pace_profile of a later sweep)."""


_PACE_MIN_SHARE = 0.01
"""A profile's share before a boundary is taken as at least this (the first boundaries take no measurable time)."""
_PACE_MIN_S = 0.25
"""A sweep's pace is judged only after it has run this long: its first boundaries are too quick to time."""
_FILTER_S_PER_LABEL = 5e-7
"""Prior of the dominance filter's time per label (measured: about 1e-7 s on one core), until one is timed."""


class _Sweep:
    def __init__(self, p: DpProblem, cfg: SweepConfig) -> None:
        self.p = p
        self.cfg = cfg
        self.clock = SweepClock(cfg.stop_at, _FILTER_S_PER_LABEL)
        self.pending: list[list[Labels]] = [[] for _ in range(p.n + 1)]
        self.pending_count = 0
        self.pending_sizes = [0] * (p.n + 1)
        self.compact_at = [200_000] * (p.n + 1)
        self.stored_count = 0
        # A voluntary stall drains a backlog at the link's bandwidth (a legal move of the relaxation), which
        # the dominance test uses; serial devices have no backlogs.
        self._bandwidths = (np.inf, np.inf) if p.serial else (p.fluid_d2h_bw, p.fluid_h2d_bw)
        # The proving sweeps also prune by the stalls a label's backlogs force (DpProblem.backlog_bound); a beam
        # does not, so that its labels, and the mispricing its plans measure (flow/answers.py), stay as measured.
        self._backlog_prune = not p.serial and cfg.beam is None

    # ------------------------------------------------------------------ helpers
    def _quant_backlog(self, x: np.ndarray) -> np.ndarray:
        q = self.cfg.quantum_bytes if self.cfg.backlog_quantum_bytes is None else self.cfg.backlog_quantum_bytes
        return np.floor(x / q) * q if q > 1 else x

    def _quant(self, x: np.ndarray) -> np.ndarray:
        q = self.cfg.quantum_bytes
        if q <= 1:
            return x
        if x.dtype == np.int64:
            return (x // q) * q
        return np.floor(x / q) * q

    def _emit(
        self,
        dst: int,
        retained: np.ndarray,
        held: np.ndarray,
        cost: np.ndarray,
        d2h: np.ndarray,
        h2d: np.ndarray,
        parent: np.ndarray,
        src: int,
        action: int,
        young: np.ndarray,
    ) -> None:
        p = self.p
        ok = (cost + self._to_come(dst, retained, d2h, h2d) < self.cfg.threshold) & (
            retained <= p.limit - p.row_floor[dst]
        )
        if p.side:  # the loss point holds the side inputs of labels whose segments keep them (SIDE_HELD_BIT)
            ok &= retained + self._side(held) <= p.limit - p.row_floor[p.n]
        if not ok.all():
            idx = np.flatnonzero(ok)
            retained, held, cost, d2h, h2d, parent, young = (
                a[idx] for a in (retained, held, cost, d2h, h2d, parent, young)
            )
        m = len(cost)
        if m:
            d2h, h2d = self._quant_backlog(d2h), self._quant_backlog(h2d)
            if p.in_flight:  # (no copy left in flight: the bytes count no more, and labels merge)
                young = np.where((d2h > 0) | (h2d > 0), young, 0)
            self._push(
                dst,
                Labels(
                    self._quant(retained),
                    held,
                    cost,
                    d2h,
                    h2d,
                    parent.astype(np.int32),
                    np.full(m, src, np.int32),
                    np.full(m, action, np.int16),
                    young,
                ),
            )

    def _side(self, held: np.ndarray) -> np.ndarray | int:
        """Side-input bytes the labels' checkpoints hold in their rows B_k and at the loss point (DpProblem.side)."""
        return np.where(held & SIDE_HELD_BIT, self.p.side, 0) if self.p.side else 0

    def _to_come(
        self,
        k: int,
        retained: np.ndarray,
        d2h: np.ndarray,
        h2d: np.ndarray,
        drained: bool = False,
        backlogs: bool | None = None,
    ) -> np.ndarray:
        """A lower bound on the cost still to come for labels at boundary k: the future-cost table's, or where
        larger, the stalls their backlogs force (DpProblem.backlog_bound) and the table's rows with the backlogs
        held (DpProblem.pending_bound). `drained`: the labels are past rows F_k / B_k and layer k's compute
        (`_rows`), so their backlogs face the rows and the compute from k + 1 on (every child retains and holds
        pending at least what the label does). `backlogs`: whether the backlogs count (default: where the sweep
        prunes by them)."""
        fut = self.p.future_bound(k, retained)
        counted = self._backlog_prune if backlogs is None else backlogs and not self.p.serial  # (serial: none)
        if not counted:
            return fut
        at = k + 1 if drained else k
        return np.maximum(
            np.maximum(fut, self.p.backlog_bound(at, d2h, h2d)), self.p.pending_bound(at, retained, d2h, h2d)
        )

    def _push(self, dst: int, labels: Labels) -> None:
        m = len(labels)
        self.pending[dst].append(labels)
        self.pending_count += m
        self.pending_sizes[dst] += m
        if self.pending_sizes[dst] > self.compact_at[dst] and self.clock.affordable(self.pending_sizes[dst]):
            # Optional (the labels are filtered when their boundary is collected): skipped where it could not
            # end by the deadline, so the expansion goes on and stops at its next look at the clock.
            self._compact(dst)
        if self.stored_count + self.pending_count > self.cfg.max_labels:
            raise _Stop("cap")

    def _compact(self, dst: int) -> None:
        """Filter a boundary's pending labels early, so segments emitted from many boundaries do not pile up."""
        parts = self.pending[dst]
        merged = self._filter(Labels.concat(parts), dst)
        self.pending[dst] = [merged]
        self.pending_count += len(merged) - self.pending_sizes[dst]
        self.pending_sizes[dst] = len(merged)
        self.compact_at[dst] = max(self.compact_at[dst], 2 * len(merged))

    def _filter(self, labels: Labels, k: int) -> Labels:
        """The dominance filter of boundary k's labels, started only if it is predicted to end by the deadline
        (optimizer/dp/clock.py): the labels stay pending otherwise, so the partial bound still covers them."""
        if not self.clock.affordable(len(labels)):
            raise _Stop("deadline")
        t = time.perf_counter()
        shared = int(self.p.shared_hold[k]) if k < self.p.n else 0
        out = pareto_filter(labels, *self._bandwidths, int(AFTER_SEGMENT_BIT), shared)
        self.clock.timed(len(labels), time.perf_counter() - t)
        return out

    def frontier_bound(self, start: int) -> float:
        """Least cost among labels not yet processed (every unfinished plan passes through one of them)."""
        best = self.cfg.threshold
        for k in range(start, self.p.n + 1):
            for part in self.pending[k]:
                if len(part):
                    best = min(best, float((part.cost + self._to_come(k, part.retained, part.d2h, part.h2d)).min()))
        return best

    # ------------------------------------------------------------------ one boundary
    def collect(self, k: int) -> Labels:
        parts = self.pending[k]
        if not parts:
            return Labels.empty()
        labels = self._filter(Labels.concat(parts), k)  # may stop the sweep: the parts are still pending then
        self.pending[k] = []
        self.pending_count -= self.pending_sizes[k]
        self.pending_sizes[k] = 0
        if self.cfg.beam is not None:
            labels = beam_select(labels, self.cfg.beam, self._beam_score(k, labels))
        return labels

    def _beam_score(self, k: int, labels: Labels) -> np.ndarray:
        """Cost so far plus what is to come, as cfg.beam_rank estimates it."""
        if self.cfg.beam_rank == BeamRank.BOUND:
            return labels.cost + self._to_come(k, labels.retained, labels.d2h, labels.h2d, backlogs=True)
        score = labels.cost + self.p.future_bound(k, labels.retained)
        if not self.p.serial:
            # As if the backlogs had to drain now.
            score = score + labels.d2h / self.p.fluid_d2h_bw + labels.h2d / self.p.fluid_h2d_bw
        return score

    def _rows(self, k: int, lab: Labels, trans_f: int) -> _Rows | None:
        """The labels past rows F_k (with `trans_f`: a recomputed layer's forward holds less, DpProblem.
        trans_f_rec) and B_k, with a backlog that overflows one drained by the shortest stall that makes the row
        fit, then by F_k's and B_k's compute; those below the threshold as (idx, retained, held, cost, d2h, h2d),
        or None where none is."""
        p, cfg = self.p, self.cfg
        idx = np.arange(len(lab), dtype=np.int64)
        retained, held = lab.retained, lab.held
        cost, d2h, h2d = lab.cost.copy(), lab.d2h.copy(), lab.h2d.copy()
        cap_f = (p.limit - p.saved[k] - trans_f - retained).astype(np.float64)
        cap_b = (p.limit - p.saved[k] - p.trans_b[k] - retained - self._side(held)).astype(np.float64)
        alive = (cap_f >= 0) & (cap_b >= 0)
        young = lab.young
        if not p.serial and not p.link_work:  # (link work: backlogs hold no memory)
            cost += np.maximum(d2h - cap_f, 0.0) / p.fluid_d2h_bw + np.maximum(h2d - cap_b, 0.0) / p.fluid_h2d_bw
            d2h = np.minimum(d2h, cap_f)
            h2d = np.minimum(h2d, cap_b)
        elif p.in_flight:
            cost, d2h, h2d = _in_flight(young, cap_f, cap_b, cost, d2h, h2d, p.d2h_bw, p.h2d_bw)
        if not p.serial:
            # F_k's compute drains the D2H backlog; B_k's (in reverse time) the H2D backlog.
            d2h = np.maximum(d2h - p.fluid_d2h_bw * p.fwd[k], 0.0)
            h2d = np.maximum(h2d - p.fluid_h2d_bw * p.bwd[k], 0.0)
        # The rows' stalls are in `cost` already.
        alive &= cost + self._to_come(k, retained, d2h, h2d, drained=True) < cfg.threshold
        if not alive.all():
            keep = np.flatnonzero(alive)
            idx, retained, held, cost, d2h, h2d, young = (a[keep] for a in (idx, retained, held, cost, d2h, h2d, young))
        return _Rows(idx, retained, held, cost, d2h, h2d, young) if len(idx) else None

    def expand(self, k: int, lab: Labels) -> None:
        p = self.p
        rows = self._rows(k, lab, int(p.trans_f[k]))
        if rows is not None:
            self._keep_and_offload(k, rows)
        if p.recompute:
            if p.trans_f_rec[k] != p.trans_f[k]:
                rows = self._rows(k, lab, int(p.trans_f_rec[k]))
            if rows is not None:
                if self.clock.expired():
                    raise _Stop("deadline")
                self._segments(k, rows)

    def _keep_and_offload(self, k: int, rows: _Rows) -> None:
        p = self.p
        idx, retained, held, cost, d2h, h2d, young = rows
        held_next = self.p.remap_held(held, k, k + 1)
        # Arrived by a segment ending at k - 1: keeping or offloading k holds its shared inputs (shared_hold).
        retained = retained + p.shared_held(held, k) if p.shared_hold[k] else retained
        # The clock is read before each emission: on a boundary of 10^5 labels with 64 offload options each
        # emission filters and copies that many children (stopping between them leaves a valid frontier, as
        # this boundary's labels count in the partial bound).
        if self.clock.expired():
            raise _Stop("deadline")
        # keep
        self._emit(k + 1, retained + p.saved[k], held_next | p.keep_bit(k), cost, d2h, h2d, idx, k, ACTION_KEEP, young)
        # offload option o: x bytes leave; the fluid backlogs of both links grow by what its copies carry (and,
        # under link work, by each copy's latency)
        lat_d, lat_h = p.latency_bytes()
        for o, opt in enumerate(p.offload[k]):
            if self.clock.expired():
                raise _Stop("deadline")
            # x bytes leave the device; the copies carry c (= x, or less on a relaxed option: OffloadOption)
            x, c = opt.nbytes, opt.copy_bytes
            # The host budget's price (DpProblem.host_price) on the bytes the option holds on the host, at least c.
            priced = cost + p.host_price * c if p.host_price else cost
            if p.serial:
                extra = 2 * p.latency + c / p.d2h_bw + c / p.h2d_bw
                self._emit(
                    k + 1, retained + (p.saved[k] - x), held_next, priced + extra, d2h, h2d, idx, k, o + 1, young
                )
            else:
                self._emit(
                    k + 1,
                    retained + (p.saved[k] - x),
                    held_next,
                    priced,
                    d2h + (c + lat_d),
                    h2d + (c + lat_h),
                    idx,
                    k,
                    o + 1,
                    # Link work: this copy is now the latest, in flight while a backlog is left (`_in_flight`).
                    np.full(len(idx), p.young_bytes(c), np.int64) if p.in_flight else young,
                )

    def _segments(self, k: int, rows: _Rows) -> None:
        """Every recompute segment [k, b] (optimizer/dp/kernels.py): rows F_m / B_m of its layers m in
        (k, b] hold the segment's checkpoint (outside producers not held yet + external inputs + the stashed
        state, which rows F_k / B_k hold too) and, at B_m,
        the layers k..m it has rematerialised; the recomputation (F_k..F_b) costs its forward time at B_b."""
        p, cfg = self.p, self.cfg
        idx, retained, held, cost, d2h, h2d, young = rows
        bits_at, out_bytes_bit = p.segment_inputs(k)
        capacity = max(4 * (p.n - k), 1 << 20)
        pos = 0
        while pos < len(idx):
            if time.perf_counter() > cfg.stop_at:
                raise _Stop("deadline")
            sl = slice(pos, pos + max(1, min(len(idx) - pos, 1 << 14)))
            done, w, dst, parent, ret, hd, cost_o, d2h_o, h2d_o = segment_children(
                k,
                p.segment_last(k),
                p.limit,
                p.serial,
                not p.link_work,
                p.fluid_d2h_bw,
                p.fluid_h2d_bw,
                cfg.threshold,
                p.saved,
                p.saved_prefix,
                p.fwd,
                p.rerun_fwd_prefix,
                p.rerun,
                p.bwd,
                p.trans_f_rec,  # rows F_m of a recomputed layer: its forward under the checkpoint
                p.trans_b,
                p.row_floor,
                p.future,
                p.future_pending,
                p.future_step,
                self._backlog_prune,
                p.fwd_left,
                p.bwd_left,
                p.external,
                p.ckpt_state,
                int(p.input_saved[k]),
                p.snap_prefix,
                p.ctx_prefix,
                bits_at,
                out_bytes_bit,
                p.side,
                p.side_layer if len(p.side_layer) else np.zeros(p.n, np.bool_),
                SIDE_HELD_BIT,
                retained[sl],
                held[sl],
                cost[sl],
                d2h[sl],
                h2d[sl],
                young[sl],
                capacity,
            )
            pos += done
            if w == 0:
                continue
            # Children leave the kernel filtered (cost, rows, future floor); sorted by destination here.
            small = dst[:w].astype(np.int16) if p.n < 1 << 15 else dst[:w]  # 16-bit keys: a radix sort
            order = np.argsort(small, kind="stable")
            dst = dst[order]
            young_o = young[sl][parent[order]]
            parent = idx[sl][parent[order]].astype(np.int32)
            ret, hd = self._quant(ret[order]), hd[order]
            cost_o, d2h_o, h2d_o = cost_o[order], self._quant_backlog(d2h_o[order]), self._quant_backlog(h2d_o[order])
            hd = p.remap_to_ends(hd, k, dst)
            src, action = np.full(w, k, np.int32), np.full(w, ACTION_SEGMENT, np.int16)
            cuts = [0, *(np.flatnonzero(np.diff(dst)) + 1).tolist(), w]
            for lo, hi in itertools.pairwise(cuts):
                self._push(
                    int(dst[lo]),
                    Labels(
                        ret[lo:hi],
                        hd[lo:hi],
                        cost_o[lo:hi],
                        d2h_o[lo:hi],
                        h2d_o[lo:hi],
                        parent[lo:hi],
                        src[lo:hi],
                        action[lo:hi],
                        young_o[lo:hi],
                    ),
                )


class _Rows(NamedTuple):
    """Labels of boundary k past rows F_k and B_k (`_Sweep._rows`), index-aligned."""

    idx: np.ndarray
    """Each one's index in the boundary's labels."""
    retained: np.ndarray
    """Retained bytes."""
    held: np.ndarray
    """Held masks."""
    cost: np.ndarray
    """Cost so far, with the rows' stalls."""
    d2h: np.ndarray
    """Device-to-host backlog after F_k's compute."""
    h2d: np.ndarray
    """Host-to-device backlog after B_k's compute."""
    young: np.ndarray
    """Bytes the latest copy carries (Labels.young)."""


class _Stop(Exception):
    pass


def _in_flight(
    young: np.ndarray,
    cap_f: np.ndarray,
    cap_b: np.ndarray,
    cost: np.ndarray,
    d2h: np.ndarray,
    h2d: np.ndarray,
    d2h_bw: float,
    h2d_bw: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows F_k / B_k of the link-work relaxation with the latest copy's bytes in flight (docs/formulation.md,
    'Bytes in flight under link work'; kernels.segment_children does the same for the rows inside a segment):
    where a backlog is left and the row's room `cap_f` / `cap_b` cannot hold the `young` bytes, the stall
    that empties that backlog, and the backlog emptied."""
    over_f = (d2h > 0) & (young > cap_f)
    if over_f.any():
        cost = cost + np.where(over_f, d2h / d2h_bw, 0.0)
        d2h = np.where(over_f, 0.0, d2h)
    over_b = (h2d > 0) & (young > cap_b)
    if over_b.any():
        cost = cost + np.where(over_b, h2d / h2d_bw, 0.0)
        h2d = np.where(over_b, 0.0, h2d)
    return cost, d2h, h2d


def _behind(cfg: SweepConfig, started: float, now: float, k: int, n: int) -> bool:
    """Whether a sweep at boundary k of n, at its pace so far, would take more than cfg.pace x its time left to
    reach boundary n, and (with cfg.finish_by) more than the time left to finish_by: linear in the boundaries, or
    shaped as an earlier sweep's time was (cfg.pace_profile). Either projection is rough (the labels' growth with
    the threshold is not even over the boundaries): the margin `pace` allows for it."""
    assert (cfg.pace is not None or cfg.finish_by is not None) and k > 0
    done = k / n if cfg.pace_profile is None else max(float(cfg.pace_profile[k]), _PACE_MIN_SHARE)
    allowed = (cfg.pace or 0.0) * (cfg.deadline - now)
    if cfg.finish_by is not None:
        allowed = max(allowed, cfg.finish_by - now)
    return (now - started) * (1.0 - done) / done > allowed


def run_sweep(p: DpProblem, cfg: SweepConfig) -> SweepResult:
    """One sweep over all boundaries; stops early (with a valid partial bound) at the deadline or cap."""
    sw = _Sweep(p, cfg)
    root = Labels(
        np.zeros(1, np.int64),
        np.zeros(1, np.int64),
        np.zeros(1),
        np.zeros(1),
        np.zeros(1),
        np.zeros(1, np.int32),
        np.zeros(1, np.int32),
        np.zeros(1, np.int16),
        np.zeros(1, np.int64),
    )
    sw.pending[0].append(root)
    sw.pending_count = sw.pending_sizes[0] = 1
    res = SweepResult(finished=False, bound_s=None)
    k = 0
    current_min = np.inf  # least cost at the boundary being expanded (its labels left the frontier)
    started = time.perf_counter()
    reached = np.zeros(p.n + 1)  # seconds from the start to each boundary's expansion (0 at boundary 0)
    try:
        for k in range(p.n):
            current_min = np.inf
            now = time.perf_counter()
            reached[k] = now - started if k else 0.0
            if now > cfg.stop_at:
                raise _Stop("deadline")
            paced = cfg.pace is not None or cfg.finish_by is not None
            if paced and k > 0 and now - started > _PACE_MIN_S and _behind(cfg, started, now, k, p.n):
                raise _Stop("pace")
            lab = sw.collect(k)
            res.stored.append((lab.parent, lab.parent_boundary, lab.action))
            res.peak_labels = max(res.peak_labels, len(lab))
            sw.stored_count += len(lab)
            if len(lab):
                current_min = float((lab.cost + sw._to_come(k, lab.retained, lab.d2h, lab.h2d)).min())
                if sw.stored_count + sw.pending_count > cfg.max_labels:
                    raise _Stop("cap")
                sw.expand(k, lab)
        k = p.n
        lab = sw.collect(p.n)
        res.stored.append((lab.parent, lab.parent_boundary, lab.action))
        final = lab.cost.copy()
        if not p.serial:
            final += lab.d2h / p.fluid_d2h_bw + lab.h2d / p.fluid_h2d_bw
        order = np.argsort(final, kind="stable")[:16]
        res.finals = [(float(final[i]), int(i)) for i in order]
        res.finished = True
        reached[p.n] = time.perf_counter() - started
        res.profile = reached / reached[p.n] if reached[p.n] > 0 else None
        best = float(final[order[0]]) if len(order) else np.inf
        res.bound_s = None if cfg.beam is not None else min(best, cfg.threshold)
    except _Stop as stop:
        res.cap_hit = str(stop) == "cap"
        res.paced = str(stop) == "pace"
        res.timed_out = str(stop) == "deadline" or res.paced
        if cfg.beam is None:
            res.bound_s = min(sw.frontier_bound(k), current_min)
    res.boundary_reached = k
    res.total_labels = sw.stored_count
    return res
