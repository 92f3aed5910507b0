"""Label sets of the dynamic program: struct-of-arrays partial plans and their dominance filter.

A label at boundary k (layers 0..k-1 decided) is one partial plan:

- `retained` (int64): bytes that stay on the device through every later stage (kept layers, the part of
  offloaded layers that is not moved, checkpoint inputs held for the rest of the step);
- `held` (int64 bitmask over `DpProblem.crossing[k]`): producers whose outputs a checkpoint already holds,
  so a later segment consuming them adds nothing;
- `cost` (float64): seconds of overhead so far (recompute + stalls);
- `d2h`, `h2d` (float64): fluid copy backlogs in bytes (see docs/formulation.md, 'The memory-state DP');
- `parent`, `parent_boundary`, `action`: back-pointers for decoding (action -1 = a recompute segment from
  `parent_boundary` to k-1, 0 = keep layer k-1, o+1 = offload option o of layer k-1).

Dominance (the Pareto staircase): label A makes label B redundant when A holds a superset of B's checkpoint
producers (here: the same set) and is no worse on retained bytes, cost and both backlogs, because every
later row and every later cost is monotone in each of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Self, TypeVar

import numpy as np
from numba import njit

ACTION_SEGMENT = -1
ACTION_KEEP = 0

_RING = 16
"""How many recent kept labels of the same held set each label is also compared with exactly (catching the
dominations the grid below cannot see: two labels in one grid cell)."""

_GRID = 48
"""Grid lines per backlog axis of the dominance index (quantiles of the labels' backlogs)."""


@dataclass
class Labels:
    """A set of labels (parallel arrays, one entry per label)."""

    retained: np.ndarray
    """int64 bytes retained through every later stage."""
    held: np.ndarray
    """int64 bitmask of checkpoint producers already held (bit order: DpProblem.crossing of the boundary)."""
    cost: np.ndarray
    """float64 seconds of overhead so far."""
    d2h: np.ndarray
    """float64 bytes still to copy device->host."""
    h2d: np.ndarray
    """float64 bytes still to copy host->device (reverse-time backlog)."""
    parent: np.ndarray
    """int32 index of the parent label in its boundary's stored set."""
    parent_boundary: np.ndarray
    """int32 boundary of the parent label."""
    action: np.ndarray
    """int16 transition taken from the parent (ACTION_SEGMENT, ACTION_KEEP or offload option + 1)."""
    young: np.ndarray
    """int64 bytes the plan's latest copy carries at least, while a backlog is left (the link-work relaxation's
    bytes in flight, DpProblem.young_bytes; 0: none counted, and always 0 in the other sweeps)."""

    def __len__(self) -> int:
        return len(self.cost)

    def take(self, idx: np.ndarray) -> Labels:
        return Labels(
            self.retained[idx],
            self.held[idx],
            self.cost[idx],
            self.d2h[idx],
            self.h2d[idx],
            self.parent[idx],
            self.parent_boundary[idx],
            self.action[idx],
            self.young[idx],
        )

    @staticmethod
    def concat(parts: list[Labels]) -> Labels:
        if len(parts) == 1:
            return parts[0]
        return Labels(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))

    @staticmethod
    def empty() -> Labels:
        return Labels(
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            np.zeros(0),
            np.zeros(0),
            np.zeros(0),
            np.zeros(0, np.int32),
            np.zeros(0, np.int32),
            np.zeros(0, np.int16),
            np.zeros(0, np.int64),
        )


_FIELDS = ("retained", "held", "cost", "d2h", "h2d", "parent", "parent_boundary", "action", "young")


@njit(cache=True)
def _fenwick_min(tree: np.ndarray, i: int, j: int) -> float:  # pragma: no cover - compiled
    """Least value stored at cells [1..i] x [1..j]."""
    best = np.inf
    a = i
    while a > 0:
        b = j
        while b > 0:
            best = min(best, tree[a, b])
            b -= b & -b
        a -= a & -a
    return best


@njit(cache=True)
def _fenwick_put(tree: np.ndarray, i: int, j: int, value: float) -> None:  # pragma: no cover - compiled
    rows, cols = tree.shape
    a = i
    while a < rows:
        b = j
        while b < cols:
            tree[a, b] = min(tree[a, b], value)
            b += b & -b
        a += a & -a


@njit(cache=True)
def _pareto_sorted(
    held: np.ndarray,
    retained: np.ndarray,
    cost: np.ndarray,
    d2h: np.ndarray,
    h2d: np.ndarray,
    grid_d: np.ndarray,
    grid_h: np.ndarray,
    d2h_bw: float,
    h2d_bw: float,
    flag: int,
    flag_bytes: int,
) -> np.ndarray:  # pragma: no cover - compiled
    """Keep-mask for labels sorted by (held less `flag`, retained): a label is dropped when an earlier one of
    the same held set (so no more retained bytes) is no worse on cost and both backlogs. A label with `flag`
    set retains `flag_bytes` more if its next layer is kept or offloaded (DpProblem.shared_hold): any earlier
    label may drop it, but it drops an unflagged label only with those bytes added to its own.

    The earlier labels sit in 2-D Fenwick trees of least cost over a grid of backlog values (one of every label,
    one of the unflagged ones): a label is stored at the grid cell just *above* its backlogs and looked up at
    the cell just *below* its own, so any cost found there belongs to a label with backlogs no larger (sound;
    two labels in one cell are left to the ring)."""
    n = len(cost)
    g_d = len(grid_d)
    g_h = len(grid_h)
    keep = np.ones(n, dtype=np.bool_)
    group_mask = ~np.int64(flag)
    # One axis per grid: the two grids differ in length (np.unique merges equal quantiles per axis).
    tree = np.full((g_d + 1, g_h + 1), np.inf)
    any_flag = flag != 0 and flag_bytes > 0
    tree_plain = np.full((g_d + 1, g_h + 1) if any_flag else (1, 1), np.inf)
    ring_c = np.empty(_RING)
    ring_d = np.empty(_RING)
    ring_h = np.empty(_RING)
    ring_r = np.empty(_RING, np.int64)  # retained bytes, plus flag_bytes where flagged (what it may drop)
    fill = 0
    pos = 0
    for i in range(n):
        if i == 0 or (held[i] & group_mask) != (held[i - 1] & group_mask):
            tree[:, :] = np.inf
            tree_plain[:, :] = np.inf
            fill = 0
            pos = 0
        c, d, h = cost[i], d2h[i], h2d[i]
        flagged = any_flag and (held[i] & flag) != 0
        lo_d = np.searchsorted(grid_d, d, side="right")  # grid lines <= d: cells 1..lo_d
        lo_h = np.searchsorted(grid_h, h, side="right")
        if _fenwick_min(tree if flagged or not any_flag else tree_plain, lo_d, lo_h) <= c:
            keep[i] = False
            continue
        dominated = False
        for r in range(fill):
            if not flagged and ring_r[r] > retained[i]:
                continue  # a flagged label with its bytes added retains more than this unflagged one
            # Ring labels are also compared with stalls allowed: one that drains its larger backlogs now
            # (a stall of excess / bandwidth) and still costs no more is at least as good.
            extra = max(ring_d[r] - d, 0.0) / d2h_bw + max(ring_h[r] - h, 0.0) / h2d_bw
            if ring_c[r] + extra <= c:
                dominated = True
                break
        if dominated:
            keep[i] = False
            continue
        up_d = np.searchsorted(grid_d, d, side="left")  # first grid line >= d (its cell is up_d + 1)
        up_h = np.searchsorted(grid_h, h, side="left")
        if up_d < g_d and up_h < g_h:
            _fenwick_put(tree, up_d + 1, up_h + 1, c)
            if any_flag and not flagged:
                _fenwick_put(tree_plain, up_d + 1, up_h + 1, c)
        ring_c[pos] = c
        ring_d[pos] = d
        ring_h[pos] = h
        # Against a flagged label i every earlier one may count (retained[i] is no less): compare bytes only
        # where i is unflagged, by storing a flagged one's retained bytes with flag_bytes added.
        ring_r[pos] = retained[i] + (flag_bytes if flagged else 0)
        pos = (pos + 1) % _RING
        fill = min(fill + 1, _RING)
    return keep


def _grid(values: np.ndarray) -> np.ndarray:
    """0 and quantiles of the positive values (from a sample): the dominance index's grid lines."""
    sample = values[:: max(1, len(values) // 8192)]  # sample first: the mask below is then cheap
    positive = sample[sample > 0]
    lines = np.quantile(positive, np.linspace(0.0, 1.0, _GRID - 1)) if len(positive) else np.zeros(0)
    return np.unique(np.concatenate([[0.0], lines]))


def _held_groups(held: np.ndarray) -> tuple[np.ndarray | None, int]:
    """Group number of each label's held set (None: all equal) and the number of groups. A boundary has few
    distinct held sets, so peeling them off one at a time beats sorting the whole array (np.unique)."""
    first = held[0]
    rest = held != first
    if not rest.any():
        return None, 1
    group = np.zeros(len(held), dtype=np.int64)
    groups = 1
    while rest.any() and groups < 16:
        value = held[int(np.argmax(rest))]
        members = held == value
        group[members] = groups
        rest &= ~members
        groups += 1
    if rest.any():  # many distinct sets: one sort is cheaper
        _, group = np.unique(held, return_inverse=True)
        groups = int(group.max()) + 1
    return group, groups


def pareto_filter(
    labels: Labels, d2h_bw: float = np.inf, h2d_bw: float = np.inf, flag: int = 0, flag_bytes: int = 0
) -> Labels:
    """The labels no other label dominates (up to the ring's reach for unsettled ones), sorted by
    (held, retained). Labels with held bit `flag` retain `flag_bytes` more if they keep or offload their next
    layer (DpProblem.shared_hold, AFTER_SEGMENT_BIT): they are compared with the others of their held set as
    _pareto_sorted says."""
    if len(labels) <= 1:
        return labels
    flag = flag if flag_bytes > 0 else 0
    order, young_group = _filter_order(labels, flag)
    # Labels of one held set whose latest copies differ (Labels.young) do not compare: each (held set, young) pair
    # is a group of its own, numbered below `flag`'s bit.
    held = labels.held[order] if young_group is None else young_group[order] | (labels.held[order] & flag)
    keep = _pareto_sorted(
        held,
        labels.retained[order],
        labels.cost[order],
        labels.d2h[order],
        labels.h2d[order],
        _grid(labels.d2h),
        _grid(labels.h2d),
        d2h_bw,
        h2d_bw,
        flag,
        flag_bytes,
    )
    return labels.take(order[keep])


def _filter_order(labels: Labels, flag: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
    """Order by (held set less `flag`, young bytes, retained bytes, cost): one stable sort of a packed int64 key
    where it fits, a lexsort otherwise. Within a tie of the key the order only affects how many dominated labels
    the Fenwick grid and the ring catch, never which undominated ones survive (see _scramble). Also each label's
    group number where some label has young bytes (None: the held sets alone are the groups)."""
    group, groups = _held_groups(labels.held & ~np.int64(flag) if flag else labels.held)
    young_group = None
    if labels.young.any():
        levels, rank = np.unique(labels.young, return_inverse=True)
        young_group = (group if group is not None else np.zeros(len(labels), np.int64)) * len(levels) + rank
        group, groups = young_group, groups * len(levels)
    # The key's bits, high to low: the held group (as few bits as the groups need), retained bytes, the cost's
    # rank within [min, max] in what is left of 63 (the key is a signed int64; at most 40), then the tie bits.
    # Where fewer than 16 bits are left for the cost, the tie bits give way first (down to _MIN_TIE_BITS): the
    # lexsort fallback costs about 3x the packed sort (PipeDream ResNet-50 at 3.7 GiB, two held sets and
    # 32-bit retained bytes: 8.2 against 2.6 ms for 125,000 labels).
    group_bits = 0 if group is None else (groups - 1).bit_length()
    spare = 63 - group_bits - int(labels.retained.max()).bit_length()
    tie_bits = min(_TIE_BITS, max(_MIN_TIE_BITS, spare - _MIN_COST_BITS))
    cost_bits = min(spare - tie_bits, 40)
    if cost_bits < _MIN_COST_BITS:
        lex = np.lexsort((labels.cost, labels.retained, group if group is not None else np.zeros(len(labels))))
        return lex, young_group
    c = labels.cost
    lo, hi = float(c.min()), float(c.max())
    scale = float((1 << cost_bits) - 1) / (hi - lo) if hi > lo else 0.0
    key = (labels.retained << (cost_bits + tie_bits)) | (((c - lo) * scale).astype(np.int64) << tie_bits)
    key |= _scramble(len(key)) >> (_TIE_BITS - tie_bits)
    if group is not None:
        key |= group.astype(np.int64) << (63 - group_bits)
    # Stable (timsort): the parts concatenated (the children of one boundary's labels, emitted in this order)
    # arrive as long sorted runs, which it merges in about half the time of the default quicksort.
    return np.argsort(key, kind="stable"), young_group


_TIE_BITS = 8
"""Low bits of the sort key that order ties (labels of equal retained bytes and cost rank) by _scramble."""
_MIN_TIE_BITS = 4
"""The fewest tie bits _filter_order packs, where the cost's rank needs the room."""
_MIN_COST_BITS = 16
"""The fewest bits of cost rank _filter_order packs; with fewer it sorts by a lexsort of the full values."""


def _scramble(m: int) -> np.ndarray:
    """_TIE_BITS bits per position 0..m-1, spread by a multiplicative hash (deterministic). Ties in emission
    order keep far more labels on some traces: keep and offload children of one parent share its cost, and the
    dominance index then meets them in an order that catches few (synthetic 200-layer chain at 20%, threshold
    0.0195 s: 27.8M labels and the cap at layer 137, against 18.0M and the whole sweep in 28 s scrambled).
    Against the default quicksort, side by side in one process, best of 3 on one core: DenseNet-121 at 25%
    3.39 -> 2.92 s, a 60-layer chain 4.00 -> 2.91 s, that 200-layer chain 33-35 -> 28 s, PipeDream ResNet-50 at
    6.7 GiB 2.03 -> 1.99 s and at 4.5 GiB 4.11 -> 4.47 s (within noise, perhaps 5% slower)."""
    h = np.arange(m, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return (h >> np.uint64(64 - _TIE_BITS)).astype(np.int64)


class _Beamable(Protocol):
    """Labels a beam can cut: the fluid sweep's (Labels) and the FIFO sweep's (fifo.FifoLabels)."""

    retained: np.ndarray

    def __len__(self) -> int: ...

    def take(self, idx: np.ndarray) -> Self: ...


_B = TypeVar("_B", bound=_Beamable)


def beam_select(labels: _B, width: int, score: np.ndarray) -> _B:
    """At most `width` labels spread along the retained-bytes axis: the best-scoring of each of `width` runs
    of equal count in retained order, so the beam keeps both cheap-but-full and costly-but-lean plans."""
    if len(labels) <= width:
        return labels
    order = np.argsort(labels.retained, kind="stable")
    edges = np.linspace(0, len(order), width + 1).astype(np.int64)
    starts = edges[:-1][edges[1:] > edges[:-1]]
    cost_sorted = score[order]
    # Each run's first label at its least score (np.argmin's choice), for all runs at once: a loop of argmins over
    # thousands of short runs took half of a 1,000-label beam's time on DenseNet-121 (0.77 of 1.66 s).
    run = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(order))))
    at_min = np.flatnonzero(cost_sorted == np.minimum.reduceat(cost_sorted, starts)[run])
    _, first = np.unique(run[at_min], return_index=True)
    picks = np.append(order[at_min[first]], np.argmin(score))
    return labels.take(np.unique(picks.astype(np.int64)))
