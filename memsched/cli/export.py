"""`memsched export SCHEDULE --format checkpoint|sac|torchtitan|megatron`: a schedule in a format users'
stacks already read (memsched.service.export; docs/exports.md). Parses and prints only."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from memsched.errors import MemschedError
from memsched.io import check_outputs_spare_inputs, load_schedule, load_trace, write_text

err = Console(stderr=True)


def export_cmd(
    schedule: Annotated[Path, typer.Argument(help="Schedule JSON.")],
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="checkpoint, sac, torchtitan (TOML; JSON with -o *.json) or megatron.")
    ],
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace", help="The trace the schedule was solved from: checked, and needed to price what a format loses."
        ),
    ] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write here instead of stdout.")] = None,
) -> None:
    """Export a schedule to PyTorch checkpoint wrappers, a SAC policy, torchtitan's [activation_checkpoint] or
    Megatron/TransformerEngine recompute and offload lists. What a format cannot carry is said on stderr, with
    its predicted cost, and in the output's memsched.lost."""
    from memsched.service.export import export_schedule

    check_outputs_spare_inputs({"--output": output}, {"schedule": schedule, "--trace": trace})
    if output is not None and output.suffix.lower() == ".toml" and fmt.lower() != "torchtitan":
        raise MemschedError(f"--output {str(output)!r}: --format {fmt} is JSON (only torchtitan has TOML); give .json")
    sc = load_schedule(schedule)
    tr = load_trace(trace) if trace is not None else None
    toml = output is None or output.suffix.lower() != ".json"
    ex = export_schedule(sc, fmt, tr, toml=toml)
    for line in ex.warnings:
        err.print(f"[bold yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)
    if output is None or str(output) == "-":
        sys.stdout.write(ex.text)
    else:
        write_text(output, ex.text)
        err.print(f"wrote {output} ({fmt}, {'exact' if ex.lost is None else 'lossy: see memsched.lost'})")


def register(app: typer.Typer) -> None:
    """Add `export` to the main app."""
    app.command("export")(export_cmd)
