"""The trace as the dynamic program reads it: flat numpy arrays, precomputed once per (trace, budget).

Everything here is a restatement of docs/cost-model.md in array form; the transients come from the
simulator's own functions, so a change to the cost model's per-stage terms reaches the DP unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from memsched.optimizer.dp.future import (
    FUTURE,
    GRID_POINTS,
    LOSS,
    LOSS_PENDING,
    PENDING_B,
    PENDING_F,
    REACH,
    TABLES,
    future_table,
)
from memsched.optimizer.simulate import (
    backward_transient,
    checkpoint_state_bytes,
    code_hold_until,
    external_input_bytes,
    forward_cuts,
    forward_transient,
    loss_point_transient,
    own_output_read_by_all,
)
from memsched.schema import Trace

MAX_HELD_BITS = 61
"""Producers tracked per boundary in a label's held-set mask (an int64 bitmask). Beyond this the DP treats
the extra producers as already held: optimistic for the bound, and the simulator judges the schedule."""

SIDE_HELD_BIT = np.int64(1) << np.int64(MAX_HELD_BITS)
"""Held-mask flag of a label some of whose recompute segments hold side inputs (DpProblem.side): from the loss
point through the backward of the segment's first layer, its checkpoint keeps them (simulate.side_input_hold), so
the label's rows B_k from here on and its loss point hold `side` more. Above every producer bit; the remaps keep
it."""

AFTER_SEGMENT_BIT = np.int64(1) << np.int64(MAX_HELD_BITS + 1)
"""Held-mask flag of a label at boundary c that arrived by a recompute segment ending at c - 1, set only where
DpProblem.shared_hold[c] > 0: keeping or offloading c then retains those bytes too. Above every producer bit,
so remap_held drops it at the next boundary. The dominance filters compare flagged and unflagged labels of one
held set asymmetrically (labels.pareto_filter, fifo_kernels.dominance_fifo)."""

MAX_OFFLOAD_OPTIONS = 64
"""Distinct offloaded byte counts tried per layer (subset sums of its saved tensors). A layer with more is
searched over its largest ones only, and the DP's bound is then not claimed (it would not cover every subset)."""


_NO_BIT = 63
"""remap_held's shift for a producer that does not cross the source boundary: the sign bit, 0 in every held mask
(producer bits and AFTER_SEGMENT_BIT lie below it)."""
_BIT_AT = np.arange(64, dtype=np.int64)
"""Each bit position of a held mask, as the shifts remap_held moves bits by."""
_REMAP_AT_ONCE = 1 << 16
"""remap_held moves every bit of every label in one array op up to this many (label, bit) pairs; above it, one op per
bit over all labels (no labels x bits temporary of more than half a MB)."""


@dataclass(frozen=True)
class OffloadOption:
    """One way to offload part of a layer: the bytes moved and which tensors carry them."""

    nbytes: int
    """Bytes offloaded: a distinct subset sum of the layer's saved tensors; on a relaxed option, the largest
    sum of its range (the bytes it frees)."""
    tensors: tuple[int, ...]
    """Indices of the tensors offloaded (the subset with the fewest tensors that sums to `nbytes`; on a
    relaxed option, a subset reaching the top of its range: what a decoded plan offloads)."""
    copied: int | None = None
    """Relaxed options only (relaxed_problem): the least sum of the range of subset sums the option stands for.
    It frees `nbytes` but its copies carry only `copied` bytes, so it is at least as good as every subset in
    its range (docs/formulation.md, 'Many saved tensors: relaxed offload ranges'). None: an exact option."""

    @property
    def copy_bytes(self) -> int:
        """Bytes the option's copies carry (its device->host and host->device backlogs grow by this)."""
        return self.nbytes if self.copied is None else self.copied


@dataclass
class DpProblem:
    """Per-layer arrays of one trace under one budget (index = layer, forward order)."""

    n: int
    """Number of layers."""
    limit: int
    """Budget minus static bytes: what activations, copies and transients may use at any stage."""
    saved: np.ndarray
    """int64 saved bytes s_i."""
    fwd: np.ndarray
    """float64 forward seconds f_i."""
    rerun: np.ndarray
    """float64 re-run seconds of layer i as a recompute segment's last layer (Layer.rerun_s, <= f_i), with the
    recompute machinery's share of the layer and of the whole segment (Trace.rerun_layer_s, rerun_segment_s): a
    segment [k..b] costs rerun_fwd_prefix[b] - rerun_fwd_prefix[k] + rerun[b] (Trace.segment_rerun_s)."""
    rerun_fwd_prefix: np.ndarray
    """float64 prefix sums (length n + 1) of what each layer costs as a segment's other layer: f_i and the
    machinery's share of a layer. fwd_prefix where the trace measured no machinery."""
    rerun_least: np.ndarray
    """float64 the least re-running layer i costs in any segment (Trace.least_rerun_s). The bounds price a
    recomputed layer at this (the future table)."""
    bwd: np.ndarray
    """float64 backward seconds."""
    trans_f: np.ndarray
    """int64 transient bytes during F_i (forward workspace + output)."""
    trans_f_rec: np.ndarray
    """int64 trans_f less the forward cut (simulate.forward_cuts): row F_i of a recomputed layer is
    saved + trans_f_rec, its forward under the checkpoint (may be negative; the sum is not)."""
    trans_b: np.ndarray
    """int64 transient bytes during B_i (workspace + output gradient + input gradient; the loss at n-1)."""
    output: np.ndarray
    """int64 output bytes of each layer that a checkpoint holds when a later segment consumes it
    (simulate.checkpoint_input_bytes and checkpoint_own_inputs): all of them, less, where the layer's own saved
    tensors hold only part of its output (Layer.output_saved_bytes) or not every reader reads that part
    (Layer.output_saved_readers), that part whatever the layer does (a relaxation: see `output_relaxed`)."""
    keep_holds_output: np.ndarray
    """bool per layer: its own saved tensors hold all its output, so keeping it holds what a later segment's
    checkpoint would: the keep transition marks it held (`keep_bit`) and no segment charges it again."""
    external: np.ndarray
    """int64 bytes each layer reads that no traced layer produced (held per segment)."""
    input_saved: np.ndarray
    """int64 bytes of each layer's saved tensors that are its inputs (Layer.input_saved_bytes): a segment [k..b]
    re-runs k, which saves the storages its checkpoint holds, so rows B_m (k < m <= b) count them once
    (simulate.rerun_input_overlap)."""
    shared_hold: np.ndarray
    """int64 bytes layer c holds from F_c through B_c where it is kept or offloaded and layer c - 1, one of its
    producers, is recomputed: its Layer.shared_input_bytes (simulate.shared_input_holders). Rows F_c and B_c
    have them already (the consumer's workspace); the labels past c retain them (AFTER_SEGMENT_BIT). The
    simulator also charges them where only an earlier producer is recomputed: the DP leaves that out, a
    relaxation (docs/cost-model.md, 'Saved twice')."""
    deps: list[list[int]]
    """Producers of each layer."""
    consumers: list[list[int]]
    """Consumers of each layer's output."""
    offload: list[list[OffloadOption]]
    """Offload choices of each layer (empty where offloading cannot lower any stage: no bytes, last layer)."""
    offload_complete: bool
    """False when some layer had more distinct subset sums than MAX_OFFLOAD_OPTIONS (bound not exhaustive)."""
    crossing: list[list[int]]
    """crossing[k], k = 0..n: producers j < k with a consumer >= k, sorted; the bit order of the held mask."""
    held_complete: bool
    """False when some boundary had more than MAX_HELD_BITS crossing producers (see MAX_HELD_BITS)."""
    serial: bool
    """Copies run on the compute thread (device.concurrent_copies false): every copy is a stall, exactly."""
    d2h_bw: float
    """Device-to-host bytes per second."""
    h2d_bw: float
    """Host-to-device bytes per second."""
    latency: float
    """Fixed seconds per copy (exact on serial devices and in the FIFO sweep; in the fluid sweep, through
    fluid_d2h_bw / fluid_h2d_bw)."""
    fluid_d2h_bw: float
    """Device-to-host bytes per second as the fluid sweep drains them: each copy's latency spread over its bytes
    as if it carried the most any copy does (all of a layer's saved tensors; fluid_bandwidth), so no real copy
    moves its bytes faster. d2h_bw on serial devices (their copies are priced exactly, latency included)."""
    fluid_h2d_bw: float
    """Host-to-device bytes per second as the fluid sweep drains them (as fluid_d2h_bw)."""
    saved_prefix: np.ndarray
    """int64 prefix sums of `saved` (length n + 1)."""
    fwd_prefix: np.ndarray
    """float64 prefix sums of `fwd` (length n + 1)."""
    bwd_prefix: np.ndarray
    """float64 prefix sums of `bwd` (length n + 1): the reverse clock of the backward (the FIFO sweep)."""
    row_floor: np.ndarray
    """int64, length n + 1: the least any stage of layers >= k needs beyond the retained bytes
    (max over m >= k of s_m + max(transients), and the loss point's transient at boundary n, where what a
    label retains is what the loss point holds); a label retaining more than limit - row_floor[k] is dead."""
    future: np.ndarray
    """float64 (n + 1, GRID_POINTS + 1): future[k, g] is a lower bound on the cost still to come for a label
    at boundary k retaining at least g * future_step bytes (optimizer/dp/future.py)."""
    future_pending: np.ndarray
    """float64 (2, n + 1, GRID_POINTS + 1): the forward rows [0] and the backward rows [1] of `future` alone, by
    retained plus pending copy bytes, no row out of reach (future_table's PENDING_F / PENDING_B; zeros where
    copies are serial or the time was short: always valid). See pending_bound."""
    future_step: float
    """Bytes between grid points of `future`."""
    _remaps: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    """remap_held's lookup table of the last source boundary: each producer's bit in crossing[src], _NO_BIT where it
    does not cross src (the sweeps ask for one source's many destinations in a row: a recompute segment's ends)."""
    _crossing_at: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    """crossing[k] as an int64 array, per boundary k asked for (remap_held)."""
    _crossing_csr: list[np.ndarray] = field(default_factory=list, repr=False)
    """crossing as [offsets (n + 2), producers]: row k is producers[offsets[k]:offsets[k + 1]], built on the first
    remap_to_ends (empty until then)."""
    _keep_bits: dict[int, np.int64] = field(default_factory=dict, repr=False)
    """Cache of keep_bit's bits."""
    recompute: bool = True
    """Whether plans may recompute (the solve options' actions); False: the sweeps emit no segments. (Without
    offload, `offload` is empty for every layer.) The future-cost table assumes every action, so it stays a
    valid lower bound under either restriction."""
    seg_last: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """int64 per layer k: the last layer a recompute segment starting at k may end at (Trace.segment_last: the
    replay cannot run one past code that saves between two layers). Empty: any layer up to n - 1."""
    ckpt_state: int = 0
    """Bytes each recompute segment [k..b] holds from F_k through B_k beyond its inputs: the RNG state its
    checkpoint stashes (simulate.checkpoint_state_bytes; nonzero on a trace measured on the CPU)."""
    snap_prefix: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    """int64 n + 1 prefix sums of each layer's changed buffers (Layer.changed_buffer_bytes: BatchNorm's running
    statistics), which a recomputed layer i snapshots from F_i until its segment's backward ends (B_k) and whose
    private copies its re-run saves from B_b through B_i (simulate._stage_memory). Segment [k..b] thus holds
    S(k..m) more in row F_m, S(k..b) + S(k..m) more in row B_m, and S(k..b) in every row after it (the kernels'
    `snap_prefix`; docs/formulation.md, 'Snapshots of changed buffers'). Zeros: no layer changes a buffer."""
    ctx_prefix: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    """int64 n + 1 prefix sums of each layer's bytes kept on a custom autograd Function's ctx (Layer.ctx_held_bytes):
    a segment [k..b]'s re-run makes them again in row B_b, beside its forked RNG state (simulate.rerun_fork_bytes;
    the kernels' `ctx_prefix`). Zeros: no layer keeps any."""
    side: int = 0
    """Bytes of side inputs (Layer.side_input_bytes: masks, rotary tables) that a recompute segment's checkpoint
    keeps from the loss point through the backward of its first layer, charged to labels with SIDE_HELD_BIT at
    their rows B_k and loss point: the least any layer reads (simulate.side_input_hold charges one set, the
    largest of the segments' layers'; all layers of a decoder read the same tensors, where the two agree). 0: no
    layer reads any."""
    side_layer: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))
    """bool per layer: it reads side inputs (a segment containing it sets SIDE_HELD_BIT). Empty: none does."""
    output_relaxed: bool = False
    """Some layer's saved tensors hold part of its output: `output` leaves that part out even where the layer is
    not kept (the simulator charges it there); or some layer saves an output that a layer past the next reads,
    which the model's code keeps in the forward where the layer does not (simulate.skip_holds), or that a
    reader does not save again, which its checkpoint holds in its own backward (simulate.
    checkpoint_backward_holds): the DP leaves those out. Bounds hold, but the decoded optimum is not claimed
    exact."""
    host_price: float = 0.0
    """Seconds charged per offloaded byte (each offload option adds host_price x its copied bytes to a label's
    cost): the Lagrangian price of the host budget (optimizer/host.py). Prices are >= 0 and only add to costs,
    so the future-cost table stays a lower bound; 0: the plain problem."""
    relaxed: bool = False
    """Some layer's offload options are relaxed ranges (OffloadOption.copied; relaxed_problem): a problem for
    bounds. Its sweeps' bounds hold for every schedule, but a plan they decode is rounded to real subsets
    (the simulator judges it), so its optimum is not claimed as the fluid optimum."""
    link_work: bool = False
    """The link-work relaxation (`link_work_problem`): an offload frees its bytes at once, and its copies owe
    their links `latency + bytes / bw` seconds of work each, carried in the backlogs as bytes at the links' own
    bandwidth (`latency_bytes`). Backlogs then hold no memory (no row caps them), and the links' work is
    priced per copy, exactly, instead of spread over the largest copy's bytes (fluid_d2h_bw). A bound only:
    docs/formulation.md, 'The link-work sweep'."""
    in_flight: bool = False
    """Link work with the latest copy's bytes in flight (Labels.young, `young_bytes`): while a backlog is left, a
    row holds the bytes of the plan's latest copy, or stalls until that backlog is empty (docs/formulation.md,
    'Bytes in flight under link work'). A label carries one more value, so its sweeps keep more labels."""
    beam_future: np.ndarray = field(default_factory=lambda: np.zeros((3, 0, 0)))
    """float64 (4, n + 1, GRID_POINTS + 1): future_table's FUTURE, PENDING_F, PENDING_B and LOSS, the tables the beams
    rank and prune by (`for_beams`): `future` and `future_pending` without the loss point's row (LOSS apart) and without
    the forward rows' reach and holds (REACH). A beam keeps a few labels per run of retained bytes, and what it keeps
    shifts with whatever it prunes, so a stronger table moves its answers either way (bert-large on an H200 at 65%:
    0.00925 -> 0.00963 s; at 55% 0.01241 -> 0.01195 s): its series run as before, and one more runs with the row where
    it decides (`loss_row_decides`). Empty: the same as `future`."""

    def remap_held(self, held: np.ndarray, src: int, dst: int) -> np.ndarray:
        """Held masks re-expressed from crossing[src] bit order in crossing[dst] bit order (producers that no
        longer cross dst drop out; SIDE_HELD_BIT stays)."""
        lookup = self._source_bits(src)
        at = self._crossing_at.get(dst)
        if at is None:
            at = self._crossing_at[dst] = np.asarray(self.crossing[dst], dtype=np.int64)
        shift = lookup[at]  # bit q at dst is bit shift[q] at src (_NO_BIT: always 0 in a mask)
        if len(held) * len(shift) <= _REMAP_AT_ONCE:
            # Few labels (a beam's): one pass over a labels x bits array, not a numpy call per bit (on the
            # 1,000-layer synthetic DAG, ~60 bits a boundary, the per-bit loop took 35 of a 24-label beam's 44 s).
            if not len(shift):
                return held & SIDE_HELD_BIT
            moved = ((held[:, None] >> shift) & 1) << _BIT_AT[: len(shift)]
            return np.bitwise_or.reduce(moved, axis=1).astype(held.dtype, copy=False) | (held & SIDE_HELD_BIT)
        out = held & SIDE_HELD_BIT
        for q, b in enumerate(shift.tolist()):
            if b != _NO_BIT:
                out |= ((held >> b) & 1) << q
        return out

    def _source_bits(self, src: int) -> np.ndarray:
        """Each producer's bit in crossing[src], _NO_BIT where it does not cross src (one source kept: `_remaps`)."""
        lookup = self._remaps.get(src)
        if lookup is None:
            self._remaps.clear()
            lookup = np.full(self.n + 1, _NO_BIT, dtype=np.int64)
            lookup[self.crossing[src]] = np.arange(len(self.crossing[src]))
            self._remaps[src] = lookup
        return lookup

    def remap_to_ends(self, held: np.ndarray, src: int, dst: np.ndarray) -> np.ndarray:
        """remap_held then after_segment for labels that recompute segments from `src` take to boundaries `dst`
        (one per label), in one compiled pass: per destination in Python, the two took 2.2 of a 24-label beam's
        7.1 s on the 1,000-layer synthetic DAG (140,000 destinations)."""
        from memsched.optimizer.dp.kernels import remap_to_ends

        if not self._crossing_csr:
            offsets = np.zeros(self.n + 2, dtype=np.int64)
            offsets[1:] = np.cumsum([len(c) for c in self.crossing])
            flat = np.array([j for c in self.crossing for j in c], dtype=np.int64)
            self._crossing_csr.extend((offsets, flat))
        offsets, flat = self._crossing_csr
        return remap_to_ends(
            held,
            dst,
            self._source_bits(src),
            offsets,
            flat,
            self.shared_hold,
            self.n,
            AFTER_SEGMENT_BIT,
            SIDE_HELD_BIT,
            _NO_BIT,
        )

    def segment_last(self, k: int) -> int:
        """The last layer a recompute segment starting at k may end at (`seg_last`); k - 1 (no segment) where plans
        may not recompute (`recompute`)."""
        if not self.recompute:
            return k - 1
        return int(self.seg_last[k]) if len(self.seg_last) else self.n - 1

    def after_segment(self, held: np.ndarray, dst: int) -> np.ndarray:
        """`held` (crossing[dst] order) of labels that a recompute segment ending at dst - 1 takes to boundary
        dst, flagged (AFTER_SEGMENT_BIT) where layer dst holds bytes for it if not recomputed (shared_hold)."""
        return held | AFTER_SEGMENT_BIT if dst < self.n and self.shared_hold[dst] else held

    def shared_held(self, held: np.ndarray, k: int) -> np.ndarray:
        """What keeping or offloading layer k adds to retained bytes for labels with `held`: shared_hold[k] where
        the label arrived by a segment ending at k - 1 (AFTER_SEGMENT_BIT)."""
        return np.where(held & AFTER_SEGMENT_BIT, self.shared_hold[k], 0)

    def keep_bit(self, k: int) -> np.int64:
        """The held-mask bit (crossing[k + 1] order) that keeping layer k sets: its own saved tensors hold its
        whole output from F_k through B_k, which covers every later checkpoint's hold of it (0: none)."""
        if not self.keep_holds_output[k]:
            return np.int64(0)
        bits = self._keep_bits.get(k)
        if bits is None:
            row = self.crossing[k + 1]
            bits = np.int64(1) << np.int64(row.index(k)) if k in row else np.int64(0)
            self._keep_bits[k] = bits
        return bits

    def segment_inputs(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """For segments starting at k: per layer b >= k, the held-mask bits (crossing[k] order) of the
        producers before k that it reads; and each bit's output bytes."""
        bits_at = np.zeros(self.n - k, dtype=np.int64)
        for bit, j in enumerate(self.crossing[k]):
            for c in self.consumers[j]:
                if c >= k:
                    bits_at[c - k] |= np.int64(1) << np.int64(bit)
        return bits_at, np.array([self.output[j] for j in self.crossing[k]], dtype=np.int64)

    def backlog_bound(self, k: int, d2h: np.ndarray, h2d: np.ndarray) -> np.ndarray:
        """Seconds of stall that labels at boundary k (before F_k's and B_k's compute) pay whatever they do next
        for the fluid backlogs they carry: the D2H link drains only during the forwards of layers k.. and forward
        stalls, and must be empty when the forward ends; the H2D link, in reverse time, only during the backwards
        of layers k.., recomputations and backward stalls, each second of which is paid. The two links' stalls
        fall in the forward and the backward: they add."""
        return np.maximum(d2h / self.fluid_d2h_bw - self.fwd_left[k], 0.0) + np.maximum(
            h2d / self.fluid_h2d_bw - self.bwd_left[k], 0.0
        )

    @property
    def fwd_left(self) -> np.ndarray:
        """float64, length n + 1: forward seconds of layers k..n-1."""
        return self.fwd_prefix[self.n] - self.fwd_prefix

    @property
    def bwd_left(self) -> np.ndarray:
        """float64, length n + 1: backward seconds of layers k..n-1."""
        return self.bwd_prefix[self.n] - self.bwd_prefix

    def pending_bound(self, k: int, retained: np.ndarray, d2h: np.ndarray, h2d: np.ndarray) -> np.ndarray:
        """The future table's forward / backward rows for labels at boundary k whose copies still hold `d2h` bytes
        on the forward clock and `h2d` on the reverse one (fluid backlogs, or fifo_kernels.pending_bytes): those
        bytes hold memory until the link moves them, ahead of any later copy."""
        g_last = self.future.shape[1] - 1
        g_f = np.minimum(((retained + d2h) / self.future_step).astype(np.int64), g_last)
        g_b = np.minimum(((retained + h2d) / self.future_step).astype(np.int64), g_last)
        return np.maximum(self.future_pending[0, k][g_f], self.future_pending[1, k][g_b])

    @property
    def exact_plans(self) -> bool:
        """Whether its plans are priced as the simulator prices them, up to their copies' timing: every offload
        subset enumerated and every output hold priced (not a relaxation's plans)."""
        return self.offload_complete and not self.output_relaxed

    @property
    def loss_row_decides(self) -> bool:
        """Whether the future table's loss-point row raises its root entry by over LOSS_ROW_GAIN: where the loss's
        own bytes make the loss point the peak (a language model's logits)."""
        if self.beam_future.size == 0:
            return False
        with_loss = max(self.beam_future[FUTURE, 0, 0], self.beam_future[LOSS, 0, 0])
        return bool(with_loss > self.beam_future[FUTURE, 0, 0] * (1.0 + LOSS_ROW_GAIN))

    def for_beams(self, loss_row: bool = False) -> DpProblem:
        """This problem as the beams see it (`beam_future`): its future tables without the loss point's row, or with
        it (`loss_row`), and in both without the forward rows' reach and holds (future_table's REACH)."""
        if self.beam_future.size == 0:
            return self
        return dataclasses.replace(
            self,
            future=np.maximum(self.beam_future[FUTURE], self.beam_future[LOSS])
            if loss_row
            else self.beam_future[FUTURE],
            future_pending=self.future_pending if loss_row else self.beam_future[PENDING_F : PENDING_B + 1],
            beam_future=np.zeros((3, 0, 0)),
            _remaps={},
        )

    def latency_bytes(self) -> tuple[float, float]:
        """What one copy's latency adds to the D2H / H2D backlogs: bytes at the link's bandwidth in the link-work
        relaxation, 0 otherwise (the fluid sweep spreads latency through fluid_d2h_bw)."""
        if not self.link_work:
            return 0.0, 0.0
        return self.latency * self.d2h_bw, self.latency * self.h2d_bw

    def young_bytes(self, copied: int) -> int:
        """Labels.young of a copy carrying `copied` bytes under link work: rounded down to one of YOUNG_LEVELS
        steps per doubling (fewer distinct values, so more labels compare in the dominance filter; rounding
        down only loosens the rows), and 0 below YOUNG_MIN_SHARE of the limit (they hardly ever decide a row)."""
        if not self.in_flight or copied <= self.limit * YOUNG_MIN_SHARE:
            return 0
        level = math.floor(math.log2(copied) * YOUNG_LEVELS)
        return min(int(2.0 ** (level / YOUNG_LEVELS)), int(copied))

    def future_bound(self, k: int, retained: np.ndarray) -> np.ndarray:
        """The future-cost bound of labels at boundary k (grid point at or below their retained bytes)."""
        g = np.minimum((retained / self.future_step).astype(np.int64), self.future.shape[1] - 1)
        return self.future[k][np.maximum(g, 0)]


@functools.lru_cache(maxsize=256)
def _offload_options(tensors: tuple[int, ...]) -> tuple[list[OffloadOption], bool]:
    """Every distinct subset sum of the positive tensors, with the smallest subset reaching it; and whether
    the list is exhaustive (otherwise it is MAX_OFFLOAD_OPTIONS real subsets spread over the layer's bytes,
    `_spread_options`)."""
    positive = [(q, t) for q, t in enumerate(tensors) if t > 0]
    few = _few_sums(positive)
    if few is not None:
        return [OffloadOption(nbytes, subset) for nbytes, subset in sorted(few.items())], True
    return _spread_options(positive), False


def _spread_options(positive: list[tuple[int, int]]) -> list[OffloadOption]:
    """Real subsets whose sums spread over the layer's saved bytes, for a layer with too many distinct sums to
    try: in each of MAX_OFFLOAD_OPTIONS equal byte ranges, the largest sum found, with a subset of few tensors.
    The plans (beams, local search) may then offload all of a layer or any part of it to within a range; the
    largest sums of subsets of a few tensors, the list before, left bert-large's blocks (19 tensors, 545 MiB)
    177-352 MiB only. The subset-sum program (tensors largest first) keeps, once its sums grow many, the least and
    the largest sum of each range of a quarter of that width, so it stays small; the sums it keeps are real, and
    the largest (the whole layer) is always one. Measured against half of them spread and half the few-tensor
    sums (2026-12-06): the same answers on the GPU decoder traces but bert-large on an H200 at 25%, where the half
    and half lost 1.15% (0.021844 -> 0.022097 s, both runs), so all 64 are spread."""
    total = sum(t for _, t in positive)
    fine = 4 * MAX_OFFLOAD_OPTIONS
    # The program's items: each size's tensors in binary chunks (1, 2, 4, ... of them, then the rest), so that any
    # number of them is a set of chunks: an unrolled recurrent layer (512 steps of 8 tensors) is 80 items, not 4,096.
    items: list[tuple[int, list[int]]] = []  # (bytes, the tensors of the chunk)
    by_size: dict[int, list[int]] = {}
    for q, t in positive:
        by_size.setdefault(t, []).append(q)
    for t, qs in by_size.items():
        at, width = 0, 1
        while at < len(qs):
            chunk = qs[at : at + width]
            items.append((t * len(chunk), chunk))
            at, width = at + len(chunk), 2 * width
    items.sort(key=lambda item: -item[0])
    # The program's states: distinct sums (sorted), each with its fewest tensors and a node of the witness forest
    # (node m: item item_of[m] added to the subset of node parent_of[m]; -1: the empty subset), in arrays.
    sums, counts, nodes = np.zeros(1, np.int64), np.zeros(1, np.int64), np.full(1, -1, np.int64)
    parent_of: list[np.ndarray] = []
    item_of: list[np.ndarray] = []
    made = 0
    for i, (nbytes, chunk) in enumerate(items):
        parent_of.append(nodes)
        item_of.append(np.full(len(nodes), i, np.int64))
        fresh = np.arange(made, made + len(nodes), dtype=np.int64)
        made += len(nodes)
        all_sums = np.concatenate([sums, sums + nbytes])
        all_counts = np.concatenate([counts, counts + len(chunk)])
        all_nodes = np.concatenate([nodes, fresh])
        order = np.lexsort((all_counts, all_sums))  # by sum, the fewest tensors first
        all_sums, all_counts, all_nodes = all_sums[order], all_counts[order], all_nodes[order]
        keep = np.r_[True, all_sums[1:] != all_sums[:-1]]  # each sum once, with its fewest tensors
        if keep.sum() > 4 * fine:  # per fine range, only its least and its largest sum
            ranges = all_sums * fine // total
            keep = np.r_[True, ranges[1:] != ranges[:-1]]
            largest = all_sums[np.r_[ranges[:-1] != ranges[1:], True]]
            keep[np.searchsorted(all_sums, largest)] = True
        sums, counts, nodes = all_sums[keep], all_counts[keep], all_nodes[keep]
    parents = np.concatenate(parent_of) if parent_of else np.zeros(0, np.int64)
    item_at = np.concatenate(item_of) if item_of else np.zeros(0, np.int64)
    ranges = (sums - 1) * MAX_OFFLOAD_OPTIONS // total  # range c holds (c, c + 1] x total / MAX_OFFLOAD_OPTIONS
    tops = np.flatnonzero((sums > 0) & np.r_[ranges[:-1] != ranges[1:], True])  # the largest sum of each range
    options = []
    for i in tops.tolist():
        subset: list[int] = []
        m = int(nodes[i])
        while m >= 0:
            subset += items[int(item_at[m])][1]
            m = int(parents[m])
        options.append(OffloadOption(int(sums[i]), tuple(sorted(subset))))
    return options


def _few_sums(positive: list[tuple[int, int]]) -> dict[int, tuple[int, ...]] | None:
    """Every distinct subset sum with a subset of fewest tensors reaching it, where there are at most
    MAX_OFFLOAD_OPTIONS (None otherwise). A sum-by-sum dynamic program: a layer of 22 tensors in a few sizes
    (GPT-2's blocks: 53 distinct sums) has too many subsets to list but few sums."""
    by_sum: dict[int, tuple[int, ...]] = {0: ()}
    for q, t in positive:
        for total, subset in list(by_sum.items()):
            have = by_sum.get(total + t)
            if have is None or len(have) > len(subset) + 1:
                by_sum[total + t] = (*subset, q)
        if len(by_sum) > MAX_OFFLOAD_OPTIONS + 1:
            return None
    del by_sum[0]
    return {total: tuple(sorted(subset)) for total, subset in by_sum.items()}


def _may_offload(trace: Trace, i: int) -> bool:
    """Whether offloading layer i can lower any stage: it saves bytes and is not the last layer (whose interior is
    empty)."""
    return i < trace.n - 1 and trace.layers[i].saved_bytes > 0


def _relaxed_layers(trace: Trace) -> list[tuple[int, ...]]:
    """The saved tensors of each layer that may offload and has more distinct subset sums than
    MAX_OFFLOAD_OPTIONS: the layers relaxed_problem relaxes."""
    return [
        tensors
        for i, x in enumerate(trace.layers)
        if _may_offload(trace, i) and not _offload_options(tensors := tuple(x.tensors))[1]
    ]


def offload_enumerable(trace: Trace) -> bool:
    """Whether every layer's offload subsets can be tried (at most MAX_OFFLOAD_OPTIONS distinct sums each): the
    problem's offload_complete, without building it. False: its bounds come from relaxed_problem."""
    return not _relaxed_layers(trace)


def build_problem(trace: Trace, budget_bytes: int, deadline: float | None = None) -> DpProblem:
    """Arrays of `trace` under `budget_bytes` (the budget is already known to be feasible). `deadline`
    (time.perf_counter()): the future-cost table is left out (zeros, always a valid bound) where its
    estimated cost exceeds a quarter of the time left."""
    n = trace.n
    layers = trace.layers
    saved = np.array([x.saved_bytes for x in layers], dtype=np.int64)
    fwd = np.array([x.forward_s for x in layers], dtype=np.float64)
    # A re-run layer's share of the recompute machinery, and the segment's, on its last layer: Trace.segment_rerun_s.
    machinery, per_segment = trace.rerun_layer_s, trace.rerun_segment_s
    rerun = np.array([x.rerun_s for x in layers], dtype=np.float64) + machinery + per_segment
    rerun_least = np.array([trace.least_rerun_s(i) for i in range(n)], dtype=np.float64)
    bwd = np.array([x.backward_s for x in layers], dtype=np.float64)
    trans_f = np.array([forward_transient(trace, i) for i in range(n)], dtype=np.int64)
    trans_b = np.array([backward_transient(trace, i) for i in range(n)], dtype=np.int64)
    offload: list[list[OffloadOption]] = []
    complete = True
    for i, layer in enumerate(layers):
        if not _may_offload(trace, i):
            offload.append([])
            continue
        opts, ok = _offload_options(tuple(layer.tensors))  # cached: a model repeats its blocks
        offload.append(list(opts))
        complete &= ok
    last_use = [-1] * n
    consumers: list[list[int]] = [[] for _ in range(n)]
    for c, layer in enumerate(layers):
        for j in layer.deps:
            last_use[j] = max(last_use[j], c)
            consumers[j].append(c)
    # crossing[k]: producers j < k still read at or after k, built in one pass (the set at k + 1 is the set
    # at k less those last read at k, plus k itself if read later), so it stays sorted and costs O(n + sizes).
    crossing: list[list[int]] = [[]]
    for k in range(n):
        crossing.append([j for j in crossing[k] if last_use[j] >= k + 1] + ([k] if last_use[k] >= k + 1 else []))
    held_complete = all(len(c) <= MAX_HELD_BITS for c in crossing)
    crossing = [c[:MAX_HELD_BITS] for c in crossing]
    # Layers whose checkpoint inputs the DP prices exactly: the output they save themselves is all or none of
    # it, and every reader of their outputs reads it. Elsewhere `output` leaves that part out (a relaxation).
    by_all = own_output_read_by_all(trace)
    whole = [x.output_saved in (0, x.output_bytes) and by_all[j] for j, x in enumerate(layers)]
    # Row F_i of a recomputed layer holds its forward under the checkpoint, less than a kept one's.
    trans_f_rec = trans_f - np.array(forward_cuts(trace), dtype=np.int64)
    # The least any action of layer i needs (row_floor and the future bound are lower bounds over actions).
    need = saved + np.maximum(trans_f_rec, trans_b)
    row_floor = np.zeros(n + 1, dtype=np.int64)
    # Boundary n is the loss point: what a label retains there is what is held across it (simulate's
    # loss_point_bytes), and every label retains at least as much at n as at any earlier boundary.
    row_floor[n] = loss_point_transient(trace)
    for k in range(n - 1, -1, -1):
        row_floor[k] = max(row_floor[k + 1], need[k])
    limit = budget_bytes - trace.static.total
    future_step = max(1.0, limit / GRID_POINTS)
    # The most one copy carries: a layer's offloaded tensors leave in one copy (the simulator's), at most all of
    # its saved tensors.
    largest = max(
        (sum(t for t in x.tensors if t > 0) for i, x in enumerate(layers) if _may_offload(trace, i)), default=0
    )
    fluid_d2h_bw, fluid_h2d_bw = (
        (trace.device.d2h_bytes_per_s, trace.device.h2d_bytes_per_s)
        if not trace.device.concurrent_copies
        else (
            fluid_bandwidth(trace.device.d2h_bytes_per_s, trace.device.copy_latency_s, largest),
            fluid_bandwidth(trace.device.h2d_bytes_per_s, trace.device.copy_latency_s, largest),
        )
    )
    window, stride = _future_rows(n)

    concurrent = trace.device.concurrent_copies
    # What the model's code holds of each layer's own saved output whatever the layer does, and through which
    # forward row (simulate.skip_holds): the future table's forward rows cannot free it.
    hold_until = np.array(code_hold_until(trace), dtype=np.int64)
    hold = np.array([x.output_saved for x in layers], dtype=np.int64)

    def tables(window: int, stride: int, boundaries: np.ndarray, pending: bool) -> np.ndarray:
        return future_table(
            saved,
            fwd,
            rerun_least,
            bwd,
            trans_f_rec,
            trans_b,
            limit,
            not concurrent,
            fluid_d2h_bw,
            fluid_h2d_bw,
            future_step,
            GRID_POINTS,
            window,
            stride,
            boundaries,
            pending,
            hold,
            hold_until,
            int(row_floor[n]),
        )

    root_only = np.zeros(1, dtype=np.int64)
    if n <= FUTURE_MAX_LAYERS and _future_affordable(n, window, stride, deadline):
        # The pending tables triple the rows evaluated: only where that too is affordable.
        pending = concurrent and _future_affordable(n, window, stride, deadline, rows_per_row=3)
        built = tables(window, stride, np.arange(n), pending)
        if window < n and _future_affordable(1, n, 1, deadline, n):
            # The root with every row: one boundary is cheap, and its bound is the one reported where no sweep
            # finishes (synthetic 1,000-layer DAG at 20%: 0.0736 -> 0.0739 s).
            every = tables(n, 1, root_only, False)
            for t in (FUTURE, REACH):
                built[t, 0] = np.maximum(built[t, 0], every[t, 0])
    elif _future_affordable(1, n, 1, deadline, n):
        # Beyond FUTURE_MAX_LAYERS (or its time) the whole table costs too much, its root row alone does not: a
        # true bound where the sweep cannot finish (synthetic 3,000-layer chain at 20%: 0 -> 0.211 s, 0.2 s).
        # The other rows stay 0, a valid bound that prunes nothing.
        built = tables(n, 1, root_only, False)
    else:  # no time even for its root: no future bound (zeros are always valid)
        built = np.zeros((TABLES, n + 1, GRID_POINTS + 1))
    # The bound is the largest row: the loss point's too, and the forward rows with the link's reach and the code's
    # holds. The beams rank without them (`for_beams`; with the loss row: `beam_future[LOSS]`).
    future = np.maximum(np.maximum(built[FUTURE], built[LOSS]), built[REACH])
    future_pending = built[PENDING_F : PENDING_B + 1].copy()
    future_pending[0] = np.maximum(future_pending[0], built[LOSS_PENDING])
    return DpProblem(
        n=n,
        limit=limit,
        saved=saved,
        fwd=fwd,
        rerun=rerun,
        bwd=bwd,
        trans_f=trans_f,
        trans_f_rec=trans_f_rec,
        trans_b=trans_b,
        output=np.array(
            [x.output_bytes - (0 if whole[j] else x.output_saved) for j, x in enumerate(layers)], dtype=np.int64
        ),
        keep_holds_output=np.array([whole[j] and x.output_saved > 0 for j, x in enumerate(layers)], dtype=np.bool_),
        output_relaxed=not all(whole) or _unpriced_holds_possible(trace),
        external=np.array([external_input_bytes(trace, i) for i in range(n)], dtype=np.int64),
        input_saved=np.array([x.input_saved for x in layers], dtype=np.int64),
        shared_hold=np.array(
            [x.shared_input if c > 0 and c - 1 in x.deps else 0 for c, x in enumerate(layers)], dtype=np.int64
        ),
        deps=[list(x.deps) for x in layers],
        consumers=consumers,
        offload=offload,
        offload_complete=complete,
        crossing=crossing,
        held_complete=held_complete,
        serial=not trace.device.concurrent_copies,
        d2h_bw=trace.device.d2h_bytes_per_s,
        h2d_bw=trace.device.h2d_bytes_per_s,
        latency=trace.device.copy_latency_s,
        fluid_d2h_bw=fluid_d2h_bw,
        fluid_h2d_bw=fluid_h2d_bw,
        saved_prefix=np.concatenate([[0], np.cumsum(saved)]).astype(np.int64),
        fwd_prefix=np.concatenate([[0.0], np.cumsum(fwd)]),
        rerun_fwd_prefix=np.concatenate([[0.0], np.cumsum(fwd + machinery)]),
        rerun_least=rerun_least,
        bwd_prefix=np.concatenate([[0.0], np.cumsum(bwd)]),
        row_floor=row_floor,
        future=future,
        future_pending=future_pending,
        future_step=future_step,
        beam_future=built[FUTURE : LOSS + 1],
        ckpt_state=checkpoint_state_bytes(trace),
        snap_prefix=np.concatenate([[0], np.cumsum([x.changed_buffers for x in layers])]).astype(np.int64),
        ctx_prefix=np.concatenate([[0], np.cumsum([x.ctx_held for x in layers])]).astype(np.int64),
        seg_last=np.array(trace.segment_last(), dtype=np.int64),
        side=min((x.side_input for x in layers if x.side_input > 0), default=0),
        side_layer=np.array([x.side_input > 0 for x in layers], dtype=np.bool_),
    )


LOSS_ROW_GAIN = 0.01
"""`loss_row_decides`: the share by which the loss point's row must raise the root entry of the future table."""


def fluid_bandwidth(bytes_per_s: float, latency_s: float, largest_bytes: int) -> float:
    """The link's bandwidth in the fluid sweep where each copy also waits `latency_s`: a copy of b <= L bytes
    (L = `largest_bytes`, the most one copy carries) takes latency + b / bw >= b x (1 / bw + latency / L)
    seconds, so the link drained at 1 / (1 / bw + latency / L) bytes per second moves every copy's bytes no later
    than the real link does, and the fluid sweep stays a relaxation (docs/formulation.md, 'Copy latency in the
    fluid sweep'). It matters where latency x bw is not small against the largest copy."""
    if latency_s <= 0.0 or largest_bytes <= 0 or not math.isfinite(bytes_per_s):
        return bytes_per_s
    slowed = 1.0 / (1.0 / bytes_per_s + latency_s / largest_bytes)
    return slowed if slowed <= (1.0 - _FLUID_MIN_SLOWDOWN) * bytes_per_s else bytes_per_s


_FLUID_MIN_SLOWDOWN = 0.01
"""fluid_bandwidth keeps the link's own bandwidth unless latency slows it by at least this share: the bound gains
less than that, and a drain rate that is not the profile's own splits backlogs that its round figures keep
equal, which the dominance filter pays for (PipeDream ResNet-50 at 56%, 10 us: a 0.03% slower link tripled the
exact sweep's labels, 2.0M -> 5.9M, and lost its proof at 10 s)."""


def _unpriced_holds_possible(trace: Trace) -> bool:
    """Whether some plan meets simulate.skip_holds or simulate.checkpoint_backward_holds, which the DP leaves out:
    both need an output the model's code holds once its layer lets go of it (simulate.code_hold_until)."""
    return any(until >= 0 for until in code_hold_until(trace))


YOUNG_LEVELS = 2
"""Steps per doubling of DpProblem.young_bytes, each at most 29% below the bytes it stands for. Measured (pruned at
the bench's answers, one core): 1 step (powers of two) leaves ResNet-50 on an H100 at 25% and on an H200 at 50% just
short of their proofs (0.156820 / 0.014096 s against 0.157330 / 0.014842 s); 2-4 steps prove both, and the sweep
on bert-large on an H200 at 35% takes 2.6 s at 1 and 2 steps, 3.0-3.3 s at 3 and 4."""
YOUNG_MIN_SHARE = 1 / 32
"""Copies below this share of the limit count no bytes in flight (DpProblem.young_bytes): fewer distinct values
(GPT-2 medium on an H100 at 45%, the bytes in powers of two: 8.5 s against 13.3 s from 1 / 256), and the copies that
decide rows are larger (bert-large on an H200 at 35%: its optimum as before)."""


FUTURE_MAX_LAYERS = 2000
"""Traces up to this many layers get a future-cost bound at every boundary (about 0.5 s at 1,000 layers on one
core); longer ones at the root only (about 0.2 s at 3,000 layers)."""


_FUTURE_OPS_PER_S = 3e8
"""Measured speed of future_table on one core of the benchmark machine: (row evaluations x (n + grid)) per
second (2,000 layers, 196 rows each: 3.0 s)."""


def _future_affordable(
    boundaries: int, window: int, stride: int, deadline: float | None, n: int | None = None, rows_per_row: int = 1
) -> bool:
    """Whether the future-cost table's estimated cost, at `boundaries` boundaries of a trace of `n` layers
    (default: every boundary, n = boundaries), fits in a quarter of the time left. `rows_per_row`: row
    evaluations per row read (3 with the pending tables)."""
    if deadline is None:
        return True
    n = boundaries if n is None else n
    rows = rows_per_row * min(n, window + n // stride)
    estimate_s = boundaries * rows * (n + GRID_POINTS) / _FUTURE_OPS_PER_S
    return estimate_s <= 0.25 * (deadline - time.perf_counter())


def _future_rows(n: int) -> tuple[int, int]:
    """(window, stride) of the rows the future-cost bound evaluates from each boundary: every row on traces
    of up to 300 layers; beyond, the next 96 rows and then every stride-th, about 100 in all."""
    if n <= 300:
        return n, 1
    return 96, max(1, n // 100)


RELAXED_CELLS = 12
"""Byte ranges a layer's offload amounts are relaxed into (relaxed_problem): each range's option frees its
largest subset sum and copies its least, so the error per option is at most about 1/RELAXED_CELLS of the
layer's saved bytes. Fewer ranges make fewer labels; more make a tighter bound (docs/formulation.md)."""
_MAX_SUMS = 1 << 17
"""Distinct subset sums enumerated per layer by relaxed_options (the largest tensors first); the smaller
tensors left over form a continuous tail."""


@functools.lru_cache(maxsize=256)
def relaxed_options(tensors: tuple[int, ...], cells: int = RELAXED_CELLS) -> list[OffloadOption]:
    """At most `cells` relaxed options (plus one for the tail alone) that together dominate every nonempty
    subset of `tensors`: each subset's sum lies in some option's [copied, nbytes]. The distinct subset sums
    of the largest tensors (up to _MAX_SUMS of them: repeated sizes keep them few) are enumerated and grouped
    into equal byte ranges of the layer's total; the tensors left over (the smallest) may be added to any
    subset, so each range's top grows by their sum."""
    positive = sorted(((t, q) for q, t in enumerate(tensors) if t > 0), reverse=True)
    total = sum(t for t, _ in positive)
    if total <= 0:
        return []
    sums = np.zeros(1, dtype=np.int64)
    masks = [0]  # a subset reaching each sum, as a bit set of positions in `positive` (Python ints: any width)
    used = 0
    for j, (t, _) in enumerate(positive):
        both = np.concatenate([sums, sums + t])
        distinct, first = np.unique(both, return_index=True)  # sorted; the first subset found is kept
        if len(distinct) > _MAX_SUMS and j > 0:
            break
        masks = [masks[i] if i < len(sums) else masks[i - len(sums)] | (1 << j) for i in first.tolist()]
        sums, used = distinct, j + 1
    tail = positive[used:]
    tail_bytes = sum(t for t, _ in tail)
    tail_idx = tuple(q for _, q in tail)
    # Range c holds the sums in (c, c + 1] x total / cells; sums are sorted, so each range's members are a run
    # whose first is its least sum and last its largest (sums[0] = 0 is the tail-only option below).
    cell = ((sums[1:] - 1) * cells) // total
    starts = np.flatnonzero(np.diff(cell, prepend=-1))
    ends = np.append(starts[1:], len(cell)) - 1
    options: list[OffloadOption] = []
    for first_i, last_i in zip(starts.tolist(), ends.tolist(), strict=True):
        mask = masks[last_i + 1]
        subset = tuple(q for j, (_, q) in enumerate(positive[:used]) if (mask >> j) & 1) + tail_idx
        lo, hi = int(sums[first_i + 1]), int(sums[last_i + 1]) + tail_bytes
        options.append(OffloadOption(hi, tuple(sorted(subset)), copied=lo))
    if tail:  # subsets of the tail alone
        options.append(OffloadOption(tail_bytes, tuple(sorted(tail_idx)), copied=min(t for t, _ in tail)))
    return sorted(options, key=lambda o: (o.nbytes, o.copy_bytes))


NEAR_EXACT_SHARE = 1.0 / 256
"""A relaxation is near exact when each of its options stands for subset sums that differ by at most this share
of their layer's saved bytes (near_exact_cells): finer ranges would then move each option by less."""


def near_exact_cells(trace: Trace, candidates: Sequence[int]) -> int | None:
    """The fewest byte ranges among `candidates` at which relaxed_problem is near exact: every relaxed layer's
    options each span at most NEAR_EXACT_SHARE of the layer's saved bytes (hi - lo, docs/formulation.md, 'Many
    saved tensors'). A layer whose tensors repeat a few sizes, as a transformer block's do, has subset sums in a
    few dozen tight clusters (the small tensors' sums spread each one a little), and the ranges that hold one
    cluster each are nearly exact. None: no candidate is (sums spread evenly), or nothing is relaxed."""
    relaxed = _relaxed_layers(trace)
    if not relaxed:
        return None
    for cells in sorted(candidates):
        if all(
            max(o.nbytes - o.copy_bytes for o in relaxed_options(tensors, cells))
            <= NEAR_EXACT_SHARE * sum(t for t in tensors if t > 0)
            for tensors in relaxed
        ):
            return cells
    return None


def relaxed_problem(p: DpProblem, trace: Trace, cells: int = RELAXED_CELLS) -> DpProblem:
    """`p` with the offload options of every layer that has more subset sums than MAX_OFFLOAD_OPTIONS
    relaxed into `cells` byte ranges (relaxed_options): its sweeps then cover every subset, so their bounds
    hold (offload_complete), at the price of a little optimism per relaxed layer. `p` itself where nothing
    needs relaxing. The arrays are shared with `p` (read-only)."""
    if p.offload_complete:
        return p
    offload: list[list[OffloadOption]] = []
    for i, opts in enumerate(p.offload):
        complete = not opts or _offload_options(tuple(trace.layers[i].tensors))[1]
        offload.append(opts if complete else list(relaxed_options(tuple(trace.layers[i].tensors), cells)))
    return dataclasses.replace(p, offload=offload, offload_complete=True, relaxed=True, _remaps={})


def link_work_problem(p: DpProblem, in_flight: bool = False) -> DpProblem:
    """`p` under the link-work relaxation (DpProblem.link_work): links drained at their own bandwidth, each copy's
    latency in its backlog, backlogs that hold no memory, and no future rows by pending bytes (`future_pending`
    zero: pending backlogs are link work, not bytes); with `in_flight`, rows that hold the latest copy's bytes
    while a backlog is left (DpProblem.in_flight). `p` itself on a device whose copies are serial (priced
    exactly there already)."""
    if p.serial:
        return p
    return dataclasses.replace(
        p,
        link_work=True,
        in_flight=in_flight,
        fluid_d2h_bw=p.d2h_bw,
        fluid_h2d_bw=p.h2d_bw,
        future_pending=np.zeros_like(p.future_pending),
        _remaps={},
    )
