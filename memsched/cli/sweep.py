"""`memsched sweep TRACE`: the curve of step time against budget (memsched.service.sweep, the function
POST /v1/sweeps calls). Parses and prints only."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from memsched.io import check_outputs_spare_inputs, load_trace, write_text
from memsched.options import SolveOptions, cli_flag, option_help
from memsched.units import format_bytes, format_seconds, parse_budget

out = Console()
err = Console(stderr=True)


def sweep_cmd(
    trace: Annotated[Path, typer.Argument(help="Trace JSON.")],
    points: Annotated[int, typer.Option("--points", "-n", help="How many budgets to solve (2-200).")] = 20,
    lo: Annotated[
        str | None,
        typer.Option("--from", help="Smallest budget (12GiB, bytes or N%); default: the smallest feasible one."),
    ] = None,
    hi: Annotated[str | None, typer.Option("--to", help="Largest budget; default: keep-all's peak.")] = None,
    solver: Annotated[str, typer.Option(cli_flag("solver"), help=option_help("solver"))] = "auto",
    time_limit: Annotated[
        float, typer.Option(cli_flag("time_limit_s"), help="Wall-clock limit of each point's solve, seconds.")
    ] = 5.0,
    gap: Annotated[float, typer.Option(cli_flag("gap"), help=option_help("gap"))] = 0.01,
    actions: Annotated[str | None, typer.Option(cli_flag("actions"), help=option_help("actions"))] = None,
    link: Annotated[str | None, typer.Option(cli_flag("link"), help=option_help("link"))] = None,
    ranks_per_link: Annotated[
        int | None, typer.Option(cli_flag("ranks_per_link"), help=option_help("ranks_per_link"))
    ] = None,
    host_budget: Annotated[str | None, typer.Option(cli_flag("host_budget"), help=option_help("host_budget"))] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", help="Solver processes (default: one per core this process may use).")
    ] = None,
    refine: Annotated[
        bool,
        typer.Option(
            "--refine/--no-refine",
            help="Solve the points left outside the gap again with the time the sweep has left of its budget "
            "(points x time limit over the workers).",
        ),
    ] = True,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the curve as JSON here.")] = None,
    png: Annotated[Path | None, typer.Option("--png", help="Draw the curve as a PNG here.")] = None,
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Write the interactive page here: one file, its script inside, no network needed."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the curve as JSON instead of a table.")] = False,
) -> None:
    """Solve budgets from the smallest feasible one to keep-all, placed where the curve bends: each point's
    overhead, true lower bound and status, and the knees below which the cost rises steeply."""
    from memsched.cli import check_png, process_started
    from memsched.service.sweep import default_workers, sweep_trace

    if png is not None:
        check_png(png, "--png")
    check_outputs_spare_inputs({"--output": output, "--png": png, "--html": html}, {"trace": trace})
    options = SolveOptions.from_user(
        solver=solver,
        time_limit_s=time_limit,
        gap=gap,
        actions=[a.strip() for a in actions.split(",") if a.strip()] if actions is not None else None,
        link=link,
        ranks_per_link=ranks_per_link,
        host_budget=host_budget,
    )
    tr = load_trace(trace)
    res = sweep_trace(
        tr,
        options,
        points=points,
        lo=parse_budget(lo) if lo is not None else None,
        hi=parse_budget(hi) if hi is not None else None,
        workers=workers if workers is not None else default_workers(),
        refine=refine,
        started_at=process_started(),
    )
    doc = res.model_dump(mode="json")
    if output is not None:
        write_text(output, json.dumps(doc, indent=2) + "\n")
    if png is not None:
        from memsched.service.sweep_plot import plot_sweep

        plot_sweep(res, png)
    if html is not None:
        from memsched.service.sweep_page import standalone_page

        write_text(html, standalone_page(tr, res))
    if as_json:
        sys.stdout.write(
            json.dumps({k: v for k, v in doc.items() if k != "points"} | {"points": _brief(doc)}, indent=2)
        )
        sys.stdout.write("\n")
        return
    t = Table(title=f"{tr.model}: step time against budget ({len(res.points)} points, {res.wall_s:.1f} s)")
    for col in ("budget", "overhead", "bound", "gap", "status", "keep/off/rec", "note"):
        t.add_column(col, justify="left" if col in ("status", "note") else "right")
    knees = {k.budget_bytes for k in res.knees}
    for p in res.points:
        a = p.actions
        note = []
        if p.budget_bytes in knees:
            note.append("[bold red]knee[/]")
        if p.reused_from is not None:
            note.append(f"schedule of {format_bytes(p.reused_from)}")
        if any(d.startswith("sweep: solved again") for d in p.schedule.solver.details):
            note.append("solved again")
        t.add_row(
            format_bytes(p.budget_bytes),
            f"{format_seconds(p.overhead_s)} ({p.overhead_pct:+.2f}%)",
            format_seconds(p.bound_s) if p.bound_s is not None else "-",
            f"{100 * p.gap:.2f}%" if p.gap is not None else "-",
            p.status.value,
            f"{a['keep']}/{a['offload']}/{a['recompute']}",
            ", ".join(note),
        )
    out.print(t)
    if res.zero_overhead_bytes is not None:
        out.print(f"no overhead from {format_bytes(res.zero_overhead_bytes)}")
    for k in res.knees:
        out.print(
            f"knee at {format_bytes(k.budget_bytes)}: below it each GiB less costs "
            f"{format_seconds(k.slope_below_s_per_gib)}, above it each GiB more saves "
            f"{format_seconds(k.slope_above_s_per_gib)}"
        )
    for n in res.notes:
        out.print(f"note: {n}")
    for path in (output, png, html):
        if path is not None:
            err.print(f"wrote {path}")


def _brief(doc: dict[str, object]) -> list[dict[str, object]]:
    """The points without their schedules (the JSON file has them)."""
    pts = doc["points"]
    assert isinstance(pts, list)
    return [{k: v for k, v in p.items() if k != "schedule"} for p in pts]


def register(app: typer.Typer) -> None:
    """Add `sweep` to the main app."""
    app.command("sweep")(sweep_cmd)
