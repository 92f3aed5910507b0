"""The DP's dominance filter (optimizer/dp/labels.py) drops a label only when another one is at least as
good on every axis: checked against brute force on random label sets, including backlog grids of different
lengths per axis (where a 2-D index sized by one axis read out of bounds and dropped undominated labels)."""

from __future__ import annotations

import numpy as np
import pytest

from memsched.optimizer.dp.labels import Labels, _filter_order, pareto_filter
from memsched.optimizer.dp.problem import AFTER_SEGMENT_BIT

BW = 12e9


def _labels(rng: np.random.Generator, m: int, held_groups: int, unit: int = 1_000_000, young_levels: int = 0) -> Labels:
    retained = rng.integers(0, 6, m).astype(np.int64) * unit
    cost = rng.integers(0, 6, m) * 1e-3
    # Few distinct d2h values and many distinct h2d values: the two axes' grids differ in length.
    d2h = rng.choice([0.0, 4e8, 8e8], m)
    h2d = rng.integers(0, 200, m) * 3e6
    held = rng.integers(0, held_groups, m).astype(np.int64)
    # Link work's bytes in flight (Labels.young): 0, or one of a few sizes.
    young = rng.integers(0, young_levels + 1, m).astype(np.int64) * (unit // 2)
    zeros = np.zeros(m)
    return Labels(
        retained, held, cost, d2h, h2d, zeros.astype(np.int32), zeros.astype(np.int32), zeros.astype(np.int16), young
    )


def _key(lab: Labels, i: int) -> tuple[int, int, float, float, float, int]:
    """Label i's values on every axis the filter compares (to find it among the kept ones)."""
    return (
        int(lab.retained[i]),
        int(lab.held[i]),
        float(lab.cost[i]),
        float(lab.d2h[i]),
        float(lab.h2d[i]),
        int(lab.young[i]),
    )


def _dominated_by(a: int, b: int, lab: Labels) -> bool:
    """Label b makes label a redundant: same held set and bytes in flight, no more retained bytes, and no more
    cost even after a stall draining b's larger backlogs down to a's."""
    if lab.held[a] != lab.held[b] or lab.young[a] != lab.young[b] or lab.retained[b] > lab.retained[a]:
        return False
    extra = max(lab.d2h[b] - lab.d2h[a], 0.0) / BW + max(lab.h2d[b] - lab.h2d[a], 0.0) / BW
    return bool(lab.cost[b] + extra <= lab.cost[a])


# Retained bytes of 2^20 (the packed sort key with all its tie bits), 2^36 (an 80 GB device: the tie bits give
# way to the cost's rank) and 2^49 (no room for 16 bits of cost rank: the lexsort).
UNITS = (1_000_000, 1 << 36, 1 << 49)


@pytest.mark.parametrize("young_levels", [0, 3])
@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("seed", range(12))
def test_pareto_filter_drops_only_dominated_labels(seed: int, unit: int, young_levels: int) -> None:
    rng = np.random.default_rng(seed)
    lab = _labels(rng, 300, held_groups=1 + seed % 3, unit=unit, young_levels=young_levels)
    kept = pareto_filter(lab, BW, BW)
    kept_keys = {_key(kept, i) for i in range(len(kept))}
    for a in range(len(lab)):
        if _key(lab, a) in kept_keys:
            continue
        assert any(_dominated_by(a, b, lab) for b in range(len(lab)) if b != a), f"label {a} dropped undominated"
    # Deterministic: the same input gives the same output (no read of uninitialised memory).
    again = pareto_filter(lab, BW, BW)
    assert np.array_equal(again.retained, kept.retained) and np.array_equal(again.cost, kept.cost)


def test_the_least_retained_label_always_survives() -> None:
    """The case found on ResNet-50: a label retaining nothing, with the largest backlogs, must be kept."""
    retained = np.array([77, 411, 411, 488, 822, 0, 77, 411, 411, 488, 822], np.int64) * 1_000_000
    cost = np.array([0.014009, 0.004303, 0.0, 0.012652, 0.0, 0.0, 0.012652, 0.0, 0.001357, 0.014009, 0.001357])
    d2h = np.array([0, 0, 3.94757792e8, 0, 0, 8.05799584e8, 4.11041792e8, 4.11041792e8, 3.94757792e8, 0, 0])
    h2d = np.array([0, 0, 3.92633792e8, 0, 0, 8.03675584e8, 4.11041792e8, 4.11041792e8, 3.76349792e8, 0, 0])
    z = np.zeros(11)
    lab = Labels(
        retained,
        np.zeros(11, np.int64),
        cost,
        d2h,
        h2d,
        z.astype(np.int32),
        z.astype(np.int32),
        z.astype(np.int16),
        np.zeros(11, np.int64),
    )
    kept = pareto_filter(lab, BW, BW)
    assert 0 in kept.retained.tolist()


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("groups", [1, 2, 5, 40])
def test_the_filter_order_is_by_held_set_then_retained_then_cost(unit: int, groups: int) -> None:
    """The dominance index needs every label's possible dominators before it: same held set, no more retained
    bytes; among equal retained bytes, cheaper first wherever the cost's rank tells them apart."""
    rng = np.random.default_rng(groups)
    lab = _labels(rng, 2000, held_groups=groups, unit=unit)
    order, young_group = _filter_order(lab)
    assert young_group is None  # (no label has bytes in flight)
    assert sorted(order.tolist()) == list(range(len(lab)))
    held, retained, cost = lab.held[order], lab.retained[order], lab.cost[order]
    runs = np.flatnonzero(np.diff(held)) + 1
    assert len(runs) == len(np.unique(held)) - 1  # each held set is one run
    for part in np.split(np.arange(len(lab)), runs):
        assert np.all(np.diff(retained[part]) >= 0)
        ties = part[:-1][np.diff(retained[part]) == 0]
        assert np.all(cost[ties] <= cost[ties + 1])  # costs 1 ms apart: every rank tells them apart


FLAG = int(AFTER_SEGMENT_BIT)


def _flag_dominated_by(a: int, b: int, lab: Labels, flag_bytes: int) -> bool:
    """With flagged labels (AFTER_SEGMENT_BIT, `flag_bytes` more retained if they keep their next layer): b makes a
    redundant when their held sets match less the flag and b's retained bytes, with flag_bytes added where b is
    flagged and a is not, are no more than a's."""
    fa, fb = bool(lab.held[a] & FLAG), bool(lab.held[b] & FLAG)
    if (lab.held[a] & ~FLAG) != (lab.held[b] & ~FLAG) or lab.young[a] != lab.young[b]:
        return False
    if lab.retained[b] + (flag_bytes if fb and not fa else 0) > lab.retained[a]:
        return False
    extra = max(lab.d2h[b] - lab.d2h[a], 0.0) / BW + max(lab.h2d[b] - lab.h2d[a], 0.0) / BW
    return bool(lab.cost[b] + extra <= lab.cost[a])


@pytest.mark.parametrize("young_levels", [0, 2])
@pytest.mark.parametrize("seed", range(12))
def test_flagged_labels_are_dropped_only_by_labels_no_worse_in_every_continuation(seed: int, young_levels: int) -> None:
    """Labels a segment took to a layer that then holds saved-twice bytes (optimizer/dp/problem.py,
    AFTER_SEGMENT_BIT): a flagged label is dropped by any no-worse label of its held set; an unflagged one by a
    flagged label only where that one's retained bytes plus the layer's saved-twice bytes are no more than its
    own. Checked against brute force; and labels across the flag drop one another (fewer survive than where the
    flag splits the held set)."""
    rng = np.random.default_rng(100 + seed)
    lab = _labels(rng, 300, held_groups=1 + seed % 3, young_levels=young_levels)
    lab.held = np.where(rng.random(len(lab)) < 0.5, lab.held | FLAG, lab.held)
    flag_bytes = 1_000_000 * (1 + seed % 2)
    kept = pareto_filter(lab, BW, BW, FLAG, flag_bytes)
    keys = {_key(kept, i) for i in range(len(kept))}
    for a in range(len(lab)):
        if _key(lab, a) not in keys:
            assert any(_flag_dominated_by(a, b, lab, flag_bytes) for b in range(len(lab)) if b != a)
    assert len(kept) < len(pareto_filter(lab, BW, BW))
