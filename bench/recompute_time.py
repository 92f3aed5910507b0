"""Where a recompute's time goes (issue 25, the time half): per block, side by side in one process.

Run: .venv/bin/python -m bench.recompute_time [--model gpt2|bert|vit] [--rounds 12]

One torch thread, the CPU clock of memsched.runtime.clock (process CPU time). Every round runs, in rotated
order, the same training step (AdamW, loss in the step) through memsched's runtime:
  keep      keep-all schedule
  ckpt      checkpoint every block (torch.utils.checkpoint non-reentrant, early stop on: what replay runs)
  ckpt-full the same with early stop off (set_checkpoint_early_stop(False)): every op of the block re-runs
each with light per-block probes (a forward pre-hook and an always-call forward hook reading the clock, and
gradient hooks on the block's input and output), so that per block we get: the forward in the step, the
re-run forward inside the backward (pre-hook to post-hook; early stop ends it by an exception, which the
always-call hook sees), and the backward span (output gradient complete -> input gradient complete) that
contains the re-run. The steps without probes give the step times. Prints medians and the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from memsched.runtime.hostalloc import steady_host_allocator
from memsched.runtime.layers import find_layers
from memsched.runtime.measure import keep_all_schedule
from memsched.runtime.replay import ScheduledModel


def build(name: str) -> tuple[nn.Module, Callable[[Callable[..., Any]], Any]]:
    import transformers as tf

    g = torch.Generator().manual_seed(0)
    if name == "gpt2":
        cfg = tf.GPT2Config(
            n_layer=6,
            n_embd=384,
            n_head=6,
            vocab_size=8192,
            n_positions=256,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            use_cache=False,
        )
        model: nn.Module = tf.GPT2LMHeadModel(cfg)
        ids = torch.randint(0, 8192, (4, 256), generator=g)
        batch = {"input_ids": ids, "labels": ids}
    elif name == "bert":
        cfg = tf.BertConfig(
            num_hidden_layers=6,
            hidden_size=384,
            num_attention_heads=6,
            intermediate_size=1536,
            vocab_size=8192,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            use_cache=False,
        )
        model = tf.BertForMaskedLM(cfg)
        ids = torch.randint(0, 8192, (4, 256), generator=g)
        batch = {"input_ids": ids, "labels": ids}
    else:
        cfg = tf.ViTConfig(
            num_hidden_layers=6,
            hidden_size=384,
            num_attention_heads=6,
            intermediate_size=1536,
            image_size=224,
            patch_size=16,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            num_labels=10,
        )
        model = tf.ViTForImageClassification(cfg)
        batch = {"pixel_values": torch.randn(8, 3, 224, 224, generator=g), "labels": torch.randint(0, 10, (8,))}
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(fwd: Callable[..., Any]) -> None:
        opt.zero_grad(set_to_none=False)
        fwd(**batch).loss.backward()
        opt.step()

    return model, step


class Probes:
    """Per block: forward in the step, re-run forward in the backward, backward span."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        self.blocks = blocks
        self.handles: list[Any] = []
        self.t0: dict[int, float] = {}
        self.fwd: dict[int, float] = {}
        self.rerun: dict[int, float] = {}
        self.bstart: dict[int, float] = {}
        self.bwd: dict[int, float] = {}
        self.in_backward = False

    def install(self) -> None:
        for i, m in enumerate(self.blocks):
            self.handles.append(m.register_forward_pre_hook(self._pre(i), with_kwargs=True))
            self.handles.append(m.register_forward_hook(self._post(i), with_kwargs=True, always_call=True))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _pre(self, i: int) -> Callable[..., None]:
        def pre(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not torch._C._current_graph_task_id() >= 0:
                x = args[0] if args else kwargs.get("hidden_states")
                if isinstance(x, torch.Tensor) and x.requires_grad:
                    x.register_hook(self._mark(i, "end"))
            self.t0[i] = time.process_time()

        return pre

    def _post(self, i: int) -> Callable[..., None]:
        def post(_m: nn.Module, _a: Any, _k: Any, out: Any) -> None:
            t = time.process_time() - self.t0[i]
            if torch._C._current_graph_task_id() >= 0:
                self.rerun[i] = self.rerun.get(i, 0.0) + t
                return
            self.fwd[i] = t
            y = out[0] if isinstance(out, tuple) else out
            if isinstance(y, torch.Tensor) and y.requires_grad:
                y.register_hook(self._mark(i, "start"))

        return post

    def _mark(self, i: int, kind: str) -> Callable[[torch.Tensor], None]:
        def hook(_g: torch.Tensor) -> None:
            now = time.process_time()
            if kind == "start":
                self.bstart.setdefault(i, now)
            elif i in self.bstart and i not in self.bwd:
                self.bwd[i] = now - self.bstart[i]

        return hook

    def take(self) -> dict[str, list[float]]:
        n = len(self.blocks)
        out = {
            "fwd": [self.fwd.get(i, math.nan) for i in range(n)],
            "rerun": [self.rerun.get(i, 0.0) for i in range(n)],
            "bwd": [self.bwd.get(i, math.nan) for i in range(n)],
        }
        self.fwd, self.rerun, self.bstart, self.bwd = {}, {}, {}, {}
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "bert", "vit"])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--trace", action="store_true", help="trace first and print the simulator's prediction")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    steady_host_allocator()
    model, step = build(args.model)
    found = find_layers(model, None)
    names = [n for n, _ in found]
    blocks = [m for _, m in found]
    n = len(blocks)
    from memsched.schema import Action, LayerAction

    keep = keep_all_schedule(names)
    ckpt = keep.model_copy(
        update={"policy": "checkpoint-all", "actions": [LayerAction(layer=x, action=Action.RECOMPUTE) for x in names]}
    )
    seg = max(1, round(math.sqrt(n)))
    size = n // seg
    sq = [
        LayerAction(layer=x, action=Action.RECOMPUTE, recompute_group=(i // size) * size)
        if i < size * (seg - 1)
        else LayerAction(layer=x, action=Action.KEEP)
        for i, x in enumerate(names)
    ]
    sqrt = keep.model_copy(update={"policy": "sqrt-segments", "actions": sq})
    probes = Probes(blocks)
    modes: dict[str, tuple[Any, Any]] = {
        "keep": (keep, contextlib.nullcontext),
        "ckpt": (ckpt, contextlib.nullcontext),
        "ckpt-full": (ckpt, lambda: torch.utils.checkpoint.set_checkpoint_early_stop(False)),
        "sqrt": (sqrt, contextlib.nullcontext),
    }
    tr = None
    if args.trace:
        from memsched.optimizer.baselines import checkpoint_all, sqrt_segments
        from memsched.optimizer.simulate import simulate
        from memsched.runtime.tracer import trace

        tr = trace(model, lambda: step(model), steps=5, measure_bandwidth=False)
        fs = sum(x.forward_s for x in tr.layers)
        print(
            f"  trace: step {tr.baseline.step_s * 1e3:.1f} ms, sum forward_s {fs * 1e3:.1f} ms "
            f"({100 * fs / tr.baseline.step_s:.1f}% of step), per layer "
            + " ".join(f"{x.forward_s * 1e3:.1f}" for x in tr.layers)
        )
        for nm, fn in (("checkpoint-all", checkpoint_all), ("sqrt-segments", sqrt_segments)):
            sim = simulate(tr, fn(tr), 10**15, with_events=False)
            print(f"  predicted {nm}: {sim.overhead_pct:+.1f}%")
    probed_steps: dict[str, list[float]] = {k: [] for k in modes}
    steps: dict[str, list[float]] = {k: [] for k in modes}
    per: dict[str, list[dict[str, list[float]]]] = {k: [] for k in modes}

    def run(mode: str, probed: bool) -> float:
        sched, ctx = modes[mode]
        if probed:
            probes.install()
        try:
            with ScheduledModel(model, sched) as sm, ctx():
                t0 = time.process_time()
                step(sm)
                t = time.process_time() - t0
        finally:
            probes.remove()
        if probed:
            per[mode].append(probes.take())
        return t

    for _ in range(2):
        for mode in modes:
            run(mode, False)
            run(mode, True)
    order = list(modes)
    for r in range(args.rounds):
        rot = order[r % len(order) :] + order[: r % len(order)]
        for mode in rot:
            steps[mode].append(run(mode, False))
        for mode in rot:
            probed_steps[mode].append(run(mode, True))

    def med(mode: str, key: str) -> list[float]:
        return [statistics.median(p[key][i] for p in per[mode]) for i in range(n)]

    ks = statistics.median(steps["keep"])
    print(f"model {args.model}, {n} blocks, {args.rounds} rounds, one thread, process CPU time")
    for mode in modes:
        s = statistics.median(steps[mode])
        paired = statistics.median(x / k for x, k in zip(steps[mode], steps["keep"], strict=True))
        pp = statistics.median(probed_steps[mode]) / statistics.median(steps[mode])
        print(
            f"  step {mode:9s} {s * 1e3:8.1f} ms  vs keep {100 * (s / ks - 1):+5.1f}%  "
            f"paired {100 * (paired - 1):+5.1f}%  probed/plain {pp:.3f}"
        )
    f_keep, b_keep = med("keep", "fwd"), med("keep", "bwd")
    f_ck, r_ck, b_ck = med("ckpt", "fwd"), med("ckpt", "rerun"), med("ckpt", "bwd")
    r_full, b_full = med("ckpt-full", "rerun"), med("ckpt-full", "bwd")
    print(
        "  block  fwd(keep) fwd(ckpt) rerun(early) rerun(full) early/fwd  bwd(keep) bwd(ckpt)-rerun bwd(ckpt)-bwd(keep)"
    )
    for i in range(n):
        print(
            f"  {i:5d} {f_keep[i] * 1e3:9.2f} {f_ck[i] * 1e3:9.2f} {r_ck[i] * 1e3:12.2f} {r_full[i] * 1e3:11.2f} "
            f"{r_ck[i] / f_keep[i]:9.3f} {b_keep[i] * 1e3:10.2f} {(b_ck[i] - r_ck[i]) * 1e3:15.2f} "
            f"{(b_ck[i] - b_keep[i]) * 1e3:19.2f}"
        )
    sf, sr, srf = sum(f_keep), sum(r_ck), sum(r_full)
    extra = sum(b_ck) - sum(b_keep)
    extra_full = sum(b_full) - sum(b_keep)
    print(f"  sum fwd(keep) {sf * 1e3:.1f} ms = {100 * sf / ks:.1f}% of the keep step")
    print(f"  sum rerun early {sr * 1e3:.1f} ms ({sr / sf:.3f} x fwd), full {srf * 1e3:.1f} ms ({srf / sf:.3f} x fwd)")
    print(
        f"  backward spans, ckpt - keep: {extra * 1e3:.1f} ms ({extra / sf:.3f} x fwd); full: {extra_full * 1e3:.1f} ms"
    )
    if tr is not None:
        # The proposed rule (docs/cost-model.md): a segment [a..b] re-runs forward_s of a..b-1 and
        # recompute_s of b, here recompute_s_b = forward_s_b x the measured early/fwd ratio of block b.
        ratio = [r_ck[i] / f_keep[i] for i in range(n)]
        fw = [x.forward_s for x in tr.layers]
        step_s = tr.baseline.step_s
        ck = sum(fw[i] * ratio[i] for i in range(n))
        ends = range(size - 1, size * (seg - 1), size)
        sqr = sum(fw[: size * (seg - 1)]) - sum(fw[e] * (1 - ratio[e]) for e in ends)
        print(f"  proposed rule: checkpoint-all {100 * ck / step_s:+.1f}%, sqrt-segments {100 * sqr / step_s:+.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
