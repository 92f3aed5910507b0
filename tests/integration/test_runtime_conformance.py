"""Conformance: on a zoo of small real models, three steps of a plain AdamW loop under a recompute plan and under
an offload+recompute plan leave the training state bitwise equal to keep-all's from the same seed: parameters,
gradients, optimizer state, buffers (BatchNorm statistics), the RNG state and every loss (CPU).

Each model is traced by the real tracer; the plans are built from its layers with the optimizer's own
constructors and priced by the simulator (`schedule_of`). Widths are tiny: the point is the mechanics (dropout,
BatchNorm, skip concatenations, shared and tied modules, in-place ops, tuple and dict outputs, caches).

Then the same zoo traced with its AdamW loop and solved by the real solver at two budgets, keep+recompute and
keep+offload+recompute (issue 20, item 6): every plan leaves keep-all's training state, and a recompute-only
plan's measured whole-step peak (every live CPU tensor byte) is within its budget and within 5% of the
simulator's predicted peak. GPT-2, BERT and ViT are also traced per sub-module (attention and MLP apart, SUB_ZOO),
and a ResNet per convolution stack and shortcut, and solved the same way."""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from test_runtime_support import schedule_of
from torch import nn

from helpers.ctx_models import CtxBlock, KeepsOnCtx
from memsched.errors import InfeasibleBudgetError
from memsched.optimizer.budget import budget_between
from memsched.optimizer.decisions import KEEP, Decision, decisions_from_schedule, offload_all, recompute, segment_ends
from memsched.optimizer.simulate import rerun_fork_bytes, simulate
from memsched.options import SolveOptions
from memsched.runtime import Workload, apply_schedule, measure, trace
from memsched.schema import Action, Schedule, Trace
from memsched.service import solve_trace
from memsched.service.measure import measured_stage_peaks, predicted_stage_peaks, worst_stage

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
    layers: tuple[str, ...] | None = None
    """Regexes of the modules traced as layers (the tracer's `layers`); None: its repeated blocks."""

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


def _resnet() -> nn.Module:
    import transformers as tf

    cfg = tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[2, 1], layer_type="bottleneck", num_labels=3)
    return tf.ResNetForImageClassification(cfg)


ZOO: dict[str, Case] = {
    "llama": Case(_llama, lambda: _ids(128), hf=True),
    # GPT-2's defaults but attention dropout, which has its own bitwise test below.
    "gpt2": Case(lambda: _gpt2(attn_pdrop=0.0), lambda: _ids(128), hf=True),
    "bert": Case(_bert, lambda: _ids(128), hf=True),
    "vit": Case(_vit, lambda: {"pixel_values": torch.randn(2, 3, 16, 16), "labels": torch.tensor([0, 2])}, hf=True),
    "bn-cnn": Case(BatchNormCNN, lambda: {"x": torch.randn(4, 3, 8, 8), "y": torch.tensor([0, 1, 2, 4])}),
    "unet": Case(UNet, lambda: {"x": torch.randn(2, 3, 8, 8), "y": torch.randn(2, 1, 8, 8)}),
    "shared": Case(SharedNet, lambda: {"x": torch.randn(8, 6), "y": torch.randn(8)}),
    "tied": Case(TiedNet, lambda: _ids(32, 4, 8)),
}


SUB_ZOO: dict[str, Case] = {
    # The same transformers models traced per sub-module: attention and MLP apart, with the norms between them
    # left to the model's code (GPT-2 and ViT: gaps where that code saves for backward, Layer.code_after_saves) or
    # inside the sub-modules (BERT: attention, intermediate, output; its layer norms are in attention and output).
    "gpt2-sub": Case(
        lambda: _gpt2(attn_pdrop=0.0),
        lambda: _ids(128),
        hf=True,
        layers=(r"transformer\.h\.\d+\.attn$", r"transformer\.h\.\d+\.mlp$"),
    ),
    "bert-sub": Case(
        _bert,
        lambda: _ids(128),
        hf=True,
        layers=tuple(rf"bert\.encoder\.layer\.\d+\.{m}$" for m in ("attention", "intermediate", "output")),
    ),
    "vit-sub": Case(
        _vit,
        lambda: {"pixel_values": torch.randn(2, 3, 16, 16), "labels": torch.tensor([0, 2])},
        hf=True,
        layers=(r"vit\.layers\.\d+\.attention$", r"vit\.layers\.\d+\.mlp$"),
    ),
}
"""Models traced per sub-module: solved plans only (the hand-made plans above are for 4 layers)."""
SUB_ZOO["resnet-sub"] = Case(
    _resnet,
    # 48 x 48 pixels: the activations outweigh the weights and AdamW's state, so the budgets need recompute.
    lambda: {"pixel_values": torch.randn(2, 3, 48, 48), "labels": torch.tensor([0, 2])},
    hf=True,
    # Each bottleneck's convolution stacks and its shortcut (the block's add and ReLU run between them and save).
    layers=(r"resnet\.encoder\.stages\.\d+\.layers\.\d+\.(shortcut|layer\.\d+)$",),
)


def _mixtral() -> nn.Module:
    import transformers as tf

    cfg = tf.MixtralConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        output_router_logits=True,
    )
    return tf.MixtralForCausalLM(cfg)


def _swin() -> nn.Module:
    import transformers as tf

    cfg = tf.SwinConfig(
        image_size=32,
        patch_size=2,
        embed_dim=16,
        depths=[2, 2],
        num_heads=[2, 4],
        window_size=4,
        num_labels=3,
        drop_path_rate=0.1,
        hidden_dropout_prob=0.1,
    )
    return tf.SwinForImageClassification(cfg)


def _convnext() -> nn.Module:
    import transformers as tf

    cfg = tf.ConvNextConfig(
        num_stages=2, hidden_sizes=[8, 16], depths=[2, 2], drop_path_rate=0.2, num_labels=3, image_size=32
    )
    return tf.ConvNextForImageClassification(cfg)


def _t5() -> nn.Module:
    import transformers as tf

    cfg = tf.T5Config(
        vocab_size=128,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=3,
        num_decoder_layers=3,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    return tf.T5ForConditionalGeneration(cfg)


def _t5_batch() -> dict[str, Any]:
    # T5's own cache changes its numerics (a plain loop with and without it differs by 7e-5 in the weights after
    # three steps), and the replay runs without it (kv_cache): so does the keep-all side here.
    return {"input_ids": torch.randint(0, 128, (2, 12)), "labels": torch.randint(0, 128, (2, 10)), "use_cache": False}


class CtxNet(nn.Module):
    """Four blocks, each with a custom Function that keeps its input on its ctx (Layer.ctx_held_bytes)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(CtxBlock(KeepsOnCtx, d=16) for _ in range(4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return (x.mean(-1) - y).square().mean()


SOLVED_ZOO: dict[str, Case] = {
    # Solved plans only, on models the hand-made 4-layer plans do not fit, each bringing what no model above has
    # (found by tracing users' models, 2026-12-07): routed experts and a router loss (Mixtral), shifted-window
    # attention and drop path (Swin), drop path and layer scale in a CNN (ConvNeXt), and a custom autograd
    # Function keeping a tensor on its ctx (docs/cost-model.md, 'Tensors kept on a ctx'). And an encoder-decoder
    # (T5): the encoder's output and attention masks feed every decoder block, and the first block of each stack
    # computes the relative position bias the others take as an input.
    "mixtral": Case(_mixtral, lambda: _ids(128), hf=True),
    "swin": Case(_swin, lambda: {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([0, 2])}, hf=True),
    "convnext": Case(
        _convnext, lambda: {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([0, 2])}, hf=True
    ),
    "ctx": Case(CtxNet, lambda: {"x": torch.randn(8, 32, 16), "y": torch.randn(8, 32)}),
    "t5": Case(_t5, _t5_batch, hf=True),
}
ALL_CASES = {**ZOO, **SUB_ZOO, **SOLVED_ZOO}


def _traced(case: Case) -> Trace:
    torch.manual_seed(0)
    model, batch = case.build().train(), case.batch()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        # Without the KV cache, as the tracer and the replay run training forwards anyway (kv_cache).
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


def test_gpt2_with_attention_dropout_is_bitwise_equal():
    """GPT-2's own attention dropout (attn_pdrop=0.1). This differed from keep-all in the last bit of a recomputed
    block's input gradient while a segment's opening left the saved-tensor hook stack out of order (the input
    observer's exit popped the checkpoint's forward observer); with the stack kept in order it is bitwise equal.

    Keep-all runs without the KV cache here, as the replay does (it switches the cache off, and says so): with the
    cache on, GPT-2 concatenates its keys into a contiguous tensor and its eager attention's batched matmul then
    reads them in another layout, which changes the gradients' last bit on some CPUs' kernels (AMD EPYC: up to
    3e-8 after one step) whatever the plan, as it does under Hugging Face's own gradient checkpointing."""
    case = Case(_gpt2, lambda: {**_ids(128), "use_cache": False}, hf=True)
    tr = _traced(case)
    reference = _train(case, None)
    got = _train(case, schedule_of(tr, _plans(tr)["recompute"]))
    assert [float(x) for x in got.losses] == [float(x) for x in reference.losses]
    assert not _differences(reference, got)


# -- the zoo solved by the real solver ---------------------------------------------------------------------------

BUDGET_FRACTIONS = (0.75, 0.40)
"""Budgets as fractions of the way from the smallest feasible budget to keep-all's peak (budget_between): at
these widths the memory outside the layers leaves no room for a 50% budget on most models."""
ACTION_SETS = {
    "keep+recompute": [Action.KEEP, Action.RECOMPUTE],
    "keep+offload+recompute": [Action.KEEP, Action.OFFLOAD, Action.RECOMPUTE],
}
PEAK_WITHIN = 0.05
OPTIONS = {"time_limit_s": 5.0}


def _workload(case: Case) -> Workload:
    """The user's loop as a Workload: AdamW, gradients zeroed in place, the KV cache off (as `_traced`)."""
    torch.manual_seed(0)
    model, batch = case.build().train(), case.batch()
    if case.hf and hasattr(model.config, "use_cache"):
        batch = {**batch, "use_cache": False}
    return Workload(
        model=model,
        model_id=type(model).__name__,
        batch=batch,
        batch_size=2,
        seq_len=None,
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
        loss_fn=(lambda out: out.loss) if case.hf else (lambda out: out),
    )


_TRACES: dict[str, Trace] = {}
_SOLVED: dict[tuple[str, float, str], Schedule] = {}


def _whole_step_trace(name: str) -> Trace:
    """The zoo model traced with its optimizer (the state a budget must hold), once per module. Traced with
    nothing else of size alive: on the CPU the tracer's whole-step peak counts every live tensor."""
    if name not in _TRACES:
        gc.collect()
        case = ALL_CASES[name]
        w = _workload(case)
        _TRACES[name] = trace(
            w.model,
            w.step,
            layers=case.layers,
            steps=1,
            warmup=1,
            batch_size=2,
            optimizer=w.optimizer,
            measure_bandwidth=False,
        )
    return _TRACES[name]


def _solved(name: str, frac: float, actions: str) -> Schedule:
    """The real solver's plan at budget_between(frac); an infeasible budget (for keep+recompute, whose smallest
    budget is above the offload one budget_between starts from) is an answer: solved again at the smallest
    feasible budget the error reports."""
    key = (name, frac, actions)
    if key not in _SOLVED:
        tr = _whole_step_trace(name)
        opts = SolveOptions(actions=ACTION_SETS[actions], **OPTIONS)
        try:
            _SOLVED[key] = solve_trace(tr, budget_between(tr, frac), opts)
        except InfeasibleBudgetError as e:
            assert e.min_feasible_bytes > e.budget_bytes
            _SOLVED[key] = solve_trace(tr, e.min_feasible_bytes, opts)
        allowed = set(ACTION_SETS[actions])
        assert {a.action for a in _SOLVED[key].actions} <= allowed, _SOLVED[key].action_counts()
    return _SOLVED[key]


_SLOW = {"llama"}
"""The slowest zoo model to trace (4 s of the file's total on the 2-core CI machine)."""


def _zoo_params(xfail: dict[tuple[str, float], str] | None = None) -> list[Any]:
    out = []
    for name in ALL_CASES:
        for frac in BUDGET_FRACTIONS:
            marks: list[Any] = [pytest.mark.slow] if name in _SLOW else []
            if xfail and (name, frac) in xfail:
                marks.append(pytest.mark.xfail(strict=True, reason=xfail[(name, frac)]))
            out.append(pytest.param(name, frac, marks=marks, id=f"{name}-{int(frac * 100)}"))
    return out


@pytest.mark.parametrize(("name", "frac"), _zoo_params())
def test_solved_plans_leave_the_training_state_of_keep_all(name, frac, caplog):
    case = ALL_CASES[name]
    plans = {actions: _solved(name, frac, actions) for actions in ACTION_SETS}  # traced before anything is alive
    reference = _train(case, None)
    for actions, sched in plans.items():
        if name in SUB_ZOO:  # below keep-all's peak, so the plan moves something (the point of these cases)
            assert sched.action_counts()["keep"] < len(sched.actions), sched.action_counts()
        with caplog.at_level(logging.WARNING, logger="memsched"):
            caplog.clear()
            got = _train(case, sched)
        bad = _differences(reference, got)
        assert not bad, f"{name} {actions} {sched.action_counts()}: differs from keep-all in {bad[:6]}"
        unexpected = [r.getMessage() for r in caplog.records if "use_cache=True" not in r.getMessage()]
        assert not unexpected, unexpected


def test_sub_module_traces_mark_the_gaps_where_the_models_code_saves():
    # GPT-2 and ViT run a layer norm between attention and MLP and between blocks (it saves its input); BERT's norms
    # are inside its sub-modules. A recompute segment of a solved plan never runs across a marked gap.
    marks = {name: [x.code_after_saves for x in _whole_step_trace(name).layers] for name in SUB_ZOO}
    assert marks["gpt2-sub"] == [True] * 7 + [False] and marks["vit-sub"] == [True] * 7 + [False], marks
    assert not any(marks["bert-sub"]) and len(marks["bert-sub"]) == 12
    # A bottleneck adds its shortcut and runs its ReLU after the layers (its last convolution stack, then the
    # shortcut, in the trace's order): the gap after each shortcut but the network's last.
    names = _whole_step_trace("resnet-sub").layer_names
    assert marks["resnet-sub"] == [n.endswith("shortcut") and i < len(names) - 1 for i, n in enumerate(names)], names
    for name in ("gpt2-sub", "vit-sub"):
        for frac in BUDGET_FRACTIONS:
            groups = [a.recompute_group for a in _solved(name, frac, "keep+recompute").actions]
            assert all(g in (None, i) for i, g in enumerate(groups)), groups  # segments of one layer each


_UNDER_PRICED: dict[tuple[str, float], str] = {
    # Plans expected to break their budget, each with its measured excess (docs/cost-model.md, 'Not priced yet').
    # Empty since 2026-11-24: BatchNormCNN's snapshots, SharedNet's re-run RNG fork and (through the fork's
    # margin) UNet's plan fit. UNet's kept skips are still unpriced (bench/results/costmodel_validation.md).
}


@pytest.mark.parametrize(("name", "frac"), _zoo_params(_UNDER_PRICED))
def test_solved_recompute_plan_fits_its_budget_and_its_prediction(name, frac):
    """On the CPU only recompute lowers the process's peak: the measured whole-step peak of the solver's
    keep+recompute plan is within the budget and within 5% of the predicted peak."""
    sched = _solved(name, frac, "keep+recompute")
    tr = _whole_step_trace(name)
    # Nothing else of size may be alive: the CPU peak counts every live tensor of the process at the start.
    gc.collect()
    w = _workload(ALL_CASES[name])
    m = measure(w.model, w.step, sched, trace=tr, optimizer=w.optimizer, steps=1, warmup=1)
    predicted = sched.prediction.peak_bytes
    sim = simulate(tr, sched, with_events=False)
    assert sim.peak_bytes == predicted
    worst = worst_stage(
        predicted_stage_peaks(sim.static_bytes, sim.stage_bytes),
        measured_stage_peaks(m.stage_peak_bytes),
        tr.layer_names,
    )
    detail = (
        f"{name} at {frac}: {sched.action_counts()} measured {m.peak_bytes} B, predicted {predicted} B, budget "
        f"{sched.budget_bytes} B; departs most at {worst}"
    )
    assert m.peak_bytes / predicted - 1 <= PEAK_WITHIN, detail
    # Below it by no more than that, and what a re-run's row holds for all of its B_b though it lives only while
    # the re-run runs: its RNG state's fork and its layers' ctx tensors (docs/cost-model.md, 'Tensors kept on a
    # ctx'; the ctx model at 75% with blocks 0-1 one segment: 32 KiB of 496 KB).
    forks = [rerun_fork_bytes(tr, a, b) for a, b in segment_ends(decisions_from_schedule(sched)).items()]
    assert predicted - m.peak_bytes <= PEAK_WITHIN * predicted + max(forks, default=0), detail
    assert m.peak_bytes <= sched.budget_bytes, detail
