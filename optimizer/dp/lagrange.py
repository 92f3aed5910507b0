"""Lagrangian bounds: lower bounds for traces too long for the exact sweeps (docs/formulation.md, 'Lagrangian
bound on the memory rows' and 'Copies beside compute: the fluid link windows').

Each memory row u (F_0..F_{n-1}, the loss point, B_{n-1}..B_0: 2n + 1 rows) gets a price mu_u >= 0 in seconds
per byte. For fixed prices, a plan's cost plus the priced bytes of every row it uses is a sum over its actions
(keep, offload, recompute segment), because each action's bytes at each row and its time are priced apart:

- memory: the simulator's rows less every term that only adds bytes and depends on several actions at once
  (the dedup of checkpoint inputs across segments, saved-twice storages, side inputs, snapshots, RNG states);
- time: a recompute segment costs its re-run exactly; on the memory rows alone an offload costs the stall its
  copy would force if it had the link to itself (every schedule's stall is at least the sum of these); where
  copies run beside compute the link is shared, and the rows are split into fluid link windows instead.

So min over plans of (cost + priced rows less their limits) is a shortest path over the n + 1 boundaries, and
for every plan within the budget it is at most that plan's overhead: a true bound for any prices. Every step's
value is a bound, and the best is kept.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit

from memsched.optimizer.dp.problem import DpProblem
from memsched.optimizer.link_plan import LinkShares
from memsched.optimizer.simulate import checkpoint_input_bytes, loss_point_transient
from memsched.schema import Trace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LagrangeArrays:
    """The per-layer data of the priced path problem (index = layer, forward order)."""

    saved: np.ndarray
    """int64 saved bytes s_i."""
    cut: np.ndarray
    """int64 bytes a recomputed layer's forward stage holds less than a kept one's (simulate.forward_cuts)."""
    overlap: np.ndarray
    """int64 inputs a segment's first layer saves again on its re-run (Layer.input_saved_bytes)."""
    fwd_prefix: np.ndarray
    """float64 prefix sums of forward seconds (length n + 1)."""
    bwd_prefix: np.ndarray
    """float64 prefix sums of backward seconds (length n + 1)."""
    rerun: np.ndarray
    """float64 re-run seconds of a layer as a segment's last, with the segment's machinery (DpProblem.rerun)."""
    rerun_fwd_prefix: np.ndarray
    """float64 prefix sums of a segment's other layers' re-run seconds (DpProblem.rerun_fwd_prefix)."""
    seg_last: np.ndarray
    """int64 per layer k: the last layer a segment from k may end at (DpProblem.seg_last; empty: any)."""
    ext_prefix: np.ndarray
    """int64 prefix sums of each layer's external inputs (held by every segment containing it)."""
    first_ptr: np.ndarray
    """int64 CSR offsets (length n + 1) into first_prod: the producers whose first reader is each layer."""
    first_prod: np.ndarray
    """int64 producers j listed under their first reader c (j < c)."""
    ckpt_bytes: np.ndarray
    """int64 bytes of each producer's output a checkpoint holds whatever the producer does
    (simulate.checkpoint_input_bytes)."""
    head_bytes: np.ndarray
    """float64 the share of ckpt_bytes the priced path charges by the first reader's rule (first_ptr / first_prod):
    1 - _SPAN_SHARE of it for producers read by several layers, all of it for the others. The completion tables
    charge all of it by that rule (_evaluate's `completions`)."""
    span_ptr: np.ndarray
    """int64 CSR offsets (length n + 1) into span_at / span_bytes, by segment start k: the producers j < k read by
    more than one layer, one of them at or after k (_span_charges)."""
    span_at: np.ndarray
    """int64 the first reader at or after k of each such producer: a segment [k, b] holds it where this is <= b."""
    span_bytes: np.ndarray
    """float64 the span rule's share of its checkpoint bytes (_SPAN_SHARE x ckpt_bytes)."""
    span_last: np.ndarray
    """int64 its last reader: the segment holding it is the last to, and pays the rows after its end too."""
    span_prod: np.ndarray
    """int64 the producer j of each such entry (the link windows' Lagrangian weighs the two rules per producer)."""
    shared: np.ndarray
    """int64 the producers read by several layers (ascending), whose bytes the two rules share."""
    opt_ptr: np.ndarray
    """int64 CSR offsets (length n + 1) of each layer's offload options."""
    opt_free: np.ndarray
    """int64 bytes an option frees from the layer's saved bytes (a relaxed option: the top of its range)."""
    opt_copy: np.ndarray
    """int64 bytes an option's copies carry (a relaxed option: the bottom of its range)."""
    trans: np.ndarray
    """int64 per row u (2n + 1): the bytes every plan has there (transients; the loss point's own bytes)."""
    limit: int
    """Budget minus static bytes."""
    serial: bool
    """Copies run on the compute thread (each costs its whole time, synchronously)."""
    d2h_bw: float
    """Device-to-host bytes per second."""
    h2d_bw: float
    """Host-to-device bytes per second."""
    latency: float
    """Seconds per copy beyond its bytes."""
    recompute: bool
    """Whether plans may recompute."""


def lagrange_arrays(p: DpProblem, trace: Trace) -> LagrangeArrays:
    """The arrays of `p` (whose offload options may be relaxed ranges: each frees its top and copies its
    bottom, at least as good as every subset in the range) for the priced path problem."""
    n = p.n
    first_of: list[list[int]] = [[] for _ in range(n)]
    for j, readers in enumerate(p.consumers):  # readers come after their producer
        if readers:
            first_of[min(readers)].append(j)
    first_ptr, first_prod = _csr(first_of)
    ckpt_bytes = np.array([checkpoint_input_bytes(trace, j) for j in range(n)], dtype=np.int64)
    many = {j for j, readers in enumerate(p.consumers) if len(set(readers)) > 1 and ckpt_bytes[j] > 0}
    span_ptr, span_at, span_last, span_prod = _span_charges(p.consumers, many)
    opt_ptr = _offsets(p.offload)
    trans = np.zeros(2 * n + 1, dtype=np.int64)
    trans[:n] = p.trans_f
    trans[n] = loss_point_transient(trace)
    trans[n + 1 :] = p.trans_b[::-1]  # row 2n - i is B_i
    arrays = LagrangeArrays(
        saved=p.saved,
        cut=p.trans_f - p.trans_f_rec,
        overlap=p.input_saved,
        fwd_prefix=p.fwd_prefix,
        bwd_prefix=p.bwd_prefix,
        rerun=p.rerun,
        rerun_fwd_prefix=p.rerun_fwd_prefix,
        seg_last=p.seg_last,
        ext_prefix=np.concatenate([[0], np.cumsum(p.external)]).astype(np.int64),
        first_ptr=first_ptr,
        first_prod=first_prod,
        ckpt_bytes=ckpt_bytes,
        head_bytes=np.zeros(0),  # set below, by rule_charges
        span_ptr=span_ptr,
        span_at=span_at,
        span_bytes=np.zeros(0),
        span_last=span_last,
        span_prod=span_prod,
        shared=np.array(sorted(many), dtype=np.int64),
        opt_ptr=opt_ptr,
        opt_free=np.array([o.nbytes for opts in p.offload for o in opts], dtype=np.int64),
        opt_copy=np.array([o.copy_bytes for opts in p.offload for o in opts], dtype=np.int64),
        trans=trans,
        limit=p.limit,
        serial=p.serial,
        d2h_bw=p.d2h_bw,
        h2d_bw=p.h2d_bw,
        latency=p.latency,
        recompute=p.recompute,
    )
    head, span = rule_charges(arrays, np.full(len(arrays.shared), _SPAN_SHARE))
    return dataclasses.replace(arrays, head_bytes=head, span_bytes=span)


def _offsets(lists: Sequence[Sequence[object]]) -> np.ndarray:
    """int64 CSR offsets (length len(lists) + 1) of the lists' entries, laid end to end."""
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    return ptr


def _csr(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    return _offsets(lists), np.array([j for x in lists for j in x], dtype=np.int64)


def _span_charges(consumers: list[list[int]], many: set[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """By segment start k: each producer j < k of `many` with a reader at or after k, as (its first reader at or
    after k, its last reader, j) (LagrangeArrays.span_*; their bytes: rule_charges). The simulator holds j's output
    once, from the earliest segment that reads it from outside, [a_1, b_1], over rows a_1 + 1 .. 2n - a_1 - 1. Every
    later such segment starts after the one before it ends, so charging each such segment [a, b] only the rows that
    its start adds and its end does not (a + 1 .. b + 1 and 2n - b - 1 .. 2n - a - 1) charges at most that: a bound
    whichever of them is the earliest (docs/formulation.md, 'Checkpoint inputs read by several layers')."""
    n = len(consumers)
    rows: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    for j in sorted(many):
        readers = sorted(set(consumers[j]))
        # From k = j + 1 on, the first reader at or after k moves along the readers.
        for q, r in enumerate(readers):
            lo = j + 1 if q == 0 else readers[q - 1] + 1
            for k in range(lo, r + 1):
                rows[k].append((r, readers[-1], j))
    ptr = _offsets(rows)
    at = np.array([e[0] for x in rows for e in x], dtype=np.int64)
    last = np.array([e[1] for x in rows for e in x], dtype=np.int64)
    prod = np.array([e[2] for x in rows for e in x], dtype=np.int64)
    return ptr, at, last, prod


def _adam_ascent(
    x: np.ndarray, first: np.ndarray, second: np.ndarray, grad: np.ndarray, it: int, rate: float
) -> np.ndarray:
    """One projected Adam step up `grad` from `x` (weights, kept in [0, 1]) at step `it` (from 1); updates the
    moments `first` and `second` in place."""
    first *= _ADAM_B1
    first += (1 - _ADAM_B1) * grad
    second *= _ADAM_B2
    second += (1 - _ADAM_B2) * grad * grad
    m = first / (1 - _ADAM_B1**it)
    v = second / (1 - _ADAM_B2**it)
    return np.clip(x + rate * m / (np.sqrt(v) + 1e-12), 0.0, 1.0)


def rule_charges(a: LagrangeArrays, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(head, span): the checkpoint bytes the first reader's rule charges each producer (as head_bytes) and the span
    rule each of its entries (as span_bytes) where producer a.shared[i] is charged weights[i] of its bytes by the span
    rule and the rest by the first reader's. Each rule alone bounds the simulator's rows for every plan and every
    producer, so any weights in [0, 1] do (docs/formulation.md, 'Checkpoint inputs read by several layers')."""
    assert len(weights) == len(a.shared) and np.all((weights >= 0.0) & (weights <= 1.0))
    head = a.ckpt_bytes.astype(np.float64)
    head[a.shared] *= 1.0 - weights
    full = np.zeros(len(a.saved))
    full[a.shared] = weights
    return head, a.ckpt_bytes[a.span_prod] * full[a.span_prod]


_SPAN_SHARE = 0.5
"""The share of a producer's checkpoint bytes charged by the span rule where several layers read it (the rest by
the first reader's rule): each rule alone is a bound, so any mix is (docs/formulation.md, 'Checkpoint inputs read
by several layers')."""

# Arc kinds of the priced path.
_KEEP, _OFFLOAD, _SEGMENT = 0, 1, 2
# The link Lagrangian's plan per layer (`_link_lagrangian`'s `plan_out`): these, or the offload option's index.
PLAN_KEEP, PLAN_START, PLAN_CONTINUE = -1, -2, -3


@njit(cache=True)
def _price_offloads(
    P: np.ndarray,
    saved: np.ndarray,
    fwd_prefix: np.ndarray,
    bwd_prefix: np.ndarray,
    opt_ptr: np.ndarray,
    opt_free: np.ndarray,
    opt_copy: np.ndarray,
    serial: bool,
    d2h_bw: float,
    h2d_bw: float,
    latency: float,
    best: np.ndarray,
    choice: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """best[i]: the least priced cost of offloading layer i (inf without options); choice[i] = (option, done-by,
    prefetch-at). Rows: u = i is F_i, u = n the loss point, u = 2n - i is B_i; P is the prefix sum of prices."""
    n = len(saved)
    two_n = 2 * n
    for i in range(n):
        best[i] = np.inf
        for o in range(opt_ptr[i], opt_ptr[i + 1]):
            x = opt_free[o]
            c = opt_copy[o]
            base = (saved[i] - x) * (P[two_n - i + 1] - P[i])  # left on the device from F_i through B_i
            if serial:
                # Synchronous copies: in flight during F_i and B_i only, and every second of them is a stall.
                v = base + c * (P[i + 1] - P[i]) + c * (P[two_n - i + 1] - P[two_n - i])
                v += 2.0 * latency + c / d2h_bw + c / h2d_bw
                if v < best[i]:
                    best[i] = v
                    choice[i, 0] = o
                    choice[i, 1] = i
                    choice[i, 2] = i
                continue
            dur_f = latency + c / d2h_bw
            best_f = np.inf
            arg_f = i
            for d in range(i, n):
                stall = max(0.0, dur_f - (fwd_prefix[d + 1] - fwd_prefix[i + 1]))
                v = c * (P[d + 1] - P[i]) + stall  # in flight F_i..F_d
                if v < best_f:
                    best_f = v
                    arg_f = d
                if stall == 0.0:
                    break  # later done-by stages hold the bytes longer and hide nothing more
            dur_b = latency + c / h2d_bw
            best_b = np.inf
            arg_b = i
            for q in range(i, n):
                # Issued at B_q's start: the backwards of B_q..B_{i+1}, and at most the forwards of the layers in
                # between re-run there (segments ending in (i, q] lie inside it), hide it.
                hide = (bwd_prefix[q + 1] - bwd_prefix[i + 1]) + (fwd_prefix[q + 1] - fwd_prefix[i + 1])
                stall = max(0.0, dur_b - hide)
                v = c * (P[two_n - i + 1] - P[two_n - q]) + stall  # back from B_q through B_i
                if v < best_b:
                    best_b = v
                    arg_b = q
                if stall == 0.0:
                    break
            v = base + best_f + best_b
            if v < best[i]:
                best[i] = v
                choice[i, 0] = o
                choice[i, 1] = arg_f
                choice[i, 2] = arg_b


@njit(cache=True)
def _segment_costs(
    k: int,
    last: int,
    P: np.ndarray,
    sums: np.ndarray,
    run_credit: np.ndarray,
    overlap: np.ndarray,
    rerun_fwd_prefix: np.ndarray,
    rerun: np.ndarray,
    ext_prefix: np.ndarray,
    first_ptr: np.ndarray,
    first_prod: np.ndarray,
    ckpt_bytes: np.ndarray,
    span_ptr: np.ndarray,
    span_at: np.ndarray,
    span_bytes: np.ndarray,
    span_last: np.ndarray,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """out[b] = the priced cost of the segment [k, b] for every b >= k, infinite past `last` (Trace.segment_last):
    its re-run (less run_credit[b] per second: link time it gives the prefetches of B_b); its forwards under the
    checkpoint; its layers rematerialised from B_b; the first layer's saved inputs counted once from B_b through
    B_{k+1}; the checkpoint's inputs from F_{k+1} through B_{k+1} (producers before k whose first reader is in the
    segment, and its layers' external inputs); the producers of the span charges (span_ptr from k: read by several
    layers) over the rows the segment adds, k+1..b+1 and 2n-b-1..2n-k-1 (_span_charges). P: prefix sums of the row
    prices; sums: _layer_sums."""
    n = len(rerun)
    two_n = 2 * n
    ckpt = 0.0
    hold = P[two_n - k] - P[k + 1]  # rows k+1 .. 2n-k-1
    first_at = np.zeros(n)  # span-charged bytes by their first reader at or after k
    last_at = np.zeros(n)  # the same bytes by their last reader
    for e in range(span_ptr[k], span_ptr[k + 1]):
        first_at[span_at[e]] += span_bytes[e]
        last_at[span_last[e]] += span_bytes[e]
    spanned = 0.0
    ended = 0.0
    out[last + 1 :] = np.inf
    for b in range(k, last + 1):
        for e in range(first_ptr[b], first_ptr[b + 1]):
            j = first_prod[e]
            if j < k:
                ckpt += ckpt_bytes[j]
        ext = ext_prefix[b + 1] - ext_prefix[k]
        remat = (sums[0, b + 1] - sums[0, k]) - P[two_n - b] * (sums[1, b + 1] - sums[1, k])
        run = rerun_fwd_prefix[b] - rerun_fwd_prefix[k] + rerun[b]
        v = run * (1.0 - run_credit[b]) + (sums[2, b + 1] - sums[2, k]) + remat + (ckpt + ext) * hold
        if b > k:
            v -= overlap[k] * (P[two_n - k] - P[two_n - b])  # rows 2n-b .. 2n-k-1
        spanned += first_at[b]
        ended += last_at[b]
        if spanned > 0.0:
            after = P[two_n - b - 1] - P[b + 2] if b + 1 < n else 0.0  # rows b+2 .. 2n-b-2: a later segment's
            v += spanned * (hold - after) + ended * after  # the last holder pays the rows after it too
        out[b] = v


@njit(cache=True)
def _layer_sums(P: np.ndarray, mu: np.ndarray, saved: np.ndarray, cut: np.ndarray) -> np.ndarray:  # pragma: no cover
    """Prefix sums over layers that price a segment in O(1) (_segment_costs): rows 0, 1, 2 hold
    sum s_i P[2n - i + 1], sum s_i and sum (s_i - cut_i) mu_i over the layers before each boundary."""
    n = len(saved)
    two_n = 2 * n
    out = np.zeros((3, n + 1))
    for i in range(n):
        out[0, i + 1] = out[0, i] + saved[i] * P[two_n - i + 1]
        out[1, i + 1] = out[1, i] + saved[i]
        out[2, i + 1] = out[2, i] + (saved[i] - cut[i]) * mu[i]
    return out


@njit(cache=True)
def _path(
    P: np.ndarray,
    mu: np.ndarray,
    sums: np.ndarray,
    saved: np.ndarray,
    off_best: np.ndarray,
    run_credit: np.ndarray,
    overlap: np.ndarray,
    rerun_fwd_prefix: np.ndarray,
    rerun: np.ndarray,
    seg_last: np.ndarray,
    ext_prefix: np.ndarray,
    first_ptr: np.ndarray,
    first_prod: np.ndarray,
    ckpt_bytes: np.ndarray,
    span_ptr: np.ndarray,
    span_at: np.ndarray,
    span_bytes: np.ndarray,
    span_last: np.ndarray,
    recompute: bool,
    suffix: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """The least priced plan: (dist, arc_kind, arc_from) over the boundaries. Arcs: keep and the best offload
    (off_best) from k to k + 1, segments [k, b] to b + 1, whose re-run in B_b earns run_credit[b] per second.
    Where `suffix` has n + 1 entries it receives, per boundary k, the least priced cost of layers k..n-1."""
    n = len(saved)
    two_n = 2 * n
    dist = np.full(n + 1, np.inf)
    dist[0] = 0.0
    arc_kind = np.zeros(n + 1, dtype=np.int64)
    arc_from = np.zeros(n + 1, dtype=np.int64)
    seg = np.empty(n)
    keep_rows = suffix.shape[0] == n + 1
    rows = np.empty((n if keep_rows and recompute else 0, n))  # segment costs, kept for the backward pass
    for k in range(n):
        base = dist[k]
        v = base + saved[k] * (P[two_n - k + 1] - P[k])  # keep: s_k from F_k through B_k
        if v < dist[k + 1]:
            dist[k + 1] = v
            arc_kind[k + 1] = _KEEP
            arc_from[k + 1] = k
        v = base + off_best[k]
        if v < dist[k + 1]:
            dist[k + 1] = v
            arc_kind[k + 1] = _OFFLOAD
            arc_from[k + 1] = k
        if not recompute:
            continue
        _segment_costs(
            k,
            seg_last[k] if len(seg_last) else n - 1,
            P,
            sums,
            run_credit,
            overlap,
            rerun_fwd_prefix,
            rerun,
            ext_prefix,
            first_ptr,
            first_prod,
            ckpt_bytes,
            span_ptr,
            span_at,
            span_bytes,
            span_last,
            seg,
        )
        if rows.shape[0]:
            rows[k] = seg
        for b in range(k, n):
            v = base + seg[b]
            if v < dist[b + 1]:
                dist[b + 1] = v
                arc_kind[b + 1] = _SEGMENT
                arc_from[b + 1] = k
    if keep_rows:
        # The same graph from each boundary to the end: what any completion from boundary k pays at these prices.
        suffix[n] = 0.0
        for k in range(n - 1, -1, -1):
            best = min(saved[k] * (P[two_n - k + 1] - P[k]), off_best[k]) + suffix[k + 1]
            if recompute:
                for b in range(k, n):
                    best = min(best, rows[k, b] + suffix[b + 1])
            suffix[k] = best
    return dist, arc_kind, arc_from


@njit(cache=True)
def _plan_out(
    arc_kind: np.ndarray, arc_from: np.ndarray, off_choice: np.ndarray, plan_out: np.ndarray
) -> None:  # pragma: no cover - compiled
    """The least priced path's plan per layer: PLAN_KEEP, PLAN_START / PLAN_CONTINUE (a recompute segment's first
    layer / a later one) or the offload option's index."""
    node = len(plan_out)
    while node > 0:
        k = arc_from[node]
        if arc_kind[node] == _KEEP:
            plan_out[k] = PLAN_KEEP
        elif arc_kind[node] == _OFFLOAD:
            plan_out[k] = off_choice[k, 0]
        else:
            plan_out[k] = PLAN_START
            plan_out[k + 1 : node] = PLAN_CONTINUE
        node = k


@njit(cache=True)
def _plan_rows(
    arc_kind: np.ndarray,
    arc_from: np.ndarray,
    off_choice: np.ndarray,
    saved: np.ndarray,
    cut: np.ndarray,
    overlap: np.ndarray,
    rerun_fwd_prefix: np.ndarray,
    rerun: np.ndarray,
    ext_prefix: np.ndarray,
    first_ptr: np.ndarray,
    first_prod: np.ndarray,
    ckpt_bytes: np.ndarray,
    span_ptr: np.ndarray,
    span_at: np.ndarray,
    span_bytes: np.ndarray,
    span_last: np.ndarray,
    opt_free: np.ndarray,
    opt_copy: np.ndarray,
    trans: np.ndarray,
    limit: float,
    g_row: np.ndarray,
    copies: np.ndarray,
    reruns: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """The least priced plan's bytes at each row less the limit (g_row: a subgradient of the row prices), its
    copied bytes per layer and its re-run seconds per segment end. off_choice[k] = (option, done-by,
    prefetch-at): the copy is in flight F_k..F_done-by and back B_prefetch-at..B_k."""
    n = len(saved)
    two_n = 2 * n
    diff = np.zeros(two_n + 2)
    node = n
    while node > 0:
        k = arc_from[node]
        kind = arc_kind[node]
        if kind == _KEEP:
            diff[k] += saved[k]
            diff[two_n - k + 1] -= saved[k]
        elif kind == _OFFLOAD:
            o = off_choice[k, 0]
            left = saved[k] - opt_free[o]
            c = opt_copy[o]
            diff[k] += left + c
            diff[off_choice[k, 1] + 1] -= c
            diff[two_n - off_choice[k, 2]] += c
            diff[two_n - k + 1] -= left + c
            copies[k] = c
        else:
            b = node - 1
            ckpt = 0.0
            for c2 in range(k, b + 1):
                for e in range(first_ptr[c2], first_ptr[c2 + 1]):
                    if first_prod[e] < k:
                        ckpt += ckpt_bytes[first_prod[e]]
                diff[c2] += saved[c2] - cut[c2]
                diff[c2 + 1] -= saved[c2] - cut[c2]
                diff[two_n - b] += saved[c2]
                diff[two_n - c2 + 1] -= saved[c2]
            ckpt += ext_prefix[b + 1] - ext_prefix[k]
            diff[k + 1] += ckpt
            diff[two_n - k] -= ckpt
            if b > k:
                diff[two_n - b] -= overlap[k]
                diff[two_n - k] += overlap[k]
            spanned = 0.0
            ended = 0.0
            for e in range(span_ptr[k], span_ptr[k + 1]):
                if span_at[e] <= b:
                    spanned += span_bytes[e]
                    if span_last[e] <= b:
                        ended += span_bytes[e]
            if spanned > 0.0:
                diff[k + 1] += spanned
                if b + 1 < n:  # rows k+1..b+1 and 2n-b-1..2n-k-1; the last holder's, all of k+1..2n-k-1
                    diff[b + 2] -= spanned - ended
                    diff[two_n - b - 1] += spanned - ended
                diff[two_n - k] -= spanned
            reruns[b] = rerun_fwd_prefix[b] - rerun_fwd_prefix[k] + rerun[b]
        node = k
    total = 0.0
    for u in range(two_n + 1):
        total += diff[u]
        g_row[u] = total + trans[u] - limit


@njit(cache=True)
def _lagrangian(
    mu: np.ndarray,
    saved: np.ndarray,
    cut: np.ndarray,
    overlap: np.ndarray,
    fwd_prefix: np.ndarray,
    bwd_prefix: np.ndarray,
    rerun: np.ndarray,
    rerun_fwd_prefix: np.ndarray,
    seg_last: np.ndarray,
    ext_prefix: np.ndarray,
    first_ptr: np.ndarray,
    first_prod: np.ndarray,
    ckpt_bytes: np.ndarray,
    span_ptr: np.ndarray,
    span_at: np.ndarray,
    span_bytes: np.ndarray,
    span_last: np.ndarray,
    opt_ptr: np.ndarray,
    opt_free: np.ndarray,
    opt_copy: np.ndarray,
    trans: np.ndarray,
    limit: float,
    serial: bool,
    d2h_bw: float,
    h2d_bw: float,
    latency: float,
    recompute: bool,
    grad: np.ndarray,
    suffix: np.ndarray,
    plan_out: np.ndarray,
    P_out: np.ndarray,
) -> float:  # pragma: no cover - compiled
    """The Lagrangian of the memory rows at prices `mu`; `grad` receives the minimising plan's bytes at each row
    less the limit (a subgradient). Where `suffix` has n + 1 entries it receives, per boundary k, the least priced
    cost of the layers k..n-1. Where plan_out has n entries it receives the plan and P_out (2n + 2) the prefix sums
    of the prices, as `_link_lagrangian`'s do (for `_rule_gradient`)."""
    n = len(saved)
    P = np.zeros(2 * n + 2)
    for u in range(2 * n + 1):
        P[u + 1] = P[u] + mu[u]
    off_best = np.empty(n)
    off_choice = np.zeros((n, 3), dtype=np.int64)
    _price_offloads(
        P, saved, fwd_prefix, bwd_prefix, opt_ptr, opt_free, opt_copy, serial, d2h_bw, h2d_bw, latency, off_best,
        off_choice,
    )  # fmt: skip
    sums = _layer_sums(P, mu, saved, cut)
    no_credit = np.zeros(n)
    dist, arc_kind, arc_from = _path(
        P, mu, sums, saved, off_best, no_credit, overlap, rerun_fwd_prefix, rerun, seg_last, ext_prefix, first_ptr,
        first_prod, ckpt_bytes, span_ptr, span_at, span_bytes, span_last, recompute, suffix,
    )  # fmt: skip
    value = dist[n]
    for u in range(2 * n + 1):
        value += mu[u] * (trans[u] - limit)
    if plan_out.shape[0] == n:
        _plan_out(arc_kind, arc_from, off_choice, plan_out)
        P_out[:] = P
    _plan_rows(
        arc_kind, arc_from, off_choice, saved, cut, overlap, rerun_fwd_prefix, rerun, ext_prefix, first_ptr, first_prod,
        ckpt_bytes, span_ptr, span_at, span_bytes, span_last, opt_free, opt_copy, trans, limit, grad, np.zeros(n),
        np.zeros(n),
    )  # fmt: skip
    return value


@dataclass
class LagrangeResult:
    """What the subgradient search established."""

    bound_s: float
    """The best Lagrangian value seen (0 at the start): a lower bound on every plan's overhead."""
    iterations: int
    """Prices evaluated."""
    wall_s: float
    """Seconds spent."""
    stopped_by: str
    """'deadline', 'iterations', 'converged' (the step became negligible) or 'target' (the bound reached it)."""
    prices: np.ndarray
    """The prices of the best value (seconds per byte, per row)."""


def _evaluate(
    a: LagrangeArrays,
    mu: np.ndarray,
    grad: np.ndarray,
    suffix: np.ndarray,
    completions: bool = False,
    charges: tuple[np.ndarray, np.ndarray] | None = None,
    plan: np.ndarray | None = None,
    P: np.ndarray | None = None,
) -> float:
    """The Lagrangian at `mu`. `completions`: with the completion tables' rule for checkpoint inputs (each producer
    charged whole to the segment holding its first reader, none by span: a label's held producers are in its
    retained bytes, which a span charge from a completion's segment would count again). `charges`: the rules'
    (head, span) bytes at other weights than half (rule_charges). `plan`, `P`: receive the least priced plan and the
    prices' prefix sums (for _rule_gradient)."""
    head_bytes, span_bytes = (a.head_bytes, a.span_bytes) if charges is None else charges
    span = (a.span_ptr, a.span_at, span_bytes, a.span_last)
    head = (a.first_ptr, a.first_prod, head_bytes)
    if completions:
        span = (np.zeros(len(a.span_ptr), dtype=np.int64), a.span_at, a.span_bytes, a.span_last)
        head = (a.first_ptr, a.first_prod, a.ckpt_bytes.astype(np.float64))
    return float(
        _lagrangian(
            mu,
            a.saved,
            a.cut,
            a.overlap,
            a.fwd_prefix,
            a.bwd_prefix,
            a.rerun,
            a.rerun_fwd_prefix,
            a.seg_last,
            a.ext_prefix,
            *head,
            *span,
            a.opt_ptr,
            a.opt_free,
            a.opt_copy,
            a.trans,
            float(a.limit),
            a.serial,
            a.d2h_bw,
            a.h2d_bw,
            a.latency,
            a.recompute,
            grad,
            suffix,
            np.zeros(0, dtype=np.int64) if plan is None else plan,
            np.zeros(0) if P is None else P,
        )
    )


def lagrangian_bound(
    arrays: LagrangeArrays,
    upper_s: float,
    deadline: float,
    target_s: float | None = None,
    max_iterations: int = 100_000,
    first_reader_only: bool = False,
    start: np.ndarray | None = None,
) -> LagrangeResult:
    """Subgradient ascent on the prices from zero, with Polyak's step towards `upper_s` (the overhead of a known
    plan within the budget), the step factor halved after a run of steps without a better value. Stops at
    `deadline` (time.perf_counter()), after `max_iterations`, when the bound reaches `target_s`, or when the
    factor is negligible. Every value is a bound; the best is returned. `first_reader_only`: checkpoint inputs by
    the first reader's rule alone, the completion tables' (completion_table): prices found for it prune the exact
    DP better than those of the path's mix of rules. `start`: the prices to start from (default: zero), e.g. another
    rule's best, from which this one's ascent goes on. With the mix, each producer read by several layers has its
    own weight between the rules (as in LinkLagrangian), raised with the prices by projected Adam steps of
    _ROWS_WEIGHT_RATE x the step factor; a restart from the best prices restarts from their weights."""
    a = arrays
    t0 = time.perf_counter()
    mu = np.zeros(len(a.trans)) if start is None else np.array(start, dtype=np.float64)
    grad = np.zeros_like(mu)
    no_suffix = np.zeros(0)
    n = len(a.saved)
    weighed = not first_reader_only and len(a.shared) > 0
    weights = np.full(len(a.shared), _SPAN_SHARE)
    w_first, w_second, w_grad = np.zeros(len(a.shared)), np.zeros(len(a.shared)), np.zeros(n)
    plan, P = (np.zeros(n, dtype=np.int64), np.zeros(2 * n + 2)) if weighed else (None, None)
    w_steps = 0
    best_value, best_mu, best_w = 0.0, mu.copy(), weights.copy()
    theta, since = 1.0, 0
    stopped = "iterations"
    it = 0
    while it < max_iterations:
        if time.perf_counter() >= deadline:
            stopped = "deadline"
            break
        it += 1
        charges = rule_charges(a, weights) if weighed else None
        value = _evaluate(a, mu, grad, no_suffix, completions=first_reader_only, charges=charges, plan=plan, P=P)
        if value > best_value + 1e-12 * max(1.0, abs(best_value)):
            best_value, best_mu, best_w, since = value, mu.copy(), weights.copy(), 0
        else:
            since += 1
            if since >= _PATIENCE:
                theta, since = theta / 2, 0
                if theta < _MIN_THETA:
                    stopped = "converged"
                    break
                if best_value > 0.0:
                    mu, weights = best_mu.copy(), best_w.copy()  # restart from the best with the smaller step
                    continue
        if target_s is not None and best_value >= target_s:
            stopped = "target"
            break
        # A price at zero whose row has room to spare cannot move: leave it out of the step.
        g = np.where((mu <= 0.0) & (grad < 0.0), 0.0, grad)
        norm = float(g @ g)
        if norm <= 0.0:
            stopped = "converged"  # the minimiser meets every row with complementary slack: value is optimal
            break
        step = theta * max(upper_s - value, 1e-9 * max(upper_s, 1e-12)) / norm
        mu = np.maximum(0.0, mu + step * g)
        if weighed:
            assert plan is not None and P is not None
            _rule_gradient(
                plan, P, a.first_ptr, a.first_prod, a.ckpt_bytes, a.span_ptr, a.span_at, a.span_last, a.span_prod,
                w_grad,
            )  # fmt: skip
            w_steps += 1
            weights = _adam_ascent(weights, w_first, w_second, w_grad[a.shared], w_steps, _ROWS_WEIGHT_RATE * theta)
    return LagrangeResult(
        bound_s=max(0.0, best_value),
        iterations=it,
        wall_s=time.perf_counter() - t0,
        stopped_by=stopped,
        prices=best_mu,
    )


def completion_table(arrays: LagrangeArrays, prices: np.ndarray, step: float, grid: int) -> np.ndarray:
    """table[k, g]: a lower bound on the cost of completing layers k..n-1 after any partial plan that keeps at
    least g * step bytes on the device through every later row (the DP's retained bytes), from the same prices:
    the least priced cost of the layers k..n-1 plus the priced rows of those layers (F_k..F_{n-1}, the loss
    point, B_{n-1}..B_k) holding g * step bytes each, less their limits. The earlier layers hold at least the
    retained bytes at each of those rows (their in-flight, prefetched and rematerialised bytes only add), so for
    every completion that fits, its cost is at least this (docs/formulation.md, 'Lagrangian bound on the memory
    rows'). Nondecreasing in g: prices are >= 0."""
    a = arrays
    n = len(a.saved)
    suffix = np.zeros(n + 1)
    _evaluate(a, prices, np.zeros_like(prices), suffix, completions=True)
    two_n = 2 * n
    P = np.concatenate([[0.0], np.cumsum(prices)])
    PT = np.concatenate([[0.0], np.cumsum(prices * (a.trans - float(a.limit)))])
    k = np.arange(n + 1)
    rows = P[two_n - k + 1] - P[k]  # rows k .. 2n-k (boundary n: the loss point alone)
    const = PT[two_n - k + 1] - PT[k]
    g = np.arange(grid + 1) * step
    return np.maximum(0.0, suffix[:, None] + const[:, None] + rows[:, None] * g[None, :])


_PATIENCE = 20
"""Steps without a better value before the step factor is halved."""
_MIN_THETA = 1e-4
"""Below this step factor the search has stalled."""


def raise_future(p: DpProblem, arrays: LagrangeArrays, prices: np.ndarray) -> None:
    """Raise `p.future` (the exact DP's future-cost table, in place: the problems of one solve share it) to the
    completion bound of these prices where that is larger. `arrays` must be of a problem whose offload options
    dominate every real subset (relaxed_problem), so the table bounds every real completion."""
    table = completion_table(arrays, prices, p.future_step, p.future.shape[1] - 1)
    np.maximum(p.future, table, out=p.future)


# ---------------------------------------------------------------- copies beside compute: the link's windows


@njit(cache=True)
def _link_cover(lam: np.ndarray, widths: np.ndarray, cols: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """cover[l] = the sum of lam[m, g] over the windows [m - widths[g], m - 1] of rows m > l that contain l: the
    price of one byte arriving at layer l (its copy is in those windows) and of one second of link time there.
    Row m's windows are its first cols[m] (the lengths up to m)."""
    n = lam.shape[0]
    diff = np.zeros(n + 1)
    for m in range(n):
        for g in range(cols[m]):
            w = widths[g]
            if w >= 1:
                diff[m - w] += lam[m, g]
                diff[m] -= lam[m, g]
    cover = np.zeros(n)
    run = 0.0
    for layer in range(n):
        run += diff[layer]
        cover[layer] = run
    return cover


@njit(cache=True)
def _link_lagrangian(
    x_f: np.ndarray,
    x_b: np.ndarray,
    unit: float,
    widths: np.ndarray,
    cols: np.ndarray,
    mu_loss: float,
    upper: float,
    saved: np.ndarray,
    cut: np.ndarray,
    overlap: np.ndarray,
    fwd_prefix: np.ndarray,
    bwd_prefix: np.ndarray,
    rerun: np.ndarray,
    rerun_fwd_prefix: np.ndarray,
    seg_last: np.ndarray,
    ext_prefix: np.ndarray,
    first_ptr: np.ndarray,
    first_prod: np.ndarray,
    ckpt_bytes: np.ndarray,
    span_ptr: np.ndarray,
    span_at: np.ndarray,
    span_bytes: np.ndarray,
    span_last: np.ndarray,
    opt_ptr: np.ndarray,
    opt_free: np.ndarray,
    opt_copy: np.ndarray,
    trans: np.ndarray,
    limit: float,
    d2h_bw: float,
    h2d_bw: float,
    recompute: bool,
    g_row: np.ndarray,
    g_f: np.ndarray,
    g_b: np.ndarray,
    lam_f: np.ndarray,
    lam_b: np.ndarray,
    plan_out: np.ndarray,
    P_out: np.ndarray,
) -> float:  # pragma: no cover - compiled
    """The Lagrangian of the fluid link windows at prices lam_f[m, g] = x_f[m, g] / unit (row F_m with the copies
    of layers m-w..m-1 still in flight, w = widths[g]), lam_b[m, g] = x_b[m, g] / unit (row B_m, prefetches of
    layers m-w..m-1 already back) and mu_loss (the loss point). g_row, g_f, g_b receive a subgradient
    (docs/formulation.md, 'Copies beside compute'). A window with w > m does not exist: row m's windows are its
    first cols[m], and only they are read or written (in lam_f, lam_b, which this fills, and in g_f, g_b), so
    the work is the n x n triangle of windows that exist. plan_out receives the least priced plan, per layer:
    PLAN_KEEP, PLAN_START or PLAN_CONTINUE (a recompute segment's first layer or a later one) or the offload option;
    P_out (2n + 2) the prefix sums of the row prices."""
    n = len(saved)
    two_n = 2 * n
    mu = np.zeros(two_n + 1)
    for m in range(n):
        sum_f = 0.0
        sum_b = 0.0
        for g in range(cols[m]):
            lam_f[m, g] = x_f[m, g] / unit
            lam_b[m, g] = x_b[m, g] / unit
            sum_f += lam_f[m, g]
            sum_b += lam_b[m, g]
        mu[m] = sum_f
        mu[two_n - m] = sum_b
    mu[n] = mu_loss
    P = np.zeros(two_n + 2)
    for u in range(two_n + 1):
        P[u + 1] = P[u] + mu[u]
    P_out[:] = P
    cover_f = _link_cover(lam_f, widths, cols)
    cover_b = _link_cover(lam_b, widths, cols)
    # An offload: what stays from F_i through B_i; its copy in flight at F_i and back at B_i, and in every
    # window of a later row that holds layer i.
    off_best = np.full(n, np.inf)
    off_choice = np.zeros((n, 3), dtype=np.int64)
    for i in range(n):
        off_choice[i, 1] = i
        off_choice[i, 2] = i
        for o in range(opt_ptr[i], opt_ptr[i + 1]):
            c = opt_copy[o]
            v = (saved[i] - opt_free[o]) * (P[two_n - i + 1] - P[i]) + c * (mu[i] + mu[two_n - i])
            v += c * (cover_f[i] + cover_b[i])
            if v < off_best[i]:
                off_best[i] = v
                off_choice[i, 0] = o
    sums = _layer_sums(P, mu, saved, cut)
    dist, arc_kind, arc_from = _path(
        P, mu, sums, saved, off_best, h2d_bw * cover_b, overlap, rerun_fwd_prefix, rerun, seg_last, ext_prefix,
        first_ptr, first_prod, ckpt_bytes, span_ptr, span_at, span_bytes, span_last, recompute, np.zeros(0),
    )  # fmt: skip
    value = dist[n]
    _plan_out(arc_kind, arc_from, off_choice, plan_out)
    # Stalls: a second of stall costs 1 and gives bw bytes of link time to every window holding its stage; where
    # that is worth more than 1, the cap on any plan worth proving (total stall below `upper`) applies.
    sf = -1
    sb = -1
    worst = 0.0
    for layer in range(n):
        if 1.0 - d2h_bw * cover_f[layer] < worst:
            worst, sf, sb = 1.0 - d2h_bw * cover_f[layer], layer, -1
        if 1.0 - h2d_bw * cover_b[layer] < worst:
            worst, sf, sb = 1.0 - h2d_bw * cover_b[layer], -1, layer
    value += upper * worst
    for u in range(two_n + 1):
        value += mu[u] * (trans[u] - limit)
    copies = np.zeros(n)
    reruns = np.zeros(n)
    _plan_rows(
        arc_kind, arc_from, off_choice, saved, cut, overlap, rerun_fwd_prefix, rerun, ext_prefix, first_ptr, first_prod,
        ckpt_bytes, span_ptr, span_at, span_bytes, span_last, opt_free, opt_copy, trans, limit, g_row, copies, reruns,
    )  # fmt: skip
    copy_prefix = np.zeros(n + 1)
    rerun_prefix = np.zeros(n + 1)
    for i in range(n):
        copy_prefix[i + 1] = copy_prefix[i] + copies[i]
        rerun_prefix[i + 1] = rerun_prefix[i] + reruns[i]
    for m in range(n):
        for g in range(cols[m]):
            w = widths[g]
            a = m - w
            tf = fwd_prefix[m] - fwd_prefix[a + 1] if w >= 1 else 0.0  # compute of F_{a+1}..F_{m-1}
            tb = bwd_prefix[m] - bwd_prefix[a + 1] if w >= 1 else 0.0  # backwards of B_{m-1}..B_{a+1}
            value -= d2h_bw * lam_f[m, g] * tf + h2d_bw * lam_b[m, g] * tb
            arrived = copy_prefix[m] - copy_prefix[a]
            stall_f = upper if a <= sf <= m - 1 else 0.0
            stall_b = upper if a <= sb <= m - 1 else 0.0
            g_f[m, g] = g_row[m] + arrived - d2h_bw * (tf + stall_f)
            g_b[m, g] = g_row[two_n - m] + arrived - h2d_bw * (tb + rerun_prefix[m] - rerun_prefix[a] + stall_b)
    return value


@njit(cache=True)
def _rule_gradient(
    plan: np.ndarray,
    P: np.ndarray,
    first_ptr: np.ndarray,
    first_prod: np.ndarray,
    ckpt_bytes: np.ndarray,
    span_ptr: np.ndarray,
    span_at: np.ndarray,
    span_last: np.ndarray,
    span_prod: np.ndarray,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """out[j], for each producer j read by several layers (LagrangeArrays.shared), = the derivative of the priced
    plan's cost in j's span-rule weight (LinkLagrangian's `weights`): its checkpoint bytes times the row prices the
    span rule charges it less those the first reader's rule charges it, summed over the plan's segments (`plan`:
    `_link_lagrangian`'s plan_out; `P`: its P_out). Other entries are not read."""
    n = len(plan)
    two_n = 2 * n
    out[:] = 0.0
    k = 0
    while k < n:
        if plan[k] != PLAN_START:
            k += 1
            continue
        b = k
        while b + 1 < n and plan[b + 1] == PLAN_CONTINUE:
            b += 1
        whole = P[two_n - k] - P[k + 1]  # rows k+1 .. 2n-k-1
        for c in range(k, b + 1):
            for e in range(first_ptr[c], first_ptr[c + 1]):
                j = first_prod[e]
                if j < k:
                    out[j] -= ckpt_bytes[j] * whole
        for e in range(span_ptr[k], span_ptr[k + 1]):
            if span_at[e] <= b:
                j = span_prod[e]
                if span_last[e] <= b or b + 1 >= n:
                    out[j] += ckpt_bytes[j] * whole
                else:  # rows k+1 .. b+1 and 2n-b-1 .. 2n-k-1
                    out[j] += ckpt_bytes[j] * (P[b + 2] - P[k + 1] + P[two_n - k] - P[two_n - b - 1])
        k = b + 1


def link_lagrangian_bound(
    arrays: LagrangeArrays,
    upper_s: float,
    deadline: float,
    target_s: float | None = None,
    max_iterations: int = 100_000,
) -> LagrangeResult:
    """The Lagrangian of the fluid link windows (copies beside compute), its prices raised by projected Adam
    steps (`LinkLagrangian`) until `deadline`, `target_s`, `max_iterations` or convergence."""
    return LinkLagrangian(arrays, upper_s).run(deadline, target_s, max_iterations)


class LinkLagrangian:
    """The Lagrangian of the fluid link windows (copies beside compute), its prices raised by projected Adam
    steps: plain subgradient steps oscillate here (the first steps make offload free, the next make it dear).
    Every value is a bound; the best is kept. `run` stops at its deadline and a later `run` goes on from the same
    prices, moments and rate (`solve()` resumes it where the local search has stopped gaining); it ends for good
    after a plateau (_LINK_PATIENCE steps in a row that raise the best value by less than 1e-4 of it) at the
    smallest rate, each plateau above it halving the rate, or at its target.

    `upper_s`: a known plan's overhead (it caps the stalls worth pricing, so it must be one); `lower_s`: a bound
    already proved (0 where none), which with the Lagrangian's own best sizes its steps (`scale`)."""

    def __init__(self, arrays: LagrangeArrays, upper_s: float, lower_s: float = 0.0) -> None:
        a = arrays
        assert not a.serial, "serial copies: lagrangian_bound prices them exactly"
        n = len(a.saved)
        self.arrays = a
        self.upper_s = upper_s
        self.lower_s = lower_s
        self.widths = link_widths(n)
        shape = (n, len(self.widths))
        # Window w of row m needs w <= m; the lengths ascend, so row m's windows are its first cols[m] columns.
        self.cols = np.searchsorted(self.widths, np.arange(n), side="right").astype(np.int64)
        # Adam on the prices in units of seconds per `limit` bytes, with steps of `rate` x `scale()`.
        self.unit = float(max(a.limit, 1))
        self.rate = _LINK_RATE
        """The steps' fraction of `scale()`: _LINK_RATE, halved at each plateau down to _LINK_RATE_MIN."""
        self.x = [np.zeros(shape), np.zeros(shape), np.zeros((1, 1))]
        self.first = [np.zeros(shape), np.zeros(shape), np.zeros((1, 1))]
        self.second = [np.zeros(shape), np.zeros(shape), np.zeros((1, 1))]
        self.loss_grad, self.loss_cols = np.zeros((1, 1)), np.ones(1, dtype=np.int64)
        self.g_row, self.g_f, self.g_b = np.zeros(2 * n + 1), np.zeros(shape), np.zeros(shape)
        self.lam_f, self.lam_b = np.zeros(shape), np.zeros(shape)  # the prices in bytes units, filled by each step
        self.plan = np.zeros(n, dtype=np.int64)
        """The last step's least priced plan (`_link_lagrangian`'s plan_out)."""
        self.P = np.zeros(2 * n + 2)
        # Each producer read by several layers: the share of its checkpoint bytes the span rule charges (the rest
        # by the first reader's rule). Each rule alone bounds the simulator's rows, so any weights do; they are
        # raised with the prices, by projected Adam steps of _WEIGHT_RATE on the plan's derivative in them
        # (_rule_gradient; docs/formulation.md, 'Checkpoint inputs read by several layers').
        self.weights = np.full(len(a.shared), _SPAN_SHARE)
        self._w_first, self._w_second = np.zeros(len(a.shared)), np.zeros(len(a.shared))
        self._w_grad = np.zeros(n)
        self.head, self.span = rule_charges(a, self.weights)
        """The checkpoint bytes each rule charges at these weights (LagrangeArrays.head_bytes / span_bytes)."""
        # Each layer's count of steps recomputed and offloaded, summed per block of _block_steps steps (the last
        # block open), so that `shares` can average the later half of the steps whatever their number. Past
        # _MAX_PLAN_BLOCKS blocks, neighbours merge and blocks grow twice as long: 2 x n floats a block, bounded.
        self._plan_blocks: list[tuple[np.ndarray, np.ndarray, int]] = []
        self._open_block = (np.zeros(n), np.zeros(n))
        self._open_steps = 0
        self._block_steps = _PLAN_BLOCK
        self.best = 0.0
        """The best value so far: a lower bound on every plan's overhead."""
        self.iterations = 0
        self.wall_s = 0.0
        self.done = False
        """It has converged or reached its target: a later `run` returns at once."""
        self._last_gain = 0
        self._gains: list[tuple[float, float]] = [(0.0, 0.0)]  # (seconds run, best value) after each rise

    def scale(self) -> float:
        """The overhead that sizes the steps: an estimate of the optimum, which the prices' magnitude follows. The
        known plan's overhead, but at most _LINK_SCALE_OVER_LOWER x the best bound known (the Lagrangian's own
        or `lower_s`) once one is above 0: a plan found early can cost several times the optimum, and steps sized
        by it make the prices circle far from their best (docs/formulation.md, 'The steps' scale')."""
        low = max(self.lower_s, self.best)
        return min(self.upper_s, _LINK_SCALE_OVER_LOWER * low) if low > 0.0 else self.upper_s

    def _set_weights(self) -> None:
        self.head, self.span = rule_charges(self.arrays, self.weights)

    def _raise_weights(self, it: int) -> None:
        """One projected Adam step of the weights up the Lagrangian's derivative in them (_rule_gradient), from the
        prices' step _WEIGHT_FROM on (`it`: the prices' step)."""
        a = self.arrays
        if not len(a.shared) or it <= _WEIGHT_FROM:
            return
        it -= _WEIGHT_FROM  # the weights' own steps, for Adam's bias corrections
        _rule_gradient(
            self.plan, self.P, a.first_ptr, a.first_prod, a.ckpt_bytes, a.span_ptr, a.span_at, a.span_last,
            a.span_prod, self._w_grad,
        )  # fmt: skip
        rate = _WEIGHT_RATE * self.rate / _LINK_RATE  # halved with the prices' rate
        self.weights = _adam_ascent(self.weights, self._w_first, self._w_second, self._w_grad[a.shared], it, rate)
        self._set_weights()

    def _count_plan(self) -> None:
        rec, off = self._open_block
        rec += self.plan <= PLAN_START
        off += self.plan >= 0
        self._open_steps += 1
        if self._open_steps == self._block_steps:
            self._plan_blocks.append((rec, off, self._open_steps))
            self._open_block = (np.zeros_like(rec), np.zeros_like(off))
            self._open_steps = 0
            if len(self._plan_blocks) == _MAX_PLAN_BLOCKS:
                pairs = zip(self._plan_blocks[::2], self._plan_blocks[1::2], strict=True)
                self._plan_blocks = [(r1 + r2, o1 + o2, s1 + s2) for (r1, o1, s1), (r2, o2, s2) in pairs]
                self._block_steps *= 2

    def shares(self) -> LinkShares | None:
        """Each layer's share of the later half of the steps so far (whole blocks, the latest last) in which the
        least priced plan recomputed or offloaded it (optimizer/link_plan.py); None before any step. The early steps
        are left out: the prices start at 0, where every plan is free of the windows."""
        blocks = [*self._plan_blocks, (*self._open_block, self._open_steps)]
        total = sum(steps for _, _, steps in blocks)
        if total == 0:
            return None
        rec, off = np.zeros_like(self._open_block[0]), np.zeros_like(self._open_block[1])
        counted = 0
        for r, o, steps in reversed(blocks):
            if counted >= total / 2:
                break
            rec += r
            off += o
            counted += steps
        return LinkShares(recompute=rec / counted, offload=off / counted, steps=counted, since=total - counted)

    def windows(self) -> list[LinkShares]:
        """The shares the link plan rounds, in the order it tries them: the later half (`shares`), then each whole
        block of _PLAN_BLOCK steps alone but the first (whose prices start at 0), spread over the ascent (the
        middle block, then the quarters, ...: a scan cut by its deadline has seen all of it coarsely), those whose
        counts repeat an earlier window's left out. The prices circle their best, and a plan rounded from one
        stretch of them can be far better than the average's: DenseNet-121 at 25% (30 s), 0.0489 s from the fifth
        of 15 blocks against 0.0798 s from the later half; the 200-layer synthetic DAG at 20%, 0.0275 against
        0.0305 s (docs/formulation.md, 'The link plan')."""
        half = self.shares()
        if half is None:
            return []
        out = [half]
        seen = {(half.recompute.tobytes(), half.offload.tobytes())}
        begins = np.cumsum([0, *(steps for _, _, steps in self._plan_blocks)])
        for k in _spread(1, len(self._plan_blocks)):
            rec, off, steps = self._plan_blocks[k]
            window = LinkShares(recompute=rec / steps, offload=off / steps, steps=steps, since=int(begins[k]))
            key = (window.recompute.tobytes(), window.offload.tobytes())
            if key not in seen:
                seen.add(key)
                out.append(window)
        return out

    def recent_rate(self, span_s: float) -> float:
        """How fast the bound rose over its last `span_s` seconds of running (seconds of bound per second)."""
        span = min(span_s, self.wall_s)
        if span <= 0.0:
            return 0.0
        before = max(v for t, v in self._gains if t <= self.wall_s - span)
        return (self.best - before) / span

    def run(self, deadline: float, target_s: float | None = None, max_iterations: int = 100_000) -> LagrangeResult:
        """Steps until `deadline`, `target_s` (the bound reached it), `max_iterations` steps in all or a plateau at
        the smallest rate; the result counts every step and second of every run so far."""
        a, t0 = self.arrays, time.perf_counter()
        n = len(a.saved)
        x, first, second = self.x, self.first, self.second
        stopped = "converged" if self.done else "iterations"
        while not self.done and self.iterations < max_iterations:
            if time.perf_counter() >= deadline:
                stopped = "deadline"
                break
            self.iterations += 1
            it = self.iterations
            value = float(
                _link_lagrangian(
                    x[0], x[1], self.unit, self.widths, self.cols, float(x[2][0, 0]) / self.unit, self.upper_s,
                    a.saved, a.cut, a.overlap, a.fwd_prefix, a.bwd_prefix, a.rerun, a.rerun_fwd_prefix, a.seg_last,
                    a.ext_prefix,
                    a.first_ptr, a.first_prod, self.head, a.span_ptr, a.span_at, self.span, a.span_last,
                    a.opt_ptr, a.opt_free, a.opt_copy, a.trans, float(a.limit), a.d2h_bw, a.h2d_bw, a.recompute,
                    self.g_row, self.g_f, self.g_b, self.lam_f, self.lam_b, self.plan, self.P,
                )
            )  # fmt: skip
            self._count_plan()
            if value > self.best * (1 + 1e-4) + 1e-15:
                self._last_gain = it
            if value > self.best:
                self._gains.append((self.wall_s + time.perf_counter() - t0, value))
            self.best = max(self.best, value)
            if target_s is not None and self.best >= target_s:
                stopped, self.done = "target", True
                break
            if it - self._last_gain >= _LINK_PATIENCE:
                # A plateau: Adam's steps at this rate circle the best value. Halve them (down to _LINK_RATE_MIN):
                # the large first rate climbs fast on long traces, the smaller ones close in where it only oscillates.
                if self.rate / 2 < _LINK_RATE_MIN:
                    stopped, self.done = "converged", True
                    break
                self.rate /= 2
                self._last_gain = it
            # Compiled: on DenseNet-121 (428 x 428 prices a row family) numpy's passes over these arrays took more
            # time than the Lagrangian itself (1.14 s against 0.85 s of 2 s).
            self.loss_grad[0, 0] = self.g_row[n]
            step = self.rate * self.scale()
            _adam_step(x[0], first[0], second[0], self.g_f, self.cols, self.unit, step, it)
            _adam_step(x[1], first[1], second[1], self.g_b, self.cols, self.unit, step, it)
            _adam_step(x[2], first[2], second[2], self.loss_grad, self.loss_cols, self.unit, step, it)
            self._raise_weights(it)
        self.wall_s += time.perf_counter() - t0
        return LagrangeResult(
            bound_s=max(0.0, self.best),
            iterations=self.iterations,
            wall_s=self.wall_s,
            stopped_by=stopped,
            prices=np.zeros(0),
        )


@njit(cache=True, fastmath=True)
def _adam_step(
    x: np.ndarray,
    first: np.ndarray,
    second: np.ndarray,
    grad: np.ndarray,
    cols: np.ndarray,
    unit: float,
    step: float,
    it: int,
) -> None:  # pragma: no cover - compiled
    """One projected Adam step on the prices `x` (in place, with its moments `first` and `second`) along the
    subgradient `grad` / `unit`, at iteration `it` (from 1), kept >= 0. Row r's prices past its first cols[r] stay
    0 (windows longer than the row: their gradient is always 0, so Adam would not move them)."""
    c1 = 1.0 / (1 - _ADAM_B1**it)
    c2 = 1.0 / (1 - _ADAM_B2**it)
    scale = 1.0 / unit
    for r in range(x.shape[0]):
        for c in range(cols[r]):
            g = grad[r, c] * scale
            m = _ADAM_B1 * first[r, c] + (1 - _ADAM_B1) * g
            v = _ADAM_B2 * second[r, c] + (1 - _ADAM_B2) * g * g
            first[r, c] = m
            second[r, c] = v
            x[r, c] = max(0.0, x[r, c] + step * (m * c1) / (np.sqrt(v * c2) + 1e-12))


def link_widths(n: int) -> np.ndarray:
    """The window lengths priced at each row: every one on traces of up to LINK_ALL_WINDOWS layers; beyond, lengths
    growing by about a fifth (any subset of windows is valid), so that a step costs O(n log n) besides the path. A
    backlog can build over the whole forward, so the lengths run up to the trace's."""
    if n <= LINK_ALL_WINDOWS:
        return np.arange(n, dtype=np.int64)
    out = [0, 1]
    while out[-1] < n - 1:
        out.append(min(n - 1, max(out[-1] + 1, int(out[-1] * 1.2))))
    return np.array(out, dtype=np.int64)


_PLAN_BLOCK = 32
"""Steps per block of the plan counts (`LinkLagrangian.shares`), until there are _MAX_PLAN_BLOCKS of them."""
_MAX_PLAN_BLOCKS = 256
"""Blocks of plan counts kept (an even number): at this many, neighbours merge into blocks twice as long. An ascent
rarely gets there (DenseNet-121 at 25%, 30 s: 15 blocks); a long one on a long trace would keep 2 x n floats for
every 32 steps (about 50 MB at 100,000 steps of a 1,000-layer trace)."""


def _spread(lo: int, hi: int) -> list[int]:
    """lo, ..., hi - 1 ordered so that every prefix is spread over the range: the middle, then the middles of the
    halves, of the quarters, ... (breadth-first bisection)."""
    out: list[int] = []
    spans = [(lo, hi)]
    while spans:
        nxt: list[tuple[int, int]] = []
        for a, b in spans:
            if a >= b:
                continue
            m = (a + b) // 2
            out.append(m)
            nxt += [(a, m), (m + 1, b)]
        spans = nxt
    return out


LINK_ALL_WINDOWS = 500
"""Up to this many layers every window length is priced (n x n prices)."""
_LINK_RATE = 5e-3
"""Adam's first step on the link prices, as a fraction of `LinkLagrangian.scale()` (in seconds per `limit` bytes). 1e-3
until the ratio plan lowered the best known overheads of long traces (and so the steps): docs/formulation.md, 'The
prices' under 'Copies beside compute'."""
_LINK_RATE_MIN = 1e-3
"""The smallest rate: after a plateau at it the search stops (each plateau above it halves the rate)."""
_LINK_SCALE_OVER_LOWER = 1.3
"""The steps' scale is at most this many times the best bound known (`LinkLagrangian.scale`). Measured (one core,
2026-12-01, 6 runs from upper bounds 0.3% apart, the link plan taken every 100 steps): DenseNet-121 at 25% from the
beam's plan (0.107 s; stage bound 0.0294 s, the Lagrangian's converged bound 0.0429 s), after 300 / 1,000 steps the
bound 0.04159 / 0.04262 s and the best link plan 0.110 / 0.0716 s when scaled by the plan, 0.04255 / 0.04269 s and
0.068 / 0.058 s at 1.3, 0.04248 / 0.04263 s and 0.076 / 0.060 s at 1.6. Fixed scales of 0.04-0.065 s reach a link
plan of 0.056-0.062 s within 300 steps, 0.075-0.115 s do not within 700. The 1,000-layer synthetic chain and DAG
at 20%, whose plans are within 1.6x their bounds, move by under 0.3% either way."""
_LINK_PATIENCE = 300
"""Steps without a gain of 1e-4 of the best value before the link search halves its rate, or stops at the smallest."""
_ADAM_B1, _ADAM_B2 = 0.9, 0.999
_WEIGHT_RATE = 0.01
"""The span-rule weights' Adam step (LinkLagrangian.weights) at the prices' first rate, halved with it. Measured
(one core, 2026-12-01, from step _WEIGHT_FROM): 0.003 / 0.01 / 0.03 converge to the same bounds within 0.3%
(the synthetic 1,000-layer DAG at 20%: 0.12326 s each; DenseNet-121 at 25%: 0.04288 / 0.04288 / 0.04277 s), and
0.01 is at or near the best after 1 s on each of five rows."""
_ROWS_WEIGHT_RATE = 0.1
"""The same weights' Adam step in the memory rows' ascent (`lagrangian_bound` with the mix of rules), times its step
factor. From the first reader's rule's best prices on the synthetic 1,000-layer DAG at 20% (keep / recompute, one
core, 2026-12-01), after 4 s: 1.0195 / 1.0688 / 1.0682 s at 0.01 / 0.03 / 0.1, after 1.5 s (its share of a 10 s
solve) 1.0421 / 1.0667 s at 0.03 / 0.1, against 1.0071 s in 4 s with the weights held at half (the answer: 1.12
s)."""
_WEIGHT_FROM = 100
"""The weights stay at half for the prices' first steps: near 0 the prices say little about which rule binds,
and weights moved by them cost the bound's climb more than they add (DenseNet-121 at 25% from a poor incumbent,
0.107 s, after 1 s: 0.04070 s moved from the first step, 0.04176 s held, 0.04238 s from step 100; the 1,000-layer
DAG after 1 s: 0.1119 / 0.1077 / 0.1154 s)."""
