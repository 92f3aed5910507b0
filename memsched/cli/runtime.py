"""The runtime's commands, registered on the main app by memsched.cli: `memsched trace`, `memsched measure`
and `memsched demo`.

torch and transformers are imported inside the commands, so `memsched --help` stays fast.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from memsched.errors import MemschedError
from memsched.units import format_bytes, format_seconds

out = Console()
log = logging.getLogger("memsched")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
MODELS_HELP = (
    "gpt2, gpt2-medium, bert-base, bert-large, vit-base, vit-large, resnet50, llama, qwen2, mistral "
    "(transformers configs, nothing downloaded), or package.module:factory."
)
DtypeOpt = Annotated[
    str, typer.Option("--dtype", help="Parameter/activation dtype of a built-in model: float32, bfloat16, float16.")
]


# The workload options `trace` and `measure` share: measure must rebuild exactly the traced workload.
BatchOpt = Annotated[int, typer.Option("--batch-size", "--batch", help="Batch size.")]
SeqLenOpt = Annotated[int, typer.Option("--seq-len", help="Sequence length (text models).")]
LayersOpt = Annotated[int | None, typer.Option("--layers", help="Number of blocks (overrides the config's depth).")]
SmallOpt = Annotated[bool, typer.Option("--small", help="A narrow version (hidden size 64) for CPU runs.")]
CompileOpt = Annotated[
    bool,
    typer.Option(
        "--compile",
        help="Compile each block on its own (block.compile(), the torchtitan pattern) [a factory: if it takes it].",
    ),
]
AutocastOpt = Annotated[
    str | None,
    typer.Option("--autocast", help="Run the forward under autocast: bf16, or fp16 on CUDA [default: none]."),
]
LayerPatternOpt = Annotated[
    list[str] | None,
    typer.Option("--layer-pattern", help="Regex over module names selecting the layers (repeatable)."),
]


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _quiet_transformers() -> None:
    # transformers warns about config defaults of the synthetic small models; those lines are noise here.
    # torch first: without it, the command's one line names the missing extra (importing transformers
    # without torch would print its own warning before it).
    import torch  # noqa: F401

    try:
        from transformers.utils import logging as tf_logging

        tf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - transformers is a runtime dependency
        pass


def trace_cmd(
    model: Annotated[
        str,
        typer.Argument(help=MODELS_HELP),
    ],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Where to write the trace JSON [default: MODEL.trace.json].")
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option("--batch-size", "--batch", help="Batch size [default: 2 for a built-in; a factory's own]."),
    ] = None,
    seq_len: Annotated[
        int | None,
        typer.Option("--seq-len", help="Sequence length (text models) [default: 128 for a built-in; a factory's own]."),
    ] = None,
    layers: LayersOpt = None,
    small: SmallOpt = False,
    layer_pattern: LayerPatternOpt = None,
    steps: Annotated[int, typer.Option("--steps", help="Measured steps (medians are reported).")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", help="Warm-up steps before measuring.")] = 2,
    device: Annotated[
        str | None, typer.Option("--device", help="cpu or cuda[:N] [default: cpu for a built-in; a factory's own].")
    ] = None,
    dropout: Annotated[float | None, typer.Option("--dropout", help="Override the config's dropout.")] = None,
    optimizer: Annotated[
        str | None,
        typer.Option("--optimizer", help="adamw, sgd or none [default: adamw for a built-in; a factory's own]."),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype", help="Parameter/activation dtype: float32, bfloat16, float16 [default: float32; a factory's]."
        ),
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", help="CPU threads for torch [default: torch's own choice].")
    ] = None,
    compile_blocks: CompileOpt = False,
    autocast: AutocastOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Trace a model: run real training steps and write its layer-level cost trace (JSON).

    A factory (package.module:factory, docs/factory.md) gets only the flags given, and each must be an
    argument it takes; what is not given is the factory's own choice."""
    from memsched.io import save_model
    from memsched.service.trace import trace_model

    _quiet_transformers()
    # Flags not given are None: a built-in takes its defaults, a factory its own (never a CLI default).
    run = trace_model(
        model,
        layer_pattern=layer_pattern,
        steps=steps,
        warmup=warmup,
        threads=threads,
        device=device,
        batch_size=batch_size,
        seq_len=seq_len,
        num_layers=layers,
        small=small,
        dropout=dropout,
        optimizer=optimizer,
        dtype=dtype,
        compile=compile_blocks,
        autocast=autocast,
    )
    tr = run.trace
    path = output or Path(f"{run.model_id}.trace.json")
    save_model(tr, path)
    if as_json:
        doc: dict[str, Any] = {"path": str(path), "hash": tr.content_hash(), "trace": tr.model_dump(mode="json")}
        doc["warnings"] = run.warnings
        doc["unowned_bytes"] = run.unowned_bytes
        _print_json(doc)
        return
    t = Table(title=f"{tr.model}: batch {tr.batch_size}, seq {tr.seq_len}, {tr.dtype}, {tr.device.name}")
    t.add_column("layer", overflow="fold")
    for col in ("forward", "backward", "saved", "tensors", "deps"):
        t.add_column(col, justify="right", no_wrap=True)
    for layer in tr.layers:
        t.add_row(
            layer.name,
            format_seconds(layer.forward_s),
            format_seconds(layer.backward_s),
            format_bytes(layer.saved_bytes),
            str(len(layer.tensors)),
            ",".join(map(str, layer.deps)),
        )
    out.print(t)
    s = tr.static
    out.print(
        f"static {format_bytes(s.total)} (params {format_bytes(s.params)}, grads {format_bytes(s.grads)}, "
        f"optimizer {format_bytes(s.optimizer_state)}, other {format_bytes(s.other)}: buffers and what the process "
        f"holds at the step's start, saved before the layers {format_bytes(s.saved_before_layers)} and held by the "
        f"model's code {format_bytes(s.saved_held_by_code)}: activations no schedule moves); "
        f"baseline step {format_seconds(tr.baseline.step_s)}, "
        f"peak {format_bytes(tr.baseline.peak_bytes)}; copies h2d {tr.device.h2d_bytes_per_s / 1e9:.1f} GB/s, "
        f"d2h {tr.device.d2h_bytes_per_s / 1e9:.1f} GB/s, latency {tr.device.copy_latency_s * 1e6:.1f} us"
    )
    if tr.rerun_overhead is not None:
        out.print(
            f"recompute machinery beyond the layers' re-runs: {format_seconds(tr.rerun_segment_s)} a segment, "
            f"{format_seconds(tr.rerun_layer_s)} a re-run layer (measured side by side with keep-all steps)"
        )
    if run.unowned_bytes:
        out.print(
            f"not in any layer: {format_bytes(run.unowned_bytes)} saved between traced layers (no schedule moves "
            f"them; up to {format_bytes(run.unowned_bytes)} of the smallest feasible budget)"
        )
    out.print(f"[green]wrote[/] {path}")


def demo_cmd(
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Where the trace, schedule and plot go.")] = Path(
        "out/demo"
    ),
    model: Annotated[str, typer.Option("--model", help="Built-in model (its small version).")] = "gpt2",
    layers: Annotated[int, typer.Option("--layers", help="Number of blocks.")] = 6,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Batch size.")] = 8,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Sequence length.")] = 128,
    budget: Annotated[str, typer.Option("--budget", "-b", help="Budget: N% (of activations) or bytes.")] = "50%",
    steps: Annotated[
        int, typer.Option("--steps", help="Timed steps per side, keep-all and scheduled alternating (median).")
    ] = 20,
    threads: Annotated[
        int, typer.Option("--threads", help="CPU threads for torch (1 keeps timings steady on a busy machine).")
    ] = 1,
    dtype: DtypeOpt = "float32",
    as_json: JsonOpt = False,
) -> None:
    """Trace a small model on the CPU, solve for half its activations, replay it: predicted vs measured."""
    from memsched.service.demo import run_demo

    _quiet_transformers()
    if steps < 1 or threads < 1:
        raise MemschedError(f"--steps and --threads must be >= 1 (got {steps}, {threads})")
    res = run_demo(
        out_dir,
        model=model,
        num_layers=layers,
        batch_size=batch_size,
        seq_len=seq_len,
        budget=budget,
        steps=steps,
        threads=threads,
        dtype=dtype,
    )
    if as_json:
        _print_json(res.to_json())
        return
    acts = ", ".join(f"{v} {k}" for k, v in sorted(res.actions.items()))
    out.print(
        f"[bold]{res.model}[/]: budget {format_bytes(res.budget_bytes)} (static {format_bytes(res.static_bytes)}); "
        f"schedule {res.policy}: {acts}"
    )
    t = Table(
        title=(
            "predicted vs measured over the whole step (CPU: every live tensor byte; step: median of "
            f"{res.steps} keep-all and {res.steps} scheduled steps, alternating, {res.threads} torch thread(s))"
        )
    )
    t.add_column("quantity")
    t.add_column("predicted", justify="right")
    t.add_column("measured", justify="right")
    t.add_column("measured / predicted", justify="right")
    for r in res.rows:
        fmt = {"bytes": format_bytes, "s": format_seconds, "%": lambda x: f"{x:+.1f}%"}[r["unit"]]
        p, m = r["predicted"], r["measured"]
        ratio = f"{m / p:.3f}" if p and m is not None and r["unit"] != "%" else "-"
        t.add_row(r["quantity"], "-" if p is None else fmt(p), "-" if m is None else fmt(m), ratio)
    out.print(t)
    out.print(f"trace    {res.trace_path}\nschedule {res.schedule_path}")
    out.print(f"plot     {res.plot_path}" if res.plot_path else "plot     (skipped: memsched.service.plot unavailable)")
    out.print(f"done in {res.seconds:.1f} s")


def measure_cmd(
    model: Annotated[str, typer.Argument(help=MODELS_HELP)],
    schedule: Annotated[
        Path | None, typer.Argument(help="Schedule JSON solved for this model (omit with --keep-all).")
    ] = None,
    trace_path: Annotated[
        Path | None,
        typer.Option("--trace", help="The trace the schedule was solved from: checked, and used for predictions."),
    ] = None,
    keep_all: Annotated[
        bool, typer.Option("--keep-all", help="Measure the in-core keep-all step only (no schedule).")
    ] = False,
    baseline: Annotated[
        bool, typer.Option("--baseline/--no-baseline", help="Also measure keep-all at the same batch (slowdown).")
    ] = True,
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", "--batch", help="Batch size [default: the trace's, else 2].")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", help="Sequence length [default: the trace's, else 128].")
    ] = None,
    layers: LayersOpt = None,
    small: SmallOpt = False,
    layer_pattern: LayerPatternOpt = None,
    steps: Annotated[
        int, typer.Option("--steps", help="Timed steps per side, keep-all and scheduled alternating (median).")
    ] = 5,
    warmup: Annotated[int, typer.Option("--warmup", help="Warm-up steps per side before the timed ones.")] = 2,
    device: Annotated[
        str | None, typer.Option("--device", help="cpu or cuda[:N] [default: cpu for a built-in; a factory's own].")
    ] = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="float32, bfloat16 or float16 [default: the trace's, else float32].")
    ] = None,
    dropout: Annotated[float | None, typer.Option("--dropout", help="Override the config's dropout.")] = None,
    optimizer: Annotated[
        str | None, typer.Option("--optimizer", help="adamw, sgd or none [default: adamw; a factory's own].")
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option("--threads", help="CPU threads for torch [default: the trace's, else torch's own choice]."),
    ] = None,
    compile_blocks: CompileOpt = False,
    autocast: AutocastOpt = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Also write the JSON result here.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay a schedule on its model: predicted vs measured peak and step time, slowdown vs keep-all.

    Peak: every live tensor byte of the whole step: max_memory_allocated on CUDA, the CPU allocator's events
    under the profiler on the CPU (peak_source). Step time: the median of --steps steps after --warmup, with
    the torch thread count fixed (--threads, else the trace's) and reported; keep-all and scheduled steps
    alternate in one process, so the overhead is a ratio measured side by side.
    """
    from memsched.io import check_outputs_spare_inputs, load_schedule, load_trace, write_text
    from memsched.service.measure import run_measure, workload_args

    _quiet_transformers()
    if keep_all and schedule is not None:
        raise MemschedError(f"--keep-all measures without a schedule; drop either --keep-all or {schedule}")
    if not keep_all and schedule is None:
        raise MemschedError("give a SCHEDULE to replay, or --keep-all to measure the in-core baseline")
    check_outputs_spare_inputs({"--output": output}, {"schedule": schedule, "--trace": trace_path})
    sched = load_schedule(schedule) if schedule is not None else None
    tr = load_trace(trace_path) if trace_path is not None else None
    # What the trace records (batch, sequence, dtype, the layers) is taken from it; a flag overrides, noted.
    args, overrides = workload_args(
        tr,
        sched,
        model=model,
        batch_size=batch_size,
        seq_len=seq_len,
        num_layers=layers,
        small=small,
        device=device,
        dtype=dtype,
        dropout=dropout,
        optimizer=optimizer,
        layer_pattern=layer_pattern,
        compile=compile_blocks or None,
        autocast=autocast,
    )
    rep = run_measure(
        args,
        sched,
        tr,
        steps=steps,
        warmup=warmup,
        baseline=baseline or keep_all,
        threads=threads,
        command=_measure_command(model, schedule, trace_path, args, keep_all, baseline, steps, warmup, threads),
        overrides=overrides,
    )
    doc = rep.to_json()
    if output is not None:
        write_text(output, json.dumps(doc, indent=2) + "\n")
    if as_json:
        _print_json(doc)
        return
    _print_measure(doc)
    if output is not None:
        out.print(f"[green]wrote[/] {output}")


def _measure_command(
    model: str,
    schedule: Path | None,
    trace_path: Path | None,
    a: Any,
    keep_all: bool,
    baseline: bool,
    steps: int,
    warmup: int,
    threads: int | None,
) -> str:
    """The command line that reproduces this measurement, every setting spelled out (for the results file)."""
    import shlex

    argv = ["memsched", "measure", model]
    argv += [str(schedule)] if schedule is not None else ["--keep-all"]
    if trace_path is not None:
        argv += ["--trace", str(trace_path)]
    from memsched.service.trace import dtype_name

    # What the user (or the trace) set; the rest is the model's own default, the same on a re-run.
    if a.device is not None:
        argv += ["--device", a.device]
    if a.dtype is not None:
        argv += ["--dtype", dtype_name(a.dtype)]
    for flag, value in (("--batch-size", a.batch_size), ("--seq-len", a.seq_len), ("--optimizer", a.optimizer)):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--steps", str(steps), "--warmup", str(warmup)]
    if threads is not None:
        argv += ["--threads", str(threads)]
    if a.num_layers is not None:
        argv += ["--layers", str(a.num_layers)]
    if a.small:
        argv.append("--small")
    if a.dropout is not None:
        argv += ["--dropout", str(a.dropout)]
    if a.compile:
        argv.append("--compile")
    if a.autocast is not None:
        argv += ["--autocast", a.autocast]
    for pat in a.layer_pattern or []:
        argv += ["--layer-pattern", pat]
    if not baseline and not keep_all:
        argv.append("--no-baseline")
    return shlex.join(argv)


def _print_measure(doc: dict[str, Any]) -> None:
    budget = doc["budget_bytes"]
    t = Table(
        title=(
            f"{doc['model']}: batch {doc['batch_size']}, seq {doc['seq_len']}, {doc['dtype']}, {doc['device_name']}"
            f" — {doc['policy']}" + (f" under {format_bytes(budget)}" if budget else "")
        ),
        caption=(
            f"peak: whole step ({doc['peak_source']}); "
            f"step time: median {doc['step_clock']}, {doc['threads']} torch thread(s)"
        ),
    )
    for col, just in (("run", "left"), ("quantity", "left"), ("predicted", "right"), ("measured", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    t.add_column("measured / predicted", justify="right")
    for label in ("keep_all", "scheduled"):
        side = doc[label]
        if side is None:
            continue
        ratios = side["ratio_measured_over_predicted"]
        for q, key, fmt in (("peak", "peak_bytes", format_bytes), ("step time", "step_s", format_seconds)):
            p, m = side[f"predicted_{key}"], side[f"measured_{key}"]
            r = ratios["peak" if key == "peak_bytes" else "step"]
            t.add_row(
                label.replace("_", "-"), q, "-" if p is None else fmt(p), fmt(m), "-" if r is None else f"{r:.3f}"
            )
        predicted_host = side.get("predicted_host_peak_bytes")
        if side["host_bytes"] or predicted_host:
            host = format_bytes(side["host_bytes"])
            p_host = "-" if predicted_host is None else format_bytes(predicted_host)
            r_host = f"{side['host_bytes'] / predicted_host:.3f}" if predicted_host else "-"
            t.add_row(label.replace("_", "-"), "host copies (beside the peak)", p_host, host, r_host)
    out.print(t)
    if doc.get("offload_emulated"):
        out.print(
            "[yellow]offload emulated on the CPU[/]: the host copies live in the same memory as the step, so the "
            f"process holds {format_bytes(doc['process_peak_bytes_with_host_copies'])} (peak + host copies); plan "
            "with --actions keep,recompute (the CPU default) to lower the process's own peak"
        )
    notes = list(doc.get("notes") or [])
    if doc.get("prediction_note"):
        notes.append(doc["prediction_note"])
    if doc["measured_overhead_pct"] is not None:
        p = doc["predicted_overhead_pct"]
        paired = doc.get("measured_step_ratio_paired")
        notes.append(
            f"overhead vs keep-all: predicted {'-' if p is None else f'{p:+.1f}%'}, "
            f"measured {doc['measured_overhead_pct']:+.1f}%"
            + ("" if paired is None else f" (paired steps: {100 * (paired - 1):+.1f}%)")
        )
    if "fits_budget" in doc:
        notes.append("within budget" if doc["fits_budget"] else "[red]OVER budget[/]")
    worst = doc.get("worst_stage")
    if worst and worst["notable"]:
        d = worst["difference_bytes"]
        notes.append(
            f"[yellow]departs from the plan[/] at stage {worst['stage']} (layer {worst['layer']}): measured "
            f"{format_bytes(worst['measured_bytes'])}, predicted {format_bytes(worst['predicted_bytes'])} "
            f"({'+' if d >= 0 else '-'}{format_bytes(abs(d))}, {100 * worst['fraction_of_predicted_peak']:+.1f}% "
            "of the predicted peak)"
        )
    if "oversubscription" in doc:
        notes.append(f"oversubscription {doc['oversubscription']:.2f}x")
    if notes:
        out.print("; ".join(notes))


def register(app: typer.Typer) -> None:
    """Add `trace`, `measure` and `demo` to the main app."""
    app.command("trace")(trace_cmd)
    app.command("measure")(measure_cmd)
    app.command("demo")(demo_cmd)
