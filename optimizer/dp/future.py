"""A lower bound on the cost still to come from a boundary, as a function of the bytes a plan retains
(docs/formulation.md, 'Future-cost bound').

For a label at boundary k retaining r bytes, every later row m >= k must fit: the layers k..m-1 have to free

    E_m(r) = r + sum(s_k..s_{m-1}) + s_m + transient_m - limit

bytes by row m, or the row fails. Freed bytes come from offloads (free while the link keeps up with the
compute between k and m, then one second of stall per `bandwidth` bytes) or from recomputation (layer j frees
s_j for f_j seconds). Dropping checkpoint bytes, segment structure, rematerialisation at B rows, the label's
own backlogs and which bytes a layer can actually offload leaves a fractional knapsack per row, whose optimum
is a lower bound on the overhead any completion of the label pays. The maximum over rows is the bound.

The table holds it on a grid of retained bytes; it is nondecreasing in r, so looking up the grid point at or
below a label's retained bytes stays a lower bound. The sweep prunes a label when cost + bound reaches its
threshold (A*-style), and the bound of the root label is a lower bound on the whole problem.
"""

from __future__ import annotations

import numpy as np
from numba import njit

GRID_POINTS = 256
"""Grid points on the retained-bytes axis (0 .. limit)."""


@njit(cache=True)
def _insert(
    rates: np.ndarray, sizes: np.ndarray, count: int, rate: float, size: float
) -> int:  # pragma: no cover - compiled
    """Insert (rate, size) into the first `count` entries, kept sorted by rate; returns the new count."""
    pos = count
    while pos > 0 and rates[pos - 1] > rate:
        rates[pos] = rates[pos - 1]
        sizes[pos] = sizes[pos - 1]
        pos -= 1
    rates[pos] = rate
    sizes[pos] = size
    return count + 1


@njit(cache=True)
def _span(out: np.ndarray, base: float, step: float, pool: float) -> tuple[int, int]:  # pragma: no cover
    """Grid points [lo, hi) of a row whose need g * step + base lies in (0, pool]; the points from hi on need
    more than the layers can free, so no completion exists there (out = inf)."""
    g_count = len(out)
    lo = 0
    while lo < g_count and lo * step + base <= 0.0:
        lo += 1
    hi = lo
    while hi < g_count and hi * step + base <= pool:
        hi += 1
    out[hi:] = np.inf
    return lo, hi


@njit(cache=True)
def _additive_row(
    out: np.ndarray,
    base: float,
    step: float,
    pool: float,
    free: float,
    off_rate: float,
    rates: np.ndarray,
    sizes: np.ndarray,
    count: int,
) -> None:  # pragma: no cover - compiled
    """out[g] = max(out[g], least cost of freeing E = g * step + base bytes) where `free` bytes cost nothing,
    recompute entry i frees sizes[i] bytes at rates[i] s/byte, and further offload bytes cost off_rate s/byte,
    all from one pool of `pool` bytes (E > pool: no completion exists)."""
    seg = 0
    used = min(free, pool)  # bytes taken so far, cheapest first
    spent = 0.0
    seg_left = sizes[0] if count > 0 else 0.0
    lo, hi = _span(out, base, step, pool)
    for g in range(lo, hi):
        need = g * step + base
        while used < need:
            if seg < count and rates[seg] < off_rate:
                take = min(seg_left, need - used)
                spent += take * rates[seg]
                used += take
                seg_left -= take
                if seg_left <= 0.0:
                    seg += 1
                    seg_left = sizes[seg] if seg < count else 0.0
            else:
                spent += (need - used) * off_rate
                used = need
        out[g] = max(out[g], spent)


@njit(cache=True)
def _overlapped_row(
    out: np.ndarray,
    base: float,
    step: float,
    pool: float,
    free: float,
    bandwidth: float,
    rates: np.ndarray,
    sizes: np.ndarray,
    count: int,
) -> None:  # pragma: no cover - compiled
    """As _additive_row, for a row where paid time (stall or recomputation) also moves offload bytes: within
    t seconds, `free + bandwidth * t` bytes can be offloaded and the recompute entries costing up to t in
    total freed. out[g] = max(out[g], least t freeing E = g * step + base)."""
    seg = 0
    seg_left = sizes[0] if count > 0 else 0.0
    t = 0.0
    moved = free  # bytes freed by paid time t
    lo, hi = _span(out, base, step, pool)
    for g in range(lo, hi):
        need = g * step + base
        while moved < need:
            if seg < count:
                rate = rates[seg]
                if rate <= 0.0:  # recomputing a layer with no forward time frees its bytes for nothing
                    moved += seg_left
                    gain_time = 0.0
                else:
                    # Inside recompute entry `seg`: bytes per paid second = 1 / rate + bandwidth.
                    speed = bandwidth + 1.0 / rate
                    gain_time = seg_left * rate
                    if moved + speed * gain_time >= need:
                        dt = (need - moved) / speed
                        t += dt
                        seg_left -= dt / rate
                        moved = need
                        break
                    moved += speed * gain_time
                t += gain_time
                seg += 1
                seg_left = sizes[seg] if seg < count else 0.0
            else:
                t += (need - moved) / bandwidth
                moved = need
        out[g] = max(out[g], t)


@njit(cache=True)
def _release(
    rates: np.ndarray,
    sizes: np.ndarray,
    count: int,
    pool: float,
    k: int,
    u: int,
    released: np.ndarray,
    ends: np.ndarray,
    saved: np.ndarray,
    hold: np.ndarray,
    rerun: np.ndarray,
) -> tuple[int, float]:  # pragma: no cover - compiled
    """Into the forward rows' knapsack (first `count` entries, `pool` bytes), the held bytes of the layers >= k whose
    hold ends at F_u (`released[ends[u]:ends[u + 1]]`): free from row u + 1 on. Returns the new count and pool."""
    for q in range(ends[u], ends[u + 1]):
        i = released[q]
        if i >= k and saved[i] > 0:
            held = min(hold[i], saved[i])
            count = _insert(rates, sizes, count, rerun[i] / saved[i], float(held))
            pool += held
    return count, pool


_NO_POOL = 1e300
"""The pool of the pending tables' rows: no grid point is out of reach (pending bytes leave by the link)."""

TABLES = 6
"""future_table's tables: [FUTURE] the bound by retained bytes, [PENDING_F] / [PENDING_B] its forward / backward
rows by retained plus pending bytes (docs/formulation.md, 'Pending copies in the future-cost bound'), and the loss
point's row apart, [LOSS] by retained bytes and [LOSS_PENDING] by retained plus forward pending bytes (the bound is
the largest of the rows: the caller takes the maximum, and the beams rank by the tables without it); [REACH] the
forward rows and the loss point's again with the link's reach and the code's holds (`hold`), which the proving
sweeps' bound takes too and the beams' ranking does not."""
FUTURE, PENDING_F, PENDING_B, LOSS, LOSS_PENDING, REACH = 0, 1, 2, 3, 4, 5


@njit(cache=True)
def future_table(
    saved: np.ndarray,
    fwd: np.ndarray,
    rerun: np.ndarray,
    bwd: np.ndarray,
    trans_f: np.ndarray,
    trans_b: np.ndarray,
    limit: int,
    serial: bool,
    d2h_bw: float,
    h2d_bw: float,
    step: float,
    grid: int,
    window: int,
    stride: int,
    boundaries: np.ndarray,
    pending: bool,
    hold: np.ndarray,
    hold_until: np.ndarray,
    loss_transient: int = 0,
) -> np.ndarray:  # pragma: no cover - compiled
    """tables[FUTURE, k, g]: a lower bound on the cost to come for a label at boundary k retaining g * step bytes.
    Rows m in [k, k + window] are all considered, farther ones every `stride` layers and the last one (any
    subset of rows gives a valid bound; the subset keeps the table's cost near n * (window + n / stride)).
    Only the `boundaries` listed are computed; the others stay 0 (always a valid bound).
    Recomputing layer j frees s_j for at least rerun[j] seconds (DpProblem.rerun_least: the least it costs as a
    segment's last layer or inside one), so rerun[j] / s_j is the rate that keeps the bound valid.

    `pending` (concurrent copies only): also tables[PENDING_F, k, g] and tables[PENDING_B, k, g], the forward rows
    alone and the backward rows alone with no row out of reach. A label whose copies still hold p_f bytes in the
    forward (p_b in reverse time) pays at least tables[PENDING_F, k, g(r + p_f)] and tables[PENDING_B, k,
    g(r + p_b)]: those bytes hold memory until the link has moved them, first in its queue (pending_bytes).

    `loss_transient`: the bytes only the loss point holds (simulate.loss_point_transient). Its row, read from
    every boundary, goes to tables[LOSS] (and tables[LOSS_PENDING] with `pending`): what layers k..n-1 save is held
    there unless recomputed or offloaded by a copy that ended during the forwards of k..n-1 (or a forward stall),
    on top of what the label retains, so they must free r + sum(s_k..s_{n-1}) + loss_transient - limit bytes; an
    F row's pricing. Where the loss's own bytes are large (a language model's logits), it is the row that decides,
    and no other row sees it.

    The forward rows (F_m and the loss point's, not the pending ones) also see when bytes exist and what the
    model's code holds (docs/formulation.md, 'Future-cost bound'): layer j's bytes reach the link at the end of
    F_j, so by F_m the link drains at most min over i of (the bytes of layers k..i-1 + bandwidth x the forwards of
    layers i+1..m-1); and `hold[j]` bytes of layer j (the output it saved itself, which the model's code holds once
    the layer lets go of it: simulate.skip_holds) stay on the device whatever j does through F_{hold_until[j]}, so
    those rows cannot free them."""
    n = len(saved)
    tables = np.zeros((TABLES, n + 1, grid + 1))
    table = tables[FUTURE]
    rates = np.empty(n + 1)
    sizes = np.empty(n + 1)
    # The forward rows' knapsack: layer j's entry without its held bytes until row hold_until[j] has passed (the
    # same entries as the other rows' where the code holds nothing).
    holds = False
    for j in range(n):
        holds |= hold_until[j] >= 0 and hold[j] > 0
    rates_f = np.empty(2 * n + 2) if holds else rates
    sizes_f = np.empty(2 * n + 2) if holds else sizes
    serial_rate = 1.0 / d2h_bw + 1.0 / h2d_bw
    # Layers by the last forward row that holds their bytes (hold_until), as CSR: `released[ends[u]:ends[u + 1]]`.
    ends = np.zeros(n + 2, np.int64)
    for j in range(n):
        if hold_until[j] >= 0 and hold[j] > 0:
            ends[min(hold_until[j], n) + 1] += 1
    for u in range(n + 1):
        ends[u + 1] += ends[u]
    released = np.empty(ends[n + 1], np.int64)
    filled = ends[:-1].copy()
    for j in range(n):
        if hold_until[j] >= 0 and hold[j] > 0:
            u = min(hold_until[j], n)
            released[filled[u]] = j
            filled[u] += 1
    for k in boundaries:
        count = 0
        count_f = 0
        pool = 0.0
        pool_f = 0.0
        sum_f = 0.0
        sum_b = 0.0
        # The link's reach by F_m: bytes of layers k..i-1 (`reach_bytes`, for i = m) or bandwidth x the forwards of
        # i+1..m-1 more, least over i: d2h_bw * after_k + reach_min, with after_k the forwards of k+1..m-1.
        after_k = 0.0
        reach_min = 0.0  # min over i in [k, m-1] of (bytes of k..i-1 - d2h_bw x forwards of k+1..i)
        reach_bytes = 0.0
        row = table[k]
        soft_f = tables[PENDING_F, k]
        soft_b = tables[PENDING_B, k]
        for m in range(k, n):
            if m > k:
                j = m - 1
                if saved[j] > 0:
                    count = _insert(rates, sizes, count, rerun[j] / saved[j], float(saved[j]))
                    pool += saved[j]
                    held = min(hold[j], saved[j]) if hold_until[j] >= m else 0
                    if holds and saved[j] > held:
                        count_f = _insert(rates_f, sizes_f, count_f, rerun[j] / saved[j], float(saved[j] - held))
                        pool_f += saved[j] - held
                sum_f += fwd[j]
                sum_b += bwd[j]
                if j > k:
                    after_k += fwd[j]
                    reach_min = min(reach_min, reach_bytes - d2h_bw * after_k)  # i = j: layers k..j-1 drain
                reach_bytes += saved[j]
                if holds:
                    count_f, pool_f = _release(
                        rates_f, sizes_f, count_f, pool_f, k, m - 1, released, ends, saved, hold, rerun
                    )
                else:
                    count_f, pool_f = count, pool
            if m - k > window and (m - k) % stride != 0 and m != n - 1:
                continue
            base_f = pool + saved[m] + trans_f[m] - limit
            base_b = pool + saved[m] + trans_b[m] - limit
            if serial:
                # Copies run on the compute thread: every offloaded byte costs both transfers, no overlap.
                _additive_row(row, max(base_f, base_b), step, pool, 0.0, serial_rate, rates, sizes, count)
                continue
            # F_m: offloads of layers k..m-1 drain during the forwards after their own, as far as the link reaches;
            # a forward stall is pure overhead. The bytes the code holds are left out of the pool.
            _additive_row(row, base_f, step, pool, d2h_bw * sum_f, 1.0 / d2h_bw, rates, sizes, count)
            reach = min(reach_bytes, d2h_bw * after_k + reach_min)
            _additive_row(tables[REACH, k], base_f, step, pool_f, reach, 1.0 / d2h_bw, rates_f, sizes_f, count_f)
            # B_m, read in reverse time: prefetches drain during the backwards of k..m-1 and during any paid
            # time (stalls and recomputations), so the paid time t bounds both at once.
            _overlapped_row(row, base_b, step, pool, h2d_bw * sum_b, h2d_bw, rates, sizes, count)
            if pending:
                _additive_row(soft_f, base_f, step, _NO_POOL, d2h_bw * sum_f, 1.0 / d2h_bw, rates, sizes, count)
                _overlapped_row(soft_b, base_b, step, _NO_POOL, h2d_bw * sum_b, h2d_bw, rates, sizes, count)
        # The loss point: every layer k..n-1 may free its bytes (the last one too, by recomputation: counting its
        # bytes as offloadable as well only loosens the row), the copies draining through F_{n-1}.
        j = n - 1
        if saved[j] > 0:
            count = _insert(rates, sizes, count, rerun[j] / saved[j], float(saved[j]))
            pool += saved[j]
            held = min(hold[j], saved[j]) if hold_until[j] >= n else 0
            if holds and saved[j] > held:
                count_f = _insert(rates_f, sizes_f, count_f, rerun[j] / saved[j], float(saved[j] - held))
                pool_f += saved[j] - held
        sum_f += fwd[j]
        if j > k:
            after_k += fwd[j]
            reach_min = min(reach_min, reach_bytes - d2h_bw * after_k)
        reach_bytes += saved[j]
        if holds:
            count_f, pool_f = _release(rates_f, sizes_f, count_f, pool_f, k, n - 1, released, ends, saved, hold, rerun)
        else:
            count_f, pool_f = count, pool
        base_loss = pool + loss_transient - limit
        if serial:
            _additive_row(tables[LOSS, k], base_loss, step, pool, 0.0, serial_rate, rates, sizes, count)
        else:
            free = d2h_bw * sum_f
            _additive_row(tables[LOSS, k], base_loss, step, pool, free, 1.0 / d2h_bw, rates, sizes, count)
            # As F rows: the link's reach through F_{n-1}, and the bytes the code holds across the loss point.
            reach = min(reach_bytes, d2h_bw * after_k + reach_min)
            _additive_row(tables[REACH, k], base_loss, step, pool_f, reach, 1.0 / d2h_bw, rates_f, sizes_f, count_f)
            if pending:
                _additive_row(
                    tables[LOSS_PENDING, k], base_loss, step, _NO_POOL, free, 1.0 / d2h_bw, rates, sizes, count
                )
    return tables


@njit(cache=True)
def bound_at(
    future: np.ndarray,
    pending: np.ndarray,
    b: int,
    retained: float,
    d_pending: float,
    h_pending: float,
    step: float,
) -> float:  # pragma: no cover - compiled
    """The future-cost bound of a label at boundary b retaining `retained` bytes whose copies still hold
    `d_pending` bytes on the forward clock and `h_pending` on the reverse one: the table by retained bytes
    (tables[FUTURE]), and its forward / backward rows with the pending bytes held too (`pending`:
    tables[PENDING_F:])."""
    g_last = future.shape[1] - 1
    out = future[b, min(int(retained / step), g_last)]
    out = max(out, pending[0, b, min(int((retained + d_pending) / step), g_last)])
    return max(out, pending[1, b, min(int((retained + h_pending) / step), g_last)])
