"""A decoder traced per sub-module (attention and MLP apart, the norms between them untraced): the trace marks
the gaps where the model's code saves for backward, the solver's plans end every recompute segment there, and
the replay runs them with the gradients of the plain step. Before the mark, the solver's plan for a 2-block llama
traced this way (the GPU script's CPU dry run) held a segment across the norms, which the replay refused."""

from __future__ import annotations

import time

import pytest
from test_runtime_support import assert_close, grads, schedule_of, tiny_llama

from memsched.errors import ScheduleMismatchError
from memsched.optimizer.actions import smallest_budget
from memsched.optimizer.budget import keepall_activation_peak
from memsched.optimizer.decisions import KEEP, recompute
from memsched.options import SolveOptions
from memsched.runtime import apply_schedule, trace
from memsched.schema import Action, Trace
from memsched.service import solve_trace

SUB_MODULES = [r"model\.layers\.\d+\.self_attn", r"model\.layers\.\d+\.mlp"]


@pytest.fixture(scope="module")
def llama():
    w = tiny_llama(layers=3, seq=32)
    tr = trace(w.model, w.step, layers=SUB_MODULES, steps=1, warmup=0, measure_bandwidth=False)
    return w, tr


def test_every_gap_between_attention_and_mlp_is_marked(llama):
    _, tr = llama
    assert tr.layer_names == [f"model.layers.{k}.{p}" for k in range(3) for p in ("self_attn", "mlp")]
    # RMSNorm saves its input in every gap (input_layernorm before each attention, post_attention_layernorm
    # before each MLP); after the last MLP comes the final norm and the head: no gap.
    assert [x.code_after_saves for x in tr.layers] == [True] * 5 + [False]
    assert tr.segment_last() == list(range(6))


def test_whole_blocks_have_no_marked_gap():
    w = tiny_llama(layers=2, batch=1, seq=8)
    tr = trace(w.model, w.step, steps=1, warmup=0, measure_bandwidth=False)
    assert not any(x.code_after_saves for x in tr.layers)


def _floor(tr: Trace) -> int:
    """The smallest budget found to fit a keep and recompute plan (what this CPU trace's solve plans with)."""
    return smallest_budget(tr, frozenset({Action.KEEP, Action.RECOMPUTE}), time.perf_counter() + 30)[0]


@pytest.mark.parametrize("frac", [0.0, 0.5])
def test_the_solvers_plan_replays_with_the_plain_steps_gradients(llama, frac):
    w, tr = llama
    floor = _floor(tr)
    budget = floor + int(frac * (tr.static.total + keepall_activation_peak(tr) - floor))
    sched = solve_trace(tr, budget, SolveOptions(time_limit_s=5))
    recomputed = [i for i, a in enumerate(sched.actions) if a.action == Action.RECOMPUTE]
    assert recomputed, "the budget should need recompute"
    assert all(a.recompute_group in (None, i) for i, a in enumerate(sched.actions))
    _, ref = grads(w)
    with apply_schedule(w.model, sched, trace=tr) as sm:
        _, got = grads(w, sm)
    assert_close(got, ref)


def test_without_the_mark_a_segment_across_a_norm_is_refused_only_when_it_runs(llama):
    # What a sub-module trace allowed before the mark (the solver chose such segments on a 2-block llama at its
    # smallest budget): a segment over an attention and the MLP after it, across post_attention_layernorm.
    w, tr = llama
    unmarked = tr.model_copy(deep=True)
    for x in unmarked.layers:
        x.code_after_saves = False
    crossing = schedule_of(unmarked, [recompute(), recompute(group=0)] + [KEEP] * 4)
    with (
        pytest.raises(ScheduleMismatchError, match="code between those layers saves tensors"),
        apply_schedule(w.model, crossing, trace=unmarked) as sm,
    ):
        grads(w, sm)
