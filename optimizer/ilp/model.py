"""The MILP, built once as plain rows so that every backend (PuLP/CBC, PuLP/HiGHS, CP-SAT) solves the
same model. docs/formulation.md explains every variable family and constraint group; the comments here
name them with the same letters.

Indices: `i`, `j` are layers (0..n-1, forward order); `k` is the layer whose two stages (F_k and B_k) a
memory row or a time variable belongs to. A layer's *interior* is the stages of the layers after it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from memsched.optimizer.simulate import (
    D2H,
    H2D,
    backward_transient,
    checkpoint_state_bytes,
    copy_seconds,
    forward_cuts,
    forward_transient,
    keepall_step_s,
    loss_point_transient,
    other_step_s,
    own_output_read_by_all,
    rerun_fork_bytes,
    rerun_input_overlap,
    segment_external_bytes,
    segment_outside_deps,
)
from memsched.schema import Trace

BIN, TIME, BYTES, FRAC = "bin", "time", "bytes", "frac"
# Units of rows: every term of a row is in the same unit, so each backend can scale a row on its own.
SECONDS, BYTE_UNIT, ONE = "time", "bytes", "one"
Terms = list[tuple[int, float]]
"""A linear expression: (variable index, coefficient) pairs."""


@dataclass
class Var:
    """One decision or auxiliary variable."""

    name: str
    """Unique name (also the column name in exported LP/MPS files)."""
    kind: str
    """bin (0/1), time (seconds), bytes, or frac (a 0..1 continuous that is integral at every optimum)."""
    lb: float = 0.0
    """Lower bound, in the variable's unit."""
    ub: float | None = None
    """Upper bound, in the variable's unit (None = unbounded)."""


@dataclass
class Row:
    """A linear constraint `sum(coef * var) + const  (sense)  0`, possibly enforced only under a literal."""

    name: str
    """Unique row name."""
    terms: list[tuple[int, float]]
    """(variable index, coefficient) pairs."""
    const: float
    """Constant term, in the row's unit."""
    sense: str
    """'>=', '<=' or '=='."""
    unit: str
    """'time' (seconds), 'bytes' or 'one' (dimensionless)."""
    lit: int = -1
    """If >= 0: the row holds only when binary variable `lit` equals `lit_value` (an indicator)."""
    lit_value: int = 1
    """The value of `lit` under which the row is enforced."""
    big_m: float = 0.0
    """A valid big-M for the indicator (seconds): the row's slack never exceeds it at the least timing."""


@dataclass
class MilpModel:
    """The model plus the index maps needed to read a schedule back out of a solution."""

    trace: Trace
    """The trace it was built for."""
    budget_bytes: int
    """The whole-peak budget."""
    window: int
    """W: done-by and prefetch-at stages of layer i lie in [i, min(i + W, n - 1)]."""
    vars: list[Var] = field(default_factory=list)
    """All variables."""
    rows: list[Row] = field(default_factory=list)
    """All constraints."""
    objective: list[tuple[int, float]] = field(default_factory=list)
    """Objective terms (seconds); minimised."""
    o: dict[int, int] = field(default_factory=dict)
    """o[i]: layer i is offloaded (some of its saved tensors go to the host)."""
    max_segment: int = 1
    """L: the longest recompute segment the model may choose."""
    seg: dict[tuple[int, int], int] = field(default_factory=dict)
    """seg[(a, b)]: layers a..b are one recompute segment."""
    y: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """y[i] = [(tensor index, var)]: tensor q of layer i is offloaded (only layers with >= 2 tensors)."""
    single: dict[int, int] = field(default_factory=dict)
    """single[i] = the one positive tensor of layer i, when it has exactly one (offloaded iff o[i])."""
    z: dict[int, dict[int, int]] = field(default_factory=dict)
    """z[i][k], k in [i, e_i - 1]: layer i is offloaded and its copy is done by the end of F_k (d_i <= k)."""
    ev: dict[int, dict[int, int]] = field(default_factory=dict)
    """ev[i][k], k in [i + 1, f_i]: layer i's prefetch is issued at or before B_k is due (p_i >= k)."""
    end_var: int = -1
    """b_0: end of the step (seconds)."""

    def add_var(self, name: str, kind: str, lb: float = 0.0, ub: float | None = None) -> int:
        self.vars.append(Var(name, kind, lb, ub))
        return len(self.vars) - 1

    def add_row(self, row: Row) -> None:
        self.rows.append(row)

    def last_stage(self, i: int) -> int:
        """e_i = f_i: the last done-by / prefetch-at stage the window allows for layer i."""
        return min(i + self.window, self.trace.n - 1)


def positive_tensors(trace: Trace, i: int) -> list[int]:
    """Indices of layer i's saved tensors that have bytes (offloading an empty tensor changes nothing)."""
    return [q for q, b in enumerate(trace.layers[i].tensors) if b > 0]


def offload_candidates(trace: Trace) -> list[int]:
    """Layers that may be offloaded. A layer that saves nothing, and the last layer (its interior is
    empty: no stage lies strictly between F_{n-1} and B_{n-1}), gain nothing from it."""
    return [i for i in range(trace.n - 1) if positive_tensors(trace, i)]


def segments(trace: Trace, max_len: int) -> list[tuple[int, int]]:
    """Candidate recompute segments [a, b] (b - a < max_len, b <= Trace.segment_last) ending before the last layer
    (a segment ending there is re-run at once and frees nothing in backward: never better) at a layer that saves
    something."""
    n = trace.n
    sizes = [x.saved_bytes for x in trace.layers]
    seg_last = trace.segment_last()
    out = []
    for a in range(n - 1):
        for b in range(a, min(a + max_len, n - 1, seg_last[a] + 1)):
            # A segment whose last layer saves nothing is dominated by the one without it (same bytes
            # freed, less re-run time, earlier rematerialisation avoided, fewer outside inputs).
            if sizes[b] > 0:
                out.append((a, b))
    return out


def default_window(n: int) -> int:
    """W = n on small traces (exact), else 12 stages: enough for a copy to hide behind a dozen layers."""
    return n if n <= 24 else 12


def default_max_segment(n: int) -> int:
    """L = n on small traces (exact), else 16 layers (sqrt-segments of up to 256 layers fit)."""
    return n if n <= 24 else 16


def build_model(
    trace: Trace,
    budget_bytes: int,
    window: int | None = None,
    max_segment: int | None = None,
    offload: bool = True,
    knapsack_rows: bool | None = None,
    channel_cuts: bool = False,
    host_budget: int | None = None,
) -> MilpModel:
    """Build the MILP of docs/formulation.md for `trace` under `budget_bytes` (`offload=False`: the
    recompute-only restriction, much easier, used as a first phase that seeds the full model;
    `channel_cuts=True` adds the cumulative copy-channel cuts: valid, but measured not to raise the LP bound
    on ResNet-50 while doubling its LP time, so off by default; see formulation.md, 'Cuts').

    Each step below is one section of docs/formulation.md; the order of the calls is the order of the
    model's columns and rows, which the solvers' behaviour (and so the returned schedules) depends on."""
    n = trace.n
    w = default_window(n) if window is None else max(0, window)
    if not trace.device.concurrent_copies:
        w = 0  # copies on the compute thread: done-by and prefetch-at are the layer's own stages
    seg = default_max_segment(n) if max_segment is None else max(1, max_segment)
    m = MilpModel(trace=trace, budget_bytes=budget_bytes, window=w, max_segment=seg)
    off = offload_candidates(trace) if offload else []
    limit = budget_bytes - trace.static.total

    covering = _add_action_vars(m, off)
    _add_one_action_rows(m, covering)
    x_terms = _add_partial_offload(m, off)
    _add_done_by_vars(m, off)
    _add_prefetch_at_vars(m, off)
    _add_prefetch_order_rows(m, off)
    held_inc = _add_checkpoint_inputs(m)
    _add_saved_twice(m, covering, held_inc)
    snaps = _add_snapshots(m, held_inc)
    acc, held = _add_cumulative_bytes(m, off, covering, x_terms, held_inc)
    _add_memory_rows(m, off, limit, x_terms, acc, held, snaps)
    _add_host_budget_row(m, x_terms, host_budget)
    if knapsack_rows if knapsack_rows is not None else n <= 60:  # where it pays: see the docstring
        _add_knapsack_rows(m, trace, limit, x_terms)
    cvar, gvar = _add_forward_time(m, off, x_terms)
    dmin = _add_d2h_cuts(m, off, cvar, gvar)
    if channel_cuts:
        _add_d2h_channel_cuts(m, cvar, [x.forward_s for x in trace.layers], dmin)
    bvar = _add_backward_time(m, off, x_terms, cvar)
    hmin = _add_h2d_cuts(m, off, bvar)
    if channel_cuts:
        _add_h2d_channel_cuts(m, bvar, [x.backward_s for x in trace.layers], hmin)
    _set_objective(m, bvar)
    return m


def _add_action_vars(m: MilpModel, off: list[int]) -> dict[int, list[int]]:
    """Variables o_i and s_{a,b} (formulation.md, 'Variables'): o[i] = layer i offloaded; seg[a, b] = layers
    a..b form one recompute segment (checkpoint at a, re-run F_a..F_b when B_b starts); keep = neither.
    Returns, per layer, the segment variables containing it."""
    for i in off:
        m.o[i] = m.add_var(f"o_{i}", BIN, 0, 1)
    for a, b in segments(m.trace, m.max_segment):
        m.seg[(a, b)] = m.add_var(f"s_{a}_{b}", BIN, 0, 1)
    covering: dict[int, list[int]] = {i: [] for i in range(m.trace.n)}
    for (a, b), v in m.seg.items():
        for i in range(a, b + 1):
            covering[i].append(v)
    return covering


def _add_one_action_rows(m: MilpModel, covering: dict[int, list[int]]) -> None:
    """'Exactly one action per layer': o[i] + sum(seg[a, b] for a <= i <= b) <= 1."""
    for i in range(m.trace.n):
        terms = [(v, 1.0) for v in covering[i]] + ([(m.o[i], 1.0)] if i in m.o else [])
        if len(terms) > 1:
            m.add_row(Row(f"one_action_{i}", terms, -1.0, "<=", ONE))


def _add_partial_offload(m: MilpModel, off: list[int]) -> dict[int, Terms]:
    """Variables y_{i,q}: tensor q of layer i goes to the host; x_i = sum(size_q * y) ('Exactly one action
    per layer': an offloaded layer moves at least one tensor). Returns x_i per candidate as linear terms
    (also the copy size)."""
    layers = m.trace.layers
    x_terms: dict[int, Terms] = {}
    for i in off:
        pos = positive_tensors(m.trace, i)
        tens = layers[i].tensors
        if len(pos) == 1:
            m.single[i] = pos[0]
            x_terms[i] = [(m.o[i], float(tens[pos[0]]))]
            continue
        m.y[i] = []
        for q in pos:
            v = m.add_var(f"y_{i}_{q}", BIN, 0, 1)
            m.y[i].append((q, v))
            # A tensor is offloaded only if the layer is.
            m.add_row(Row(f"tensor_needs_offload_{i}_{q}", [(v, 1.0), (m.o[i], -1.0)], 0.0, "<=", ONE))
        # An offloaded layer moves at least one tensor.
        m.add_row(Row(f"offload_moves_some_{i}", [(v, 1.0) for _, v in m.y[i]] + [(m.o[i], -1.0)], 0.0, ">=", ONE))
        x_terms[i] = [(v, float(tens[q])) for q, v in m.y[i]]
    return x_terms


def _copy_duration(m: MilpModel, x_terms: dict[int, Terms], i: int, bw: float) -> Terms:
    """Copy duration of layer i as terms: latency * o_i + x_i / bandwidth (0 when not offloaded)."""
    return [(m.o[i], m.trace.device.copy_latency_s)] + [(v, c / bw) for v, c in x_terms[i]]


def _add_done_by_vars(m: MilpModel, off: list[int]) -> None:
    """Variables z_{i,k} = (d_i <= k), monotone in k, z[i][e_i] = o[i] (the window ends the choice)."""
    for i in off:
        e = m.last_stage(i)
        m.z[i] = {k: m.add_var(f"z_{i}_{k}", BIN, 0, 1) for k in range(i, e)}
        m.z[i][e] = m.o[i]
        for k in range(i, e):
            m.add_row(Row(f"doneby_monotone_{i}_{k}", [(m.z[i][k], 1.0), (m.z[i][k + 1], -1.0)], 0.0, "<=", ONE))


def _add_prefetch_at_vars(m: MilpModel, off: list[int]) -> None:
    """Variables p_{i,k}: ev[i][k] = (p_i >= k) for k in (i, f_i], monotone in k.

    Not tied to o[i]: a kept layer carries a *virtual* prefetch stage that keeps the order chain unbroken
    (formulation.md, 'Prefetch order'); its memory terms are zero because x_i = 0."""
    for i in off:
        f = m.last_stage(i)
        m.ev[i] = {k: m.add_var(f"p_{i}_{k}", BIN, 0, 1) for k in range(i + 1, f + 1)}
        for k in range(i + 1, f):
            m.add_row(Row(f"prefetch_monotone_{i}_{k}", [(m.ev[i][k + 1], 1.0), (m.ev[i][k], -1.0)], 0.0, "<=", ONE))


def _add_prefetch_order_rows(m: MilpModel, off: list[int]) -> None:
    """'Prefetch order': p is non-decreasing along the offload candidates (validate_actions' rule).
    p_i = i + sum_k ev[i][k]; consecutive candidates a < b need p_a <= p_b."""
    for a, b in itertools.pairwise(off):
        terms = [(v, 1.0) for v in m.ev[b].values()] + [(v, -1.0) for v in m.ev[a].values()]
        m.add_row(Row(f"prefetch_order_{a}_{b}", terms, float(b - a), ">=", ONE))


def _add_checkpoint_inputs(m: MilpModel) -> dict[int, Terms]:
    """'Recompute needs its inputs present; DAG dependencies': h[j, a] = producer j's output is held at the
    stages of layers > a because a selected segment starting at some a' <= a consumes it from outside
    (j < a'). Monotone in a. Returns, per layer a, the bytes (as terms) that start being held after it."""
    trace = m.trace
    held_inc: dict[int, Terms] = {}
    starts: dict[int, dict[int, list[int]]] = {}  # producer j -> segment start a -> segment variables
    seg_end = {v: b for (_, b), v in m.seg.items()}
    for (a, b), v in m.seg.items():
        for j in segment_outside_deps(trace, a, b):
            starts.setdefault(j, {}).setdefault(a, []).append(v)
        # Inputs no traced layer produced are held by this segment's checkpoint alone (no dedup), and so is
        # the RNG state it stashes (held from F_a on; rows F_a / B_a add it themselves).
        ext = segment_external_bytes(trace, a, b) + checkpoint_state_bytes(trace)
        if ext:
            held_inc.setdefault(a, []).append((v, float(ext)))
    by_all = own_output_read_by_all(trace)
    for j, by_start in starts.items():
        # A kept j's own saved tensors hold `own` of its output from F_j through B_j (simulate.
        # checkpoint_input_bytes), so a checkpoint adds only the rest; `own` only while j is not kept.
        # Where not every reader reads that part, the simulator charges it at a later segment or not at all
        # (simulate.checkpoint_own_inputs): left out here, a relaxation (like the DP's `output`).
        rest = float(trace.layers[j].output_bytes - trace.layers[j].output_saved)
        own = float(trace.layers[j].output_saved) if by_all[j] else 0.0
        not_kept = [(v, 1.0) for (a2, b2), v in m.seg.items() if a2 <= j <= b2] + ([(m.o[j], 1.0)] if j in m.o else [])
        prev = prev_u = -1
        for a in sorted(by_start):
            h = m.add_var(f"h_{j}_{a}", FRAC, 0, 1)
            # Segments that contain layer a are mutually exclusive, so their *sum* bounds h (a max would
            # be exact too, but the sum is what keeps the LP from sharing one checkpoint among fractions).
            # Those starting at a' <= a, consuming j from outside, hold j at the stages after a.
            covering_a = [v for a2, vs in by_start.items() if a2 <= a for v in vs if seg_end[v] >= a]
            m.add_row(Row(f"ckpt_needed_{j}_{a}", [(h, 1.0)] + [(v, -1.0) for v in covering_a], 0.0, ">=", ONE))
            if prev >= 0:
                m.add_row(Row(f"ckpt_monotone_{j}_{a}", [(h, 1.0), (prev, -1.0)], 0.0, ">=", ONE))
                held_inc.setdefault(a, []).extend([(h, rest), (prev, -rest)])
            else:
                held_inc.setdefault(a, []).append((h, rest))
            prev = h
            if own:
                # u[j, a] >= h[j, a] - keep_j, keep_j = 1 - o_j - (segments containing j): the own part is
                # held by the checkpoint only where j is not kept.
                u = m.add_var(f"u_{j}_{a}", FRAC, 0, 1)
                terms = [(u, 1.0), (h, -1.0)] + [(v, -c) for v, c in not_kept]
                m.add_row(Row(f"ckpt_unkept_{j}_{a}", terms, 1.0, ">=", ONE))
                if prev_u >= 0:
                    m.add_row(Row(f"ckpt_unkept_monotone_{j}_{a}", [(u, 1.0), (prev_u, -1.0)], 0.0, ">=", ONE))
                    held_inc.setdefault(a, []).extend([(u, own), (prev_u, -own)])
                else:
                    held_inc.setdefault(a, []).append((u, own))
                prev_u = u
    return held_inc


def _add_saved_twice(m: MilpModel, covering: dict[int, list[int]], held_inc: dict[int, Terms]) -> None:
    """'Saved twice' (docs/cost-model.md; simulate.shared_input_holders): w[c] = layer c is not recomputed and a
    producer among its deps is, so c alone holds the storages both saved (Layer.shared_input_bytes) at the
    stages of layers > c (F_c and B_c carry them in c's workspace). w[c] >= rec_j - rec_c for each dep j, where
    rec_i = sum of the segments containing i; the rows only ever want w small, so w takes max(0, ...), the
    simulator's rule. (The loss point past B_{n-1} is left out for c = n - 1: a relaxation.)"""
    for c, layer in enumerate(m.trace.layers):
        if not layer.shared_input or not layer.deps or c == m.trace.n - 1:
            continue
        deps = [j for j in layer.deps if covering[j]]
        if not deps:
            continue  # no producer of c can be recomputed (segment length or window)
        w = m.add_var(f"w_{c}", FRAC, 0, 1)
        for j in deps:
            # A segment containing both j and c cancels out (one term per variable).
            coef = dict.fromkeys(covering[j], -1.0)
            for v in covering[c]:
                coef[v] = coef.get(v, 0.0) + 1.0
            terms = [(w, 1.0)] + [(v, x) for v, x in coef.items() if x]
            m.add_row(Row(f"saved_twice_{c}_{j}", terms, 0.0, ">=", ONE))
        held_inc.setdefault(c, []).append((w, float(layer.shared_input)))


def _add_snapshots(m: MilpModel, held_inc: dict[int, Terms]) -> tuple[dict[int, Terms], dict[int, Terms]]:
    """Snapshots of changed buffers (Layer.changed_buffer_bytes, BatchNorm's running statistics; docs/cost-model.md):
    a recomputed layer i holds its snapshot from F_i until its segment's backward ends, and its re-run's private
    copies from B_b through B_i. So segment [a, b] holds S(a..k) more in row F_k and S(a..b) + S(a..k) in row B_k
    (a <= k <= b), and S(a..b) at the stages of layers > b (`held_inc[b]`, which H_k accumulates). Returns the
    terms of rows F_k and B_k per layer (the exact DP's rule: DpProblem.snap_prefix)."""
    n = m.trace.n
    changed = [x.changed_buffers for x in m.trace.layers]
    snap_f: dict[int, Terms] = {k: [] for k in range(n)}
    snap_b: dict[int, Terms] = {k: [] for k in range(n)}
    if not any(changed):
        return snap_f, snap_b
    for (a, b), v in m.seg.items():
        whole = float(sum(changed[a : b + 1]))
        if whole:
            held_inc.setdefault(b, []).append((v, whole))
        own = 0.0
        for k in range(a, b + 1):
            own += changed[k]
            if own:
                snap_f[k].append((v, own))
                snap_b[k].append((v, whole + own))
    return snap_f, snap_b


def _add_cumulative_bytes(
    m: MilpModel,
    off: list[int],
    covering: dict[int, list[int]],
    x_terms: dict[int, Terms],
    held_inc: dict[int, Terms],
) -> tuple[list[int], list[int]]:
    """Variables A_k = sum_{i<k} (s_i r_i + x_i) freed and H_k = checkpoint bytes held ('Memory at every
    stage <= budget'). Recurrences keep every memory row O(W) long instead of O(n). Returns (A, H)."""
    n = m.trace.n
    sizes = [layer.saved_bytes for layer in m.trace.layers]
    off_set = set(off)
    acc: list[int] = [-1] * n
    held: list[int] = [-1] * n
    for k in range(1, n):
        acc[k] = m.add_var(f"A_{k}", BYTES, 0)
        held[k] = m.add_var(f"H_{k}", BYTES, 0)
        i = k - 1
        terms = [(acc[k], 1.0)] + ([(acc[i], -1.0)] if i >= 1 else [])
        terms += [(v, -float(sizes[i])) for v in covering[i]]
        if i in off_set:
            terms += [(v, -c) for v, c in x_terms[i]]
        m.add_row(Row(f"freed_acc_{k}", terms, 0.0, "==", BYTE_UNIT))
        hterms = [(held[k], 1.0)] + ([(held[i], -1.0)] if i >= 1 else [])
        hterms += [(v, -c) for v, c in held_inc.get(i, [])]
        m.add_row(Row(f"held_acc_{k}", hterms, 0.0, "==", BYTE_UNIT))
    return acc, held


def _add_memory_rows(
    m: MilpModel,
    off: list[int],
    limit: int,
    x_terms: dict[int, Terms],
    acc: list[int],
    held: list[int],
    snaps: tuple[dict[int, Terms], dict[int, Terms]],
) -> None:
    """'Memory at every stage <= budget', with the variables vF / vB of 'An offload frees memory only once
    its copy has finished' and 'its destination is allocated at issue'.

    Stage F_k / B_k: transients + sum_{i<=k} s_i - A_k + H_k + bytes of interior offloads still on the
    device (copy not done yet in forward, prefetched already in backward) + the segments' snapshots
    (`_add_snapshots`)."""
    trace = m.trace
    n = trace.n
    sizes = [layer.saved_bytes for layer in trace.layers]
    prefix = 0
    pend_f: dict[int, Terms] = {k: [] for k in range(n)}
    pend_b: dict[int, Terms] = {k: [] for k in range(n)}
    for i in off:
        e = m.last_stage(i)
        for k in range(i + 1, e + 1):
            # Forward: x_i is still on the device at F_k iff d_i >= k iff not z[i][k-1].
            if i in m.single:
                pend_f[k] += [(m.o[i], float(sizes[i])), (m.z[i][k - 1], -float(sizes[i]))]
            else:
                v = m.add_var(f"vF_{i}_{k}", BYTES, 0)
                # v >= x_i - s_i * z[i][k-1]: the product x_i * (1 - z), linearised (minimised by the rows).
                m.add_row(
                    Row(
                        f"pendF_{i}_{k}",
                        [(v, 1.0)] + [(t, -c) for t, c in x_terms[i]] + [(m.z[i][k - 1], float(sizes[i]))],
                        0.0,
                        ">=",
                        BYTE_UNIT,
                    )
                )
                pend_f[k].append((v, 1.0))
            # Backward: x_i is back on the device at B_k iff p_i >= k.
            wv = m.add_var(f"vB_{i}_{k}", BYTES, 0)
            m.add_row(
                Row(
                    f"pendB_{i}_{k}",
                    [(wv, 1.0)] + [(t, -c) for t, c in x_terms[i]] + [(m.ev[i][k], -float(sizes[i]))],
                    float(sizes[i]),
                    ">=",
                    BYTE_UNIT,
                )
            )
            pend_b[k].append((wv, 1.0))
    # A segment [a, b] rematerialises its layers' saved bytes when B_b starts: at B_k (a < k <= b) the
    # bytes of its layers a..k-1 are back on the device, less layer a's inputs that its re-run saves again:
    # those are its checkpoint's storages, which the held bytes count (simulate.rerun_input_overlap).
    remat: dict[int, Terms] = {k: [] for k in range(n)}
    for (a, b), v in m.seg.items():
        for k in range(a + 1, b + 1):
            nbytes = float(sum(sizes[a:k]) - rerun_input_overlap(trace, a, b))
            if nbytes:
                remat[k].append((v, nbytes))
    # A segment [a, b]'s checkpoint stashes the RNG state at entry: rows F_a and B_a hold it too; its re-run
    # forks it (torch.random.fork_rng), a second copy in row B_b.
    # With it, the bytes its layers keep on a ctx, made again by the re-run (simulate.rerun_fork_bytes).
    state = float(checkpoint_state_bytes(trace))
    state_at: dict[int, Terms] = {k: [] for k in range(n)}
    fork_at: dict[int, Terms] = {k: [] for k in range(n)}
    for (a, b), v in m.seg.items():
        if state:
            state_at[a].append((v, state))
        fork = float(rerun_fork_bytes(trace, a, b))
        if fork:
            fork_at[b].append((v, fork))
    # A recomputed layer's forward runs under the checkpoint, which saves nothing: row F_k holds its saved bytes
    # less its cut (simulate.forward_cuts; docs/cost-model.md, 'A recomputed layer's forward').
    cuts = forward_cuts(trace)
    cut_f: dict[int, Terms] = {k: [] for k in range(n)}
    for (a, b), v in m.seg.items():
        for k in range(a, b + 1):
            if cuts[k]:
                cut_f[k].append((v, -float(cuts[k])))
    for k in range(n):
        prefix += sizes[k]
        common = ([(acc[k], -1.0), (held[k], 1.0)] if k >= 1 else []) + state_at[k]
        for stage, transient, pend in (
            ("F", forward_transient(trace, k), pend_f[k] + cut_f[k] + snaps[0][k]),
            # B_{n-1}'s row also bounds the loss point before it (it holds no more than B_{n-1} but the
            # loss's bytes): conservative where the last layer is recomputed (docs/cost-model.md).
            (
                "B",
                max(backward_transient(trace, k), loss_point_transient(trace) if k == n - 1 else 0),
                pend_b[k] + remat[k] + fork_at[k] + snaps[1][k],
            ),
        ):
            m.add_row(Row(f"mem_{stage}{k}", common + pend, float(transient + prefix - limit), "<=", BYTE_UNIT))


def _add_forward_time(m: MilpModel, off: list[int], x_terms: dict[int, Terms]) -> tuple[list[int], dict[int, int]]:
    """'Copy-channel capacity in each direction', forward: c_k end of F_k (after waits), g_i end of layer
    i's D2H copy (FIFO), and the waits c_k >= g_i when d_i <= k (indicator z[i][k]; big-M = the D2H backlog
    bound of 'Big-M values'). Returns (c, g)."""
    trace = m.trace
    n = trace.n
    fwd = [layer.forward_s for layer in trace.layers]
    sizes = [layer.saved_bytes for layer in trace.layers]
    bw_d = trace.device.d2h_bytes_per_s
    off_set = set(off)
    cvar = [m.add_var(f"c_{k}", TIME, 0) for k in range(n)]
    gvar: dict[int, int] = {}
    prev_g = -1
    for k in range(n):
        # c_k >= c_{k-1} + forward_k (compute is sequential).
        prev_c = [(cvar[k - 1], -1.0)] if k else []
        m.add_row(Row(f"fwd_compute_{k}", [(cvar[k], 1.0), *prev_c], -fwd[k], ">=", SECONDS))
        if k in off_set:
            g = m.add_var(f"g_{k}", TIME, 0)
            gvar[k] = g
            d = [(t, -c) for t, c in _copy_duration(m, x_terms, k, bw_d)]
            # D2H FIFO: the copy starts after the layer's forward and after the previous copy.
            m.add_row(Row(f"d2h_after_fwd_{k}", [(g, 1.0), *prev_c, *d], -fwd[k], ">=", SECONDS))
            if prev_g >= 0:
                m.add_row(Row(f"d2h_fifo_{k}", [(g, 1.0), (prev_g, -1.0), *d], 0.0, ">=", SECONDS))
            prev_g = g
    for i in off:
        e = m.last_stage(i)
        backlog = sum(copy_seconds(trace, sizes[j], D2H) for j in off if i - m.window < j <= i)
        # Valid for every candidate, offloaded or not (a kept layer's g_i is at most the previous copy's end
        # or its own forward's end): the D2H channel never lags more than the window. Strengthens the LP.
        m.add_row(Row(f"d2h_window_{i}", [(cvar[e], 1.0), (gvar[i], -1.0)], 0.0, ">=", SECONDS))
        for k in range(i, e):
            big = max(0.0, backlog - sum(fwd[i + 1 : k + 1]))
            m.add_row(
                Row(
                    f"wait_copy_{i}_{k}",
                    [(cvar[k], 1.0), (gvar[i], -1.0)],
                    0.0,
                    ">=",
                    SECONDS,
                    lit=m.z[i][k],
                    lit_value=1,
                    big_m=big,
                )
            )
    return cvar, gvar


def _smallest_copy(m: MilpModel, off: list[int], direction: str) -> dict[int, float]:
    """dmin / hmin of 'Valid inequalities (cuts)': the copy time of each candidate's smallest tensor, which
    keeps the cuts valid under partial offload."""
    trace = m.trace
    return {
        i: min(copy_seconds(trace, trace.layers[i].tensors[q], direction) for q in positive_tensors(trace, i))
        for i in off
    }


def _add_d2h_cuts(m: MilpModel, off: list[int], cvar: list[int], gvar: dict[int, int]) -> dict[int, float]:
    """'Valid inequalities (cuts)', forward: a copy that cannot hide behind the compute between its start
    and its deadline stalls by the difference. Implied at integral points, but local (no big-M), so the LP
    relaxation cannot make a fractional done-by stage look free. Returns dmin."""
    fwd = [layer.forward_s for layer in m.trace.layers]
    dmin = _smallest_copy(m, off, D2H)
    for i in off:
        e = m.last_stage(i)
        for k in range(i, e + 1):
            # d_i <= k: c_k - c_{i-1} >= forward_i..k + (copy_i - forward_{i+1..k})^+.
            short = dmin[i] - sum(fwd[i + 1 : k + 1])
            if short > 0:
                m.add_row(
                    Row(
                        f"cut_d2h_{i}_{k}",
                        [(cvar[k], 1.0)] + ([(cvar[i - 1], -1.0)] if i else []) + [(m.z[i][k], -short)],
                        -sum(fwd[i : k + 1]),
                        ">=",
                        SECONDS,
                    )
                )
    return dmin


def _add_backward_time(m: MilpModel, off: list[int], x_terms: dict[int, Terms], cvar: list[int]) -> list[int]:
    """'Copy-channel capacity in each direction', backward, and 'A prefetch finishes before its layer's
    backward': b_k end of B_k; b_n = c_{n-1} + other; q_i end of layer i's prefetch (FIFO in descending
    layer order, which the prefetch order makes the issue order). Returns b."""
    trace = m.trace
    n = trace.n
    bwd = [layer.backward_s for layer in trace.layers]
    sizes = [layer.saved_bytes for layer in trace.layers]
    bw_h = trace.device.h2d_bytes_per_s
    off_set = set(off)
    bvar = [m.add_var(f"b_{k}", TIME, 0) for k in range(n + 1)]
    m.add_row(Row("other_time", [(bvar[n], 1.0), (cvar[n - 1], -1.0)], -other_step_s(trace), "==", SECONDS))
    qvar: dict[int, int] = {}
    prev_q = -1
    # Per-stage bound on b_{l} - b_{l+1} (compute + recompute or prefetch stall), for the big-Ms.
    rerun: dict[int, Terms] = {k: [] for k in range(n)}  # segments ending at k
    for (a, b), v in m.seg.items():
        rerun[b].append((v, trace.segment_rerun_s(a, b)))  # the last layer to the early stop
    step_ub = [
        bwd[k]
        + max(max((c for _, c in rerun[k]), default=0.0), copy_seconds(trace, sizes[k], H2D) if k in off_set else 0.0)
        for k in range(n)
    ]
    for i in reversed(off):
        q = m.add_var(f"q_{i}", TIME, 0)
        qvar[i] = q
        d = [(t, -c) for t, c in _copy_duration(m, x_terms, i, bw_h)]
        if prev_q >= 0:
            # H2D FIFO: after the prefetch of the next higher offloaded layer.
            m.add_row(Row(f"h2d_fifo_{i}", [(q, 1.0), (prev_q, -1.0), *d], 0.0, ">=", SECONDS))
        prev_q = q
        f = m.last_stage(i)
        # Issued at the start of B_{p_i} = b_{p_i + 1}: at least the start of B_{f_i} ...
        m.add_row(Row(f"h2d_issue_{i}_{f}", [(q, 1.0), (bvar[f + 1], -1.0), *d], 0.0, ">=", SECONDS))
        # ... and at least b_{k+1} for every k >= p_i, i.e. whenever not ev[i][k+1].
        for k in range(i, f):
            big = sum(step_ub[k + 1 : f + 1])
            m.add_row(
                Row(
                    f"h2d_issue_{i}_{k}",
                    [(q, 1.0), (bvar[k + 1], -1.0), *d],
                    0.0,
                    ">=",
                    SECONDS,
                    lit=m.ev[i][k + 1],
                    lit_value=0,
                    big_m=big,
                )
            )
    for k in range(n - 1, -1, -1):
        # b_k >= b_{k+1} + re-run of the segment ending at k + backward_k.
        terms = [(bvar[k], 1.0), (bvar[k + 1], -1.0)] + [(v, -c) for v, c in rerun[k]]
        m.add_row(Row(f"bwd_compute_{k}", terms, -bwd[k], ">=", SECONDS))
        if k in off_set:
            # b_k >= q_k + backward_k: the backward waits for its prefetch (harmless when kept: q_k <= b_{k+1}).
            m.add_row(Row(f"wait_prefetch_{k}", [(bvar[k], 1.0), (qvar[k], -1.0)], -bwd[k], ">=", SECONDS))
    return bvar


def _add_h2d_cuts(m: MilpModel, off: list[int], bvar: list[int]) -> dict[int, float]:
    """'Valid inequalities (cuts)', backward: the prefetch of layer i issued at B_k or later cannot hide
    behind less than backward_{i+1..k}. Returns hmin."""
    bwd = [layer.backward_s for layer in m.trace.layers]
    hmin = _smallest_copy(m, off, H2D)
    for i in off:
        for k in range(i, m.last_stage(i) + 1):
            short = hmin[i] - sum(bwd[i + 1 : k + 1])
            if short <= 0:
                continue
            # p_i <= k (offloaded, not ev[i][k+1]): b_i - b_{k+1} >= backward_i..k + (prefetch_i - backward_{i+1..k})^+.
            terms = [(bvar[i], 1.0), (bvar[k + 1], -1.0), (m.o[i], -short)]
            if k + 1 in m.ev[i]:
                terms.append((m.ev[i][k + 1], short))
            m.add_row(Row(f"cut_h2d_{i}_{k}", terms, -sum(bwd[i : k + 1]), ">=", SECONDS))
    return hmin


def _set_objective(m: MilpModel, bvar: list[int]) -> None:
    """'Objective': end of step - keep-all step = stall + recompute seconds. A variable of its own (not
    b_0 - constant) so that the solvers' relative gap is measured against the overhead itself and not
    against the whole step time."""
    m.end_var = bvar[0]
    ovh = m.add_var("overhead", TIME, 0)
    m.add_row(Row("overhead_def", [(ovh, 1.0), (bvar[0], -1.0)], keepall_step_s(m.trace), "==", SECONDS))
    m.objective = [(ovh, 1.0)]


def _add_d2h_channel_cuts(m: MilpModel, cvar: list[int], fwd: list[float], dmin: dict[int, float]) -> None:
    """Cumulative D2H channel cuts (valid inequalities, no big-M).

    For a window of layers a..k: every copy of a layer i in a..k that is due by the end of F_k (z[i][k],
    or o[i] once k is past i's window, whose done-by is then already <= k) starts after F_a's compute ends
    (at c_{a-1} + forward_a or later), the D2H stream runs them one at a time, and F_k waits for all of
    them, so

        c_k - c_{a-1} >= forward_a + sum_{i=a..k} dmin_i * z[i][k].

    dmin_i (the copy of i's smallest tensor) keeps the row valid under partial offload. The single-layer
    cuts above are the case a = i; here a < k and at least two copies are summed. The compute chain
    already gives c_k - c_{a-1} >= forward_{a..k}, so a row is written only when its copies can exceed
    forward_{a+1..k}. a ranges over the window (k - W .. k - 1).
    """
    n = m.trace.n
    for k in range(1, n):
        for a in range(max(0, k - m.window), k):
            terms: list[tuple[int, float]] = []
            for i in range(a, k + 1):
                if i in m.o:
                    terms.append((m.z[i][min(k, m.last_stage(i))], -dmin[i]))
            if len(terms) < 2 or -sum(c for _, c in terms) <= sum(fwd[a + 1 : k + 1]) + 1e-12:
                continue
            prev = [(cvar[a - 1], -1.0)] if a else []
            m.add_row(Row(f"chan_d2h_{a}_{k}", [(cvar[k], 1.0), *prev, *terms], -fwd[a], ">=", SECONDS))


def _add_h2d_channel_cuts(m: MilpModel, bvar: list[int], bwd: list[float], hmin: dict[int, float]) -> None:
    """Cumulative H2D channel cuts (valid inequalities, no big-M): the mirror of the D2H ones.

    For a window of layers a..k: every offloaded layer i in a..k whose prefetch is issued at B_k or later
    (p_i <= k: o[i] - ev[i][k+1], or o[i] when k is at or past i's window end) is issued after b_{k+1},
    the H2D stream runs them one at a time in descending layer order, and the lowest of them, i*, is
    needed before B_{i*} starts, and B_a ends no earlier than B_{i*} (backward runs down to a), so

        b_a - b_{k+1} >= backward_a + sum_{i=a..k} hmin_i * (o[i] - ev[i][k+1]).

    (b_a >= b_{i*} + backward_{a..i*-1} >= q_{i*} + backward_{a..i*} and q_{i*} >= b_{k+1} + the copies.)
    Written only when the copies can exceed backward_{a+1..k} (else the compute chain implies it).
    """
    n = m.trace.n
    for k in range(1, n):
        for a in range(max(0, k - m.window), k):
            terms: list[tuple[int, float]] = []
            for i in range(a, k + 1):
                if i not in m.o:
                    continue
                terms.append((m.o[i], -hmin[i]))
                if k + 1 in m.ev[i]:
                    terms.append((m.ev[i][k + 1], hmin[i]))
            total = sum(hmin[i] for i in range(a, k + 1) if i in m.o)
            if sum(1 for i in range(a, k + 1) if i in m.o) < 2 or total <= sum(bwd[a + 1 : k + 1]) + 1e-12:
                continue
            m.add_row(Row(f"chan_h2d_{a}_{k}", [(bvar[a], 1.0), (bvar[k + 1], -1.0), *terms], -bwd[a], ">=", SECONDS))


def _add_host_budget_row(m: MilpModel, x_terms: dict[int, Terms], host_budget: int | None) -> None:
    """Host budget: sum_i x_i <= H (formulation.md, 'Host budget'). The runtime holds an offloaded layer's host
    buffers from F_i through B_i, so every offloaded byte is on the host at the loss point: the host peak is
    the sum of x_i, one row (None: no row)."""
    if host_budget is None or not x_terms:
        return
    terms = [t for i in sorted(x_terms) for t in x_terms[i]]
    m.add_row(Row("host_budget", terms, -float(host_budget), "<=", BYTE_UNIT))


def _add_knapsack_rows(m: MilpModel, trace: Trace, limit: int, x_terms: dict[int, list[tuple[int, float]]]) -> None:
    """Freed-bytes knapsacks with strengthened coefficients (valid inequalities).

    At each stage the memory row implies: bytes freed by earlier layers >= need (transients + saved bytes
    of layers <= k - the budget), since the other terms (copies still pending, rematerialised segments,
    checkpoint inputs) only add. Each binary's freed bytes are bounded above by a constant times it, and
    in `sum a_j x_j >= need` with binaries a coefficient above `need` may be lowered to `need`: choosing
    that one item alone already satisfies the row. The cumulative A_k hides this structure from the
    solvers; written out, it stops the LP from "recomputing a quarter of a layer" to free exactly the
    bytes it lacks (on the hand-built traces of the tests the LP bound becomes the optimum). On large
    traces each item is small next to the bytes needed, the capping does not bite and the rows only slow
    the LP (ResNet-50: no change in the bound, +45% LP time), so by default they are added up to 60 layers.
    """
    n = trace.n
    sizes = [x.saved_bytes for x in trace.layers]
    cuts = forward_cuts(trace)
    prefix = 0
    for k in range(1, n):
        prefix += sizes[k - 1]
        for stage, transient in (("F", forward_transient(trace, k)), ("B", backward_transient(trace, k))):
            need = transient + prefix + sizes[k] - limit
            if need <= 0:
                continue
            items: list[tuple[int, float]] = []  # (binary, upper bound on the bytes it frees here)
            cut = float(cuts[k]) if stage == "F" else 0.0
            for (a, b), v in m.seg.items():
                # Its layers before k (none at a backward stage inside it: rematerialised), and at F_k, where it
                # contains k, what k's forward under the checkpoint does not hold.
                freed = float(sum(sizes[a : min(b, k - 1) + 1])) if a < k and not (stage == "B" and b >= k) else 0.0
                freed += cut if a <= k <= b else 0.0
                if freed:
                    items.append((v, freed))
            for i, ov in m.o.items():
                if i >= k:
                    continue
                if k <= m.last_stage(i):
                    # Forward: freed only once the copy is done (d_i <= k - 1); backward: offloaded at all.
                    items.append((m.z[i][k - 1] if stage == "F" else ov, float(sizes[i])))
                else:
                    items += x_terms[i]
            coef: dict[int, float] = {}
            for v, c in items:
                coef[v] = min(float(need), coef.get(v, 0.0) + c)
            if sum(coef.values()) < need:
                continue  # cannot be met by this relaxation; the memory row itself will say infeasible
            m.add_row(Row(f"knap_{stage}{k}", [(v, -c) for v, c in coef.items()], float(need), "<=", BYTE_UNIT))
