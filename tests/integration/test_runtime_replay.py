"""Replay on real transformers models (CPU): gradients, RNG under recompute, the ledger against the simulator,
host memory across steps."""

from __future__ import annotations

import gc
import logging
import resource

import pytest
import torch
from test_runtime_support import assert_bitwise, assert_close, grads, schedule_of, tiny, tiny_llama

from memsched.errors import ScheduleMismatchError
from memsched.optimizer.baselines import BASELINES
from memsched.optimizer.decisions import KEEP, offload_all, offload_subset, recompute
from memsched.optimizer.saved_profile import predicted_saved_profile
from memsched.runtime import SavedLedger, Workload, apply_schedule, trace
from memsched.runtime.wrapping import is_wrapped
from memsched.schema import Action
from memsched.service import solve_trace
from memsched.service.measure import stage_name


@pytest.fixture(scope="module")
def gpt2():
    w = tiny("gpt2", layers=4)  # dropout 0.1 everywhere (the GPT-2 config default)
    tr = trace(w.model, w.step, steps=2, warmup=1, batch_size=2, seq_len=32, measure_bandwidth=False)
    return w, tr


def _mixed(tr):
    """Layer 0 offloads two of its tensors, 1 keeps, 2..3 recompute as one segment."""
    return [offload_subset(tr, 0, (0, 3), done_by=1, prefetch_at=2), KEEP, recompute(), recompute(group=2)]


def test_trace_of_gpt2_is_consistent(gpt2):
    w, tr = gpt2
    assert tr.layer_names == [f"transformer.h.{i}" for i in range(4)]
    assert all(layer.deps == ([i - 1] if i else []) for i, layer in enumerate(tr.layers))  # a chain of blocks
    assert len({layer.saved_bytes for layer in tr.layers}) == 1  # identical blocks save identical bytes
    hidden = 2 * 32 * 64 * 4
    assert all(layer.output_bytes == hidden and layer.input_bytes == hidden for layer in tr.layers)
    assert all(len(layer.saved_tensor_bytes) > 5 for layer in tr.layers)
    params = sum(p.numel() * 4 for p in w.model.parameters())  # lm_head is tied to wte: parameters() dedups
    assert tr.static.params == params and tr.static.grads == params
    assert tr.framework["torch"] == torch.__version__ and "transformers" in tr.framework
    assert all(layer.forward_s > 0 and layer.backward_s > 0 for layer in tr.layers)


@pytest.mark.parametrize("policy", ["keep-all", "offload-all-sync", "offload-all-overlapped"])
def test_keep_and_offload_gradients_are_bitwise_equal(gpt2, policy):
    w, tr = gpt2
    loss0, ref = grads(w)
    sched = schedule_of(tr, BASELINES[policy](tr), policy)
    with apply_schedule(w.model, sched, trace=tr) as sm:
        loss1, got = grads(w, sm)
        stats = sm.pool_stats()
    assert torch.equal(loss0, loss1)
    assert_bitwise(got, ref)
    if policy != "keep-all":
        assert stats.allocated_bytes == sum(x.saved_bytes for x in tr.layers)  # every saved byte went to host
        assert stats.in_use_buffers == 0  # and came back to the pool after backward


def test_partial_offload_moves_only_the_scheduled_tensors(gpt2):
    w, tr = gpt2
    _, ref = grads(w)
    sched = schedule_of(tr, [offload_subset(tr, i, (1, 2, 5)) for i in range(tr.n)])
    with apply_schedule(w.model, sched, trace=tr) as sm:
        _, got = grads(w, sm)
        stats = sm.pool_stats()
    assert_bitwise(got, ref)
    assert stats.allocated_bytes == sum(a.offload.bytes for a in sched.actions if a.offload)


@pytest.mark.parametrize("policy", ["checkpoint-all", "sqrt-segments", "mixed"])
def test_recompute_with_dropout_matches(gpt2, policy):
    w, tr = gpt2
    loss0, ref = grads(w, seed=1)
    _, other = grads(w, seed=2)
    assert any(not torch.equal(ref[k], other[k]) for k in ref), "dropout must be active for this test to mean much"
    decisions = _mixed(tr) if policy == "mixed" else BASELINES[policy](tr)
    sched = schedule_of(tr, decisions, policy)
    assert any(a.action == Action.RECOMPUTE for a in sched.actions)
    with apply_schedule(w.model, sched, trace=tr) as sm:
        loss1, got = grads(w, sm, seed=1)
    torch.testing.assert_close(loss1, loss0)
    assert_close(got, ref)


def _ledger_peak(w, sched, tr):
    ledger = SavedLedger()
    with apply_schedule(w.model, sched, trace=tr, ledger=ledger) as sm:
        grads(w, sm)  # first step: the pool fills
        ledger.reset()
        grads(w, sm)
    st = ledger.stats()
    assert st.live_bytes == 0, "saved tensors outlived their backward"
    return st.peak_bytes


@pytest.mark.parametrize("policy", [*BASELINES, "mixed", "solver-50%"])
def test_ledger_peak_within_5pct_of_simulator(gpt2, policy):
    """Measured: the ledger's peak of live saved bytes (traced layers, storage-deduplicated). Predicted: the
    simulator's stage memory minus the stage's transients (saved bytes + checkpoint inputs), maximised over
    stages: memsched.optimizer.saved_profile.predicted_saved_profile."""
    w, tr = gpt2
    if policy == "solver-50%":
        sched = solve_trace(tr, "50%")
    else:
        sched = schedule_of(tr, _mixed(tr) if policy == "mixed" else BASELINES[policy](tr), policy)
    predicted = max(predicted_saved_profile(tr, sched))
    measured = _ledger_peak(w, sched, tr)
    assert abs(measured - predicted) <= 0.05 * predicted, (measured, predicted)


def test_offload_timing_is_realised_stage_by_stage(gpt2):
    """Without recompute the ledger equals the cost model at every stage: copies released at their done-by
    stage, prefetched at their prefetch-at stage."""
    w, tr = gpt2
    from memsched.optimizer.decisions import offload_all

    decisions = [offload_all(tr, 0, 2, 1), offload_all(tr, 1, 1, 2), KEEP, offload_all(tr, 3, 3, 3)]
    sched = schedule_of(tr, decisions)
    assert _ledger_profile(w, sched, tr) == predicted_saved_profile(tr, sched)


def _ledger_profile(w, sched, tr) -> list[int]:
    """The ledger's live saved bytes per stage over one step, in the simulator's stage order."""
    ledger = SavedLedger()
    with apply_schedule(w.model, sched, trace=tr, ledger=ledger) as sm:
        grads(w, sm)
    st = ledger.stats()
    return [st.stage_peak_bytes[stage_name(tr.n, t)[0]] for t in range(2 * tr.n)]


def test_saved_bytes_never_exceed_the_model_after_a_recomputed_block():
    """The ledger's live saved bytes at every stage are at most the cost model's (keep-all: equal), when every
    other ResNet block is recomputed. Each kept block saves the recomputed block's ReLU output again, as its
    convolutions' input: the trace counts that storage with its producer, so the model holds it for the kept
    block (Layer.shared_input_bytes; on the H100, ResNet-50 b256 at 50% went 11.8% over its predicted peak
    without it: +65,536 B at F1, +32,768 B at F3, ... here). Left: under 1% of the peak in a rematerialising
    block's backward (BatchNorm state the re-run holds; see docs/cost-model.md 'Not priced yet')."""
    w = tiny("resnet50", layers=8, batch=2)
    tr = trace(w.model, w.step, steps=1, warmup=0, batch_size=2, seq_len=16, measure_bandwidth=False)
    for plan in ([KEEP] * tr.n, [recompute() if i % 2 == 0 else KEEP for i in range(tr.n)]):
        sched = schedule_of(tr, plan)
        measured = _ledger_profile(w, sched, tr)
        over = {
            stage_name(tr.n, t)[0]: m - p
            for t, (m, p) in enumerate(zip(measured, predicted_saved_profile(tr, sched), strict=True))
            if m > p
        }
        assert sum(over.values()) <= 0.01 * max(predicted_saved_profile(tr, sched)), over


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_host_memory_does_not_grow_over_1000_steps():
    w = tiny("gpt2", layers=2, batch=1, seq=8)
    tr = trace(w.model, w.step, steps=1, warmup=0, batch_size=1, seq_len=8, measure_bandwidth=False)
    sched = schedule_of(tr, BASELINES["offload-all-overlapped"](tr))
    opt = torch.optim.SGD(w.model.parameters(), lr=1e-3)
    with apply_schedule(w.model, sched, trace=tr) as sm:
        for step in range(1000):
            opt.zero_grad(set_to_none=True)
            w.backward(sm)
            opt.step()
            if step == 0:
                first = sm.pool_stats()
            if step == 100:
                gc.collect()
                rss100 = _rss_bytes()
        last = sm.pool_stats()
    assert first.allocated_bytes > 0
    assert last.allocated_bytes == first.allocated_bytes and last.allocated_buffers == first.allocated_buffers
    assert last.in_use_buffers == 0
    assert last.reuses == 999 * first.allocated_buffers
    gc.collect()
    assert _rss_bytes() - rss100 < 16 << 20  # the process's high-water mark barely moves


@pytest.mark.parametrize("name", ["bert-base", "vit-base", "resnet50"])
def test_other_models_offload_and_recompute(name):
    """BERT, ViT and ResNet (whose ReLU output is saved by the next layer too: shared storages)."""
    w = tiny(name, layers=4 if name != "resnet50" else None, batch=2, seq=16)
    tr = trace(w.model, w.step, steps=1, warmup=0, batch_size=2, seq_len=16, measure_bandwidth=False)
    _, ref = grads(w, seed=3)
    for policy in ("offload-all-overlapped", "checkpoint-all"):
        sched = schedule_of(tr, BASELINES[policy](tr), policy)
        with apply_schedule(w.model, sched, trace=tr) as sm:
            _, got = grads(w, sm, seed=3)
            assert sm.pool_stats().in_use_buffers == 0
        (assert_bitwise if policy.startswith("offload") else assert_close)(got, ref)


@pytest.mark.parametrize("name", ["resnet50", "gpt2"])
def test_offload_after_a_recompute_segment_moves_the_traced_tensors(name):
    """A layer right after a recompute segment saves the segment's output too (ResNet's conv, GPT-2's LayerNorm),
    which the trace gives to the segment's last layer. The replay must number that layer's saves as the trace
    does: on an H100 the shifted numbering offloaded 0.62 of the planned GB at one layer and 4x at another,
    and the step went 11% over its budget."""
    w = tiny(name, layers=4, batch=2, seq=16)
    tr = trace(w.model, w.step, steps=1, warmup=0, batch_size=2, seq_len=16, measure_bandwidth=False)
    _, ref = grads(w, seed=3)
    # Every other tensor of layers 1 and 3, each right after a recomputed layer.
    subset = {i: tuple(range(0, len(tr.layers[i].saved_tensor_bytes), 2)) for i in (1, 3)}
    plan = [recompute(), offload_subset(tr, 1, subset[1]), recompute(), offload_subset(tr, 3, subset[3])]
    sched = schedule_of(tr, plan)
    with apply_schedule(w.model, sched, trace=tr) as sm:
        _, got = grads(w, sm, seed=3)
        stats = sm.pool_stats()
    assert_close(got, ref)
    planned = [sum(tr.layers[i].saved_tensor_bytes[k] for k in subset[i]) for i in (1, 3)]
    assert stats.allocated_bytes == sum(planned)


def test_model_is_restored_after_the_context(gpt2):
    w, tr = gpt2
    sched = schedule_of(tr, BASELINES["checkpoint-all"](tr))
    with apply_schedule(w.model, sched, trace=tr):
        assert all(is_wrapped(w.model.get_submodule(n)) for n in tr.layer_names)
    assert not any(is_wrapped(w.model.get_submodule(n)) for n in tr.layer_names)
    assert all("forward" not in w.model.get_submodule(n).__dict__ for n in tr.layer_names)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in w.model.modules())  # no hook left behind
    sm = apply_schedule(w.model, sched)  # the wrapper form
    try:
        _, got = grads(w, sm)
        assert sm.config is w.model.config  # attributes are the model's
    finally:
        sm.remove()


def test_llama_offload_and_one_four_layer_segment():
    """A decoder whose blocks take keyword tensors (rotary cos/sin tuple, masks): the segment's recomputation
    re-feeds them, and chains the hidden states through the recorded links."""
    w = tiny_llama(layers=4, attention_dropout=0.1)
    model = w.model
    tr = trace(model, w.step, steps=1, warmup=0, measure_bandwidth=False)
    assert tr.layer_names == [f"model.layers.{i}" for i in range(4)]
    _, ref = grads(w)
    with apply_schedule(model, schedule_of(tr, BASELINES["offload-all-overlapped"](tr)), trace=tr) as sm:
        _, got = grads(w, sm)
    assert_bitwise(got, ref)
    segment = schedule_of(tr, [recompute(), recompute(group=0), recompute(group=0), recompute(group=0)])
    with apply_schedule(model, segment, trace=tr) as sm:
        _, got = grads(w, sm)
    assert_close(got, ref)


def test_framework_gradient_checkpointing_must_be_off(gpt2):
    w, tr = gpt2
    w.model.gradient_checkpointing_enable()
    try:
        with pytest.raises(ScheduleMismatchError, match="gradient_checkpointing_disable"):
            apply_schedule(w.model, schedule_of(tr, BASELINES["keep-all"](tr)))
    finally:
        w.model.gradient_checkpointing_disable()


def test_shorter_steps_are_told_once_and_a_larger_one_warns_after_them(gpt2, caplog):
    """Dynamic padding: batches shorter than the traced one hold smaller tensors (said once, at INFO); a batch
    larger than the traced one can break the budget, so it warns even after the short ones (it once was hidden
    behind their warning), and again only when a step outgrows the last one warned of by a tenth."""
    w, tr = gpt2  # traced at batch 2, sequence 32 (the model's longest)
    sched = schedule_of(tr, BASELINES["checkpoint-all"](tr))
    short = {k: v[:, :16] for k, v in w.batch.items()}
    wide = {k: torch.cat([v, v[:1]]) for k, v in w.batch.items()}  # batch 3
    wider = {k: torch.cat([v, v]) for k, v in w.batch.items()}  # batch 4
    with (
        caplog.at_level(logging.INFO, logger="memsched.runtime.replay"),
        apply_schedule(w.model, sched, trace=tr) as sm,
    ):
        sm(**w.batch).loss.backward()
        assert not caplog.records  # the traced shapes: nothing to say
        for batch in (short, short):
            sm(**batch).loss.backward()
        [info] = caplog.records  # once
        assert info.levelno == logging.INFO
        assert info.getMessage().startswith(
            "layer transformer.h.0 returned 8192 bytes of output, fewer than the 16384 traced "
            "(batch_size=2, seq_len=32): this step is smaller"
        )
        caplog.clear()
        for batch in (wide, wide, short, wider, wider):
            sm(**batch).loss.backward()
    warnings = [r.getMessage() for r in caplog.records]
    assert all(r.levelno == logging.WARNING for r in caplog.records), warnings
    assert [m.split(" traced")[0] for m in warnings] == [
        "layer transformer.h.0 returned 24576 bytes of output, more than the 16384",
        "layer transformer.h.0 returned 32768 bytes of output, more than the 16384",
    ]
    assert all("can peak above its budget" in m and "the longest batch" in m for m in warnings)


def test_an_offload_plan_at_other_shapes_names_the_step_not_the_tensors(gpt2, caplog):
    """The offloaded-bytes check tells of tensors a plan could not move. A shorter step moves fewer bytes by its
    shapes, which is no such case; a larger one moves more, and without a trace that is all that shows it."""
    w, tr = gpt2
    sched = schedule_of(tr, BASELINES["offload-all-overlapped"](tr))
    short = {k: v[:, :16] for k, v in w.batch.items()}
    wide = {k: torch.cat([v, v]) for k, v in w.batch.items()}
    with caplog.at_level(logging.WARNING, logger="memsched.runtime.replay"):
        with apply_schedule(w.model, sched, trace=tr) as sm:
            for batch in (w.batch, short):
                sm(**batch).loss.backward()
        assert not caplog.records, [r.getMessage() for r in caplog.records]
        with apply_schedule(w.model, sched) as sm:  # no trace: the offloaded bytes are the only sign
            sm(**wide).loss.backward()
            sm(**wide).loss.backward()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == tr.n, messages  # once per layer
    assert all("its saved tensors are larger than the schedule's" in m for m in messages), messages


def _cached(name: str) -> Workload:
    """GPT-2 or Llama as a user builds it from its config: use_cache=True, the config's default."""
    import transformers as tf

    torch.manual_seed(0)
    if name == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=64, n_layer=4, n_head=4, vocab_size=256, n_positions=32))
    else:
        model = tiny("llama", layers=4).model
    assert model.config.use_cache
    ids = torch.randint(0, 256, (2, 32))
    return Workload(model.train(), name, {"input_ids": ids, "labels": ids}, 2, 32)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_model_with_a_kv_cache_is_traced_as_the_schedule_replays_it(name, caplog):
    """GPT-2's and Llama's config default use_cache=True copies each layer's keys and values into the cache,
    and the attention saves the copies. The tracer traced that (GPT-2: 7% more saved bytes, other save
    indices) while the replay runs without the cache, so an offload moved other tensors than planned (seen on
    an H200: 96 of 240 MiB missing in a GPT-2 layer, the plan over its budget). Now both run without it: the
    trace is the one a use_cache=False step gives, and a partial offload moves exactly the planned bytes."""
    w = _cached(name)

    def no_cache_step():
        w.model.zero_grad(set_to_none=True)
        w.model(**w.batch, use_cache=False).loss.backward()

    with caplog.at_level(logging.WARNING, logger="memsched"):
        tr = trace(w.model, w.backward, steps=1, warmup=0, batch_size=2, seq_len=32, measure_bandwidth=False)
    assert sum("use_cache=True" in r.getMessage() for r in caplog.records) == 1
    ref = trace(w.model, no_cache_step, steps=1, warmup=0, batch_size=2, seq_len=32, measure_bandwidth=False)
    assert [x.saved_tensor_bytes for x in tr.layers] == [x.saved_tensor_bytes for x in ref.layers]
    assert w.model.config.use_cache and w.model(input_ids=w.batch["input_ids"]).past_key_values is not None

    _, expected = grads(w)
    # Not Llama's layer-0 tensors 4 and 5 (RoPE's cos and sin, which its code holds through the forward).
    for decisions in ([KEEP] * tr.n, [offload_subset(tr, i, (1, 2, 3)) for i in range(tr.n)]):
        sched = schedule_of(tr, decisions)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="memsched"), apply_schedule(w.model, sched, trace=tr) as sm:
            _, got = grads(w, sm)
            stats = sm.pool_stats()
        said = [r.getMessage().split(",")[0] for r in caplog.records]
        assert said == [f"memsched: {type(w.model).__name__} has use_cache=True"]  # no bytes missed
        assert stats.allocated_bytes == sum(a.offload.bytes for a in sched.actions if a.offload)
        assert_close(got, expected)
        assert _ledger_peak(w, sched, tr) == max(predicted_saved_profile(tr, sched))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_saved_bytes_the_models_code_holds_are_static_and_never_moved(name, caplog):
    """Llama's forward keeps its embedding output and RoPE's cos and sin in local variables through every layer,
    so offloading layer 0's saved copies would free nothing before its last layer (the ledger measured 16,384 B
    over the prediction when they were offloaded). The tracer finds them (a probe step in which autograd keeps
    copies): 0 bytes in layer 0's save order, their 20,480 B static (saved_held_by_code), and the tracer says so.
    Offload-all then moves none of them and the prediction holds to the byte; the replay has nothing to warn
    about. GPT-2's forward holds none of what its layers save."""
    w = _cached(name)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memsched"):
        tr = trace(w.model, w.backward, steps=1, warmup=0, batch_size=2, seq_len=32, measure_bandwidth=False)
    traced = [r.getMessage() for r in caplog.records if "held by the model's own code" in r.getMessage()]
    if name == "gpt2":
        assert tr.static.saved_held_by_code == 0 and traced == []
    else:
        # inputs_embeds (2 x 32 x 64 fp32) and RoPE's cos and sin (2 x 32 x 16 fp32 each)
        assert tr.static.saved_held_by_code == 16384 + 2 * 2048
        assert tr.layers[0].saved_tensor_bytes.count(0) >= 3 and all(
            0 not in x.saved_tensor_bytes for x in tr.layers[1:]
        )
        assert len(traced) == 1 and "of 'model.layers.0'" in traced[0]
    sched = schedule_of(tr, [offload_all(tr, i, i, i) for i in range(tr.n)])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memsched"):
        over = _ledger_peak(w, sched, tr) - max(predicted_saved_profile(tr, sched))
    assert [r.getMessage() for r in caplog.records if "still on the device" in r.getMessage()] == []
    assert over == 0


def test_a_kv_cache_is_switched_off_under_a_moving_plan_and_back_on_after(caplog):
    """Llama's config default use_cache=True kept every recomputed layer's keys and values until the backward
    (peak 1.09x the prediction at 4 layers): the replay runs training forwards without it, says so once, and
    leaves the model as it was."""
    import transformers as tf

    from memsched.runtime import Workload

    def llama(use_cache: bool) -> Workload:
        torch.manual_seed(0)
        cfg = tf.LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=256,
            use_cache=use_cache,
        )
        ids = torch.randint(0, 256, (2, 32))
        return Workload(tf.LlamaForCausalLM(cfg).train(), "llama", {"input_ids": ids, "labels": ids}, 2, 32)

    peaks = {}
    for use_cache in (False, True):
        w = llama(use_cache)
        tr = trace(w.model, w.step, steps=1, warmup=0, measure_bandwidth=False)
        sched = schedule_of(tr, [recompute(), recompute(group=0), recompute(group=0), recompute(group=0)])
        peaks[use_cache] = _ledger_peak(w, sched, tr)
    assert peaks[True] == peaks[False]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memsched"), apply_schedule(w.model, sched, trace=tr) as sm:
        grads(w, sm)
        grads(w, sm)
        with torch.no_grad():  # not a training forward: the user's own choice stands
            assert sm(input_ids=w.batch["input_ids"]).past_key_values is not None
    assert [r.getMessage().split(",")[0] for r in caplog.records] == ["memsched: LlamaForCausalLM has use_cache=True"]
    assert w.model.config.use_cache is True
    assert w.model(input_ids=w.batch["input_ids"]).past_key_values is not None  # the model is as it was
