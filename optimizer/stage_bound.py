"""The stage bound: a lower bound on the overhead from each stage's memory alone, with every copy's latency.

At any one stage k, a plan must hold at most the budget, so it frees at least need_k = keep-all's bytes there less
the budget's. Only layers whose saved bytes keep-all holds at k can free them, and each frees at most its saved
bytes: recomputed, for at least its re-run (Layer.rerun_s, or forward_s inside a segment, with the recompute
machinery's share: Trace.segment_rerun_s), less what its segment's checkpoint holds for it past
its own forward; offloaded, by a copy that ends before stage k starts. The copies run one after another on the
device-to-host stream, none before F_0 ends, and each takes the copy latency plus its bytes over the bandwidth, so
freeing z bytes by copies needs at least the fewest layers whose offloadable bytes reach z, each paying the
latency; and since a copy moves whole tensors, they move the least sum of tensors of that many layers that reaches
z, or of any number of layers for one latency more (`CopySums`). The time by which they must end is where stage k
starts in keep-all's timeline (for the loss point and the backward, the end of F_{n-1}: every copy is done by then),
later by the stalls before it, which the overhead pays for. So

    overhead >= min over recompute sets R of  cost(R) + max(0, F_0 end + m(z) x latency + Z(z) / bandwidth - T_k)

where z = need_k - bytes(R), m(z) the fewest copies that hold z and Z(z) >= z the bytes whole tensors move to
free it. The largest over the stages is the bound
(docs/formulation.md, 'The stage bound'). It ignores how the stages share one plan, so it is loose wherever the
fluid sweeps are tight; it is tight where a few copies of large layers, each paying a long latency, are what the
link can do before the peak (bert-large on an H100 at 75%: 1.76 ms a copy, 8.9 ms of bytes; the fluid sweeps
spread the latency over the largest copy's bytes and prove 0.00560 s, this proves 0.006658 s, against the best
plan's 0.006715 s). The recompute sets are a knapsack over bytes rounded up to `cells` steps (which can only lower
it), whose state says whether the layer before is recomputed too (a segment's checkpoint holds its inputs once).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from memsched.optimizer.decisions import ALL_ACTIONS, KEEP
from memsched.optimizer.simulate import (
    checkpoint_input_bytes,
    external_input_bytes,
    forward_stage_memory,
    loss_point_bytes,
    simulate,
)
from memsched.schema import Action, Trace

CELLS = 16384
"""Byte steps of the recompute knapsack, across the largest need, on traces of up to CELL_WORK / CELLS layers
(fewer on longer ones, at least MIN_CELLS): each recomputed layer's bytes are rounded up to them, so the bound
loses at most a step's worth of copy time per recomputed layer. bert-large on an H100 at 75% (need 4.2 GB, a step
of 0.26 MB): 0.006658 s; at 4,096 steps 0.006626 s, at 65,536 0.006663 s, against the best plan's 0.006715 s."""
MIN_CELLS = 2048
CELL_WORK = 1_000_000
"""Layers x steps: the knapsack's work (DenseNet-121's 429 layers: 2,331 steps, 0.1 s in all)."""
SUM_ROWS = 8
"""The copy counts up to which the sums are kept per count of layers (`CopySums.rows`)."""
SUM_BATCH = 32
"""Recompute sets whose copies' sums `_stage_value` reads at once."""
SUM_BITS = 1 << 16
"""Quanta of the copied-bytes sums (`CopySums`) across the largest need, on traces of up to SUM_WORK / SUM_BITS
layers (fewer on longer ones, at least MIN_SUM_BITS): a quantum is the power of two at or below need / bits, so
tensors of power-of-two sizes (a transformer's) lose nothing to it."""
MIN_SUM_BITS = 1 << 12
SUM_WORK = 1 << 23
"""Layers x sum bits: the work of reading the sums at every stage."""


@dataclass(frozen=True)
class StageBound:
    """The stage bound and where it comes from."""

    bound_s: float
    """Seconds of overhead every plan within the budget pays at least (0.0: none proven)."""
    stage: int
    """The stage (0..2n-1: F_0..F_{n-1}, then B_{n-1}..B_0) whose memory proves it; -1 where none does."""
    cells: int = 0
    """Byte steps of its recompute knapsack across the largest need (0: no stage needed one)."""
    complete: bool = True
    """Whether every stage was seen (False: `until` stopped it first, with the stages it had seen)."""


def stage_bound(
    trace: Trace,
    budget_bytes: int,
    allowed: frozenset[Action] = ALL_ACTIONS,
    cells: int | None = None,
    until: float = math.inf,
    floor: float = 0.0,
) -> StageBound:
    """The stage bound (module docstring) for the plans of `allowed` actions. 0.0 on devices whose copies run on
    the compute thread (Device.concurrent_copies false: their copies are priced whole, which this does not model).
    At `until` (time.perf_counter()) it stops and returns the best of the stages it has seen (a stage left out
    only weakens it). `floor`: a bound the caller already holds; a stage that cannot pass it is skipped without
    its value, so the result is at least `floor` (its `stage` -1 where no stage passed it)."""
    n = trace.n
    keep = simulate(trace, [KEEP] * n, None, with_events=False)
    limit = budget_bytes - trace.static.total
    # Stage n-1 is the larger of F_{n-1} and the loss point after it: each must fit, and its copies end earlier.
    held = [float(x) for x in keep.stage_bytes] + [float(loss_point_bytes(trace, [KEEP] * n))]
    held[n - 1] = float(forward_stage_memory(trace, [KEEP] * n)[n - 1])
    need = np.asarray(held) - limit
    if not trace.device.concurrent_copies or need.max() <= 0:
        return StageBound(floor, -1)  # (no stage to read: the floor, as the docstring says)
    if cells is None:
        cells = min(CELLS, max(MIN_CELLS, CELL_WORK // n))
    step = float(need.max()) / cells
    # Recompute items: layer i frees at most its saved bytes, in knapsack steps rounded up, for its re-run. At the
    # stages after it, less what its segment's checkpoint holds for it: its external inputs (charged for every
    # layer of a segment), and where it starts the segment, the outputs of producers it alone reads (a
    # producer read by several layers is charged once, for the earliest segment that reads it).
    recompute_ok = Action.RECOMPUTE in allowed
    readers = [0] * n
    for layer in trace.layers:
        for j in set(layer.deps):
            readers[j] += 1
    weight, weight_on, weight_first = [], [], []
    for i, layer in enumerate(trace.layers):
        on = layer.saved_bytes - external_input_bytes(trace, i)
        alone = sum(checkpoint_input_bytes(trace, j) for j in set(layer.deps) if j < i and readers[j] == 1)
        weight.append(math.ceil(layer.saved_bytes / step))
        weight_on.append(max(0, math.ceil(on / step)))
        weight_first.append(max(0, math.ceil((on - alone) / step)))
    cost = [trace.least_rerun_s(i) for i in range(n)]
    # Offload items: what a copy of layer i can move (the last layer is never offloaded).
    movable = [
        sum(layer.tensors) if Action.OFFLOAD in allowed and i < n - 1 else 0 for i, layer in enumerate(trace.layers)
    ]
    release = trace.layers[0].forward_s  # no copy starts before F_0 ends
    latency = trace.device.copy_latency_s
    bw = trace.device.d2h_bytes_per_s
    loss_end = keep.stage_end[n - 1]
    # Per stage: how many leading layers may be offloaded to free its bytes (the key), whether one more may be
    # recomputed, and by when its copies end. F_t: layers 0..t recomputed (F_t itself holds less under the
    # checkpoint), 0..t-1 offloaded (a copy starts after its layer's forward), copies ending as F_t starts. The
    # loss point (need[2n]): every layer recomputed, all but the last offloaded, copies ending with F_{n-1}. B_j:
    # layers 0..j-1 either way (B_j needs j's own bytes back), copies ending with F_{n-1}.
    stages: dict[int, list[tuple[int, bool, float]]] = {}
    for k in range(2 * n + 1):
        if need[k] <= 0:
            continue
        if k < n:
            off, plus, by = k, True, keep.stage_start[k]
        elif k == 2 * n:
            off, plus, by = n - 1, True, loss_end
        else:
            off, plus, by = 2 * n - 1 - k, False, loss_end
        stages.setdefault(off, []).append((k, plus, by))
    grid = np.arange(cells + 1, dtype=np.float64) * step
    sums = CopySums.for_need(float(need.max()), max(max(layer.tensors, default=0) for layer in trace.layers), n)
    best, where = floor, -1
    # after_kept[y] / after_run[y]: the least re-run time of a recompute set among layers 0..p-1 that frees at least
    # y steps at the stages after them, with layer p-1 kept (or offloaded) / recomputed; `sizes`: the offloadable
    # bytes of layers 0..p-1, largest first.
    after_kept = np.full(cells + 1, np.inf)
    after_kept[0] = 0.0
    after_run = np.full(cells + 1, np.inf)
    sizes = np.zeros(0)
    reach = np.zeros(0)  # what the m largest copies can free
    complete = True
    for p in range(n + 1):
        if p in stages and time.perf_counter() >= until:
            complete = False
            break
        mincost = np.minimum(after_kept, after_run)
        for k, plus, by in stages.get(p, ()):
            # Recompute alone and copies alone are two of the ways to free the need: where either costs no more
            # than the best stage so far, this stage cannot raise the bound.
            alone = mincost[min(cells, math.ceil(need[k] / step))]
            if plus and recompute_ok:
                alone = min(alone, cost[p] + mincost[min(cells, max(0, math.ceil(need[k] / step) - weight[p]))])
            if alone <= best or _copies_alone_within(need[k], reach, sums, release, latency, bw, by, best):
                continue  # recompute alone, or copies alone, free it for no more than the best so far
            costs = mincost
            if plus and recompute_ok:  # layer p, at its own stage: its checkpoint holds nothing yet
                costs = np.minimum(mincost, _with_item(mincost, weight[p], cost[p]))
            value = _stage_value(need[k], grid, costs, reach, sums, release, latency, bw, by, floor=best)
            # Infinite: nothing frees enough there, so no plan fits, which the solve settles before it asks.
            if best < value < math.inf:
                best, where = value, min(k, n - 1)  # the loss point is folded into F_{n-1}
        if p < n:
            if recompute_ok:
                run = np.minimum(
                    _with_item(after_run, weight_on[p], cost[p]), _with_item(after_kept, weight_first[p], cost[p])
                )
                after_kept, after_run = mincost, run
            if movable[p] > 0:
                sizes = np.insert(sizes, int(np.searchsorted(-sizes, -movable[p])), float(movable[p]))
                reach = np.cumsum(sizes)
                sums.add(trace.layers[p].tensors)
    return StageBound(best, where, cells, complete)


def _with_item(mincost: np.ndarray, weight: int, cost: float) -> np.ndarray:
    """mincost's sets, each with one more layer that frees `weight` steps for `cost` seconds."""
    out = np.empty_like(mincost)
    if weight >= len(mincost):
        out[:] = mincost[0] + cost
        return out
    out[:weight] = mincost[0] + cost
    out[weight:] = mincost[: len(mincost) - weight] + cost
    return np.minimum.accumulate(out[::-1])[::-1]  # freeing more also frees at least less


class CopySums:
    """The byte counts that copies can move. A copy moves a subset of its layer's saved tensors (`Layer.tensors`),
    so what m copies free before a stage is a sum of some tensors of at most m layers, never a count in between.
    The sums are bitsets in quanta (each tensor rounded down; `slack`, the bytes the rounding dropped in all), up
    to `top` quanta: every sum up to there is in them, since a subset's partial sums only grow. `rows[m]` holds
    the sums of tensors of at most m layers (m <= SUM_ROWS), `any_layers` those of any number."""

    def __init__(self, quantum: int, top: int, largest: int) -> None:
        self.quantum = quantum
        """Bytes a bit stands for."""
        self.largest = largest
        """The largest tensor's bytes."""
        self.top = top
        """The largest sum kept, in quanta."""
        self.slack = 0
        """Bytes the rounding down dropped, over every tensor added: a real sum exceeds its bits' by at most this."""
        # Bit s of a row: some subset of the tensors (of at most m layers) sums to s quanta, rounded down.
        self.rows = [1] * (SUM_ROWS + 1)
        self.any_layers = 1
        self._mask = (1 << (top + 1)) - 1
        self._next: dict[int, np.ndarray] = {}  # row (-1: any_layers) -> its sums in order, then top + 1

    @classmethod
    def for_need(cls, need: float, largest_tensor: int, n: int) -> CopySums:
        """Sums in quanta of a power of two bytes (`SUM_BITS`), up to the largest need and one tensor more: the
        least subset that reaches a need exceeds it by less than its last tensor. The quantum follows that whole
        range, not the need alone: where the need is a few bytes (a budget just under keep-all's peak) and a
        tensor is hundreds of MiB, quanta of the need's size made bitsets of 10^9 bits, and a 0.2 s solve took 6-80
        s in this bound. (A coarser quantum only rounds more bytes into `slack`: the bound stays a bound.)"""
        bits = min(SUM_BITS, max(MIN_SUM_BITS, SUM_WORK // max(1, n)))
        quantum = 1 << max(0, math.floor(math.log2(max(1.0, (need + largest_tensor) / bits))))
        return cls(quantum, math.ceil(need / quantum) + math.ceil(largest_tensor / quantum) + 1, largest_tensor)

    def add(self, tensors: list[int]) -> None:
        """One more layer whose copies may move any subset of these tensors."""
        steps = []
        for size in tensors:
            whole, dropped = divmod(size, self.quantum)
            self.slack += dropped
            if whole:
                steps.append(whole)
        for m in range(SUM_ROWS, 0, -1):  # from the top, so that rows[m - 1] is still without this layer
            opened = self.rows[m - 1]
            for step in steps:
                opened |= (opened << step) & self._mask
            self.rows[m] |= opened
        for step in steps:
            self.any_layers |= (self.any_layers << step) & self._mask
        self._next = {}

    def _least(self, row: int, rest: np.ndarray) -> np.ndarray:
        """At most the bytes of every sum of `row` (-1: any_layers) that reaches each count in `rest`."""
        bits = self.any_layers if row < 0 else self.rows[row]
        # A subset reaching `rest` bytes keeps at least rest - slack of them in its bits, so its bits reach the
        # first kept sum at or above that (or lie past `top`).
        low = np.maximum(0.0, np.ceil((rest - self.slack) / self.quantum))
        # Past the highest sum not kept, every sum is: there the first one at or above `low` is `low` itself (the
        # common case on long traces, whose many layers' sums fill the range; no need to list them).
        if float(np.min(low)) >= (~bits & self._mask).bit_length():
            return np.maximum(rest, low * self.quantum)
        if row not in self._next:
            raw = np.frombuffer(bits.to_bytes((self.top + 8) // 8, "little"), dtype=np.uint8)
            self._next[row] = np.append(np.flatnonzero(np.unpackbits(raw, bitorder="little")), self.top + 1)
        kept = self._next[row]
        first = kept[np.minimum(np.searchsorted(kept, low, side="left"), len(kept) - 1)]
        return np.maximum(rest, first.astype(np.float64) * self.quantum)

    def copy_seconds(self, rest: np.ndarray, copies: np.ndarray, latency: float, bw: float) -> np.ndarray:
        """For each count in `rest` and the fewest copies that hold it (`copies`): at most the time of every set
        of copies that frees it, one after another, each paying the latency. With c copies they move a sum of at
        most c layers; with more, a sum of any, and one latency more at least."""
        moving = self._least(-1, rest) / bw
        seconds = np.where(copies > SUM_ROWS, copies, copies + 1) * latency + moving
        for c in np.unique(copies[(copies > 0) & (copies <= SUM_ROWS)]):
            at = copies == c
            seconds[at] = np.minimum(seconds[at], c * latency + self._least(int(c), rest[at]) / bw)
        return seconds


def _stage_value(
    need: float,
    grid: np.ndarray,
    mincost: np.ndarray,
    reach: np.ndarray,
    sums: CopySums,
    release: float,
    latency: float,
    bw: float,
    by: float,
    floor: float = -math.inf,
) -> float:
    """The least overhead that frees `need` bytes at one stage: a recompute set (`mincost` over `grid`) and copies
    of the rest (`reach[m-1]`: what the m largest copies can free; `sums`: the byte counts copies of whole
    tensors can move), stalling where they end after `by`. Once a set at or below `floor` is found (the bound so
    far, which this stage then cannot raise) it returns that set's value, which may lie above the least."""
    # Only recompute sets that leave something to copy, or just cover the need, can be the least: past the first
    # grid step at or above `need`, mincost only grows.
    top = min(len(grid), int(np.searchsorted(grid, need, side="left")) + 1)
    rest = need - grid[:top]  # bytes the copies must free after each recompute set
    copies = np.searchsorted(reach, rest, side="left") + 1  # the fewest copies that hold `rest`
    stall = np.maximum(0.0, release + copies * latency + rest / bw - by)
    stall = np.where(rest <= 0, 0.0, np.where(copies > len(reach), np.inf, stall))
    value = mincost[:top] + stall  # copies that move exactly `rest`; whole tensors take no less
    least = float(np.min(value[rest <= 0], initial=np.inf))  # nothing to copy: exact
    # The sets of least value, a batch at a time, until none left has a value below the least found with whole
    # tensors: the rest cannot be less (reading the sums costs, so few sets are read). Only sets whose value lies
    # below the least so far stay candidates (whole tensors take no less than that value), and the batch is
    # picked by a partition, not a sort of them all (most stages end after a batch or two).
    cand = np.flatnonzero((rest > 0) & (value < least))
    while cand.size and least > floor:
        if cand.size > SUM_BATCH:
            picked = np.argpartition(value[cand], SUM_BATCH - 1)[:SUM_BATCH]
            batch = cand[picked]
            rest_of = np.ones(cand.size, dtype=bool)
            rest_of[picked] = False
            cand = cand[rest_of]
        else:
            batch, cand = cand, cand[:0]
        whole = release + sums.copy_seconds(rest[batch], copies[batch], latency, bw) - by
        least = min(least, float(np.min(mincost[batch] + np.maximum(0.0, whole))))
        cand = cand[value[cand] < least]
    return least


def _copies_alone_within(
    need: float, reach: np.ndarray, sums: CopySums, release: float, latency: float, bw: float, by: float, best: float
) -> bool:
    """Whether copies alone free `need` with no more stall than `best`."""
    copies = int(np.searchsorted(reach, need, side="left")) + 1
    if copies > len(reach) or release + copies * latency + need / bw - by > best:
        return False  # moving whole tensors takes no less than moving `need` bytes: no need to read the sums
    seconds = float(sums.copy_seconds(np.asarray([need]), np.asarray([copies]), latency, bw)[0])
    return release + seconds - by <= best


__all__ = ["CELLS", "MIN_CELLS", "CopySums", "StageBound", "stage_bound"]
