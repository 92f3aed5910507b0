"""The CUDA replay path: side streams really overlap compute, max_memory_allocated stays within the budget,
gradients match. Skipped without CUDA; written for one H100 (any GPU with >= 16 GB works)."""

from __future__ import annotations

import contextlib

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _gpt2(layers: int = 8, batch: int = 8, seq: int = 512, width: int = 768):
    """A GPT-2 whose activations dominate its memory (vocab 1024: the LM head stays small)."""
    import transformers as tf

    from memsched.runtime import Workload

    torch.manual_seed(0)
    cfg = tf.GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=12,
        vocab_size=1024,
        n_positions=seq,
        use_cache=False,
        bos_token_id=1023,
        eos_token_id=1023,
    )
    model = tf.GPT2LMHeadModel(cfg).cuda().train()
    ids = torch.randint(0, 1024, (batch, seq), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return Workload(model, f"gpt2-{layers}l", {"input_ids": ids, "labels": ids}, batch, seq, opt)


@pytest.fixture(scope="module")
def traced():
    from memsched.runtime import trace

    w = _gpt2()
    tr = trace(
        w.model, w.step, steps=3, warmup=2, model_id=w.model_id, batch_size=8, seq_len=512, optimizer=w.optimizer
    )
    return w, tr


def test_trace_on_cuda_uses_the_allocator(traced):
    _, tr = traced
    assert tr.device.memory_bytes > 10**10 and "cpu" not in tr.device.name.lower()
    assert tr.baseline.peak_bytes > tr.static.total + sum(x.saved_bytes for x in tr.layers) // 2
    assert tr.device.h2d_bytes_per_s > 1e9 and tr.device.d2h_bytes_per_s > 1e9


@pytest.mark.parametrize("budget", ["50%", "30%"])
def test_max_memory_allocated_within_budget(traced, budget):
    from memsched.runtime import measure
    from memsched.service import solve_trace

    w, tr = traced
    sched = solve_trace(tr, budget)
    m = measure(w.model, w.step, sched, trace=tr, optimizer=w.optimizer, steps=3, warmup=1)
    print(
        f"{budget}: {sched.policy} measured {m.peak_bytes} <= budget {sched.budget_bytes}? "
        f"predicted {sched.prediction.peak_bytes}; step {m.step_s:.4f} s vs predicted {sched.prediction.step_s:.4f}"
    )
    assert m.peak_bytes <= sched.budget_bytes
    assert m.pool is not None and m.pool.in_use_buffers == 0


def _intervals(prof, pred):
    out = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() == torch.autograd.DeviceType.CUDA and pred(e.name()):
            out.append((e.start_ns(), e.start_ns() + e.duration_ns()))
    return out


def test_offload_and_prefetch_copies_overlap_compute(traced):
    from torch.profiler import ProfilerActivity, profile

    from memsched.optimizer.baselines import offload_all_overlapped
    from memsched.optimizer.simulate import make_schedule, simulate
    from memsched.runtime import apply_schedule
    from memsched.schema import SolverRecord, SolverStatus

    w, tr = traced
    sim = simulate(tr, offload_all_overlapped(tr))
    sched = make_schedule(
        tr, sim.decisions, 10**12, "overlapped", SolverRecord(backend="t", status=SolverStatus.HEURISTIC)
    )
    with apply_schedule(w.model, sched, trace=tr) as sm:
        w.step(sm)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            w.step(sm)
            torch.cuda.synchronize()
    copies = _intervals(prof, lambda n: "Memcpy DtoH" in n or "Memcpy HtoD" in n)
    kernels = _intervals(prof, lambda n: "Memcpy" not in n and "Memset" not in n)
    assert copies and kernels
    overlapped = sum(max(0, min(b, d) - max(a, c)) for a, b in copies for c, d in kernels)
    copy_time = sum(b - a for a, b in copies)
    kernel_time = sum(b - a for a, b in kernels)
    # Copies run on their own streams while kernels run. Serialised copies would overlap nothing; the
    # bound leaves room for the copies that outlast the compute they hide behind (copy-bound layers stall).
    assert overlapped >= 0.25 * min(copy_time, kernel_time), (overlapped, copy_time, kernel_time)


def test_gradients_match_under_offload_on_cuda(traced):
    from memsched.optimizer.baselines import offload_all_overlapped
    from memsched.optimizer.simulate import make_schedule, simulate
    from memsched.runtime import apply_schedule
    from memsched.schema import SolverRecord, SolverStatus

    w, tr = traced

    def grads(model=None):
        w.model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        w.backward(model)
        return {n: p.grad.clone() for n, p in w.model.named_parameters()}

    ref = grads()
    sim = simulate(tr, offload_all_overlapped(tr))
    sched = make_schedule(
        tr, sim.decisions, 10**12, "overlapped", SolverRecord(backend="t", status=SolverStatus.HEURISTIC)
    )
    with apply_schedule(w.model, sched, trace=tr) as sm:
        got = grads(sm)
    for k, v in ref.items():
        # The embedding backward uses atomics on CUDA: equal up to summation order, not bitwise.
        torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-6)


def test_layerdrop_under_segments_and_offloads_on_cuda():
    """tests/integration/test_runtime_layerdrop.py on CUDA, where a tensor hook of the backward runs on the autograd
    engine's device thread: a segment whose last layers a step skipped stays open through that backward and is
    closed by the next forward, on the forward's thread. The weights after ten steps match keep-all's under the
    same LayerDrop draws, and after the loop the thread's saved-tensor hooks are the ones it had before."""
    import transformers as tf

    from memsched.optimizer.decisions import KEEP, offload_all, recompute
    from memsched.optimizer.simulate import make_schedule, simulate
    from memsched.runtime import apply_schedule, trace
    from memsched.schema import SolverRecord, SolverStatus

    def build():
        torch.manual_seed(0)
        cfg = tf.BartConfig(
            vocab_size=1024, d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=8,
            decoder_attention_heads=8, encoder_ffn_dim=1024, decoder_ffn_dim=1024, encoder_layerdrop=0.3,
            decoder_layerdrop=0.3,
        )  # fmt: skip
        return tf.BartForConditionalGeneration(cfg).cuda().train()

    g = torch.Generator().manual_seed(1)
    batch = {
        "input_ids": torch.randint(0, 1024, (4, 128), generator=g).cuda(),
        "labels": torch.randint(0, 1024, (4, 64), generator=g).cuda(),
        "use_cache": False,
    }
    model = build()

    def step():
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()

    tr = trace(model, step, steps=2, warmup=1, batch_size=4, seq_len=128)

    def train(decisions):
        m = build()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        torch.manual_seed(3)
        sched = None
        if decisions is not None:
            sim = simulate(tr, decisions)
            sched = make_schedule(
                tr, sim.decisions, 10**12, "t", SolverRecord(backend="t", status=SolverStatus.HEURISTIC)
            )
        hooks_before = torch._C._autograd._top_saved_tensors_default_hooks(False)
        with apply_schedule(m, sched, trace=tr) if sched is not None else contextlib.nullcontext():
            for _ in range(10):
                opt.zero_grad(set_to_none=True)
                m(**batch).loss.backward()
                opt.step()
        assert torch._C._autograd._top_saved_tensors_default_hooks(False) == hooks_before
        return {n: p.detach().clone() for n, p in m.named_parameters()}

    ref = train(None)
    segments = [recompute(), recompute(group=0), recompute(group=0), recompute(), recompute(group=3)]
    for decisions in (
        [*segments, recompute(group=3)],
        [offload_all(tr, 0, 1, 2), KEEP, KEEP, *segments[3:], offload_all(tr, 5, 5, 5)],
    ):
        got = train(decisions)
        for k, v in ref.items():
            torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-5)
