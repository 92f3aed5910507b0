"""The simulator against timelines and peaks worked out by hand (docs/cost-model.md).

Stage numbering: F_i is stage i, B_i is stage 2n-1-i. Copies move 100 bytes/s with no latency.
"""

from __future__ import annotations

import pytest

from helpers import tiny_trace
from memsched.optimizer.decisions import KEEP, Decision, offload_all, recompute
from memsched.optimizer.simulate import simulate
from memsched.schema import Action, Trace


def spans(sim, stream):
    return [(e.kind, e.layer, e.start, e.end) for e in sim.events if e.stream == stream]


def test_keep_all():
    tr = tiny_trace([1, 2, 3], [2, 4, 6], [10, 20, 30], static=5)
    sim = simulate(tr, [KEEP] * 3)
    # Stage memory: F0 10, F1 30, F2 60, B2 60, B1 30, B0 10.
    assert sim.stage_bytes == [10, 30, 60, 60, 30, 10]
    assert sim.peak_bytes == 65
    assert sim.step_s == 18 and sim.overhead_s == 0 and sim.keepall_step_s == 18
    assert spans(sim, "compute") == [
        ("forward", 0, 0, 1),
        ("forward", 1, 1, 3),
        ("forward", 2, 3, 6),
        ("backward", 2, 6, 12),
        ("backward", 1, 12, 16),
        ("backward", 0, 16, 18),
    ]


def test_recompute_middle_layer_keeps_its_input():
    # outputs (4, 5, 6), inputs (0, 4, 5): forward transient = output, backward = output + input.
    tr = tiny_trace([1, 2, 3], [2, 4, 6], [10, 20, 30], output=[4, 5, 6], inputs=[0, 4, 5], static=5)
    sim = simulate(tr, [KEEP, recompute(), KEEP])
    # F0: 10 + 4 | F1: 10 + 20 + 5 | F2: 10 + 30 + ckpt(o0=4) + 6 | B2: 10 + 30 + 4 + 11
    # B1: 10 + 20 (rematerialised) + 9 | B0: 10 + 4
    assert sim.stage_bytes == [14, 35, 50, 55, 39, 14]
    assert sim.peak_bytes == 60
    assert sim.recompute_s == 2 and sim.stall_s == 0 and sim.step_s == 20
    assert ("recompute", 1, 12, 14) in spans(sim, "compute")
    assert ("backward", 1, 14, 18) in spans(sim, "compute")
    keep = simulate(tr, [KEEP] * 3)
    assert keep.peak_bytes == 5 + 71  # B2: 10 + 20 + 30 + 11


def test_offload_fully_hidden_behind_compute():
    tr = tiny_trace([1, 2, 3], [2, 4, 6], [100, 20, 30])
    sim = simulate(tr, [offload_all(tr, 0, done_by=1, prefetch_at=1), KEEP, KEEP])
    # D2H 1->2 finishes inside F1 (1->3); prefetch issued at B1's start (12) ends at 13 < B0's start (16).
    assert spans(sim, "d2h") == [("offload", 0, 1, 2)]
    assert spans(sim, "h2d") == [("prefetch", 0, 12, 13)]
    assert sim.stall_s == 0 and sim.step_s == 18
    # Layer 0 is on the device during F0, F1 (done-by) and from B1 (prefetch) on.
    assert sim.stage_bytes == [100, 120, 50, 50, 120, 100]
    assert simulate(tr, [KEEP] * 3).peak_bytes == 150


def test_offload_that_stalls():
    tr = tiny_trace([1, 2, 3], [2, 4, 6], [300, 20, 30])
    sim = simulate(tr, [offload_all(tr, 0, done_by=1, prefetch_at=1), KEEP, KEEP])
    # The 3 s copy (1->4) is not done when F1 ends (3): compute waits 1 s, F2 runs 4->7.
    assert spans(sim, "d2h") == [("offload", 0, 1, 4)]
    assert ("stall", 0, 3, 4) in spans(sim, "compute")
    assert ("forward", 2, 4, 7) in spans(sim, "compute")
    # Prefetch at B1's start (13) takes 3 s: done at 16 < B0's start (17).
    assert spans(sim, "h2d") == [("prefetch", 0, 13, 16)]
    assert sim.stall_s == 1 and sim.step_s == 19


def test_prefetch_issued_too_late():
    tr = tiny_trace([1, 2, 3], [2, 4, 6], [100, 20, 30])
    sim = simulate(tr, [offload_all(tr, 0, done_by=2, prefetch_at=0), KEEP, KEEP])
    # Forward: copy 1->2 hidden. Backward: B2 6->12, B1 12->16; prefetch issued only at B0's start: 16->17.
    assert spans(sim, "h2d") == [("prefetch", 0, 16, 17)]
    assert ("stall", 0, 16, 17) in spans(sim, "compute")
    assert sim.stall_s == 1 and sim.step_s == 19
    # Only B0 has layer 0 back; F2 still holds it (done-by 2).
    assert sim.stage_bytes == [100, 120, 150, 50, 20, 100]


def test_dag_output_feeding_two_recomputed_layers_is_held_once():
    # Layer 0 feeds layers 1 and 3 (a skip connection); 1 and 3 are recomputed.
    tr = tiny_trace(
        [1] * 5,
        [2] * 5,
        [10, 20, 30, 40, 50],
        output=[8, 5, 6, 7, 9],
        inputs=[0, 8, 5, 14, 7],
        deps=[[], [0], [1], [2, 0], [3]],
    )
    sim = simulate(tr, [KEEP, recompute(), KEEP, recompute(), KEEP])
    # o0 is held by the segment at 1 over stages 2..7 (covers the segment at 3's 4..5): counted once.
    # o2 is held by the segment at 3 over stages 4..5.
    assert sim.stage_bytes == [18, 35, 54, 95, 113, 120, 109, 59, 43, 18]
    assert sim.peak_bytes == 120
    assert sim.recompute_s == 2 and sim.step_s == 17


def test_recompute_segment_keeps_only_its_input():
    tr = tiny_trace([1, 1, 1], [1, 1, 1], [10, 20, 30], output=[3, 4, 5])
    sim = simulate(tr, [recompute(), recompute(group=0), KEEP])
    # Segment [0, 1]: F0 10+3, F1 20+4, F2 30+5 (nothing of the segment retained: it has no outside input),
    # B2 30 + 5, B1: layers 0 and 1 rematerialised: 10 + 20 + 4, B0: 10 + 3.
    assert sim.stage_bytes == [13, 24, 35, 35, 34, 13]
    assert sim.recompute_s == 2 and sim.step_s == 8


def test_partial_offload_moves_only_the_listed_tensors():
    tr = tiny_trace([1, 1], [1, 1], [[60, 40], 10])
    d = Decision(action=Action.OFFLOAD, offload_tensors=(0,), offload_bytes=60, done_by=0, prefetch_at=0)
    sim = simulate(tr, [d, KEEP])
    # F0 100 | F1 40 + 10 | B1 40 + 10 | B0 100; D2H 0.6 s copy: stall 0.6 at F0's end, 0.6 at B0's start.
    assert sim.stage_bytes == [100, 50, 50, 100]
    assert sim.stall_s == pytest.approx(1.2)


def test_default_timing_hides_copy_and_prefetches_early():
    tr = tiny_trace([1, 2, 3], [2, 4, 6], [100, 20, 30])
    sim = simulate(tr, [offload_all(tr, 0), KEEP, KEEP])
    d = sim.decisions[0]
    # Copy 1->2 ends inside F1 (ends at 3): done-by 1. No budget: prefetch at the first backward stage.
    assert (d.done_by, d.prefetch_at) == (1, 2)
    assert sim.stall_s == 0


def test_default_timing_respects_the_budget():
    tr = tiny_trace([1, 2, 3], [2, 4, 6], [100, 20, 30])
    # Prefetching at B2 would put B2 at 150 > 130: the earliest that fits is B1 (120).
    sim = simulate(tr, [offload_all(tr, 0), KEEP, KEEP], budget_bytes=130)
    assert sim.decisions[0].prefetch_at == 1
    assert sim.feasible and sim.peak_bytes == 120


def test_other_step_time_is_added_once():
    tr = tiny_trace([1], [1], [5], other_s=3)
    sim = simulate(tr, [KEEP])
    assert sim.step_s == 5 and sim.keepall_step_s == 5 and sim.overhead_s == 0


def test_non_monotone_prefetch_is_rejected():
    from memsched.errors import ScheduleMismatchError

    tr = tiny_trace([1, 1, 1], [1, 1, 1], [10, 10, 10])
    bad = [offload_all(tr, 0, done_by=0, prefetch_at=2), offload_all(tr, 1, done_by=1, prefetch_at=1), KEEP]
    with pytest.raises(ScheduleMismatchError, match="order backward needs them"):
        simulate(tr, bad)


def _naive_prefetch(tr, decisions, budget):
    """The definition, stage by stage: the earliest issue stage whose whole holding span fits."""
    from dataclasses import replace

    from memsched.optimizer.simulate import stage_memory

    n, last, out = tr.n, 2 * tr.n - 1, list(decisions)
    cap = n - 1
    for i in range(n - 1, -1, -1):
        if out[i].action != Action.OFFLOAD:
            continue
        chosen = i
        for p in range(cap, i - 1, -1):
            trial = list(out)
            trial[i] = replace(out[i], prefetch_at=p)
            mem = stage_memory(tr, trial)
            if all(tr.static.total + mem[t] <= budget for t in range(last - p, last - i)):
                chosen = p
                break
        out[i] = replace(out[i], prefetch_at=chosen)
        cap = chosen
    return [d.prefetch_at for d in out]


@pytest.mark.parametrize("seed", range(30))
def test_fast_prefetch_placement_matches_its_definition(seed):
    import random
    from dataclasses import replace

    from memsched.optimizer.simulate import default_timing

    rng = random.Random(seed)
    n = rng.randint(2, 9)
    tr = tiny_trace(
        [rng.uniform(0.1, 2) for _ in range(n)],
        [rng.uniform(0.1, 2) for _ in range(n)],
        [rng.randint(1, 100) for _ in range(n)],
        output=[rng.randint(0, 20) for _ in range(n)],
    )
    ds = [offload_all(tr, i, done_by=i) if rng.random() < 0.6 else KEEP for i in range(n)]
    budget = rng.randint(60, 400)
    fast = default_timing(tr, ds, budget)
    provisional = [replace(d, prefetch_at=i) if d.action == Action.OFFLOAD else d for i, d in enumerate(ds)]
    assert [d.prefetch_at for d in fast] == _naive_prefetch(tr, provisional, budget)


def test_unattributed_measured_peak_is_placed_at_the_loss_point():
    from memsched.optimizer.simulate import unattributed_bytes

    tr = tiny_trace([1, 2, 3], [2, 4, 6], [10, 20, 30], static=5)
    tr.baseline.peak_bytes = 5 + 60 + 25  # measured: 25 bytes more than the layers explain (logits, loss)
    # The loss's own bytes: the measured peak beyond static, every saved byte and the last output (0 here).
    assert unattributed_bytes(tr) == 25
    keep = simulate(tr, [KEEP] * 3)
    # The loss point lies between F2 and B2; it is folded into F2 (global stage 2), and B2 does not carry
    # it (the loss is freed when the last layer's output gradient arrives). Keep-all reproduces the peak.
    assert keep.stage_bytes == [10, 30, 85, 60, 30, 10]
    assert keep.peak_bytes == tr.baseline.peak_bytes
    # Recomputing the last layer: its 30 bytes exist during F2 and again from B2, never beside the loss
    # (loss point 30 + 25 = 55 < F2's 60). The old rule put the loss at B2 beside them: 85.
    rec = simulate(tr, [KEEP, KEEP, recompute()])
    assert rec.stage_bytes == [10, 30, 60, 60, 30, 10]
    tr.baseline.peak_bytes = 10  # a measured peak below the model's is not subtracted
    assert unattributed_bytes(tr) == 0


def test_loss_point_holds_every_checkpoint_input_and_no_recomputed_bytes():
    from memsched.optimizer.simulate import loss_point_bytes

    tr = tiny_trace([1, 2, 3], [2, 4, 6], [10, 20, 30], static=5)
    for layer in tr.layers:
        layer.output_bytes = 3
    tr.layers[1].deps, tr.layers[2].deps = [0], [1]
    tr.baseline.peak_bytes = 5 + 60 + 3 + 40  # the loss: 40 bytes beyond the last output
    # Checkpoint every layer: the loss point holds the checkpoint inputs of layers 1 and 2 (3 + 3), the
    # last output (3) and the loss (40); layer 0's input is an external one (input_bytes 0 here).
    ds = [recompute(), recompute(), recompute()]
    assert loss_point_bytes(tr, ds) == 3 + 3 + 3 + 40
    # F2 itself holds 30 (layer 2's own bytes, forward only) + 3 (layer 1's checkpoint input) + 3 (its
    # output) = 36: the stage is the larger of the two moments.
    assert simulate(tr, ds).stage_bytes[2] == 49
    tr.baseline.peak_bytes = 5 + 60 + 3 + 10
    assert simulate(tr, ds).stage_bytes[2] == 36


def test_checkpoints_hold_side_inputs_from_the_loss_point_to_the_earliest_holders_backward():
    # A rotary table or mask of 7 bytes, made by the step before the layers and read by layers 1 and 2 (no
    # gradient, no traced producer). The forward's stages are keep-all's fit (the model's code holds it then);
    # after the forward only checkpoints hold it: one set, over the earliest holding segment's span.
    from memsched.optimizer.simulate import loss_point_bytes, side_input_hold

    tr = tiny_trace([1, 1, 1, 1], [1, 1, 1, 1], [10, 20, 30, 40])
    tr.layers[1].side_input_bytes = 7
    tr.layers[2].side_input_bytes = 7
    keep = [KEEP] * 4
    assert side_input_hold(tr, keep) == (-1, 0)
    assert simulate(tr, keep).stage_bytes == simulate(replace_side(tr, 0), keep).stage_bytes
    # Segments [1] and [2, 3]: the earliest holder is segment 1; held at the loss point and
    # from B3 (stage 4) through B1 (stage 6), not in B0.
    plan = [KEEP, recompute(), recompute(), recompute(group=2)]
    assert side_input_hold(tr, plan) == (1, 7)
    without = replace_side(tr, 0)
    base = simulate(without, plan).stage_bytes
    got = simulate(tr, plan).stage_bytes
    # F3's stage is the larger of its forward (the larger here) and the loss point, which holds the 7 too.
    assert [g - b for g, b in zip(got, base, strict=True)] == [0, 0, 0, 0, 7, 7, 7, 0]
    assert loss_point_bytes(tr, plan) == loss_point_bytes(without, plan) + 7
    # Only layer 0 reads it and only layer 3 is recomputed: no checkpoint holds it.
    tr.layers[1].side_input_bytes = tr.layers[2].side_input_bytes = None
    tr.layers[0].side_input_bytes = 7
    assert side_input_hold(tr, [KEEP, KEEP, KEEP, recompute()]) == (-1, 0)


def test_recomputed_layers_hold_their_buffer_snapshots_and_the_reruns_copies():
    # Layer 1 changes 5 bytes of buffers (BatchNorm's statistics). Recomputed in segment [1..2]: the snapshot
    # from F1 through B1 (its segment's start), across the loss point; the re-run's copies, saved for its
    # backward, from the re-run in B2 through B1. Kept, nothing.
    from memsched.optimizer.saved_profile import saved_profile
    from memsched.optimizer.simulate import loss_point_bytes

    tr = tiny_trace([1, 1, 1, 1], [1, 1, 1, 1], [10, 20, 30, 40])
    plain = tr.model_copy(deep=True)
    tr.layers[1].changed_buffer_bytes = 5
    plan = [KEEP, recompute(), recompute(group=1), KEEP]
    got, base = simulate(tr, plan).stage_bytes, simulate(plain, plan).stage_bytes
    # Stages F0 F1 F2 F3 | B3 B2 B1 B0: snapshot F1..B1; copies B2..B1.
    assert [g - b for g, b in zip(got, base, strict=True)] == [0, 5, 5, 5, 5, 10, 10, 0]
    assert loss_point_bytes(tr, plan) == loss_point_bytes(plain, plan) + 5
    saved = [g - b for g, b in zip(saved_profile(tr, plan), saved_profile(plain, plan), strict=True)]
    assert saved == [0, 0, 0, 0, 0, 5, 5, 0]  # the copies are saved tensors; the snapshot is not
    assert simulate(tr, [KEEP] * 4).stage_bytes == simulate(plain, [KEEP] * 4).stage_bytes


def replace_side(tr: Trace, nbytes: int) -> Trace:
    out = tr.model_copy(deep=True)
    for layer in out.layers:
        layer.side_input_bytes = nbytes or None
    return out


def test_ilp_counts_the_unattributed_transient_too():
    from memsched.optimizer.solve import solve
    from memsched.options import SolveOptions

    tr = tiny_trace([1, 2, 3, 1], [2, 4, 6, 2], [10, 20, 30, 10], static=5, bandwidth=10)
    tr.baseline.peak_bytes = 5 + 70 + 40
    budget = 5 + 80
    s = solve(tr, budget, SolveOptions(solver="cbc", time_limit_s=20))
    sim = simulate(tr, s)
    assert sim.feasible and sim.peak_bytes <= budget
    assert s.solver.objective_s == pytest.approx(sim.overhead_s, rel=1e-6, abs=1e-9)


def test_copies_on_the_compute_thread_are_synchronous_and_all_stall():
    tr = tiny_trace([1, 2, 3], [2, 4, 6], [100, 20, 30])
    tr.device.concurrent_copies = False
    sim = simulate(tr, [offload_all(tr, 0), KEEP, KEEP])
    # Default timing is the only one there is: copy out at the end of F0 (1 s), back at the start of B0 (1 s).
    assert (sim.decisions[0].done_by, sim.decisions[0].prefetch_at) == (0, 0)
    assert sim.stall_s == 2 and sim.step_s == 20
    # Any other timing costs the same time (the copies still run on the compute thread) and holds more memory.
    late = simulate(tr, [offload_all(tr, 0, done_by=1, prefetch_at=1), KEEP, KEEP])
    assert late.stall_s == 2 and late.peak_bytes > sim.peak_bytes
    assert ("stall", 0, 13, 14) in spans(late, "compute")  # the prefetch, issued at B1's start (13)


def test_new_default_fields_keep_old_hashes():
    tr = tiny_trace([1, 2], [1, 2], [5, 6])
    h = tr.content_hash()
    doc = tr.model_dump(mode="json")
    # The trace as version 1 wrote it: without the fields added since (at their defaults).
    del doc["device"]["concurrent_copies"]
    del doc["static"]["saved_before_layers"]
    del doc["static"]["saved_held_by_code"]
    del doc["rerun_overhead"]
    for layer in doc["layers"]:
        del layer["recompute_s"]
        del layer["forward_workspace_bytes"]
        del layer["shared_input_bytes"]
        del layer["resaved_from"]
        del layer["side_input_bytes"]
        del layer["changed_buffer_bytes"]
        del layer["output_saved_bytes"]
        del layer["checkpointed_forward_bytes"]
        del layer["output_saved_readers"]
        del layer["input_saved_bytes"]
        del layer["output_held_until"]
        del layer["code_after_saves"]
        del layer["ctx_held_bytes"]
    import hashlib
    import json

    old = hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert h == old
    tr.device.concurrent_copies = False
    assert tr.content_hash() != h


def test_recompute_holds_inputs_no_traced_layer_produced():
    # Layer 0 reads 9 bytes from outside the traced layers (an embedding's output); layer 1 reads 4 from
    # layer 0 and 2 more from outside (a mask). Recomputing [0, 1] as one segment holds 9 + 2 over stages 1..4.
    tr = tiny_trace([1, 1, 1], [1, 1, 1], [10, 20, 30], output=[4, 5, 6], inputs=[9, 6, 5])
    sim = simulate(tr, [recompute(), recompute(group=0), KEEP])
    # F0 10 + o0 4 | F1 20 + 5 + 11 | F2 30 + 6 + 11 | B2 30 + 11 + (6 + 5) | B1 10 + 20 + 11 + (5 + 6)
    # | B0 10 + (4 + 9)
    assert sim.stage_bytes == [14, 36, 47, 52, 52, 23]


def test_saved_part_of_the_loss_point_stage_is_what_it_holds():
    """The saved profile (the ledger's counterpart) folds F_{n-1} and the loss point moment by moment: at
    F_{n-1} it is the larger of the two moments' saved parts, never the loss point's whole bytes minus F_{n-1}'s
    transient (issue 25: that read the loss's bytes beyond the last forward's transient as saved)."""
    from memsched.optimizer.saved_profile import saved_profile
    from memsched.optimizer.simulate import stage_memory, stage_saved_bytes

    tr = tiny_trace([1, 2, 3], [2, 4, 6], [10, 20, 30], static=5)
    for layer in tr.layers:
        layer.workspace_bytes, layer.output_bytes = 4, 3
    tr.baseline.peak_bytes = 5 + 60 + 3 + 25  # the loss point is the keep-all peak
    keep = [KEEP] * 3
    assert stage_memory(tr, keep)[2] == 60 + 3 + 25  # the loss point, above F2's 60 + 4 + 3
    assert stage_saved_bytes(tr, keep) == saved_profile(tr, keep) == [10, 30, 60, 60, 30, 10]
    rec = [KEEP, KEEP, recompute()]  # F2 holds layer 2's own 30 bytes, the loss point does not
    assert stage_saved_bytes(tr, rec)[2] == 60
