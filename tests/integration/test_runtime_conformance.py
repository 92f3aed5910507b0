"""Conformance: on a zoo of small real models, three steps of a plain AdamW loop under a recompute plan and under
an offload+recompute plan leave the training state bitwise equal to keep-all's from the same seed: parameters,
gradients, optimizer state, buffers (BatchNorm statistics), the RNG state and every loss (CPU).

Each model is traced by the real tracer; the plans are built from its layers with the optimizer's own
constructors and priced by the simulator (`schedule_of`). Widths are tiny: the point is the mechanics (dropout,
BatchNorm, skip concatenations, shared and tied modules, in-place ops, tuple and dict outputs, caches)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from test_runtime_support import schedule_of
from torch import nn

from memsched.optimizer.decisions import KEEP, Decision, offload_all, recompute
from memsched.runtime import apply_schedule, trace
from memsched.schema import Schedule, Trace

STEPS = 3


# -- the user's own models -------------------------------------------------------------------------------------


class ResBlock(nn.Module):
    """conv-BN-ReLU(in place)-conv-BN, a residual add in place, channel dropout."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.drop = nn.Dropout2d(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.b2(self.c2(torch.relu_(self.b1(self.c1(x)))))
        return self.drop(h.add_(x))


class BatchNormCNN(nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
        self.blocks = nn.ModuleList(ResBlock(c) for _ in range(4))
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for b in self.blocks:
            h = b(h)
        return nn.functional.cross_entropy(self.head(h.mean((2, 3))), y)


class Down(nn.Module):
    """Returns a tuple: the pooled map for the next level and the skip for the decoder."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1),
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        skip = self.conv(x)
        return nn.functional.max_pool2d(skip, 2), skip


class Up(nn.Module):
    """Upsample, concatenate the skip, convolve."""

    def __init__(self, cin: int, cskip: int, cout: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cin, 2, stride=2)
        self.conv = nn.Sequential(
            nn.Conv2d(cin + cskip, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.Conv2d(cout, cout, 1)
        )

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([self.up(x), skip], dim=1))


class UNet(nn.Module):
    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.downs = nn.ModuleList([Down(c, 2 * c), Down(2 * c, 4 * c)])
        self.ups = nn.ModuleList([Up(4 * c, 4 * c, 2 * c), Up(2 * c, 2 * c, c)])
        self.out = nn.Conv2d(c, 1, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h, skips = self.stem(x), []
        for d in self.downs:
            h, s = d(h)
            skips.append(s)
        for u in self.ups:
            h = u(h, skips.pop())
        return nn.functional.mse_loss(self.out(h), y)


class SharedBlock(nn.Module):
    """Uses a BatchNorm1d shared by every block (its statistics are updated by each); returns a dict."""

    def __init__(self, d: int, shared: nn.Module) -> None:
        super().__init__()
        self.shared = shared
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"h": x + self.drop(self.down(torch.nn.functional.gelu(self.up(self.shared(x)))))}


class SharedNet(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(6, d)
        shared = nn.BatchNorm1d(d)
        self.blocks = nn.ModuleList(SharedBlock(d, shared) for _ in range(4))
        self.head = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)["h"]
        return nn.functional.mse_loss(self.head(h).squeeze(-1), y)


class TiedBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.up(self.norm(x))
        return x + self.down(nn.functional.silu(a)), a.detach().mean()  # a tuple with a side output


class TiedNet(nn.Module):
    """Blocks 0 and 2 share their up-projection weight; the output head is tied to the embedding."""

    def __init__(self, d: int = 16, vocab: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(TiedBlock(d) for _ in range(4))
        self.blocks[2].up.weight = self.blocks[0].up.weight
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for b in self.blocks:
            h, _ = b(h)
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


# -- the zoo ---------------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One zoo model: how to build it and one batch, and how to get the loss."""

    build: Callable[[], nn.Module]
    """A fresh model, seeded by the caller."""
    batch: Callable[[], dict[str, torch.Tensor]]
    """One fixed batch, seeded by the caller."""
    hf: bool = False
    """A transformers model: the loss is `model(**batch).loss`."""

    def loss(self, model: Callable[..., Any], batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out = model(**batch)
        return out.loss if self.hf else out


def _ids(vocab: int, b: int = 2, s: int = 16) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (b, s))
    return {"input_ids": ids, "labels": ids}


def _llama() -> nn.Module:
    import transformers as tf

    cfg = tf.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    assert cfg.use_cache  # the config default: the runtime must keep the cache out of a moving plan
    return tf.LlamaForCausalLM(cfg)


def _gpt2(attn_pdrop: float = 0.1) -> nn.Module:
    import transformers as tf

    cfg = tf.GPT2Config(n_embd=32, n_layer=4, n_head=4, vocab_size=128, n_positions=32, attn_pdrop=attn_pdrop)
    return tf.GPT2LMHeadModel(cfg)


def _bert() -> nn.Module:
    import transformers as tf

    cfg = tf.BertConfig(
        hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64, vocab_size=128
    )
    return tf.BertForMaskedLM(cfg)


def _vit() -> nn.Module:
    import transformers as tf

    cfg = tf.ViTConfig(
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=16,
        patch_size=4,
        num_labels=3,
        hidden_dropout_prob=0.1,
    )
    return tf.ViTForImageClassification(cfg)


ZOO: dict[str, Case] = {
    "llama": Case(_llama, lambda: _ids(128), hf=True),
    # GPT-2's defaults but attention dropout: with it, a recomputed block's input gradient differs from
    # keep-all's in the last bit (3e-8 on these weights; the block's own gradients are equal), see the xfail below.
    "gpt2": Case(lambda: _gpt2(attn_pdrop=0.0), lambda: _ids(128), hf=True),
    "bert": Case(_bert, lambda: _ids(128), hf=True),
    "vit": Case(_vit, lambda: {"pixel_values": torch.randn(2, 3, 16, 16), "labels": torch.tensor([0, 2])}, hf=True),
    "bn-cnn": Case(BatchNormCNN, lambda: {"x": torch.randn(4, 3, 8, 8), "y": torch.tensor([0, 1, 2, 4])}),
    "unet": Case(UNet, lambda: {"x": torch.randn(2, 3, 8, 8), "y": torch.randn(2, 1, 8, 8)}),
    "shared": Case(SharedNet, lambda: {"x": torch.randn(8, 6), "y": torch.randn(8)}),
    "tied": Case(TiedNet, lambda: _ids(32, 4, 8)),
}


def _traced(case: Case) -> Trace:
    torch.manual_seed(0)
    model, batch = case.build().train(), case.batch()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        # Traced as the replay will run it: without the KV cache (GPT-2's cache would add its own copies of
        # the keys and values to the traced saved bytes; the tracer does not switch it off itself yet).
        case.loss(
            model, {**batch, "use_cache": False} if case.hf and hasattr(model.config, "use_cache") else batch
        ).backward()

    return trace(model, step, steps=1, warmup=0, batch_size=2, measure_bandwidth=False)


def _plans(tr: Trace) -> dict[str, list[Decision]]:
    """Over 4 layers: a two-layer recompute segment and a single one; then an offload (done by the next
    layer's forward, prefetched at its backward) beside recompute segments."""
    assert tr.n == 4, tr.layer_names
    return {
        "recompute": [recompute(), recompute(group=0), KEEP, recompute()],
        "offload+recompute": [offload_all(tr, 0, 1, 1), recompute(), recompute(group=1), offload_all(tr, 3, 3, 3)],
    }


@dataclass
class State:
    """The training state after the loop."""

    losses: list[torch.Tensor]
    params: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor | None]
    buffers: dict[str, torch.Tensor]
    optimizer: dict[int, dict[str, torch.Tensor]]
    rng: torch.Tensor


def _train(case: Case, schedule: Schedule | None) -> State:
    torch.manual_seed(0)
    model, batch = case.build().train(), case.batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1)  # dropout masks from here on
    losses = []
    with apply_schedule(model, schedule) if schedule is not None else contextlib.nullcontext(model) as m:
        for _ in range(STEPS):
            opt.zero_grad(set_to_none=True)
            loss = case.loss(m, batch)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    return State(
        losses,
        {n: p.detach().clone() for n, p in model.named_parameters()},
        {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
        {n: b.clone() for n, b in model.named_buffers()},
        {k: {n: v.clone() for n, v in st.items()} for k, st in opt.state_dict()["state"].items()},
        torch.get_rng_state(),
    )


def _differences(a: State, b: State) -> list[str]:
    bad = [f"loss {i}" for i, (x, y) in enumerate(zip(a.losses, b.losses, strict=True)) if not torch.equal(x, y)]
    for label, da, db in (("param", a.params, b.params), ("buffer", a.buffers, b.buffers)):
        assert da.keys() == db.keys()
        bad += [f"{label} {k}" for k in da if not torch.equal(da[k], db[k])]
    assert a.grads.keys() == b.grads.keys()
    for k, g in a.grads.items():
        h = b.grads[k]
        if (g is None) != (h is None) or (g is not None and h is not None and not torch.equal(g, h)):
            bad.append(f"grad {k}")
    assert a.optimizer.keys() == b.optimizer.keys()
    bad += [
        f"adamw {k}.{n}"
        for k, st in a.optimizer.items()
        for n, v in st.items()
        if not torch.equal(v, b.optimizer[k][n])
    ]
    if not torch.equal(a.rng, b.rng):
        bad.append("rng state")
    return bad


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", list(ZOO))
def test_training_state_equals_keep_all_after_every_plan(name, caplog):
    case = ZOO[name]
    tr = _traced(case)
    reference = _train(case, None)
    assert len({float(x) for x in reference.losses}) == STEPS  # the loop trains: every loss differs
    for label, decisions in _plans(tr).items():
        sched = schedule_of(tr, decisions, label)
        with caplog.at_level(logging.WARNING, logger="memsched"):
            caplog.clear()
            got = _train(case, sched)
        bad = _differences(reference, got)
        assert not bad, f"{name} under {label}: differs from keep-all in {bad[:6]}"
        # Nothing to warn about but a cache the runtime switched off (the transformers decoders' default).
        unexpected = [r.getMessage() for r in caplog.records if "use_cache=True" not in r.getMessage()]
        assert not unexpected, unexpected


def test_batchnorm_statistics_are_updated_once_per_step():
    """The issue's numbers: a recompute plan on a BatchNorm CNN counted 6 batches after 3 steps."""
    case = ZOO["bn-cnn"]
    sched = schedule_of(_traced(case), [recompute(), recompute(group=0), recompute(group=0), recompute(group=0)])
    got = _train(case, sched)
    assert {int(v) for k, v in got.buffers.items() if k.endswith("num_batches_tracked")} == {STEPS}
    assert not _differences(_train(case, None), got)


@pytest.mark.xfail(
    strict=True,
    reason="known: under GPT-2's attention dropout (attn_pdrop=0.1, its default) a recomputed block's input "
    "gradient differs from keep-all's in the last bit; the masks are equal (the losses are)",
)
def test_gpt2_with_attention_dropout_is_bitwise_equal():
    case = Case(_gpt2, lambda: _ids(128), hf=True)
    tr = _traced(case)
    reference = _train(case, None)
    got = _train(case, schedule_of(tr, _plans(tr)["recompute"]))
    assert [float(x) for x in got.losses] == [float(x) for x in reference.losses]
    assert not _differences(reference, got)
