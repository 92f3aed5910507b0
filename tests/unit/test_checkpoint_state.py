"""A recompute segment's checkpoint stashes the RNG state for its recomputation: on the CPU a 5,056-byte tensor
in device (= host) memory, held from F_a through B_a (issue 25, the 50% GPT-2 plan measured 15,168 bytes =
3 segments x 5,056 above its prediction), and its re-run forks it once more while it runs, in B_b (SharedNet's
re-run peak, 1,924 B over its prediction before). The simulator prices both; the DP and the MILP identically."""

from __future__ import annotations

import pytest

from helpers.pricing import assert_brute_force_dp_and_milp_agree, cpu_trace
from memsched.optimizer.decisions import KEEP, recompute
from memsched.optimizer.simulate import CPU_RNG_STATE_BYTES, checkpoint_state_bytes, simulate


def test_each_segment_holds_the_state_from_its_forward_through_its_backward() -> None:
    tr = cpu_trace(4, 1)
    assert checkpoint_state_bytes(tr) == CPU_RNG_STATE_BYTES == 5056
    plan = [recompute(), KEEP, recompute(group=2), recompute(group=2)]  # segments [0..0] and [2..3]
    on_cpu = simulate(tr, plan).stage_bytes
    tr.device.name = "test"  # a GPU's stashed states are host tensors: no device bytes
    assert checkpoint_state_bytes(tr) == 0
    elsewhere = simulate(tr, plan).stage_bytes
    # Stages F0..F3, B3..B0: segment [0..0] holds it at every stage, [2..3] from F2 through B2; each re-run
    # forks it once more, in its last layer's backward stage (B3 for [2..3], B0 for [0..0]).
    assert [a - b for a, b in zip(on_cpu, elsewhere, strict=True)] == [
        5056,
        5056,
        10112,
        10112,
        15168,
        10112,
        5056,
        10112,
    ]


@pytest.mark.parametrize("seed", range(6))
def test_dp_and_milp_price_the_state_like_the_simulator(seed: int) -> None:
    assert_brute_force_dp_and_milp_agree(cpu_trace(3 + seed % 3, seed))
