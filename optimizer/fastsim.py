"""The simulator's verdict on one plan, compiled: what the local search asks thousands of times a second.

`simulate(trace, default_timing(trace, decisions, budget), budget)` in pure Python costs ~16 ms on a 1,000-layer
trace, so a 45 s local search tried about 2,800 one-layer changes: less than half of one pass over the layers.
`FastSim` computes the same two numbers, overhead seconds and bytes over budget summed over the stages, from
per-layer action arrays, in compiled code (numba), with the same rules in the same order as
`optimizer/simulate.py` (`default_timing`, `stage_memory`, `_forward_stages`, `_backward_stages`), so the result
is equal to the float. tests/unit/test_fastsim.py checks that equality on random chains and DAGs, serial and
concurrent copies. Whatever the search picks is simulated again by the real simulator.

Plans are two arrays over layers: `kind` (KIND_*) and `nbytes` (offloaded bytes; offload only). A layer of kind
KIND_CONTINUE continues the recompute segment of the layer before it, or starts one if that layer is not
recomputed (the local search's 'R' gene).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from memsched.optimizer.simulate import (
    checkpoint_state_bytes,
    code_hold_until,
    external_input_bytes,
    forward_cuts,
    keepall_step_s,
    loss_point_transient,
    other_step_s,
)
from memsched.schema import Trace

KIND_KEEP, KIND_OFFLOAD, KIND_START, KIND_CONTINUE = 0, 1, 2, 3


class FastSim:
    """The trace's arrays, prepared once; `__call__(kind, nbytes)` -> (overhead seconds, bytes over budget)."""

    def __init__(self, trace: Trace, budget_bytes: int) -> None:
        layers = trace.layers
        self.fwd = np.array([x.forward_s for x in layers], dtype=np.float64)
        # A re-run layer with its share of the recompute machinery (Trace.segment_rerun_s): the segment's last to
        # the checkpoint's early stop, with the segment's own share; the others whole.
        machinery = trace.rerun_layer_s
        self.rerun = np.array([x.rerun_s for x in layers], dtype=np.float64) + machinery + trace.rerun_segment_s
        self.rerun_mid = self.fwd + machinery
        self.bwd = np.array([x.backward_s for x in layers], dtype=np.float64)
        self.saved = np.array([x.saved_bytes for x in layers], dtype=np.int64)
        self.fwd_transient = np.array([x.forward_workspace + x.output_bytes for x in layers], dtype=np.int64)
        self.bwd_transient = np.array(
            [x.workspace_bytes + x.output_bytes + x.input_bytes for x in layers], dtype=np.int64
        )
        self.out_bytes = np.array([x.output_bytes for x in layers], dtype=np.int64)
        self.out_saved = np.array([x.output_saved for x in layers], dtype=np.int64)
        self.cut = np.array(forward_cuts(trace), dtype=np.int64)
        self.skip_until = np.array(code_hold_until(trace), dtype=np.int64)  # simulate.skip_holds
        readers = trace.saved_output_readers()
        self.reader_ptr = np.zeros(trace.n + 1, dtype=np.int64)
        self.reader_ptr[1:] = np.cumsum([len(r) for r in readers])
        self.readers = np.array([c for r in readers for c in r], dtype=np.int64)
        self.external = np.array([external_input_bytes(trace, i) for i in range(trace.n)], dtype=np.int64)
        self.dep_ptr = np.zeros(trace.n + 1, dtype=np.int64)
        self.dep_ptr[1:] = np.cumsum([len(x.deps) for x in layers])
        self.deps = np.array([j for x in layers for j in x.deps], dtype=np.int64)
        self.shared = np.array([x.shared_input for x in layers], dtype=np.int64)
        self.side = np.array([x.side_input for x in layers], dtype=np.int64)
        self.changed = np.array([x.changed_buffers for x in layers], dtype=np.int64)
        self.in_saved = np.array([x.input_saved for x in layers], dtype=np.int64)
        self.ctx = np.array([x.ctx_held for x in layers], dtype=np.int64)
        dev = trace.device
        self.d2h_bw, self.h2d_bw, self.latency = dev.d2h_bytes_per_s, dev.h2d_bytes_per_s, dev.copy_latency_s
        self.serial = not dev.concurrent_copies
        self.loss_transient = loss_point_transient(trace)
        self.ckpt_state = checkpoint_state_bytes(trace)
        self.other_s = other_step_s(trace)
        self.keepall_s = keepall_step_s(trace)
        self.limit = budget_bytes - trace.static.total
        self.args = (
            self.fwd,
            self.rerun,
            self.rerun_mid,
            self.bwd,
            self.saved,
            self.fwd_transient,
            self.bwd_transient,
            self.out_bytes,
            self.out_saved,
            self.cut,
            self.skip_until,
            self.reader_ptr,
            self.readers,
            self.external,
            self.dep_ptr,
            self.deps,
            self.shared,
            self.side,
            self.changed,
            self.in_saved,
            self.ctx,
            self.d2h_bw,
            self.h2d_bw,
            self.latency,
            self.serial,
            self.loss_transient,
            self.ckpt_state,
            self.other_s,
            self.limit,
        )
        """`_evaluate`'s arguments after the plan, in its order: what a compiled caller passes on (`descend`)."""

    def __call__(self, kind: np.ndarray, nbytes: np.ndarray) -> tuple[float, int]:
        return _evaluate(kind, nbytes, *self.args)


@njit(cache=True)
def _copy_s(nbytes: int, latency: float, bw: float) -> float:  # pragma: no cover - compiled
    if nbytes <= 0:
        return 0.0
    return latency + nbytes / bw


@njit(cache=True)
def _add(diff: np.ndarray, lo: int, hi: int, nbytes: int) -> None:  # pragma: no cover - compiled
    if nbytes != 0 and lo <= hi:
        diff[lo] += nbytes
        diff[hi + 1] -= nbytes


@njit(cache=True)
def _stage_memory(
    kind: np.ndarray,
    nbytes: np.ndarray,
    done_by: np.ndarray,
    prefetch_at: np.ndarray,
    seg_start: np.ndarray,
    seg_end: np.ndarray,
    saved: np.ndarray,
    fwd_transient: np.ndarray,
    bwd_transient: np.ndarray,
    out_bytes: np.ndarray,
    out_saved: np.ndarray,
    cut: np.ndarray,
    skip_until: np.ndarray,
    reader_ptr: np.ndarray,
    readers: np.ndarray,
    external: np.ndarray,
    dep_ptr: np.ndarray,
    deps: np.ndarray,
    shared: np.ndarray,
    side: np.ndarray,
    changed: np.ndarray,
    in_saved: np.ndarray,
    ctx: np.ndarray,
    loss_transient: int,
    ckpt_state: int,
) -> tuple[np.ndarray, int, np.ndarray]:  # pragma: no cover
    """simulate.stage_memory: non-static bytes at each global stage 0..2n-1, each segment's stashed state
    (simulate.checkpoint_state_bytes) from F_a through B_a; with what is held across the loss point (`held`, to
    fold into F_{n-1}'s: simulate.loss_point_bytes) and each producer's earliest segment with a reader of the
    part it saved itself (`earliest_own`; n: none)."""
    n = kind.shape[0]
    last = 2 * n - 1
    diff = np.zeros(2 * n + 1, dtype=np.int64)
    for i in range(n):
        s = saved[i]
        k = kind[i]
        if k == KIND_KEEP:
            _add(diff, i, last - i, s)
        elif k == KIND_OFFLOAD:
            x = nbytes[i]
            _add(diff, i, last - i, s - x)
            _add(diff, i, done_by[i], x)
            _add(diff, last - prefetch_at[i], last - i, x)
        else:
            a = seg_start[i]
            _add(diff, i, i, s - cut[i])  # its forward under the checkpoint (simulate._stage_memory)
            _add(diff, last - seg_end[a], last - i, s + changed[i])  # with the re-run's buffer copies
            _add(diff, i, last - a, changed[i])  # the snapshot (simulate._stage_memory)
            if i == a and seg_end[a] > a:  # its re-run saves its inputs again (simulate.rerun_input_overlap)
                _add(diff, last - seg_end[a], last - a - 1, -in_saved[a])
    # Checkpoint inputs: each outside producer once, at the earliest segment that holds it; the part it saved
    # itself, where it is not kept, at the earliest segment with a reader of that part (simulate.
    # checkpoint_own_inputs).
    earliest = np.full(n, n, dtype=np.int64)
    earliest_own = np.full(n, n, dtype=np.int64)
    side_held = 0
    side_start = n
    for a in range(n):
        b = seg_end[a]
        if b < 0:
            continue
        ext = 0
        for c in range(a, b + 1):
            ext += external[c]
            for q in range(dep_ptr[c], dep_ptr[c + 1]):
                j = deps[q]
                if j < a < earliest[j]:
                    earliest[j] = a
                if j < a < earliest_own[j] and out_saved[j] > 0 and kind[j] != KIND_KEEP:
                    for p in range(reader_ptr[j], reader_ptr[j + 1]):
                        if a <= readers[p] <= b:
                            earliest_own[j] = a
                            break
        _add(diff, a + 1, last - a - 1, ext)
        _add(diff, a, last - a, ckpt_state)
        # The re-run's fork of it, in B_b, and what its layers keep on a ctx, made again (simulate.rerun_fork_bytes).
        fork = ckpt_state
        for c in range(a, b + 1):
            fork += ctx[c]
        _add(diff, last - b, last - b, fork)
        for c in range(a, b + 1):
            if side[c] > 0:
                side_held = max(side_held, side[c])
                side_start = min(side_start, a)
    # Side inputs (simulate.side_input_hold): one set, from the loss point through the earliest holder's B_a.
    if side_held > 0:
        _add(diff, n, last - side_start, side_held)
    held = loss_transient + side_held  # the loss point: what is held across it, plus its own bytes
    for a in range(n):
        if seg_end[a] >= 0:
            held += ckpt_state
            for c in range(a, seg_end[a] + 1):
                held += external[c] + changed[c]
    # Saved twice (simulate.shared_input_holders): a layer not recomputed that reads a recomputed producer holds
    # what both saved, strictly between F_c and B_c (its workspace carries it at those two stages).
    for c in range(n):
        if shared[c] == 0 or seg_start[c] >= 0:
            continue
        for q in range(dep_ptr[c], dep_ptr[c + 1]):
            if seg_start[deps[q]] >= 0:
                _add(diff, c + 1, last - c - 1, shared[c])
                held += shared[c]
                break
    for j in range(n):
        if earliest[j] < n:
            a = earliest[j]
            _add(diff, a + 1, last - a - 1, out_bytes[j] - out_saved[j])  # simulate.checkpoint_input_bytes
            held += out_bytes[j] - out_saved[j]
        if earliest_own[j] < n:
            a = earliest_own[j]
            _add(diff, a + 1, last - a - 1, out_saved[j])
            held += out_saved[j]
    # Checkpoint inputs a segment still holds at its own B_a (simulate.checkpoint_backward_holds).
    room = shared.copy()
    for j in range(n):
        a = earliest_own[j]
        if a >= n:
            continue
        reads_a = False
        for q in range(reader_ptr[j], reader_ptr[j + 1]):
            if readers[q] == a:
                reads_a = True
        covered = min(room[a], out_saved[j]) if reads_a else 0
        room[a] -= covered
        _add(diff, last - a, last - a, out_saved[j] - covered)
    # Skips the model's code keeps until a later reader, where their layer does not (simulate.skip_holds).
    for j in range(n):
        if skip_until[j] < 0 or kind[j] == KIND_KEEP:
            continue
        lo = done_by[j] + 1 if kind[j] == KIND_OFFLOAD else j + 1
        _add(diff, lo, min(skip_until[j], earliest_own[j], n - 1), out_saved[j])
        if skip_until[j] >= n and earliest_own[j] >= n:  # across the loss point (simulate.loss_point_skips)
            held += out_saved[j]
    for i in range(n):
        _add(diff, i, i, fwd_transient[i])
        _add(diff, last - i, last - i, bwd_transient[i])
        if kind[i] == KIND_KEEP:
            held += saved[i]
        elif kind[i] == KIND_OFFLOAD:
            held += saved[i] - nbytes[i]
    out = np.empty(2 * n, dtype=np.int64)
    run = 0
    for st in range(2 * n):
        run += diff[st]
        out[st] = run
    return out, held, earliest_own


@njit(cache=True)
def _offloads_by_stage(kind: np.ndarray, stage: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
    """The offloaded layers grouped by `stage[i]`, in layer order: those of stage s are
    `items[ptr[s]:ptr[s + 1]]` (a counting sort, as simulate's dicts of lists)."""
    n = kind.shape[0]
    ptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        if kind[i] == KIND_OFFLOAD:
            ptr[stage[i] + 1] += 1
    for s in range(n):
        ptr[s + 1] += ptr[s]
    items = np.empty(ptr[n], dtype=np.int64)
    fill = ptr[:n].copy()
    for i in range(n):
        if kind[i] == KIND_OFFLOAD:
            items[fill[stage[i]]] = i
            fill[stage[i]] += 1
    return ptr, items


@njit(cache=True)
def _evaluate(
    kind: np.ndarray,
    nbytes: np.ndarray,
    fwd: np.ndarray,
    rerun: np.ndarray,
    rerun_mid: np.ndarray,
    bwd: np.ndarray,
    saved: np.ndarray,
    fwd_transient: np.ndarray,
    bwd_transient: np.ndarray,
    out_bytes: np.ndarray,
    out_saved: np.ndarray,
    cut: np.ndarray,
    skip_until: np.ndarray,
    reader_ptr: np.ndarray,
    readers: np.ndarray,
    external: np.ndarray,
    dep_ptr: np.ndarray,
    deps: np.ndarray,
    shared: np.ndarray,
    side: np.ndarray,
    changed: np.ndarray,
    in_saved: np.ndarray,
    ctx: np.ndarray,
    d2h_bw: float,
    h2d_bw: float,
    latency: float,
    serial: bool,
    loss_transient: int,
    ckpt_state: int,
    other_s: float,
    limit: int,
) -> tuple[float, int]:  # pragma: no cover - compiled
    n = kind.shape[0]
    last = 2 * n - 1
    # Recompute segments: seg_start[i] for recomputed layers, seg_end[a] for segment starts (-1 elsewhere).
    seg_start = np.full(n, -1, dtype=np.int64)
    seg_end = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        k = kind[i]
        if k in (KIND_START, KIND_CONTINUE):
            a = i if (k == KIND_START or i == 0 or seg_start[i - 1] < 0) else seg_start[i - 1]
            seg_start[i] = a
            seg_end[a] = i
    # ---- default_timing (every offload's timing unset)
    done_by = np.full(n, -1, dtype=np.int64)
    prefetch_at = np.full(n, -1, dtype=np.int64)
    n_off = 0
    for i in range(n):
        if kind[i] == KIND_OFFLOAD:
            n_off += 1
    offloads = np.empty(n_off, dtype=np.int64)
    m = 0
    for i in range(n):
        if kind[i] == KIND_OFFLOAD:
            offloads[m] = i
            m += 1
            done_by[i] = i
            prefetch_at[i] = i
    # Concurrent copies: each copy is done by the first stage whose forward ends after it (the link's FIFO order).
    timed = n_off > 0 and not serial
    if timed:
        fwd_end = np.empty(n, dtype=np.float64)
        clock = 0.0
        for i in range(n):
            clock += fwd[i]
            fwd_end[i] = clock
        free = 0.0
        k = 0
        for q in range(n_off):
            i = offloads[q]
            free = max(free, fwd_end[i]) + _copy_s(nbytes[i], latency, d2h_bw)
            # The copies' ends only grow, so each one's stage is found from the last one's on.
            k = max(i, k)
            while k < n - 1 and fwd_end[k] < free:
                k += 1
            done_by[i] = k
    mem, held, earliest_own = _stage_memory(
        kind,
        nbytes,
        done_by,
        prefetch_at,
        seg_start,
        seg_end,
        saved,
        fwd_transient,
        bwd_transient,
        out_bytes,
        out_saved,
        cut,
        skip_until,
        reader_ptr,
        readers,
        external,
        dep_ptr,
        deps,
        shared,
        side,
        changed,
        in_saved,
        ctx,
        loss_transient,
        ckpt_state,
    )
    if timed:
        # The forward's waits: a copy waited for at stage st frees its bytes from st on. What the waits free
        # is a difference array (`freed`), summed as st advances (`waited`), so each wait costs O(1).
        freed = np.zeros(n + 1, dtype=np.int64)
        first_done = done_by.copy()
        waited = 0
        head = 0
        for st in range(1, n):
            waited += freed[st]
            # F_{n-1}'s row as simulate's default_timing checks it: the loss point folded in, then the waits.
            row = max(mem[st], held) if st == n - 1 else mem[st]
            while head < n_off and row - waited > limit and offloads[head] < st:
                j = offloads[head]
                head += 1
                if done_by[j] >= st:
                    freed[st] += nbytes[j]
                    freed[done_by[j] + 1] -= nbytes[j]
                    waited += nbytes[j]
                    done_by[j] = st - 1
        # The prefetches, from the last offloaded layer down: each is issued at the latest stage p (no later
        # than the next one's, the need order) whose rows B_{i+1}..B_p all fit its bytes, which they then
        # hold. One pass does both: each row that fits takes the bytes, up to the first that does not.
        cap = n - 1
        for q in range(n_off - 1, -1, -1):
            i = offloads[q]
            x = nbytes[i]
            over = limit - x
            p = cap
            for s in range(last - i - 1, last - cap - 1, -1):
                if mem[s] > over:
                    p = last - s - 1
                    break
                mem[s] += x
            prefetch_at[i] = p
            cap = p
        # The rows with this timing, from the ones above (the prefetches' bytes are in; the forward's are
        # not): what the waits freed, and the skips the code keeps from done_by + 1 on (simulate.skip_holds),
        # which start earlier where a wait moved done_by.
        waited = 0
        for st in range(n):
            waited += freed[st]
            mem[st] -= waited
        for q in range(n_off):
            j = offloads[q]
            if skip_until[j] >= 0 and done_by[j] < first_done[j]:
                hi = min(skip_until[j], earliest_own[j], n - 1, first_done[j])
                for st in range(done_by[j] + 1, hi + 1):
                    mem[st] += out_saved[j]
    mem[n - 1] = max(mem[n - 1], held)  # the loss point (simulate.loss_point_bytes)
    excess = 0
    for st in range(2 * n):
        if mem[st] > limit:
            excess += mem[st] - limit
    # ---- forward stages: waits at stage s for the copies due by its end, in layer order
    wait_count, waits = _offloads_by_stage(kind, done_by)
    t = 0.0
    stall = 0.0
    d2h_free = 0.0
    copy_done = np.zeros(n, dtype=np.float64)
    for i in range(n):
        t += fwd[i]
        if kind[i] == KIND_OFFLOAD:
            start = max(t, d2h_free)
            d2h_free = start + _copy_s(nbytes[i], latency, d2h_bw)
            copy_done[i] = d2h_free
            if serial:
                stall += d2h_free - t
                t = d2h_free
        for q in range(wait_count[i], wait_count[i + 1]):
            j = waits[q]
            if copy_done[j] > t:
                stall += copy_done[j] - t
                t = copy_done[j]
    t += other_s
    # ---- backward stages: prefetches issued at stage i (latest layer first), the segment ending at i, the
    # wait for layer i's own prefetch, its backward
    pre_count, pres = _offloads_by_stage(kind, prefetch_at)
    ends_at = np.full(n, -1, dtype=np.int64)
    for a in range(n):
        if seg_end[a] >= 0:
            ends_at[seg_end[a]] = a
    recompute_s = 0.0
    h2d_free = 0.0
    prefetch_done = np.zeros(n, dtype=np.float64)
    for i in range(n - 1, -1, -1):
        for q in range(pre_count[i + 1] - 1, pre_count[i] - 1, -1):
            j = pres[q]
            start = max(t, h2d_free)
            h2d_free = start + _copy_s(nbytes[j], latency, h2d_bw)
            prefetch_done[j] = h2d_free
            if serial:
                stall += h2d_free - t
                t = h2d_free
        if ends_at[i] >= 0:
            for k in range(ends_at[i], i + 1):
                dur = rerun[k] if k == i else rerun_mid[k]  # the last layer to the early stop (segment_rerun_s)
                t += dur
                recompute_s += dur
        if kind[i] == KIND_OFFLOAD and prefetch_done[i] > t:
            stall += prefetch_done[i] - t
            t = prefetch_done[i]
        t += bwd[i]
    return stall + recompute_s, excess


@njit(cache=True)
def descend(
    order: np.ndarray,
    pos: int,
    cur: np.ndarray,
    move_kind: np.ndarray,
    move_bytes: np.ndarray,
    n_moves: np.ndarray,
    kind: np.ndarray,
    nbytes: np.ndarray,
    lam: float,
    score: float,
    excess_now: int,
    target: float,
    max_evaluations: int,
    host_budget: int,
    best: np.ndarray,
    best_cur: np.ndarray,
    args: tuple[Any, ...],
) -> tuple[int, float, int, bool, int]:  # pragma: no cover - compiled
    """Part of one descent pass of the local search (optimizer/polish.py, `LocalSearch._search`), compiled: for
    the layers `order[pos:]`, each of the layer's moves in turn, scored `overhead + lam * bytes over budget` with
    the move applied; a move that lowers `score` is taken. `cur[i]` is layer i's gene, an index into its rows of
    `move_kind` / `move_bytes` (the first `n_moves[i]` are its moves; a start's gene outside them comes after),
    and `kind` / `nbytes` are the plan they code, kept in step. The best feasible plan seen goes to `best[0]`
    (its overhead) and `best_cur`.

    It returns at a layer boundary, once `max_evaluations` plans are scored or `best[0] <= target`, so that its
    caller can look at the clock: (where it stopped in `order`, score, the plan's bytes over budget (`excess_now`
    on entry), whether a move was taken, plans scored).
    The same moves in the same order as one uninterrupted pass."""
    n = kind.shape[0]
    moved = False
    evaluations = 0
    while pos < order.shape[0]:
        if evaluations >= max_evaluations or best[0] <= target:
            break
        i = order[pos]
        pos += 1
        for j in range(n_moves[i]):
            k = move_kind[i, j]
            if j == cur[i] or (k == KIND_CONTINUE and kind[i - 1] != KIND_START and kind[i - 1] != KIND_CONTINUE):
                continue  # unchanged, or the same schedule as a segment start
            old_kind, old_bytes = kind[i], nbytes[i]
            kind[i], nbytes[i] = k, move_bytes[i, j]
            overhead, excess = _evaluate(kind, nbytes, *args)
            evaluations += 1
            if host_budget >= 0:
                # The host holds every offloaded byte at the loss point (simulate.host_stage_bytes).
                held = 0
                for q in range(n):
                    if kind[q] == KIND_OFFLOAD:
                        held += nbytes[q]
                excess += max(0, held - host_budget)
            if excess == 0 and overhead < best[0]:
                best[0] = overhead
                best_cur[:] = cur
                best_cur[i] = j
            if overhead + lam * excess < score - 1e-15:
                cur[i], score, excess_now, moved = j, overhead + lam * excess, excess, True
            else:
                kind[i], nbytes[i] = old_kind, old_bytes
    return pos, score, excess_now, moved, evaluations
