"""Compiled inner loop of the sweep: every recompute segment [k, b] of every label, one label at a time.

numba (a wheel, no compiler needed on the user's machine) compiles it on first use and caches the machine
code beside this file. The rules are those of docs/formulation.md, 'The memory-state DP', and of the
vectorised rows in optimizer/dp/sweep.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from memsched.optimizer.dp.future import bound_at


@njit(cache=True)
def checkpoint_bytes(
    seg: np.int64, held: np.int64, external: np.int64, out_bytes_bit: np.ndarray
) -> np.int64:  # pragma: no cover - compiled
    """Bytes a segment's checkpoint holds: its external inputs plus the outputs of the producers it reads
    (bits of `seg`) that the plan does not hold already (bits of `held`)."""
    ckpt = external
    for bit in range(len(out_bytes_bit)):
        if (seg >> bit) & 1 and not (held >> bit) & 1:
            ckpt += out_bytes_bit[bit]
    return ckpt


@njit(cache=True)
def segment_children(
    k: int,
    last: int,
    limit: int,
    serial: bool,
    backlogs_hold: bool,
    d2h_bw: float,
    h2d_bw: float,
    threshold: float,
    saved: np.ndarray,
    saved_prefix: np.ndarray,
    fwd: np.ndarray,
    rerun_fwd_prefix: np.ndarray,
    rerun: np.ndarray,
    bwd: np.ndarray,
    trans_f: np.ndarray,
    trans_b: np.ndarray,
    row_floor: np.ndarray,
    future: np.ndarray,
    future_pending: np.ndarray,
    future_step: float,
    backlog_prune: bool,
    fwd_left: np.ndarray,
    bwd_left: np.ndarray,
    external: np.ndarray,
    state: int,
    overlap: int,
    snap_prefix: np.ndarray,
    ctx_prefix: np.ndarray,
    bits_at: np.ndarray,
    out_bytes_bit: np.ndarray,
    side: int,
    side_layer: np.ndarray,
    side_bit: np.int64,
    retained: np.ndarray,
    held: np.ndarray,
    cost: np.ndarray,
    d2h: np.ndarray,
    h2d: np.ndarray,
    young: np.ndarray,
    capacity: int,
) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Children of labels (already past rows F_k / B_k and drained by layer k's compute) that recompute
    [k, b], for every b <= `last` (DpProblem.seg_last) where all rows fit and the cost stays under `threshold`.

    `bits_at[b - k]`: held-mask bits (crossing[k] order) of the producers before k that layer b consumes;
    `out_bytes_bit[bit]`: those producers' output bytes. `state`: what a segment's checkpoint holds from F_k
    through B_k beyond its inputs (the stashed RNG state, simulate.checkpoint_state_bytes): in rows F_k and
    B_k too, which the caller checked without it; its rows' backlog drain is not replayed (the state is
    nonzero on a CPU trace only, whose copies are serial: no backlog). `overlap`: bytes of layer k's saved
    tensors that are its checkpoint inputs (simulate.rerun_input_overlap), counted once in rows B_m, m > k.
    `snap_prefix`: prefix sums of the layers' changed buffers (DpProblem.snap_prefix): rows F_m hold S(k..m),
    rows B_k..B_b S(k..b) + S(k..m), the child S(k..b); the fits are exact, the backlog drains of rows B_m see
    S(k..b) only from b = m on (fluid copies are a relaxation already: optimistic).
    Returns (labels done, children written, then the children's arrays: destination boundary, parent,
    retained, held (crossing[k] order), cost, d2h, h2d).
    `future[b, g]` bounds the cost to come from boundary b at g * future_step retained bytes (dp/future.py);
    where larger and `backlog_prune` holds, so do the stalls a child's backlogs force (DpProblem.backlog_bound,
    from `fwd_left[b]` / `bwd_left[b]`: forward / backward seconds of layers b..n-1) and the table's rows with
    its backlogs held (`future_pending`, DpProblem.pending_bound).
    `side` (DpProblem.side): bytes of side inputs held from the loss point through B_k by a segment [k, b] where a
    layer of it reads them (`side_layer`), or by every later segment of a label with `side_bit` (SIDE_HELD_BIT):
    rows B_k..B_b and the loss point hold them; the child gets `side_bit`.
    `backlogs_hold`: the backlogs hold memory, so a row caps them (False: the link-work relaxation,
    DpProblem.link_work, where instead a row that cannot hold the bytes of a label's latest copy, `young`, while
    a backlog is left, stalls until that backlog is empty: sweep._in_flight).
    Stops before a label whose children might not fit in `capacity`; the caller resumes from there."""
    n = len(saved)
    o_dst = np.empty(capacity, np.int64)
    o_parent = np.empty(capacity, np.int64)
    o_ret = np.empty(capacity, np.int64)
    o_held = np.empty(capacity, np.int64)
    o_cost = np.empty(capacity)
    o_d2h = np.empty(capacity)
    o_h2d = np.empty(capacity)
    w = 0
    done = 0
    for i in range(len(cost)):
        if w + (n - k) > capacity:
            break
        done = i + 1
        r = retained[i]
        if state > 0 and (limit - saved[k] - max(trans_f[k], trans_b[k]) - r - state < 0):
            continue  # rows F_k / B_k cannot hold the segment's stashed state
        # Row F_k holds layer k's snapshot; row B_k the segment's snapshots and layer k's private copy (`snap_room`).
        snap_k = snap_prefix[k + 1] - snap_prefix[k]
        if snap_k > 0 and limit - saved[k] - trans_f[k] - r - snap_k - state < 0:
            continue
        snap_room_k = limit - saved[k] - trans_b[k] - r - snap_k - state
        c0, d0, h0 = cost[i], d2h[i], h2d[i]
        c, d, h = c0, d0, h0
        seg_side = side > 0 and (held[i] & side_bit) != 0  # an earlier segment holds the side inputs already
        seg = np.int64(0)
        ext = np.int64(0)
        ckpt = np.int64(0)
        snap_room = snap_room_k  # the least room of rows B_k..B_b for the segment's snapshots S(k..b)
        replay_from = k + 1
        for b in range(k, last + 1):
            snaps = snap_prefix[b + 1] - snap_prefix[k]  # S(k..b)
            new_bits = bits_at[b - k] & ~seg
            side_now = seg_side or (side > 0 and side_layer[b])
            if new_bits != 0 or external[b] > 0 or b == k or side_now != seg_side:
                # The checkpoint grew (or now holds side inputs): every interior row sees it, so replay them from
                # the segment's start.
                seg_side = side_now
                seg |= new_bits
                ext += external[b]
                ckpt = checkpoint_bytes(seg, held[i], ext, out_bytes_bit) + state
                c, d, h = c0, d0, h0
                snap_room = snap_room_k - (side if seg_side else 0)
                replay_from = k + 1
            charge = side if seg_side else 0  # side inputs held in rows B_k..B_b and at the loss point
            if charge > 0 and limit - saved[k] - trans_b[k] - r - charge < 0:
                break  # row B_k (the caller's, without them) cannot hold them: nor with a longer segment
            dead = False
            for m in range(replay_from, b + 1):
                rem = saved_prefix[m + 1] - saved_prefix[k]
                own = snap_prefix[m + 1] - snap_prefix[k]  # S(k..m): snapshots taken by F_m, copies held at B_m
                cap_f = limit - saved[m] - trans_f[m] - r - ckpt - own
                room = limit - rem - trans_b[m] - r - ckpt - own + (overlap if m > k else 0) - charge
                snap_room = min(snap_room, room)
                cap_b = room - snaps
                if cap_f < 0 or cap_b < 0:
                    dead = True  # and for every longer segment: the checkpoint and the snapshots only grow
                    break
                if not serial:
                    if backlogs_hold and d > cap_f:
                        c += (d - cap_f) / d2h_bw
                        d = float(cap_f)
                    if backlogs_hold and h > cap_b:
                        c += (h - cap_b) / h2d_bw
                        h = float(cap_b)
                    if not backlogs_hold and d > 0.0 and young[i] > cap_f:
                        c += d / d2h_bw
                        d = 0.0
                    if not backlogs_hold and h > 0.0 and young[i] > cap_b:
                        c += h / h2d_bw
                        h = 0.0
                    d = max(d - d2h_bw * fwd[m], 0.0)
                    h = max(h - h2d_bw * bwd[m], 0.0)
                # Least re-run of any segment [k..b], b >= m (DpProblem.rerun: what m costs as its last).
                if c + (rerun_fwd_prefix[m] - rerun_fwd_prefix[k] + rerun[m]) >= threshold:
                    dead = True
                    break
            if dead or snap_room < snaps:
                break  # rows B_k..B_b cannot hold the snapshots: nor with a longer segment's
            replay_from = b + 1
            # Row B_b holds the re-run's fork of the state too, and its layers' ctx-kept bytes made again
            # (simulate.rerun_fork_bytes). B_k holds no checkpoint inputs (the simulator's rule: they are held
            # strictly between F_k and B_k), only the stashed state the caller checked.
            held_b = saved[k] + state if b == k else saved_prefix[b + 1] - saved_prefix[k] + ckpt - overlap
            fork = state + ctx_prefix[b + 1] - ctx_prefix[k]
            if fork > 0 and limit - held_b - 2 * snaps - trans_b[b] - r - charge < fork:
                continue  # (a longer segment's row B_b has another fork: it may still fit)
            recompute_s = rerun_fwd_prefix[b] - rerun_fwd_prefix[k] + rerun[b]
            child_cost = c + recompute_s
            child_ret = r + ckpt + snaps
            if child_cost >= threshold:
                break
            if child_ret > limit - row_floor[b + 1] or child_ret + charge > limit - row_floor[n]:
                continue  # (the loss point holds the side inputs; a label retains no less there than here)
            child_h = h if serial else max(h - h2d_bw * recompute_s, 0.0)
            if backlog_prune:
                forced = max(d / d2h_bw - fwd_left[b + 1], 0.0) + max(child_h / h2d_bw - bwd_left[b + 1], 0.0)
                to_come = max(bound_at(future, future_pending, b + 1, child_ret, d, child_h, future_step), forced)
            else:
                to_come = future[b + 1, min(int(child_ret / future_step), future.shape[1] - 1)]
            if child_cost + to_come >= threshold:
                continue  # no completion beats the threshold (a longer segment may still: its row differs)
            o_dst[w] = b + 1
            o_parent[w] = i
            o_ret[w] = child_ret
            o_held[w] = held[i] | seg | (side_bit if seg_side else np.int64(0))
            o_cost[w] = child_cost
            o_d2h[w] = d
            o_h2d[w] = child_h
            w += 1
    return done, w, o_dst, o_parent, o_ret, o_held, o_cost, o_d2h, o_h2d


@njit(cache=True)
def remap_to_ends(
    held: np.ndarray,
    dst: np.ndarray,
    src_bits: np.ndarray,
    offsets: np.ndarray,
    producers: np.ndarray,
    shared_hold: np.ndarray,
    n: int,
    after_bit: np.int64,
    side_bit: np.int64,
    no_bit: int,
) -> np.ndarray:  # pragma: no cover - compiled
    """DpProblem.remap_to_ends: label i's held mask (crossing[src] bits: src_bits[j] is producer j's, `no_bit` where
    j does not cross src) in crossing[dst[i]] bit order, with `after_bit` where layer dst[i] holds shared bytes, and
    `side_bit` where the label has it."""
    out = np.zeros_like(held)
    for i in range(len(held)):
        b = dst[i]
        h = held[i]
        m = h & side_bit
        first = offsets[b]
        for q in range(first, offsets[b + 1]):
            s = src_bits[producers[q]]
            if s != no_bit and (h >> s) & 1:
                m |= np.int64(1) << np.int64(q - first)
        if b < n and shared_hold[b] != 0:
            m |= after_bit
        out[i] = m
    return out
