"""`memsched bench ...`: the benchmarks under bench/, which live in the source checkout, not in the wheel.

The harness is imported as the ordinary package `bench`, found on the import path as Python finds any other
(never by a path computed from the installed package): from the repository root, `python -m memsched.cli bench`
or `PYTHONPATH=. memsched bench` sees it; an installed wheel alone does not, and says so.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from memsched.errors import MemschedError

_NO_HARNESS = (
    "bench: the benchmark harness (the bench/ folder of a source checkout) is not on the import path; "
    "git clone the repository, `pip install -e '.[runtime]'` in it, and from its root run "
    "`python -m bench.peers ...` or `PYTHONPATH=. memsched bench peers ...`"
)


def _bench_main() -> Callable[[list[str]], int]:
    """The harness's entry point; MemschedError naming the fix when it or its torch/transformers is missing."""
    try:
        found = importlib.util.find_spec("bench.peers.__main__") is not None
    except ModuleNotFoundError:  # no `bench` package at all
        found = False
    if not found:
        raise MemschedError(_NO_HARNESS)
    for mod in ("torch", "transformers"):
        if importlib.util.find_spec(mod) is None:
            raise MemschedError(
                f"bench: {mod} is not installed; install the runtime extra: pip install -e '.[runtime]'"
            )
    from bench.peers.__main__ import main

    return main


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
        bench_main = _bench_main()
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
        try:
            rc = bench_main(argv)
        except SystemExit as e:  # argparse rejects a value: its message is already printed
            rc = int(e.code) if isinstance(e.code, int) else 2
        if rc:
            raise typer.Exit(rc)

    app.add_typer(bench_app, name="bench")
