"""What a recompute re-runs (issue 25, the time half; docs/cost-model.md, 'What a re-run costs').

The replay recomputes with torch.utils.checkpoint, non-reentrant, early stop on: the re-run of a segment
[a..b] stops as soon as the last tensor the segment saved is rematerialised. So layers a..b-1 re-run whole and
layer b re-runs only up to its last saving op: on a GPT-2 block the MLP's output projection (it saves its input
before it computes) and the residual add are not re-run, 0.75x of the block's forward time measured on the CPU
(bench/results/recompute-time.md); on a block that ends in an op that saves its own output (a ReLU) all of it
re-runs. The tracer measures it (`Layer.recompute_s`, where measurably below forward_s) and every pricer
charges a segment forward_s of a..b-1 plus recompute_s of b. These tests hold the facts that rule rests on, so
a change of torch's early stop or of the runtime's checkpoint call shows up here.
"""

from __future__ import annotations

import pytest
import torch
from test_runtime_support import schedule_of, tiny
from torch import nn

from memsched.optimizer.decisions import KEEP, recompute
from memsched.runtime import apply_schedule, trace
from memsched.runtime.tracer import RERUN_BELOW


class _Reruns:
    """Counts forward calls of named submodules that run inside a backward (a checkpoint's re-run)."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        self.counts = dict.fromkeys(names, 0)
        mods = dict(model.named_modules())
        self.handles = [mods[n].register_forward_hook(self._hook(n)) for n in names]

    def _hook(self, name: str):
        def hook(*_a):
            if torch._C._current_graph_task_id() >= 0:
                self.counts[name] += 1

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def test_a_gpt2_segment_re_runs_its_last_block_only_up_to_the_mlp_output_projection():
    w = tiny("gpt2", layers=4, dropout=0.0)
    tr = trace(w.model, w.step, steps=1, warmup=1, batch_size=2, seq_len=32, measure_bandwidth=False)
    # Segments: [0..1] (two blocks), [2], and block 3 kept.
    sched = schedule_of(tr, [recompute(), recompute(group=0), recompute(), KEEP])
    probe = [f"transformer.h.{i}.{m}" for i in range(4) for m in ("attn.c_attn", "mlp.c_fc", "mlp.c_proj")]
    reruns = _Reruns(w.model, probe)
    try:
        with apply_schedule(w.model, sched, trace=tr) as sm:
            w.step(sm)
    finally:
        reruns.remove()
    c = reruns.counts
    # Inside a segment, every block but the last re-runs whole: its output feeds the next block's saved tensors.
    assert [c[f"transformer.h.0.{m}"] for m in ("attn.c_attn", "mlp.c_fc", "mlp.c_proj")] == [1, 1, 1]
    # The segment's last block stops before its MLP output projection (early stop); so does a one-block segment.
    for i in (1, 2):
        assert [c[f"transformer.h.{i}.{m}"] for m in ("attn.c_attn", "mlp.c_fc", "mlp.c_proj")] == [1, 1, 0], c
    # A kept block re-runs nothing.
    assert [c[f"transformer.h.3.{m}"] for m in ("attn.c_attn", "mlp.c_fc", "mlp.c_proj")] == [0, 0, 0]


class _ReluBlock(nn.Module):
    """A residual block that ends in a ReLU, which saves its own output: its last op must re-run."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, d)
        self.fc2 = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.fc2(torch.relu(self.fc1(x))))


class _Net(nn.Module):
    def __init__(self, d: int = 16, n: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(_ReluBlock(d) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return h.square().mean()


def test_a_block_ending_in_a_relu_re_runs_whole():
    torch.manual_seed(0)
    net = _Net()
    x = torch.randn(8, 16)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)

    def step(model=None):
        opt.zero_grad(set_to_none=False)
        (model or net)(x).backward()
        opt.step()

    layers = [r"blocks\.\d+"]
    tr = trace(net, step, layers=layers, steps=1, warmup=1, measure_bandwidth=False)
    sched = schedule_of(tr, [recompute(), recompute(), recompute()])
    reruns = _Reruns(net, [f"blocks.{i}.{m}" for i in range(3) for m in ("fc1", "fc2")])
    try:
        with apply_schedule(net, sched, trace=tr, layers=layers) as sm:
            step(sm)
    finally:
        reruns.remove()
    assert all(v == 1 for v in reruns.counts.values()), reruns.counts


def test_the_tracer_measures_a_gpt2_blocks_rerun_below_its_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    # The realistic width of bench/results/recompute-time.md (384), where the skipped MLP output projection
    # and residual add are about a quarter of the block: re-run 0.75x forward there, 0.76x here. What this
    # checks is that the tracer sees the early stop, not its noise, so: a batch of 8 (at 2 the per-op overheads
    # are much of a block: beside a busy core re-runs measured 0.75-0.92x, some above RERUN_BELOW, recorded as
    # None), and 5 re-run steps (the CLI's 2, beside the suite's other worker, measured 0.90 / 1.0 / 0.93 at
    # batch 8 once). Each re-run is paired with its forward in the same step (tracer._recompute_s): compared
    # across steps, 1 of 3 fresh clones measured [1.0] * 3 or [0.92, 0.93, 0.88]; paired, 0.66-0.82 in 15
    # layers, 6 of them beside a busy core. It runs with the wallclock tests, alone (tests/conftest.py).
    from transformers import GPT2Config, GPT2LMHeadModel

    import memsched.runtime.tracer as tracer_module

    monkeypatch.setattr(tracer_module, "RERUN_STEPS", 5)

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=3,
        n_embd=384,
        n_head=6,
        vocab_size=1024,
        n_positions=128,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 1024, (8, 128))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=False)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tr = trace(model, step, steps=5, warmup=1, measure_bandwidth=False)
    finally:
        torch.set_num_threads(threads)
    assert [x.name for x in tr.layers] == [f"transformer.h.{i}" for i in range(3)]
    ratios = [x.rerun_s / x.forward_s for x in tr.layers]
    assert any(x.recompute_s is not None for x in tr.layers), ratios
    assert all(x.recompute_s is None or x.recompute_s < x.forward_s for x in tr.layers)
    assert sum(ratios) / len(ratios) < 0.9, ratios


def test_the_tracer_leaves_a_relu_blocks_rerun_at_its_forward():
    torch.manual_seed(0)
    net = _Net(d=512, n=3)
    x = torch.randn(256, 512)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=False)
        net(x).backward()
        opt.step()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # process CPU time: a busy machine does not move it
    try:
        tr = trace(net, step, layers=[r"blocks\.\d+"], steps=3, warmup=1, measure_bandwidth=False)
    finally:
        torch.set_num_threads(threads)
    # Its last op saves its output, so all of it re-runs. Recorded only where measurably below its forward:
    # whether noise puts a whole re-run there varies run to run (0.87-0.94 of the forward in one run), so
    # what is asserted is the rule, not its outcome.
    ratios = [x.rerun_s / x.forward_s for x in tr.layers]
    assert all(r > 0.8 for r in ratios), ratios
    assert all(x.recompute_s is None or x.recompute_s < RERUN_BELOW * x.forward_s for x in tr.layers), ratios
