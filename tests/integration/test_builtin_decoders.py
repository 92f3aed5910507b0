"""The built-in decoders users fine-tune (issue 21, item 4): llama, qwen2 and mistral, built from their
transformers configs with the configs' own defaults (use_cache=True, tied or untied head, RoPE buffers).
Each traces on the CPU at --small, and a recompute plan replays with gradients bitwise equal to keep-all."""

from __future__ import annotations

import logging

import pytest
import torch
from test_runtime_support import assert_bitwise, grads, schedule_of, tiny

from memsched.optimizer.decisions import KEEP, recompute
from memsched.runtime import apply_schedule, builtin_workload, trace
from memsched.runtime.models import BUILTIN_MODELS, decoder_class, decoder_config

DECODERS = ("llama", "qwen2", "mistral")

FULL_PARAMS = {"llama": 1_235_814_400, "qwen2": 494_032_768, "mistral": 7_248_023_552}
"""The published parameter counts of Llama-3.2-1B, Qwen2.5-0.5B and Mistral-7B-v0.3 (untied heads counted once)."""


@pytest.mark.parametrize("name", DECODERS)
def test_full_size_matches_the_published_model(name):
    assert name in BUILTIN_MODELS
    cfg = decoder_config(name)
    with torch.device("meta"):  # nothing allocated
        model = decoder_class(name)(cfg)
    assert sum(p.numel() for p in model.parameters()) == FULL_PARAMS[name]
    assert cfg.use_cache  # the config's default, kept


@pytest.mark.parametrize("name", DECODERS)
def test_small_keeps_the_configs_defaults_and_layers_sets_the_depth(name):
    w = builtin_workload(name, small=True, num_layers=2, seq_len=16, optimizer="none")
    cfg = w.model.config
    assert w.model_id == f"{name}-small2"
    assert cfg.num_hidden_layers == 2 and cfg.hidden_size == 64
    assert cfg.use_cache
    tied = w.model.lm_head.weight is w.model.model.embed_tokens.weight
    assert tied == (name != "mistral")  # Llama 3.2 1B and Qwen2.5 0.5B tie their head; Mistral 7B does not
    assert "model.rotary_emb.inv_freq" in dict(w.model.named_buffers())


@pytest.mark.parametrize("name", DECODERS)
def test_traces_and_a_recompute_plan_gives_keep_alls_gradients(name, caplog):
    w = tiny(name, layers=4, seq=16)
    tr = trace(w.model, w.backward, steps=1, warmup=0, batch_size=w.batch_size, measure_bandwidth=False)
    assert tr.layer_names == [f"model.layers.{i}" for i in range(4)]
    assert all(layer.saved_bytes > 0 for layer in tr.layers)
    loss_ref, ref = grads(w)
    sched = schedule_of(tr, [recompute(), recompute(group=0), KEEP, recompute()])
    caplog.clear()  # the tracer's own notes (no optimizer given) are not the replay's
    with caplog.at_level(logging.WARNING, logger="memsched"), apply_schedule(w.model, sched, trace=tr) as m:
        loss, got = grads(w, m)
    assert torch.equal(loss, loss_ref)
    assert_bitwise(ref, got)
    # The one warning is the KV cache the config asks for, switched off for the training forwards.
    assert [r.getMessage() for r in caplog.records if "use_cache=True" not in r.getMessage()] == []
    assert any("use_cache=True" in r.getMessage() for r in caplog.records)
