"""The ratio plan: a second constructive start, built for long traces whose copy link is the bottleneck.

Where copies run beside compute and the budget is tight, a good plan offloads what the link can carry and
recomputes the rest, choosing for recompute the layers that free the most bytes per second of re-run (a copy's
bytes cost link time whatever the layer, but a re-run costs the layer's own forward). The greedy (`heuristic.py`)
commits one cheapest change at a time and meets the link's saturation late, so on long chains it recomputes far
more than that split needs.

The family has two parameters:
- k: recompute the k layers cheapest per byte freed (`_recompute_order`), each as a segment of its own;
- the tail: offload each layer not recomputed whole up to the tail, keep it from there on (or keep every layer, where
  offload is not allowed). The last layers' copies would still be queued when the backward needs them back, so
  past some point an offload only adds to the link's backlog.

Each member is scored by the compiled simulator (`FastSim`: the simulator's own rules and default timing): a coarse
scan over both, a finer one around the best, then every k near it. The best member that fits is the candidate;
where none fits there is none. Measured (2026-11-30, one core): the 1,000-layer synthetic chain at 20%, greedy
0.400 s, this plan 0.123 s in 0.33 s (about 2,000 members); the DAG 0.590 / 0.164 s; the 200-layer chain 0.121 /
0.037 s. On DenseNet-121 no layer frees bytes when recomputed alone (its concatenations' inputs are larger than
what they save), so the family is offload-then-keep there and loses to the greedy.
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from memsched.optimizer.decisions import ALL_ACTIONS, KEEP, Decision, offload_all, recompute
from memsched.optimizer.fastsim import KIND_KEEP, KIND_OFFLOAD, KIND_START, FastSim
from memsched.optimizer.simulate import SimResult, checkpoint_input_bytes, external_input_bytes, simulate
from memsched.schema import Action, Trace

_COARSE_K = 32
"""Points of the first scan over k (recomputed layers)."""
_COARSE_TAIL = 50
"""Points of the first scan over the kept tail (module docstring)."""
_FINE = 8
"""The finer scans divide the coarse steps by this."""


def _recompute_order(trace: Trace) -> list[int]:
    """Layers that free bytes when recomputed as a segment of their own, cheapest re-run per byte freed first,
    picked one at a time. What one frees: its saved bytes less what its checkpoint then holds (the outputs of
    producers that no earlier pick's checkpoint holds already, and its external inputs): the simulator holds a
    producer's output once for all the segments reading it. So on a DAG a skip's producer, once held for one reader,
    costs its other readers nothing, and they move up (the 1,000-layer synthetic DAG at 20%: this plan 0.1709 ->
    0.1639 s; a chain has one reader per output and the same order as a single scoring)."""
    layers = trace.layers
    readers: dict[int, list[int]] = {}
    for i, layer in enumerate(layers):
        for j in set(layer.deps):
            readers.setdefault(j, []).append(i)
    held: set[int] = set()  # producers whose outputs a picked layer's checkpoint holds

    def ratio(i: int) -> float | None:
        layer = layers[i]
        holds = sum(checkpoint_input_bytes(trace, j) for j in set(layer.deps) if j not in held)
        freed = layer.saved_bytes - holds - external_input_bytes(trace, i)
        return trace.segment_rerun_s(i, i) / freed if freed > 0 else None

    # A heap of (ratio, layer) with lazy updates: a layer's ratio only falls as producers become held, so an
    # entry that no longer matches is pushed again with its new value.
    heap = [(r, i) for i in range(trace.n) if (r := ratio(i)) is not None]
    heapq.heapify(heap)
    order: list[int] = []
    picked: set[int] = set()
    while heap:
        r, i = heapq.heappop(heap)
        if i in picked or ratio(i) != r:
            continue  # picked already, or a stale entry (its current one is in the heap)
        picked.add(i)
        order.append(i)
        for j in set(layers[i].deps) - held:
            held.add(j)
            for c in readers[j]:
                if c not in picked and (rc := ratio(c)) is not None:
                    heapq.heappush(heap, (rc, c))
    return order


def whole_offloads(trace: Trace, allowed: frozenset[Action] = ALL_ACTIONS) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, whether offloading it whole (`offload_all`: its movable tensors) offloads anything, and those
    bytes; never the last layer, whose copy has no interior to hide in, and none where offload is not allowed."""
    movable = np.zeros(trace.n, dtype=bool)
    nbytes = np.zeros(trace.n, dtype=np.int64)
    if Action.OFFLOAD in allowed:
        for i in range(trace.n - 1):
            d = offload_all(trace, i)
            if d.action == Action.OFFLOAD:
                movable[i], nbytes[i] = True, d.offload_bytes
    return movable, nbytes


def grid(lo: int, hi: int, step: int) -> list[int]:
    """lo..hi (both within) by `step`, with hi itself."""
    return sorted({*range(lo, hi + 1, max(1, step)), hi})


def ratio_plan(
    trace: Trace,
    budget_bytes: int,
    allowed: frozenset[Action] = ALL_ACTIONS,
    host_budget: int | None = None,
    deadline: float | None = None,
) -> SimResult | None:
    """The best plan of the family (module docstring) that fits the budget and the host budget, simulated; None
    where recompute is not allowed or no member fits. `deadline` (perf_counter): the scans stop there, with the
    best member found so far."""
    if Action.RECOMPUTE not in allowed:
        return None
    n = trace.n
    order = _recompute_order(trace)
    # The base plan: every layer offloaded whole where that offloads something, else kept.
    movable, base_bytes = whole_offloads(trace, allowed)
    base_kind = np.where(movable, KIND_OFFLOAD, KIND_KEEP).astype(np.int64)
    offloads = bool(movable.any())
    score = FastSim(trace, budget_bytes)
    seen: set[tuple[int, int]] = set()
    best: tuple[float, int, int] | None = None  # (overhead, k, tail) of the best member that fits

    def arrays(k: int, tail: int) -> tuple[np.ndarray, np.ndarray]:
        """The member recomputing order[:k] and keeping what it would offload from layer `tail` on, as FastSim's
        (kind, offloaded bytes) per layer."""
        kind, nbytes = base_kind.copy(), base_bytes.copy()
        kind[tail:], nbytes[tail:] = KIND_KEEP, 0
        for i in order[:k]:
            kind[i], nbytes[i] = KIND_START, 0
        return kind, nbytes

    def member(k: int, tail: int) -> None:
        """Score one member; the best that fits is kept."""
        nonlocal best
        if (k, tail) in seen:
            return
        seen.add((k, tail))
        kind, nbytes = arrays(k, tail)
        overhead, excess = score(kind, nbytes)
        fits = excess == 0 and (host_budget is None or int(nbytes.sum()) <= host_budget)
        if fits and (best is None or (overhead, k, -tail) < (best[0], best[1], -best[2])):
            best = (overhead, k, tail)

    def scan(ks: list[int], tails: list[int]) -> bool:
        """Score every (k, tail) pair; False where the deadline cut the scan."""
        for tail in tails:
            for k in ks:
                if deadline is not None and time.perf_counter() >= deadline:
                    return False
                member(k, tail)
        return True

    k_step = max(1, len(order) // _COARSE_K)
    # Without offload the tail changes nothing (every layer is kept or recomputed already).
    tail_step = max(1, n // _COARSE_TAIL) if offloads else n
    if scan(grid(0, len(order), k_step), sorted(grid(0, n, tail_step), reverse=True)) and best is not None:
        # Finer around the best: both parameters at an eighth of their steps, then every k near the best.
        _, k0, t0 = best
        fine_k, fine_t = max(1, k_step // _FINE), max(1, tail_step // _FINE)
        ks = grid(max(0, k0 - k_step), min(len(order), k0 + k_step), fine_k)
        tails = grid(max(0, t0 - tail_step), min(n, t0 + tail_step), fine_t) if offloads else [n]
        if scan(ks, tails) and best is not None:
            _, k0, t0 = best
            scan(grid(max(0, k0 - fine_k), min(len(order), k0 + fine_k), 1), [t0])
    if best is None:
        return None
    kind, _ = arrays(best[1], best[2])
    decisions: list[Decision] = [
        recompute() if kind[i] == KIND_START else offload_all(trace, i) if kind[i] == KIND_OFFLOAD else KEEP
        for i in range(n)
    ]
    sim = simulate(trace, decisions, budget_bytes, with_events=False)
    return sim if sim.feasible else None


__all__ = ["grid", "ratio_plan", "whole_offloads"]
