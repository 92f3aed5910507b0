"""Tier 2 of the memory-state DP: the same sweep with each label's pending copies kept as FIFO queues.

The fluid sweep (optimizer/dp/sweep.py) lets an offloaded tensor's bytes leave the device as they are copied
and carries copy latency only as a slower link. Where stalls are a large part of the optimum that bound is loose
(ResNet-18: 17-24% below the best schedule). Here a copy frees its bytes only when it is complete, copies run
one after another on their stream with their latency, and a row that does not fit waits for the oldest copies:
exactly the simulator's timing (docs/formulation.md, 'Tier 2: FIFO copies'). Its optimum is the optimum over
every schedule, so it proves bounds the fluid sweep cannot. It costs more per label, so `solve()` runs it only
where the fluid bound leaves a gap and time remains.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from memsched.optimizer.dp.clock import SweepClock
from memsched.optimizer.dp.fifo_kernels import QUEUE, dominance_fifo, expand_fifo, to_come_of
from memsched.optimizer.dp.labels import ACTION_KEEP, ACTION_SEGMENT, beam_select
from memsched.optimizer.dp.problem import AFTER_SEGMENT_BIT, DpProblem
from memsched.optimizer.dp.sweep import SweepResult

_CHUNK = 1 << 15
"""Children written per kernel call before they are handed to their boundaries."""

DEFAULT_MAX_LABELS = 2_000_000
"""Labels held at once (stored + pending): about 0.7 GB at ~330 bytes a label (two queues of QUEUE copies)."""


@dataclass
class FifoLabels:
    """Labels of the FIFO sweep (parallel arrays; see optimizer/dp/fifo_kernels.py for the queues)."""

    retained: np.ndarray
    """int64 bytes retained through every later stage (as in the fluid sweep)."""
    held: np.ndarray
    """int64 bitmask of checkpoint producers already held (bit order: DpProblem.crossing of the boundary)."""
    cf: np.ndarray
    """float64 forward stall so far, seconds."""
    cr: np.ndarray
    """float64 backward stall and recomputation so far, seconds (reverse clock)."""
    dq_t: np.ndarray
    """float64 (labels, QUEUE): completion times of pending device->host copies on the forward clock."""
    dq_b: np.ndarray
    """int64 (labels, QUEUE): their bytes."""
    dq_n: np.ndarray
    """int64 pending device->host copies."""
    hq_t: np.ndarray
    """float64 (labels, QUEUE): completion times of pending host->device copies on the reverse clock."""
    hq_b: np.ndarray
    """int64 (labels, QUEUE): their bytes."""
    hq_n: np.ndarray
    """int64 pending host->device copies."""
    parent: np.ndarray
    """int32 index of the parent label in its boundary's stored set."""
    parent_boundary: np.ndarray
    """int32 boundary of the parent label."""
    action: np.ndarray
    """int16 transition from the parent (as in optimizer/dp/labels.py)."""

    def __len__(self) -> int:
        return len(self.cf)

    @property
    def cost(self) -> np.ndarray:
        return self.cf + self.cr

    def queues(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(dq_t, dq_b, dq_n, hq_t, hq_b, hq_n): both queues, in the order the kernels take them."""
        return self.dq_t, self.dq_b, self.dq_n, self.hq_t, self.hq_b, self.hq_n

    def take(self, idx: np.ndarray) -> FifoLabels:
        return FifoLabels(*(getattr(self, f)[idx] for f in _FIELDS))

    @staticmethod
    def concat(parts: list[FifoLabels]) -> FifoLabels:
        if len(parts) == 1:
            return parts[0]
        return FifoLabels(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))


_FIELDS = (
    "retained",
    "held",
    "cf",
    "cr",
    "dq_t",
    "dq_b",
    "dq_n",
    "hq_t",
    "hq_b",
    "hq_n",
    "parent",
    "parent_boundary",
    "action",
)


def _root(queue: int) -> FifoLabels:
    return FifoLabels(
        np.zeros(1, np.int64),
        np.zeros(1, np.int64),
        np.zeros(1),
        np.zeros(1),
        np.zeros((1, queue)),
        np.zeros((1, queue), np.int64),
        np.zeros(1, np.int64),
        np.zeros((1, queue)),
        np.zeros((1, queue), np.int64),
        np.zeros(1, np.int64),
        np.zeros(1, np.int32),
        np.zeros(1, np.int32),
        np.zeros(1, np.int16),
    )


_FILTER_S_PER_LABEL = 1e-5
"""Prior of the FIFO dominance filter's time per label (measured: about 6e-6 s on one core), until one is timed."""


@dataclass
class _State:
    pending: list[list[FifoLabels]]
    compact_at: list[int]
    clock: SweepClock
    stored: int = 0
    sizes: list[int] = field(default_factory=list)
    """Labels pending per boundary (the sum of len over pending[k])."""
    waiting: int = 0
    """Labels pending over all boundaries."""
    beam: int | None = None
    """At most this many labels per boundary (fifo_sweep's `beam`), else every undominated one."""

    def filter(self, p: DpProblem, k: int, lab: FifoLabels) -> FifoLabels:
        """_filter, started only if it is predicted to end by the deadline (optimizer/dp/clock.py); the sweep
        stops otherwise, with the labels still pending, so its partial bound covers them."""
        if not self.clock.affordable(len(lab)):
            raise FifoStop("deadline")
        t = time.perf_counter()
        out, work = _filter(p, k, lab, self.clock.work_budget())
        seconds = time.perf_counter() - t
        self.clock.timed_work(work, seconds)
        if out is None:  # its work budget ran out: the deadline has come
            raise FifoStop("deadline")
        self.clock.timed(len(lab), seconds)
        return out


class FifoStop(Exception):
    """The deadline or the label cap stopped the sweep."""


def _filter(p: DpProblem, k: int, lab: FifoLabels, max_work: int) -> tuple[FifoLabels | None, int]:
    """The labels no other dominates, and the work done (dominance_fifo); None where `max_work` ran out first."""
    if len(lab) <= 1:
        return lab, len(lab)
    # Flagged labels (AFTER_SEGMENT_BIT) are compared with the others of their held set (dominance_fifo).
    order = np.lexsort((lab.cost, lab.retained, lab.held & ~AFTER_SEGMENT_BIT))
    lab = lab.take(order)
    keep, done, work = dominance_fifo(
        lab.held,
        lab.cf,
        lab.cr,
        float(p.fwd_prefix[k]),
        float(p.bwd_prefix[k]),
        *lab.queues(),
        lab.retained,
        int(p.shared_hold[k]) if k < p.n else 0,
        int(AFTER_SEGMENT_BIT),
        max_work,
    )
    if done < len(keep):
        return None, work
    return lab.take(np.flatnonzero(keep)), work


def _queue_waits(p: DpProblem, k: int, lab: FifoLabels) -> np.ndarray:
    """Seconds each label's clocks at boundary `k` would wait for the last copy queued in each direction."""
    idx = np.arange(len(lab))
    d_tail = np.where(lab.dq_n > 0, lab.dq_t[idx, np.maximum(lab.dq_n - 1, 0)], -np.inf)
    h_tail = np.where(lab.hq_n > 0, lab.hq_t[idx, np.maximum(lab.hq_n - 1, 0)], -np.inf)
    tf = p.fwd_prefix[k] + lab.cf
    tr = p.bwd_prefix[k] + lab.cr
    return np.maximum(d_tail - tf, 0.0) + np.maximum(h_tail - tr, 0.0)


def _final_cost(p: DpProblem, lab: FifoLabels) -> np.ndarray:
    """Cost of complete plans: the last forward waits for every D2H copy, the first backward for every H2D."""
    return lab.cost + _queue_waits(p, p.n, lab)


def fifo_sweep(
    p: DpProblem,
    deadline: float,
    threshold: float,
    max_labels: int = DEFAULT_MAX_LABELS,
    queue: int = QUEUE,
    beam: int | None = None,
) -> SweepResult:
    """The exact FIFO sweep under `threshold` (labels reaching it are dropped). Its `bound_s` holds for every
    schedule: the cheapest complete plan, or, when stopped, the least cost plus future bound on the frontier,
    each capped by the threshold. Back-pointers are stored as the fluid sweep's, so `decode` reads them.
    `queue`: copies held exactly per direction (>= 2; beyond, the oldest merge optimistically).
    `beam`: keep at most this many labels per boundary (`_beam_score`): a search for plans, not a proof, so
    `bound_s` is None; its finals are priced by the simulator's own timing, stalls included, where the fluid
    beam's are not."""
    assert not p.serial, "serial devices: the fluid sweep is already exact"
    assert queue >= 2, "a full queue merges its two oldest copies"
    st = _State(
        pending=[[] for _ in range(p.n + 1)],
        # A beam compacts a boundary's pending children once they pass a few widths: segments emitted from every
        # earlier boundary would otherwise pile up past the label cap (ResNet-50, width 4096).
        compact_at=[4 * _CHUNK if beam is None else 4 * beam] * (p.n + 1),
        clock=SweepClock(deadline, _FILTER_S_PER_LABEL),
        beam=beam,
    )
    st.sizes = [0] * (p.n + 1)
    st.pending[0].append(_root(queue))
    st.sizes[0] = st.waiting = 1
    res = SweepResult(finished=False, bound_s=None)
    offload_bytes = [np.array([o.nbytes for o in opts], dtype=np.int64) for opts in p.offload]
    copy_bytes = [np.array([o.copy_bytes for o in opts], dtype=np.int64) for opts in p.offload]
    k = 0
    current_min = np.inf
    try:
        for k in range(p.n):
            current_min = np.inf
            if time.perf_counter() > deadline:
                raise FifoStop("deadline")
            parts = st.pending[k]
            lab = st.filter(p, k, FifoLabels.concat(parts)) if parts else None
            st.pending[k] = []  # after the filter: where it stops the sweep, they are still on the frontier
            st.waiting -= st.sizes[k]
            st.sizes[k] = 0
            if lab is None:
                res.stored.append((np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int16)))
                continue
            if beam is not None:
                lab = beam_select(lab, beam, _beam_score(p, k, lab))
            res.stored.append((lab.parent, lab.parent_boundary, lab.action))
            res.peak_labels = max(res.peak_labels, len(lab))
            st.stored += len(lab)
            current_min = float((lab.cost + _to_come(p, k, lab)).min())
            _expand(p, st, k, lab, threshold, deadline, offload_bytes[k], copy_bytes[k], max_labels)
        k = p.n
        parts = st.pending[p.n]
        st.pending[p.n] = []
        if parts:
            lab = FifoLabels.concat(parts)
            final = _final_cost(p, lab)
            order = np.argsort(final, kind="stable")[:16]
            res.stored.append((lab.parent, lab.parent_boundary, lab.action))
            res.finals = [(float(final[i]), int(i)) for i in order if final[i] < threshold]
        else:
            res.stored.append((np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int16)))
        res.finished = True
        if beam is None:
            res.bound_s = min(res.finals[0][0], threshold) if res.finals else threshold
    except FifoStop as stop:
        res.cap_hit = str(stop) == "cap"
        res.timed_out = str(stop) == "deadline"
        if beam is None:
            res.bound_s = min(_frontier(p, st, k), current_min, threshold)
    res.boundary_reached = k
    res.total_labels = st.stored
    return res


def _beam_score(p: DpProblem, k: int, lab: FifoLabels) -> np.ndarray:
    """What a label at boundary `k` is sure to cost, roughly: its cost, the future-cost bound of its retained
    bytes, and the waits its queued copies would still cause if no compute were left to hide them (the fluid
    beam's drain term, with the queues' real completion times)."""
    return lab.cost + p.future_bound(k, lab.retained) + _queue_waits(p, k, lab)


def _to_come(p: DpProblem, k: int, lab: FifoLabels) -> np.ndarray:
    """A lower bound on the cost still to come for labels at boundary k < n: the future-cost table's, or where
    larger its rows with the bytes their queues still hold (DpProblem.pending_bound, fifo_kernels.pending_bytes)."""
    return to_come_of(
        p.future,
        p.future_pending,
        p.future_step,
        k,
        lab.retained,
        lab.cf,
        lab.cr,
        float(p.fwd_prefix[k]),
        float(p.bwd_prefix[k]),
        p.fluid_d2h_bw,
        p.fluid_h2d_bw,
        *lab.queues(),
    )


def _frontier(p: DpProblem, st: _State, start: int) -> float:
    """Least cost plus future bound among labels not yet expanded (every unfinished plan passes one)."""
    best = np.inf
    for k in range(start, p.n + 1):
        for part in st.pending[k]:
            if len(part):
                fut = _to_come(p, k, part) if k < p.n else _final_cost(p, part) - part.cost
                best = min(best, float((part.cost + fut).min()))
    return best


def _expand(
    p: DpProblem,
    st: _State,
    k: int,
    lab: FifoLabels,
    threshold: float,
    deadline: float,
    offload_bytes: np.ndarray,
    copy_bytes: np.ndarray,
    max_labels: int,
) -> None:
    bits_at, out_bytes_bit = p.segment_inputs(k)
    per_label = 1 + len(offload_bytes) + (p.n - k)
    capacity = max(_CHUNK, 2 * per_label)
    first = 0
    while first < len(lab):
        if time.perf_counter() > deadline:
            raise FifoStop("deadline")
        (first, w, dst, parent, action, ret, held, cf, cr, dqt, dqb, dqn, hqt, hqb, hqn) = expand_fifo(
            k,
            p.segment_last(k),
            p.limit,
            p.latency,
            p.d2h_bw,
            p.h2d_bw,
            threshold,
            p.saved,
            p.saved_prefix,
            p.fwd,
            p.fwd_prefix,
            p.rerun,
            p.rerun_fwd_prefix,
            p.bwd,
            p.bwd_prefix,
            p.trans_f,
            p.trans_f_rec,
            p.trans_b,
            p.row_floor,
            p.future,
            p.future_pending,
            p.future_step,
            p.fluid_d2h_bw,
            p.fluid_h2d_bw,
            p.external,
            p.ckpt_state,
            int(p.input_saved[k]),
            int(p.shared_hold[k]),
            int(AFTER_SEGMENT_BIT),
            p.snap_prefix,
            p.ctx_prefix,
            bits_at,
            out_bytes_bit,
            offload_bytes,
            copy_bytes,
            lab.retained,
            lab.held,
            lab.cf,
            lab.cr,
            lab.dq_t,
            lab.dq_b,
            lab.dq_n,
            lab.hq_t,
            lab.hq_b,
            lab.hq_n,
            first,
            capacity,
        )
        if w == 0:
            continue
        # The children in destination order, each field gathered once; every destination's part is a slice.
        order = np.argsort(dst[:w], kind="stable")
        dst, ret, held, cf, cr = dst[order], ret[order], held[order], cf[order], cr[order]
        dqt, dqb, dqn, hqt, hqb, hqn = dqt[order], dqb[order], dqn[order], hqt[order], hqb[order], hqn[order]
        parent, action = parent[order].astype(np.int32), action[order].astype(np.int16)
        cuts = [0, *(np.flatnonzero(np.diff(dst)) + 1).tolist(), w]
        for lo, hi in itertools.pairwise(cuts):
            b1 = int(dst[lo])
            held_part = p.remap_held(held[lo:hi], k, b1)
            bit = p.keep_bit(k) if b1 == k + 1 else 0
            if bit:  # a kept layer whose saved tensors hold its whole output: no checkpoint charges it again
                held_part = np.where(action[lo:hi] == ACTION_KEEP, held_part | bit, held_part)
            if b1 < p.n and p.shared_hold[b1]:  # segments ending at b1 - 1 (DpProblem.after_segment)
                held_part = np.where(action[lo:hi] == ACTION_SEGMENT, p.after_segment(held_part, b1), held_part)
            part = FifoLabels(
                ret[lo:hi],
                held_part,
                cf[lo:hi],
                cr[lo:hi],
                dqt[lo:hi],
                dqb[lo:hi],
                dqn[lo:hi],
                hqt[lo:hi],
                hqb[lo:hi],
                hqn[lo:hi],
                parent[lo:hi],
                np.full(hi - lo, k, np.int32),
                action[lo:hi],
            )
            st.pending[b1].append(part)
            st.sizes[b1] += hi - lo
            st.waiting += hi - lo
            size = st.sizes[b1]
            if size > st.compact_at[b1] and b1 < p.n and st.clock.affordable(size):
                # Filter early so that segments emitted from many boundaries do not pile up; the next
                # filter waits until the set has doubled, so the work stays linear in what is emitted.
                # (Only where it can end by the deadline: this filter is optional, the expansion goes on
                # without it and stops at its next look at the clock.)
                merged = st.filter(p, b1, FifoLabels.concat(st.pending[b1]))
                if st.beam is not None:  # the beam at b1 keeps no more than this: cut it now, not later
                    merged = beam_select(merged, st.beam, _beam_score(p, b1, merged))
                st.pending[b1] = [merged]
                st.waiting += len(merged) - size
                st.sizes[b1] = len(merged)
                st.compact_at[b1] = max(st.compact_at[b1], 2 * len(merged))
        if st.stored + st.waiting > max_labels:
            raise FifoStop("cap")
