"""The conformance zoo at realistic CPU widths: predicted vs measured whole-step peak and step time per plan.

The models of tests/integration/test_runtime_conformance.py (a `transformers` Llama, GPT-2, BERT and ViT with
their default configs but for the widths; a BatchNorm CNN with in-place ops; a UNet with skip concatenations;
a model with a shared BatchNorm; one with tied weights), each wider and fed a larger batch than in the tests;
and architectures found by tracing users' models (2026-12-07): T5 and BART (encoder-decoders; BART with
LayerDrop on), DeBERTa-v2 (relative attention), Wav2Vec2 (a speech encoder, LayerDrop at its default).
For each: trace one AdamW step on the CPU (one torch thread), solve at 75 / 50 / 25% (the CPU default:
keep+recompute; a budget below the smallest feasible one is solved at that smallest one, labelled so), and
replay each plan with `memsched measure`'s code (memsched.service.measure.run_measure): the whole-step peak
(every live CPU tensor byte) and the median step time, keep-all's steps interleaved with the plan's.

    .venv/bin/python -m bench.zoo                   # the whole zoo (~10 minutes on 2 cores)
    .venv/bin/python -m bench.zoo --models llama unet --steps 3

Writes bench/results/zoo.md and zoo.json. Each model is also a factory (`bench.zoo:llama`, ...), which is
how run_measure builds it again for the replay: `memsched measure bench.zoo:llama SCHEDULE --trace TRACE`.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))  # the zoo's own models live with the conformance tests
sys.path.insert(0, str(ROOT / "tests"))  # and import the tests' helpers package

from test_runtime_conformance import BatchNormCNN, SharedNet, TiedNet, UNet  # noqa: E402

from memsched.runtime import Workload  # noqa: E402

log = logging.getLogger("bench.zoo")

BUDGETS = ("75%", "50%", "25%")
PEAK_TARGET = 0.05
STEP_TARGET = 0.10
OUT = ROOT / "bench" / "results"


# -- the zoo at bench widths: each a factory (docs/factory.md) --------------------------------------------------


def _workload(
    model: torch.nn.Module,
    model_id: str,
    batch: dict[str, torch.Tensor],
    batch_size: int,
    seq_len: int | None,
    hf: bool,
) -> Workload:
    torch.manual_seed(1)
    if hf and getattr(getattr(model, "config", None), "use_cache", False):
        batch = {**batch, "use_cache": False}  # the replay turns it off anyway (and says so)
    return Workload(
        model=model.train(),
        model_id=model_id,
        batch=batch,
        batch_size=batch_size,
        seq_len=seq_len,
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4),
        loss_fn=(lambda out: out.loss) if hf else (lambda out: out),
    )


def _check(given: dict[str, Any]) -> None:
    """The zoo runs on the CPU in float32 with AdamW (what `memsched measure` passes by default); anything
    else asked of a factory is refused rather than ignored."""
    ok = {"device": ("cpu",), "optimizer": ("adamw",), "dtype": ("float32",)}
    bad = {k: v for k, v in given.items() if v is not None and str(v) not in ok.get(k, ())}
    if bad:
        raise ValueError(f"bench.zoo factories build the CPU float32 AdamW zoo only; cannot honour {bad}")


def _ids(vocab: int, b: int, s: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (b, s))
    return {"input_ids": ids, "labels": ids}


VOCAB = 8192


def _seq2seq(b: int, s: int) -> dict[str, torch.Tensor]:
    """An encoder-decoder's batch: source ids, and target labels half as long."""
    return {"input_ids": torch.randint(0, VOCAB, (b, s)), "labels": torch.randint(0, VOCAB, (b, s // 2))}


def llama(batch_size: int = 4, seq_len: int = 256, **given: Any) -> Workload:
    _check(given)
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=max(512, seq_len),
    )
    return _workload(tf.LlamaForCausalLM(cfg), "zoo-llama", _ids(VOCAB, batch_size, seq_len), batch_size, seq_len, True)


def gpt2(batch_size: int = 4, seq_len: int = 256, **given: Any) -> Workload:
    _check(given)
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_embd=256, n_layer=6, n_head=8, vocab_size=VOCAB, n_positions=max(512, seq_len))
    return _workload(tf.GPT2LMHeadModel(cfg), "zoo-gpt2", _ids(VOCAB, batch_size, seq_len), batch_size, seq_len, True)


def bert(batch_size: int = 4, seq_len: int = 256, **given: Any) -> Workload:
    _check(given)
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.BertConfig(
        hidden_size=256, num_hidden_layers=6, num_attention_heads=8, intermediate_size=1024, vocab_size=VOCAB
    )
    return _workload(tf.BertForMaskedLM(cfg), "zoo-bert", _ids(VOCAB, batch_size, seq_len), batch_size, seq_len, True)


def vit(batch_size: int = 16, **given: Any) -> Workload:
    _check(given)
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.ViTConfig(
        hidden_size=256,
        num_hidden_layers=6,
        num_attention_heads=8,
        intermediate_size=1024,
        image_size=64,
        patch_size=8,
        num_labels=10,
    )
    batch = {"pixel_values": torch.randn(batch_size, 3, 64, 64), "labels": torch.randint(0, 10, (batch_size,))}
    return _workload(tf.ViTForImageClassification(cfg), "zoo-vit", batch, batch_size, None, True)


def bn_cnn(batch_size: int = 16, **given: Any) -> Workload:
    _check(given)
    torch.manual_seed(0)
    batch = {"x": torch.randn(batch_size, 3, 32, 32), "y": torch.randint(0, 5, (batch_size,))}
    return _workload(BatchNormCNN(32), "zoo-bn-cnn", batch, batch_size, None, False)


def unet(batch_size: int = 8, **given: Any) -> Workload:
    _check(given)
    torch.manual_seed(0)
    batch = {"x": torch.randn(batch_size, 3, 64, 64), "y": torch.randn(batch_size, 1, 64, 64)}
    return _workload(UNet(16), "zoo-unet", batch, batch_size, None, False)


def shared(batch_size: int = 512, **given: Any) -> Workload:
    _check(given)
    torch.manual_seed(0)
    batch = {"x": torch.randn(batch_size, 6), "y": torch.randn(batch_size)}
    return _workload(SharedNet(512), "zoo-shared", batch, batch_size, None, False)


def tied(batch_size: int = 8, seq_len: int = 256, **given: Any) -> Workload:
    _check(given)
    torch.manual_seed(0)
    vocab = 2048  # a smaller head than the decoders': its logits would otherwise be the whole step's peak
    return _workload(TiedNet(256, vocab), "zoo-tied", _ids(vocab, batch_size, seq_len), batch_size, seq_len, False)


def t5(batch_size: int = 4, seq_len: int = 256, **given: Any) -> Workload:
    """An encoder-decoder: the encoder's output feeds every decoder block; relative position bias passed on."""
    _check(given)
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.T5Config(
        vocab_size=VOCAB, d_model=256, d_kv=32, d_ff=1024, num_layers=3, num_decoder_layers=3, num_heads=8,
        decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return _workload(
        tf.T5ForConditionalGeneration(cfg), "zoo-t5", _seq2seq(batch_size, seq_len), batch_size, seq_len, True
    )


def bart(batch_size: int = 4, seq_len: int = 256, **given: Any) -> Workload:
    """An encoder-decoder with LayerDrop on (0.1): traced without it, replayed with it (runtime/layerdrop.py)."""
    _check(given)
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.BartConfig(
        vocab_size=VOCAB, d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=8,
        decoder_attention_heads=8, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
        max_position_embeddings=max(512, seq_len), encoder_layerdrop=0.1, decoder_layerdrop=0.1,
    )  # fmt: skip
    model = tf.BartForConditionalGeneration(cfg)
    return _workload(model, "zoo-bart", _seq2seq(batch_size, seq_len), batch_size, seq_len, True)


def deberta(batch_size: int = 4, seq_len: int = 256, **given: Any) -> Workload:
    """Disentangled relative attention: every layer reads the shared relative position embeddings."""
    _check(given)
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.DebertaV2Config(
        vocab_size=VOCAB, hidden_size=256, num_hidden_layers=6, num_attention_heads=8, intermediate_size=1024,
        max_position_embeddings=max(512, seq_len), relative_attention=True, pos_att_type=["p2c", "c2p"],
    )  # fmt: skip
    return _workload(
        tf.DebertaV2ForMaskedLM(cfg), "zoo-deberta", _ids(VOCAB, batch_size, seq_len), batch_size, seq_len, True
    )


def wav2vec2(batch_size: int = 4, **given: Any) -> Workload:
    """A speech encoder behind a convolutional feature extractor, CTC loss, LayerDrop at its default 0.1."""
    _check(given)
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.Wav2Vec2Config(
        vocab_size=32, hidden_size=256, num_hidden_layers=6, num_attention_heads=8, intermediate_size=1024,
        conv_dim=(64, 64, 64), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=32,
        num_conv_pos_embedding_groups=8, mask_time_prob=0.0,
    )  # fmt: skip
    batch = {"input_values": torch.randn(batch_size, 16000), "labels": torch.randint(1, 32, (batch_size, 40))}
    return _workload(tf.Wav2Vec2ForCTC(cfg), "zoo-wav2vec2", batch, batch_size, None, True)


ZOO: dict[str, Callable[..., Workload]] = {
    "llama": llama,
    "gpt2": gpt2,
    "bert": bert,
    "vit": vit,
    "bn-cnn": bn_cnn,
    "unet": unet,
    "shared": shared,
    "tied": tied,
    "t5": t5,
    "bart": bart,
    "deberta": deberta,
    "wav2vec2": wav2vec2,
}


# -- the benchmark ------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One model at one budget."""

    model: str
    shape: str
    budget: str
    """'75%', or '25% -> min' when the percentage was infeasible and the smallest feasible budget was used."""
    budget_bytes: int
    policy: str
    actions: dict[str, int]
    predicted_peak_bytes: int
    measured_peak_bytes: int
    predicted_step_s: float
    measured_step_s: float
    keepall_predicted_step_s: float
    keepall_measured_step_s: float
    predicted_overhead_pct: float
    measured_step_ratio_paired: float | None
    worst_stage: dict[str, Any] | None

    @property
    def peak_ratio(self) -> float:
        return self.measured_peak_bytes / self.predicted_peak_bytes

    @property
    def step_ratio(self) -> float:
        return self.measured_step_s / self.predicted_step_s

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "peak_ratio": self.peak_ratio,
            "step_ratio": self.step_ratio,
            "fits_budget": self.measured_peak_bytes <= self.budget_bytes,
            "peak_within_target": abs(self.peak_ratio - 1) <= PEAK_TARGET,
            "step_within_target": abs(self.step_ratio - 1) <= STEP_TARGET,
        }


def _shape(w: Workload) -> str:
    return f"batch {w.batch_size}" + ("" if w.seq_len is None else f", seq {w.seq_len}")


def run_model(name: str, steps: int, warmup: int, time_limit: float) -> list[Row]:
    from memsched.errors import InfeasibleBudgetError
    from memsched.options import SolveOptions
    from memsched.runtime import trace_workload
    from memsched.service import solve_trace
    from memsched.service.measure import WorkloadArgs, run_measure

    gc.collect()
    w = ZOO[name]()
    shape = _shape(w)
    log.info("%s: tracing (%s)", name, shape)
    t0 = time.perf_counter()
    tr, _ = trace_workload(w, steps=steps, warmup=warmup, measure_bandwidth=False)
    log.info(
        "%s: traced in %.0f s, %d layers, keep-all peak %d B",
        name,
        time.perf_counter() - t0,
        tr.n,
        tr.baseline.peak_bytes,
    )
    del w
    gc.collect()  # the CPU peak counts every live tensor: nothing of this model may survive into the replay
    # The factory's defaults are the shapes: passing batch/seq again would need every factory to take both.
    args = WorkloadArgs(f"bench.zoo:{ZOO[name].__name__}", batch_size=None, seq_len=None)  # type: ignore[arg-type]
    rows: list[Row] = []
    for label in BUDGETS:
        opts = SolveOptions(time_limit_s=time_limit)
        try:
            sched = solve_trace(tr, label, opts)
        except InfeasibleBudgetError as e:
            label = f"{label} -> min"
            sched = solve_trace(tr, e.min_feasible_bytes, opts)
        log.info("%s %s: %s %s, measuring", name, label, sched.policy, sched.action_counts())
        rep = run_measure(args, sched, tr, steps=steps, warmup=warmup, command=f"bench.zoo {name} {label}")
        s, k = rep.scheduled, rep.keep_all
        assert s is not None and s.predicted_peak_bytes is not None and s.predicted_step_s is not None
        assert k is not None and k.predicted_step_s is not None
        rows.append(
            Row(
                model=name,
                shape=shape,
                budget=label,
                budget_bytes=sched.budget_bytes,
                policy=f"{sched.policy} ({sched.solver.status.value})",
                actions=rep.actions,
                predicted_peak_bytes=s.predicted_peak_bytes,
                measured_peak_bytes=s.measured_peak_bytes,
                predicted_step_s=s.predicted_step_s,
                measured_step_s=s.measured_step_s,
                keepall_predicted_step_s=k.predicted_step_s,
                keepall_measured_step_s=k.measured_step_s,
                predicted_overhead_pct=sched.prediction.overhead_pct,
                measured_step_ratio_paired=rep.paired_ratio,
                worst_stage=None if s.worst_stage is None else s.worst_stage.to_json(),
            )
        )
        log.info(
            "%s %s: peak %d / %d B (%.3f), step %.3f / %.3f s",
            name,
            label,
            s.measured_peak_bytes,
            s.predicted_peak_bytes,
            rows[-1].peak_ratio,
            s.measured_step_s,
            s.predicted_step_s,
        )
    return rows


def machine() -> dict[str, Any]:
    from memsched.runtime.device import framework_versions

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": list(load),
        "versions": framework_versions(),
        "commit": commit,
    }


def _mib(b: int) -> str:
    return f"{b / 2**20:.2f}"


def write(rows: list[Row], meta: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "zoo.json").write_text(json.dumps({**meta, "rows": [r.to_json() for r in rows]}, indent=2) + "\n")
    v = meta["machine"]["versions"]
    lines = [
        "# The conformance zoo at bench widths: predicted vs measured (CPU)",
        "",
        f"Command: `{meta['command']}` (commit {meta['machine']['commit']}, {meta['wall_s']:.0f} s).",
        f"Machine: {meta['machine']['platform']}, {meta['machine']['cpus']} CPUs, torch threads 1 (trace and "
        f"replay); torch {v.get('torch')}, transformers {v.get('transformers')}, Python {v.get('python')}, "
        f"memsched {v.get('memsched')}. Load average at start {meta['machine']['load_average_at_start']}.",
        "",
        "**The machine was shared with other agents' work during this run**: step times are indicative only "
        "(the step clock is process CPU time on one thread, which shields them from most of it, not all). The "
        "peaks are byte counts (`cpu-all-tensors`: every live CPU tensor byte of the step) and do not depend on "
        "the load.",
        "",
        "Each model is traced (one AdamW step), solved at 75 / 50 / 25% with the CPU default, keep+recompute "
        "(`-> min`: the percentage is below the smallest feasible budget, solved at that one), and replayed by "
        "`memsched measure`'s code (`run_measure`: keep-all's steps interleaved with the plan's, "
        f"{meta['steps']} timed steps each after {meta['warmup']} warm-up rounds). Peak ratio = measured / "
        "predicted whole-step peak (target within 5%); step ratio = measured / predicted step time (target "
        "within 10%); paired = median of plan step / keep-all step beside it. Worst stage: where the measured "
        "per-stage peak departs most from the simulator's (`memsched measure`'s `worst_stage`).",
        "",
        "| model | shape | budget | actions (k/r) | budget MiB | predicted peak MiB | measured peak MiB | peak "
        "ratio | fits | predicted step s | measured step s | step ratio | overhead predicted | measured (paired) "
        "| worst stage (layer): measured - predicted |",
        "|---|---|---|---|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|---|",
    ]
    for r in rows:
        ws = r.worst_stage
        worst = "-"
        if ws is not None:
            pct = 100 * ws["fraction_of_predicted_peak"]
            worst = f"{ws['stage']} ({ws['layer']}): {ws['difference_bytes']:+,} B ({pct:+.2f}% of the peak)"
        paired = "-" if r.measured_step_ratio_paired is None else f"{100 * (r.measured_step_ratio_paired - 1):+.1f}%"
        lines.append(
            f"| {r.model} | {r.shape} | {r.budget} | {r.actions.get('keep', 0)}/{r.actions.get('recompute', 0)} | "
            f"{_mib(r.budget_bytes)} | {_mib(r.predicted_peak_bytes)} | {_mib(r.measured_peak_bytes)} | "
            f"{r.peak_ratio:.3f} | {'yes' if r.measured_peak_bytes <= r.budget_bytes else '**no**'} | "
            f"{r.predicted_step_s:.3f} | {r.measured_step_s:.3f} | {r.step_ratio:.2f} | "
            f"{r.predicted_overhead_pct:+.1f}% | {paired} | {worst} |"
        )
    n = len(rows)
    fits = sum(r.measured_peak_bytes <= r.budget_bytes for r in rows)
    peak_ok = sum(abs(r.peak_ratio - 1) <= PEAK_TARGET for r in rows)
    step_ok = sum(abs(r.step_ratio - 1) <= STEP_TARGET for r in rows)
    lines += [
        "",
        f"Summary: {fits}/{n} plans within their budget, {peak_ok}/{n} peaks within 5% of predicted, "
        f"{step_ok}/{n} step times within 10% of predicted (indicative: shared machine).",
        "",
    ]
    over = [r for r in rows if r.measured_peak_bytes > r.budget_bytes]
    if over:
        lines += ["Over budget (the cost model under-prices these plans):", ""]
        for r in over:
            ws = r.worst_stage or {}
            diff = ws.get("difference_bytes", 0)
            lines.append(
                f"- {r.model} {r.budget}: measured {r.measured_peak_bytes:,} B > budget {r.budget_bytes:,} B "
                f"(+{r.measured_peak_bytes - r.budget_bytes:,} B; predicted {r.predicted_peak_bytes:,} B); the stage "
                f"furthest above the plan is {ws.get('stage')} ({ws.get('layer')}), {diff:+,} B"
            )
        lines.append("")
    off = [r for r in rows if abs(r.peak_ratio - 1) > PEAK_TARGET]
    if off:
        lines += ["Peaks outside 5% of the prediction:", ""]
        lines += [f"- {r.model} {r.budget}: measured / predicted {r.peak_ratio:.3f}" for r in off]
        lines.append("")
    md = out / "zoo.md"
    old = md.read_text() if md.exists() else ""
    notes = old[old.index("\n## Notes") :] if "\n## Notes" in old else ""  # hand-written, kept under a new run
    md.write_text("\n".join(lines) + notes)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.zoo", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=list(ZOO), default=list(ZOO))
    p.add_argument("--steps", type=int, default=5, help="timed steps per side (and trace steps)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--time-limit", type=float, default=10.0, help="solver time limit per budget, seconds")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("memsched").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    import transformers  # noqa: F401  (imported before the versions are read: the zoo's decoders are its models)

    meta: dict[str, Any] = {
        "command": shlex.join([".venv/bin/python", "-m", "bench.zoo", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "shared_machine": True,
        "steps": a.steps,
        "warmup": a.warmup,
        "time_limit_s": a.time_limit,
        "budgets": list(BUDGETS),
    }
    t0 = time.perf_counter()
    rows: list[Row] = []
    for name in a.models:
        rows += run_model(name, a.steps, a.warmup, a.time_limit)
        meta["wall_s"] = time.perf_counter() - t0
        write(rows, meta, a.out)  # after every model: a cut-off run still leaves its results
    log.info("wrote %s and %s (%.0f s)", a.out / "zoo.md", a.out / "zoo.json", meta["wall_s"])


if __name__ == "__main__":
    main()
