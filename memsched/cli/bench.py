"""`memsched bench ...`: the benchmarks under bench/, which live in the source checkout, not in the wheel."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

import memsched
from memsched.errors import MemschedError


def bench_dir() -> Path:
    """The checkout's bench/ folder (next to the memsched package); MemschedError when absent."""
    path = Path(memsched.__file__).resolve().parents[1] / "bench"
    if not (path / "peers" / "__main__.py").is_file():
        raise MemschedError(
            f"bench: no benchmark harness at {path}; `memsched bench` runs from a source checkout "
            "(git clone the repository, then `pip install -e '.[runtime]'` in it)"
        )
    return path


def _import_bench() -> None:
    root = str(bench_dir().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    for mod in ("torch", "transformers"):
        try:
            __import__(mod)
        except ImportError:
            raise MemschedError(
                f"bench: {mod} is not installed; install the runtime extra: pip install -e '.[runtime]'"
            ) from None


def register(app: typer.Typer) -> None:
    bench_app = typer.Typer(help="Benchmarks from the source checkout's bench/ folder.", no_args_is_help=True)

    @bench_app.command("peers")
    def peers(
        model: Annotated[
            list[str] | None,
            typer.Option("--model", "-m", help="gpt2, bert-base, vit-base, resnet50 or all (repeatable)."),
        ] = None,
        quick: Annotated[bool, typer.Option("--quick", help="Small batch / sequence, few steps (minutes).")] = False,
        batch_size: Annotated[int | None, typer.Option("--batch-size", help="Batch size.")] = None,
        size: Annotated[int | None, typer.Option("--size", help="Sequence length or image side.")] = None,
        steps: Annotated[int | None, typer.Option("--steps", help="Timed steps per run (median).")] = None,
        budgets: Annotated[
            str | None, typer.Option("--budgets", help="Fractions of keep-all activation memory, e.g. 0.75,0.5.")
        ] = None,
        approaches: Annotated[str | None, typer.Option("--approaches", help="Comma-separated subset.")] = None,
        device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
        threads: Annotated[
            int | None, typer.Option("--threads", help="torch threads (default: 1 with --quick on CPU).")
        ] = None,
        out: Annotated[Path | None, typer.Option("--out", help="Results folder (default bench/results).")] = None,
        report_only: Annotated[bool, typer.Option("--report-only", help="Only rebuild the report.")] = False,
    ) -> None:
        """Measure memsched against checkpointing, save_on_cpu, torch.compile's budget and PyTorch's SAC MILP."""
        _import_bench()
        argv: list[str] = []
        for m in model or ["gpt2"]:
            argv += ["--model", m]
        if quick:
            argv.append("--quick")
        for flag, value in (
            ("--batch-size", batch_size),
            ("--size", size),
            ("--steps", steps),
            ("--budgets", budgets),
            ("--approaches", approaches),
            ("--out", out),
            ("--threads", threads),
        ):
            if value is not None:
                argv += [flag, str(value)]
        argv += ["--device", device]
        if report_only:
            argv.append("--report-only")
        from bench.peers.__main__ import main as bench_main

        try:
            rc = bench_main(argv)
        except SystemExit as e:  # argparse rejects a value: its message is already printed
            rc = int(e.code) if isinstance(e.code, int) else 2
        if rc:
            raise typer.Exit(rc)

    app.add_typer(bench_app, name="bench")
