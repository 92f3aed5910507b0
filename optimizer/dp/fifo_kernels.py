"""Compiled inner loops of the FIFO sweep (tier 2, optimizer/dp/fifo.py): expansion and dominance.

A label carries its pending copies as two short FIFO queues (docs/formulation.md, 'Tier 2: FIFO copies'):
entry e of a queue is one copy, `t[e]` its completion time on the label's clock and `b[e]` the bytes it holds
until then. The D2H queue runs on the forward clock (forward compute + forward stalls); the H2D queue on the
reverse clock of the backward (backward compute + recomputation + backward stalls, read from the loss back to
the first layer). Entries are in completion order. A queue that is full merges its two oldest copies into one
that frees both at the earlier time: optimistic, so the sweep stays a relaxation.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from memsched.optimizer.dp.future import bound_at
from memsched.optimizer.dp.kernels import checkpoint_bytes

QUEUE = 8
"""Copies each queue holds exactly; beyond, the two oldest merge (optimistic, see the module docstring)."""


@njit(cache=True)
def _queued(qb: np.ndarray, n: int) -> np.int64:  # pragma: no cover - compiled
    """Bytes the first n copies of a queue hold."""
    out = np.int64(0)
    for e in range(n):
        out += qb[e]
    return out


@njit(cache=True)
def _settle(qt: np.ndarray, qb: np.ndarray, n: int, clock: float, cap: int) -> tuple[int, float]:
    """Drop the copies done by `clock`, then wait for the oldest ones until the bytes still pending fit `cap`
    (the least wait: copies finish in queue order). Returns (entries left, clock after the wait)."""
    pending = _queued(qb, n)
    h = 0
    while h < n and (qt[h] <= clock or pending > cap):
        clock = max(clock, qt[h])
        pending -= qb[h]
        h += 1
    if h:
        for e in range(n - h):
            qt[e] = qt[e + h]
            qb[e] = qb[e + h]
    return n - h, clock


@njit(cache=True)
def _enqueue(qt: np.ndarray, qb: np.ndarray, n: int, ready: float, seconds: float, nbytes: int) -> int:
    """Append a copy that may start at `ready` and runs `seconds` after the queue's last one; returns the
    new length (the two oldest merged first when full)."""
    start = ready
    if n > 0 and qt[n - 1] > start:
        start = qt[n - 1]
    if n == len(qt):
        qb[0] += qb[1]  # frees both at the earlier time: optimistic
        for e in range(1, n - 1):
            qt[e] = qt[e + 1]
            qb[e] = qb[e + 1]
        n -= 1
    qt[n] = start + seconds
    qb[n] = nbytes
    return n + 1


@njit(cache=True)
def _copy_queues(
    dt: np.ndarray,
    db: np.ndarray,
    ht: np.ndarray,
    hb: np.ndarray,
    src_dt: np.ndarray,
    src_db: np.ndarray,
    src_ht: np.ndarray,
    src_hb: np.ndarray,
) -> None:
    """Both queues of a label into the destination arrays."""
    dt[:] = src_dt
    db[:] = src_db
    ht[:] = src_ht
    hb[:] = src_hb


@njit(cache=True)
def _tail_wait(qt: np.ndarray, n: int, clock: float) -> float:
    """What waiting for every pending copy costs from `clock`."""
    return max(qt[n - 1] - clock, 0.0) if n > 0 else 0.0


@njit(cache=True)
def _end_waits(
    dq_t: np.ndarray,
    dq_n: int,
    f_clock: float,
    hq_t: np.ndarray,
    hq_n: int,
    r_clock: float,
    fwd_prefix: np.ndarray,
    bwd_prefix: np.ndarray,
    b: int,
) -> float:  # pragma: no cover - compiled
    """What a child at boundary b pays at least for its queued copies: the waits for them at the end of each pass,
    less the compute of layers b..n-1 still to hide them (every second it waits beyond that is paid)."""
    n = len(fwd_prefix) - 1
    return max(_tail_wait(dq_t, dq_n, f_clock) - (fwd_prefix[n] - fwd_prefix[b]), 0.0) + max(
        _tail_wait(hq_t, hq_n, r_clock) - (bwd_prefix[n] - bwd_prefix[b]), 0.0
    )


@njit(cache=True)
def pending_bytes(qt: np.ndarray, qb: np.ndarray, n: int, clock: float, bw: float) -> float:  # pragma: no cover
    """Bytes a queue still holds at `clock` that a link draining `bw` bytes per second could not have moved yet:
    each pending copy counts at most what `bw` moves between the copy before it (or `clock`) and its completion.
    Every copy takes at least bytes / bw (bw: the fluid rate, latency included), so from `clock` on the queue
    holds no fewer than this minus bw x the time passed, and the link, FIFO, moves no new copy's byte before
    these are done (docs/formulation.md, 'Pending copies in the future-cost bound')."""
    out = 0.0
    prev = clock
    for e in range(n):
        if qt[e] > clock:
            out += min(float(qb[e]), bw * (qt[e] - prev))
            prev = qt[e]
    return out


@njit(cache=True)
def to_come_of(
    future: np.ndarray,
    pending: np.ndarray,
    step: float,
    k: int,
    retained: np.ndarray,
    cf: np.ndarray,
    cr: np.ndarray,
    fwd_at: float,
    bwd_at: float,
    fluid_d2h_bw: float,
    fluid_h2d_bw: float,
    dq_t: np.ndarray,
    dq_b: np.ndarray,
    dq_n: np.ndarray,
    hq_t: np.ndarray,
    hq_b: np.ndarray,
    hq_n: np.ndarray,
) -> np.ndarray:  # pragma: no cover - compiled
    """future.bound_at of each label at boundary k, its queues' pending bytes read at its own clocks (fwd_at + cf on
    the forward, bwd_at + cr in reverse time). One pass, no temporaries: a stopped sweep's frontier can hold
    millions of labels."""
    out = np.empty(len(cf))
    for i in range(len(cf)):
        d_pend = pending_bytes(dq_t[i], dq_b[i], dq_n[i], fwd_at + cf[i], fluid_d2h_bw)
        h_pend = pending_bytes(hq_t[i], hq_b[i], hq_n[i], bwd_at + cr[i], fluid_h2d_bw)
        out[i] = bound_at(future, pending, k, float(retained[i]), d_pend, h_pend, step)
    return out


@njit(cache=True)
def expand_fifo(
    k: int,
    last: int,
    limit: int,
    latency: float,
    d2h_bw: float,
    h2d_bw: float,
    threshold: float,
    saved: np.ndarray,
    saved_prefix: np.ndarray,
    fwd: np.ndarray,
    fwd_prefix: np.ndarray,
    rerun: np.ndarray,
    rerun_fwd_prefix: np.ndarray,
    bwd: np.ndarray,
    bwd_prefix: np.ndarray,
    trans_f: np.ndarray,
    trans_f_rec: np.ndarray,
    trans_b: np.ndarray,
    row_floor: np.ndarray,
    future: np.ndarray,
    future_pending: np.ndarray,
    future_step: float,
    fluid_d2h_bw: float,
    fluid_h2d_bw: float,
    external: np.ndarray,
    state: int,
    overlap: int,
    shared_k: int,
    after_bit: int,
    snap_prefix: np.ndarray,
    ctx_prefix: np.ndarray,
    bits_at: np.ndarray,
    out_bytes_bit: np.ndarray,
    offload_bytes: np.ndarray,
    copy_bytes: np.ndarray,
    retained: np.ndarray,
    held: np.ndarray,
    cf: np.ndarray,
    cr: np.ndarray,
    dq_t: np.ndarray,
    dq_b: np.ndarray,
    dq_n: np.ndarray,
    hq_t: np.ndarray,
    hq_b: np.ndarray,
    hq_n: np.ndarray,
    first: int,
    capacity: int,
) -> tuple[
    int,
    int,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
]:
    """Children of the labels at boundary k from index `first` on: rows F_k / B_k (waits where they need
    them), layer k's compute, then keep, each offload option and every recompute segment [k, b], b <= `last`
    (DpProblem.seg_last).

    Clocks: a label's forward clock is fwd_prefix[k] + cf, its reverse clock bwd_prefix[k] + cr; cf is the
    forward stall, cr the backward stall plus recomputation. Children are those whose cost plus the
    future-cost bound stays under `threshold`. Held masks are returned in crossing[k] bit order. Returns
    (next label to expand, children written, destination, parent, action, retained, held, cf, cr, then the
    children's queues). `state`: what a recompute segment holds from F_k through B_k beyond its inputs
    (kernels.segment_children); rows F_k / B_k are checked with it for segments, their queue waits are not
    replayed (nonzero on CPU traces only, which the FIFO sweep, for concurrent copies, does not see).
    `shared_k`: what keeping or offloading layer k also retains for a label flagged `after_bit` (it arrived by a
    segment ending at k - 1: DpProblem.shared_hold, AFTER_SEGMENT_BIT). `snap_prefix`: prefix sums of the layers'
    changed buffers (DpProblem.snap_prefix): a segment [k..b] holds S(k..m) more in rows F_m, S(k..b) + S(k..m) in
    rows B_m (B_k included) and S(k..b) in its child; a row of the backward settled before b grew is settled
    again where the snapshots added since exceed the room it had left (`settled_room`), so the waits stay exact."""
    n = len(saved)
    q = dq_t.shape[1]
    g_last = future.shape[1] - 1
    o_dst = np.empty(capacity, np.int64)
    o_parent = np.empty(capacity, np.int64)
    o_action = np.empty(capacity, np.int64)
    o_ret = np.empty(capacity, np.int64)
    o_held = np.empty(capacity, np.int64)
    o_cf = np.empty(capacity)
    o_cr = np.empty(capacity)
    o_dqt = np.empty((capacity, q))
    o_dqb = np.empty((capacity, q), np.int64)
    o_dqn = np.empty(capacity, np.int64)
    o_hqt = np.empty((capacity, q))
    o_hqb = np.empty((capacity, q), np.int64)
    o_hqn = np.empty(capacity, np.int64)
    # The label's queues after layer k (base) and a working copy replayed through a segment's rows.
    bdt = np.empty(q)
    bdb = np.empty(q, np.int64)
    bht = np.empty(q)
    bhb = np.empty(q, np.int64)
    wdt = np.empty(q)
    wdb = np.empty(q, np.int64)
    rdt = np.empty(q)  # the label's D2H queue past row F_k of a recomputed layer k
    rdb = np.empty(q, np.int64)
    wht = np.empty(q)
    whb = np.empty(q, np.int64)
    kht = np.empty(q)  # the label's H2D queue past row B_k of a recomputed layer k, with the segment's snapshots
    khb = np.empty(q, np.int64)
    per_label = 1 + len(offload_bytes) + (n - k)
    snapshots = snap_prefix[len(snap_prefix) - 1] > 0  # without any, their room is never read (the sweep's speed)
    w = 0
    i = first
    while i < len(cf):
        if w + per_label > capacity:
            break
        r = retained[i]
        _copy_queues(bdt, bdb, bht, bhb, dq_t[i], dq_b[i], hq_t[i], hq_b[i])
        # ---- rows F_k and B_k: B_k is common to every action of layer k; F_k holds less where k is recomputed
        # (trans_f_rec: its forward under the checkpoint), so the segments settle the D2H queue apart (rdt, rdb).
        snap_k = snap_prefix[k + 1] - snap_prefix[k]  # a recomputed layer k's snapshot, from row F_k on
        cap_f = limit - saved[k] - trans_f[k] - r
        cap_fr = limit - saved[k] - trans_f_rec[k] - r - snap_k
        cap_b = limit - saved[k] - trans_b[k] - r
        i += 1
        if (cap_f < 0 and cap_fr < 0) or cap_b < 0:
            continue
        parent = i - 1
        fut_k = future[k, min(int(r / future_step), g_last)]
        nh, tr = _settle(bht, bhb, hq_n[parent], bwd_prefix[k] + cr[parent], cap_b)
        tr += bwd[k]
        c_r = tr - bwd_prefix[k + 1]
        rdt[:] = bdt
        rdb[:] = bdb
        nd_r, tf_r = _settle(rdt, rdb, dq_n[parent], fwd_prefix[k] + cf[parent], cap_fr)
        tf_r += fwd[k]
        nd, tf = nd_r, tf_r
        kept_rows = cap_f >= 0
        if kept_rows and cap_f != cap_fr:
            nd, tf = _settle(bdt, bdb, dq_n[parent], fwd_prefix[k] + cf[parent], cap_f)
            tf += fwd[k]
        elif kept_rows:
            bdt[:] = rdt
            bdb[:] = rdb
        c_f = tf - fwd_prefix[k + 1]
        if not kept_rows or c_f + c_r + fut_k >= threshold:
            kept_rows = False
        # ---- keep, and each offload option (both queues gain the copy)
        for o in range(-1, len(offload_bytes) if kept_rows else -1):
            x = 0 if o < 0 else offload_bytes[o]
            c = 0 if o < 0 else copy_bytes[o]  # what the copies carry: x, or less on a relaxed option
            child_ret = r + saved[k] - x + (shared_k if held[parent] & after_bit else 0)
            if child_ret > limit - row_floor[k + 1]:
                continue
            _copy_queues(o_dqt[w], o_dqb[w], o_hqt[w], o_hqb[w], bdt, bdb, bht, bhb)
            m_d, m_h = nd, nh
            if x > 0:
                m_d = _enqueue(o_dqt[w], o_dqb[w], nd, tf, latency + c / d2h_bw, c)
                m_h = _enqueue(o_hqt[w], o_hqb[w], nh, tr, latency + c / h2d_bw, c)
            # The cost to come includes at least the wait for these copies at the end of each pass.
            floor = _end_waits(o_dqt[w], m_d, tf, o_hqt[w], m_h, tr, fwd_prefix, bwd_prefix, k + 1)
            if c_f + c_r + floor >= threshold:
                continue
            d_pend = pending_bytes(o_dqt[w], o_dqb[w], m_d, tf, fluid_d2h_bw)
            h_pend = pending_bytes(o_hqt[w], o_hqb[w], m_h, tr, fluid_h2d_bw)
            fut = bound_at(future, future_pending, k + 1, child_ret, d_pend, h_pend, future_step)
            if c_f + c_r + fut >= threshold:
                continue
            o_dst[w] = k + 1
            o_parent[w] = parent
            o_action[w] = o + 1
            o_ret[w] = child_ret
            o_held[w] = held[parent]
            o_cf[w] = c_f
            o_cr[w] = c_r
            o_dqn[w] = m_d
            o_hqn[w] = m_h
            w += 1
        # ---- recompute segments [k, b], from the queues past row F_k of a recomputed layer
        if cap_fr < 0 or tf_r - fwd_prefix[k + 1] + c_r + fut_k >= threshold:
            continue
        if state > 0 and (cap_fr < state or cap_b < state):
            continue
        # Row B_k, settled above without snapshots, holds S(k..b) + snap_k for segment [k..b]: its settle stays
        # exact while that fits the room it left (cap_b less the bytes still queued), else it is settled again.
        k_room = cap_b - _queued(bhb, nh) if snapshots else cap_b
        k_n, k_clock = nh, tr
        k_settled_again = False  # kht / khb hold B_k's queue settled with snapshots (else bht / bhb do)
        seg = np.int64(0)
        ext = np.int64(0)
        ckpt = np.int64(0)
        settled_room = k_room  # the least room, over the backward rows settled, for snapshots beyond theirs
        replay_from = k + 1
        sd, sh, stf, stream = nd_r, nh, tf_r, tr
        for b in range(k, last + 1):
            snaps = snap_prefix[b + 1] - snap_prefix[k]  # S(k..b)
            new_bits = bits_at[b - k] & ~seg
            if new_bits != 0 or external[b] > 0 or b == k or snaps > settled_room:
                # The checkpoint or the snapshots grew past what the rows settled allow: replay from layer k.
                seg |= new_bits
                ext += external[b]
                ckpt = checkpoint_bytes(seg, held[parent], ext, out_bytes_bit) + state
                if snap_k + snaps > k_room:
                    if cap_b - snap_k - snaps < 0:
                        break  # row B_k cannot hold them, nor a longer segment's
                    kht[:] = hq_t[parent]
                    khb[:] = hq_b[parent]
                    k_n, k_clock = _settle(kht, khb, hq_n[parent], bwd_prefix[k] + cr[parent], cap_b - snap_k - snaps)
                    k_clock += bwd[k]
                    k_room = cap_b - _queued(khb, k_n)
                    k_settled_again = True
                if k_settled_again:
                    _copy_queues(wdt, wdb, wht, whb, rdt, rdb, kht, khb)
                else:
                    _copy_queues(wdt, wdb, wht, whb, rdt, rdb, bht, bhb)
                sd, sh, stf, stream = nd_r, k_n, tf_r, k_clock
                settled_room = k_room - snap_k
                replay_from = k + 1
            dead = False
            for m in range(replay_from, b + 1):
                own = snap_prefix[m + 1] - snap_prefix[k]  # S(k..m): snapshots taken by F_m, copies held at B_m
                cf_m = limit - saved[m] - trans_f_rec[m] - r - ckpt - own
                # Layer k's inputs its re-run saves again are its checkpoint's: once (rerun_input_overlap).
                rem = saved_prefix[m + 1] - saved_prefix[k] - (overlap if m > k else 0)
                cb_m = limit - rem - trans_b[m] - r - ckpt - own - snaps
                if cf_m < 0 or cb_m < 0:
                    dead = True  # and for every longer segment: the checkpoint and the snapshots only grow
                    break
                sd, stf = _settle(wdt, wdb, sd, stf, cf_m)
                sh, stream = _settle(wht, whb, sh, stream, cb_m)
                if snapshots:
                    settled_room = min(settled_room, cb_m - _queued(whb, sh) + snaps)
                stf += fwd[m]
                stream += bwd[m]
                # The least re-run of any segment [k..b], b >= m (DpProblem.rerun: what m costs as its last).
                spent = (
                    (stf - fwd_prefix[m + 1])
                    + (stream - bwd_prefix[m + 1])
                    + (rerun_fwd_prefix[m] - rerun_fwd_prefix[k] + rerun[m])
                )
                if spent >= threshold:
                    dead = True
                    break
            if dead:
                break
            replay_from = b + 1
            # Row B_b holds the re-run's fork of the state too. B_k holds no checkpoint inputs (the simulator's
            # rule: they are held strictly between F_k and B_k), only the stashed state the caller checked.
            held_b = saved[k] + state if b == k else saved_prefix[b + 1] - saved_prefix[k] + ckpt - overlap
            fork = state + ctx_prefix[b + 1] - ctx_prefix[k]  # with the ctx-kept bytes (kernels.segment_children)
            if fork > 0 and limit - held_b - 2 * snaps - trans_b[b] - r < fork:
                continue  # (a longer segment's row B_b has another fork: it may still fit)
            recompute_s = rerun_fwd_prefix[b] - rerun_fwd_prefix[k] + rerun[b]
            child_ret = r + ckpt + snaps
            c_f = stf - fwd_prefix[b + 1]
            c_r = stream + recompute_s - bwd_prefix[b + 1]
            if c_f + c_r >= threshold:
                break
            if child_ret > limit - row_floor[b + 1]:
                continue
            # As for keep and offload: at least the wait for the queued copies at the end of each pass.
            floor = _end_waits(wdt, sd, stf, wht, sh, stream + recompute_s, fwd_prefix, bwd_prefix, b + 1)
            if c_f + c_r + floor >= threshold:
                continue
            d_pend = pending_bytes(wdt, wdb, sd, stf, fluid_d2h_bw)
            h_pend = pending_bytes(wht, whb, sh, stream + recompute_s, fluid_h2d_bw)
            if c_f + c_r + bound_at(future, future_pending, b + 1, child_ret, d_pend, h_pend, future_step) >= threshold:
                continue
            _copy_queues(o_dqt[w], o_dqb[w], o_hqt[w], o_hqb[w], wdt, wdb, wht, whb)
            o_dst[w] = b + 1
            o_parent[w] = parent
            o_action[w] = -1
            o_ret[w] = child_ret
            o_held[w] = held[parent] | seg
            o_cf[w] = c_f
            o_cr[w] = c_r
            o_dqn[w] = sd
            o_hqn[w] = sh
            w += 1
    return (i, w, o_dst, o_parent, o_action, o_ret, o_held, o_cf, o_cr, o_dqt, o_dqb, o_dqn, o_hqt, o_hqb, o_hqn)


@njit(cache=True)
def _delay(
    at: np.ndarray, ab: np.ndarray, an: int, a_clock: float, bt: np.ndarray, bb: np.ndarray, bn: int, b_clock: float
) -> float:  # pragma: no cover - compiled
    """The least delay d >= 0 of A's clock after which A's queue, seen from its clock (a_clock + d), is no worse
    than B's seen from b_clock: it holds no more bytes at any moment after the clock and frees its copy stream no
    later (its last copy done by B's last or by B's clock). A longer delay only helps, so A is no worse exactly
    when delayed by at least this.

    In B's frame A's completion times are at + (b_clock - a_clock - d). A's pending bytes minus B's can only
    rise at B's clock or just after one of B's copies ends; at each such moment m, with pb bytes still pending in
    B, A's oldest copies must be done until the rest hold at most pb, which bounds A's shift by m - (the last of
    them). Both queues are in completion order and pb only falls from moment to moment: one pass over each."""
    if an == 0:
        return 0.0
    b_tail = bt[bn - 1] if bn > 0 else -np.inf
    shift = max(b_tail, b_clock) - at[an - 1]  # the largest shift of A's times that passes every test
    pa = _queued(ab, an)
    pb = _queued(bb, bn)
    done = 0  # A's oldest copies that must be complete by the moments so far
    ib = 0
    for e in range(-1, bn):
        moment = b_clock if e < 0 else bt[e]
        if moment < b_clock:
            continue
        while ib < bn and bt[ib] <= moment:
            pb -= bb[ib]
            ib += 1
        while pa > pb:
            pa -= ab[done]
            done += 1
        if done > 0:
            shift = min(shift, moment - at[done - 1])
    return max(b_clock - a_clock - shift, 0.0)


RING = 256
"""Kept labels of the same held set each label may be compared with (a missed dominance only costs time)."""
_RING_MASK = RING - 1  # RING is a power of two
_DEPTH_START = 64
_DEPTH_MIN = 16
_DEPTH_WINDOW = 2048
_DEPTH_DEEP_HITS = 8
"""The ring's scan depth (dominance_fifo): where it starts, its least, the labels between changes, and the
dominators found in its back half over them that double it."""


@njit(cache=True)
def dominance_fifo(
    held: np.ndarray,
    cf: np.ndarray,
    cr: np.ndarray,
    fwd_at: float,
    bwd_at: float,
    dq_t: np.ndarray,
    dq_b: np.ndarray,
    dq_n: np.ndarray,
    hq_t: np.ndarray,
    hq_b: np.ndarray,
    hq_n: np.ndarray,
    retained: np.ndarray,
    shared_k: int,
    after_bit: int,
    max_work: int,
) -> tuple[np.ndarray, int, int]:
    """Keep-mask for labels sorted by (held less `after_bit`, retained, cost): a label i is dropped when one of
    RING earlier kept labels j of its held set (so no more retained bytes) pays no more in any continuation
    (docs/formulation.md, 'Tier 2: FIFO copies', dominance). What a label still pays depends on its queues
    relative to its clocks, not on when its future starts; and a label whose clock is delayed by d pays at most
    d more (every wait and copy of a pass is a max of a clock and fixed completion times, so it ends no later
    for an earlier start). So j dominates i when j's cost plus the least delays of its forward and reverse
    clocks after which each of its queues is no worse than i's (holds no more bytes at any moment from the clock
    on, frees its stream no later) is at most i's cost.

    Returns (keep, labels done, work done). Work counts a unit per label and per ring label compared with it;
    past `max_work` the filter stops before its next label (done < len: the mask is incomplete, the caller
    stops the sweep): its time grows with the ring labels compared, which a label count cannot foresee.

    A label flagged `after_bit` (it arrived by a segment ending at k - 1) retains `shared_k` more bytes if it
    keeps or offloads layer k (DpProblem.shared_hold): any earlier label of its held set may drop it, but it drops
    an unflagged label only with those bytes added to its own retained bytes."""
    m = len(cf)
    keep = np.ones(m, dtype=np.bool_)
    ring = np.empty(RING, np.int64)
    head = 0
    work = m
    # Per label: its clocks and each queue's tail, which bound the delays before the queues are compared.
    fclock = fwd_at + cf
    bclock = bwd_at + cr
    d_tail = np.full(m, -np.inf)
    h_tail = np.full(m, -np.inf)
    for i in range(m):
        if dq_n[i] > 0:
            d_tail[i] = dq_t[i, dq_n[i] - 1]
        if hq_n[i] > 0:
            h_tail[i] = hq_t[i, hq_n[i] - 1]
    fill = 0
    idle = np.inf  # least cost of a label of this held set so far whose copies are all done by its clocks
    idle_plain = np.inf  # the same among unflagged labels (those that may drop an unflagged one at any bytes)
    group_mask = ~np.int64(after_bit)
    # How far into the ring labels look: halved after _DEPTH_WINDOW labels that found no dominator in its back
    # half, doubled (up to RING) after _DEPTH_WINDOW with _DEPTH_DEEP_HITS there. Where labels seldom dominate
    # one another every kept label scans the whole ring for nothing (bert-large at 75%: 99% kept).
    depth = _DEPTH_START
    seen = 0
    deep_hits = 0
    for i in range(m):
        if work > max_work:
            return keep, i, work
        if seen == _DEPTH_WINDOW:
            if deep_hits >= _DEPTH_DEEP_HITS:
                depth = min(2 * depth, RING)
            elif deep_hits == 0:
                depth = max(depth // 2, _DEPTH_MIN)
            seen = 0
            deep_hits = 0
        seen += 1
        work += 1
        if i == 0 or (held[i] & group_mask) != (held[i - 1] & group_mask):
            fill = 0
            idle = np.inf
            idle_plain = np.inf
        cost = cf[i] + cr[i]
        flagged = held[i] & after_bit
        if (idle if flagged else idle_plain) <= cost:
            # An earlier label (no more retained bytes) with no copy pending and no more cost: nothing pending is
            # no worse than any queue seen from any clock (the rule below with no delay).
            keep[i] = False
            continue
        if d_tail[i] <= fclock[i] and h_tail[i] <= bclock[i]:
            idle = cost
            if not flagged:
                idle_plain = cost
        d_rel = max(d_tail[i] - fclock[i], 0.0)
        h_rel = max(h_tail[i] - bclock[i], 0.0)
        hit = -1
        scan = min(fill, depth)
        work += scan
        for s in range(scan):
            j = ring[(head + s) & _RING_MASK]
            if not flagged and held[j] & after_bit and retained[j] + shared_k > retained[i]:
                continue
            base = cf[j] + cr[j]
            # Each delay is at least what brings j's last copy, seen from its delayed clock, to i's.
            if base + max(d_tail[j] - fclock[j] - d_rel, 0.0) + max(h_tail[j] - bclock[j] - h_rel, 0.0) > cost:
                continue
            d_f = _delay(dq_t[j], dq_b[j], dq_n[j], fclock[j], dq_t[i], dq_b[i], dq_n[i], fclock[i])
            if base + d_f > cost:
                continue
            if base + d_f + _delay(hq_t[j], hq_b[j], hq_n[j], bclock[j], hq_t[i], hq_b[i], hq_n[i], bclock[i]) <= cost:
                hit = s
                break
        # The ring is kept in order of use: a label that dominated moves to the front, a kept one enters there
        # and the least recently used drops out. Labels dominated by one another come in runs, so most are
        # dropped by the first few compared (PipeDream ResNet-50, 2.25 GiB, 148k labels: 64 most recent keep
        # 27,280; 256 by use keep 18,432 in less time; every earlier one, 18,082).
        # (A circular buffer from `head`: entering at the front overwrites the least recently used slot.)
        if hit >= 0:
            deep_hits += 2 * hit >= depth
            keep[i] = False
            j = ring[(head + hit) & _RING_MASK]
            for s in range(hit, 0, -1):
                ring[(head + s) & _RING_MASK] = ring[(head + s - 1) & _RING_MASK]
            ring[head] = j
        else:
            head = (head - 1) & _RING_MASK
            ring[head] = i
            fill = min(fill + 1, RING)
    return keep, m, work
