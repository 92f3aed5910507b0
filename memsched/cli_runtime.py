"""The runtime's commands, registered on the main app by memsched.cli: `memsched trace` and `memsched demo`.

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


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _quiet_transformers() -> None:
    # transformers warns about config defaults of the synthetic small models; those lines are noise here.
    try:
        from transformers.utils import logging as tf_logging

        tf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - transformers is a runtime dependency
        pass


def trace_cmd(
    model: Annotated[
        str,
        typer.Argument(help="gpt2, gpt2-medium, bert-base, vit-base, resnet50, or package.module:factory."),
    ],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Where to write the trace JSON [default: MODEL.trace.json].")
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", "--batch", help="Batch size.")] = 2,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Sequence length (text models).")] = 128,
    layers: Annotated[
        int | None, typer.Option("--layers", help="Number of blocks (overrides the config's depth).")
    ] = None,
    small: Annotated[bool, typer.Option("--small", help="A narrow version (hidden size 64) for CPU runs.")] = False,
    layer_pattern: Annotated[
        list[str] | None,
        typer.Option("--layer-pattern", help="Regex over module names selecting the layers (repeatable)."),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", help="Measured steps (medians are reported).")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", help="Warm-up steps before measuring.")] = 2,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda[:N].")] = "cpu",
    dropout: Annotated[float | None, typer.Option("--dropout", help="Override the config's dropout.")] = None,
    optimizer: Annotated[str, typer.Option("--optimizer", help="adamw, sgd or none.")] = "adamw",
    threads: Annotated[
        int | None, typer.Option("--threads", help="CPU threads for torch [default: torch's own choice].")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Trace a model: run real training steps and write its layer-level cost trace (JSON)."""
    import torch

    from memsched.io import save_model
    from memsched.runtime import trace, workload

    _quiet_transformers()
    if steps < 1 or warmup < 0:
        raise MemschedError(f"--steps must be >= 1 and --warmup >= 0 (got {steps}, {warmup})")
    if threads is not None:
        if threads < 1:
            raise MemschedError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise MemschedError(f"--device {device}: CUDA is not available on this machine; use --device cpu")
    try:
        torch.device(device)
    except RuntimeError:
        raise MemschedError(f"--device {device!r} is not a device; use cpu or cuda[:N]") from None
    w = workload(
        model,
        batch_size=batch_size,
        seq_len=seq_len,
        num_layers=layers,
        small=small,
        device=device,
        dropout=dropout,
        optimizer=optimizer,
    )
    tr = trace(
        w.model,
        w.step,
        layers=layer_pattern,
        steps=steps,
        warmup=warmup,
        model_id=w.model_id,
        batch_size=w.batch_size,
        seq_len=w.seq_len,
        optimizer=w.optimizer,
    )
    path = output or Path(f"{w.model_id}.trace.json")
    save_model(tr, path)
    if as_json:
        _print_json({"path": str(path), "hash": tr.content_hash(), "trace": tr.model_dump(mode="json")})
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
        f"optimizer {format_bytes(s.optimizer_state)}); baseline step {format_seconds(tr.baseline.step_s)}, "
        f"peak {format_bytes(tr.baseline.peak_bytes)}; copies h2d {tr.device.h2d_bytes_per_s / 1e9:.1f} GB/s, "
        f"d2h {tr.device.d2h_bytes_per_s / 1e9:.1f} GB/s, latency {tr.device.copy_latency_s * 1e6:.1f} us"
    )
    out.print(f"[green]wrote[/] {path}")


def demo_cmd(
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Where the trace, schedule and plot go.")] = Path(
        "out/demo"
    ),
    model: Annotated[str, typer.Option("--model", help="Built-in model (small version).")] = "gpt2",
    layers: Annotated[int, typer.Option("--layers", help="Number of blocks.")] = 6,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Batch size.")] = 8,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Sequence length.")] = 128,
    budget: Annotated[str, typer.Option("--budget", "-b", help="Budget: N% (of activations) or bytes.")] = "50%",
    steps: Annotated[int, typer.Option("--steps", help="Measured steps.")] = 3,
    threads: Annotated[
        int, typer.Option("--threads", help="CPU threads for torch (1 keeps timings steady on a busy machine).")
    ] = 1,
    as_json: JsonOpt = False,
) -> None:
    """Trace a small model on the CPU, solve for half its activations, replay it: predicted vs measured."""
    from memsched.demo import run_demo

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
    )
    if as_json:
        _print_json(res.to_json())
        return
    acts = ", ".join(f"{v} {k}" for k, v in sorted(res.actions.items()))
    out.print(
        f"[bold]{res.model}[/]: budget {format_bytes(res.budget_bytes)} (static {format_bytes(res.static_bytes)}); "
        f"schedule {res.policy}: {acts}"
    )
    t = Table(title="predicted vs measured (CPU; memory = saved-tensor ledger)")
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
    out.print(f"plot     {res.plot_path}" if res.plot_path else "plot     (skipped: memsched.plot unavailable)")
    out.print(f"done in {res.seconds:.1f} s")


def register(app: typer.Typer) -> None:
    """Add `trace` and `demo` to the main app."""
    app.command("trace")(trace_cmd)
    app.command("demo")(demo_cmd)
