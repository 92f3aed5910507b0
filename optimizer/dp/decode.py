"""From a final label back to per-layer decisions (offload timing left to `default_timing`)."""

from __future__ import annotations

from memsched.optimizer.decisions import KEEP, Decision, offload_subset, recompute
from memsched.optimizer.dp.labels import ACTION_KEEP, ACTION_SEGMENT
from memsched.optimizer.dp.problem import DpProblem
from memsched.optimizer.dp.sweep import SweepResult
from memsched.schema import Trace


def decode(trace: Trace, p: DpProblem, res: SweepResult, label: int) -> list[Decision]:
    """Decisions of the plan ending in `label` at boundary n (done-by / prefetch-at unset)."""
    out: list[Decision] = [KEEP] * p.n
    k, i = p.n, label
    while k > 0:
        parent, parent_boundary, action = res.stored[k]
        src, a, up = int(parent_boundary[i]), int(action[i]), int(parent[i])
        if a == ACTION_SEGMENT:
            for m in range(src, k):
                out[m] = recompute(group=src)
        elif a == ACTION_KEEP:
            out[src] = KEEP
        else:
            out[src] = offload_subset(trace, src, p.offload[src][a - 1].tensors)
        k, i = src, up
    return out
