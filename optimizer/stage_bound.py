"""The stage bound: a lower bound on the overhead from each stage's memory alone, with every copy's latency.

At any one stage k, a plan must hold at most the budget, so it frees at least need_k = keep-all's bytes there less
the budget's. Only layers whose saved bytes keep-all holds at k can free them, and each frees at most its saved
bytes: recomputed, for at least its re-run (Layer.rerun_s), less what its segment's checkpoint holds for it past
its own forward; offloaded, by a copy that ends before stage k starts. The copies run one after another on the
device-to-host stream, none before F_0 ends, and each takes the copy latency plus its bytes over the bandwidth, so
freeing z bytes by copies needs at least the fewest layers whose offloadable bytes reach z, each paying the
latency. The time by which they must end is where stage k starts in keep-all's timeline (for the loss point and
the backward, the end of F_{n-1}: every copy is done by then), later by the stalls before it, which the overhead
pays for. So

    overhead >= min over recompute sets R of  cost(R) + max(0, F_0 end + m(z) x latency + z / bandwidth - T_k)

where z = need_k - bytes(R) and m(z) the fewest copies that hold z. The largest over the stages is the bound
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


@dataclass(frozen=True)
class StageBound:
    """The stage bound and where it comes from."""

    bound_s: float
    """Seconds of overhead every plan within the budget pays at least (0.0: none proven)."""
    stage: int
    """The stage (0..2n-1: F_0..F_{n-1}, then B_{n-1}..B_0) whose memory proves it; -1 where none does."""


def stage_bound(
    trace: Trace,
    budget_bytes: int,
    allowed: frozenset[Action] = ALL_ACTIONS,
    cells: int | None = None,
    until: float = math.inf,
) -> StageBound:
    """The stage bound (module docstring) for the plans of `allowed` actions. 0.0 on devices whose copies run on
    the compute thread (Device.concurrent_copies false: their copies are priced whole, which this does not model).
    At `until` (time.perf_counter()) it stops and returns the best of the stages it has seen (a stage left out
    only weakens it)."""
    n = trace.n
    keep = simulate(trace, [KEEP] * n, None, with_events=False)
    limit = budget_bytes - trace.static.total
    # Stage n-1 is the larger of F_{n-1} and the loss point after it: each must fit, and its copies end earlier.
    held = [float(x) for x in keep.stage_bytes] + [float(loss_point_bytes(trace, [KEEP] * n))]
    held[n - 1] = float(forward_stage_memory(trace, [KEEP] * n)[n - 1])
    need = np.asarray(held) - limit
    if not trace.device.concurrent_copies or need.max() <= 0:
        return StageBound(0.0, -1)
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
    cost = [layer.rerun_s for layer in trace.layers]
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
    best, where = 0.0, -1
    # after_kept[y] / after_run[y]: the least re-run time of a recompute set among layers 0..p-1 that frees at least
    # y steps at the stages after them, with layer p-1 kept (or offloaded) / recomputed; `sizes`: the offloadable
    # bytes of layers 0..p-1, largest first.
    after_kept = np.full(cells + 1, np.inf)
    after_kept[0] = 0.0
    after_run = np.full(cells + 1, np.inf)
    sizes = np.zeros(0)
    reach = np.zeros(0)  # what the m largest copies can free
    for p in range(n + 1):
        if p in stages and time.perf_counter() >= until:
            break
        mincost = np.minimum(after_kept, after_run)
        for k, plus, by in stages.get(p, ()):
            # Recompute alone and copies alone are two of the ways to free the need: where either costs no more
            # than the best stage so far, this stage cannot raise the bound.
            alone = mincost[min(cells, math.ceil(need[k] / step))]
            if plus and recompute_ok:
                alone = min(alone, cost[p] + mincost[min(cells, max(0, math.ceil(need[k] / step) - weight[p]))])
            if alone <= best or _copies_alone(need[k], reach, release, latency, bw, by) <= best:
                continue  # recompute alone, or copies alone, free it for no more than the best so far
            costs = mincost
            if plus and recompute_ok:  # layer p, at its own stage: its checkpoint holds nothing yet
                costs = np.minimum(mincost, _with_item(mincost, weight[p], cost[p]))
            value = _stage_value(need[k], grid, costs, reach, release, latency, bw, by)
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
    return StageBound(best, where)


def _with_item(mincost: np.ndarray, weight: int, cost: float) -> np.ndarray:
    """mincost's sets, each with one more layer that frees `weight` steps for `cost` seconds."""
    out = np.empty_like(mincost)
    if weight >= len(mincost):
        out[:] = mincost[0] + cost
        return out
    out[:weight] = mincost[0] + cost
    out[weight:] = mincost[: len(mincost) - weight] + cost
    return np.minimum.accumulate(out[::-1])[::-1]  # freeing more also frees at least less


def _stage_value(
    need: float,
    grid: np.ndarray,
    mincost: np.ndarray,
    reach: np.ndarray,
    release: float,
    latency: float,
    bw: float,
    by: float,
) -> float:
    """The least overhead that frees `need` bytes at one stage: a recompute set (`mincost` over `grid`) and copies
    of the rest (`reach[m-1]`: what the m largest copies can free), stalling where they end after `by`."""
    # Only recompute sets that leave something to copy, or just cover the need, can be the least: past the first
    # grid step at or above `need`, mincost only grows.
    top = min(len(grid), int(np.searchsorted(grid, need, side="left")) + 1)
    rest = need - grid[:top]  # bytes the copies must free after each recompute set
    copies = np.searchsorted(reach, rest, side="left") + 1  # the fewest copies that hold `rest`
    stall = np.maximum(0.0, release + copies * latency + rest / bw - by)
    stall = np.where(rest <= 0, 0.0, np.where(copies > len(reach), np.inf, stall))
    return float(np.min(mincost[:top] + stall))


def _copies_alone(need: float, reach: np.ndarray, release: float, latency: float, bw: float, by: float) -> float:
    """The stall of freeing `need` bytes by copies alone (inf: they cannot)."""
    copies = int(np.searchsorted(reach, need, side="left")) + 1
    if copies > len(reach):
        return math.inf
    return max(0.0, release + copies * latency + need / bw - by)


__all__ = ["CELLS", "MIN_CELLS", "StageBound", "stage_bound"]
