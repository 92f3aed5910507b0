"""The `memsched` command line. Thin: every command calls memsched.service (shared with the REST API).

Exit codes: 0 success, 2 user error (one line naming the problem, no traceback), 1 internal error.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memsched.errors import MemschedError, SolverError
from memsched.io import check_outputs_spare_inputs, load_schedule, load_trace, save_model, write_text
from memsched.options import SERVER_QUEUE_SLACK_S, SolveOptions, SolveResources, cli_flag, option_help
from memsched.schema import json_schema
from memsched.units import format_bytes, format_seconds, parse_budget

_IMPORTED_AT = time.perf_counter()
"""When this module had loaded: 0.2-0.6 s after the process started (interpreter, typer, rich, the core), more on
a loaded machine."""
_FRESH_PROCESS_S = 5.0
"""A process that started more than this long before this module loaded is not a fresh `memsched` command (a
program that calls main() itself): its limit counts from the import, not from the process's start."""
_PROCESS: dict[str, float] = {}
"""'started': set by main(), the process's entry, so that `solve`'s time limit counts from the process's start
and bounds the whole command. Unset where the app runs inside another process (tests): each solve counts
from its own call there."""

app = typer.Typer(
    name="memsched",
    help="Memory schedules (keep / offload / recompute per layer) for training under a GPU memory budget.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
import_app = typer.Typer(help="Import profiles from other tools into a memsched trace.", no_args_is_help=True)
app.add_typer(import_app, name="import")

out = Console()
_DEFAULT = SolveOptions()
err = Console(stderr=True)
log = logging.getLogger("memsched")
F = TypeVar("F", bound=Callable[..., Any])

BudgetOpt = Annotated[
    str,
    typer.Option(
        "--budget", "-b", help="Whole-device budget: 12GiB, 500MB, bytes, or N% (static + N% of activations)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _print_json(obj: Any, to_stderr: bool = False) -> None:
    (sys.stderr if to_stderr else sys.stdout).write(json.dumps(obj, indent=2) + "\n")


def _to_stdout(output: Path | None) -> bool:
    """`-o -` writes the file itself to stdout: the command's own report then goes to stderr."""
    return output is not None and str(output) == "-"


@app.command()
def schema(
    kind: Annotated[str, typer.Argument(help="trace or schedule")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write to this file instead of stdout.")] = None,
) -> None:
    """Print the JSON Schema of the Trace or Schedule format."""
    if kind not in ("trace", "schedule"):
        raise MemschedError(f"schema: unknown kind {kind!r}; use 'trace' or 'schedule'")
    text = json.dumps(json_schema(kind), indent=2) + "\n"  # type: ignore[arg-type]
    if output and not _to_stdout(output):
        write_text(output, text)
        out.print(f"wrote {output}")
    else:
        sys.stdout.write(text)


@app.command()
def validate(
    file: Annotated[Path, typer.Argument(help="A trace or schedule JSON file.")],
    trace: Annotated[Path | None, typer.Option("--trace", help="Also check a schedule against this trace.")] = None,
) -> None:
    """Validate a trace or schedule file (a schedule also against its trace with --trace)."""
    from memsched.schema import check_schedule

    try:
        head = json.loads(file.read_text()) if file.is_file() else None
    except (ValueError, RecursionError):  # not JSON, not UTF-8, too deep, a giant number: load_trace says which
        head = None
    if isinstance(head, dict) and "actions" in head:
        sched = load_schedule(file)
        if trace is not None:
            check_schedule(sched, load_trace(trace))
        out.print(
            f"[green]ok[/]: schedule for {len(sched.layer_names)} layers, budget {format_bytes(sched.budget_bytes)}"
        )
    else:
        tr = load_trace(file)
        if trace is not None:
            raise MemschedError(
                f"--trace checks a schedule against its trace, and {str(file)!r} is a trace; give a schedule file "
                "first, or drop --trace"
            )
        out.print(
            f"[green]ok[/]: trace of {tr.model}, {tr.n} layers, batch {tr.batch_size}, hash {tr.content_hash()[:12]}"
        )


@app.command("simulate")
def simulate_cmd(
    trace: Annotated[Path, typer.Argument(help="Trace JSON.")],
    schedule: Annotated[Path, typer.Argument(help="Schedule JSON made for that trace.")],
    as_json: JsonOpt = False,
    timeline: Annotated[bool, typer.Option("--timeline", help="Include the event timeline in --json.")] = False,
) -> None:
    """Simulate a schedule on its trace: peak, step time, overhead, stall and recompute parts."""
    from memsched.service import simulate_schedule

    if timeline and not as_json:
        raise MemschedError("--timeline adds the events to --json's output; give --json too (or drop --timeline)")
    tr, sc = load_trace(trace), load_schedule(schedule)
    sim = simulate_schedule(tr, sc)
    if as_json:
        doc: dict[str, Any] = {
            "feasible": sim.feasible,
            "budget_bytes": sc.budget_bytes,
            **sim.prediction().model_dump(),
        }
        if timeline:
            doc["events"] = [e.__dict__ for e in sim.events]
        _print_json(doc)
        return
    t = Table(title=f"{tr.model}: {sc.policy} schedule", show_header=True)
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_row("budget", format_bytes(sc.budget_bytes))
    t.add_row("predicted peak", format_bytes(sim.peak_bytes))
    t.add_row("predicted host peak", format_bytes(sim.host_peak_bytes))
    t.add_row("feasible", "yes" if sim.feasible else "[red]NO[/]")
    t.add_row("step time", format_seconds(sim.step_s))
    t.add_row("keep-all step time", format_seconds(sim.keepall_step_s))
    t.add_row("overhead", f"{format_seconds(sim.overhead_s)} ({sim.overhead_pct:.2f}%)")
    t.add_row("  stall", format_seconds(sim.stall_s))
    t.add_row("  recompute", format_seconds(sim.recompute_s))
    out.print(t)


@app.command()
def compare(
    trace: Annotated[Path, typer.Argument(help="Trace JSON.")],
    budget: BudgetOpt,
    as_json: JsonOpt = False,
    link: Annotated[str | None, typer.Option(cli_flag("link"), help=option_help("link"))] = None,
    ranks_per_link: Annotated[
        int | None, typer.Option(cli_flag("ranks_per_link"), help=option_help("ranks_per_link"))
    ] = None,
    host_budget: Annotated[str | None, typer.Option(cli_flag("host_budget"), help=option_help("host_budget"))] = None,
) -> None:
    """Compare the baseline policies under a budget: feasible, predicted peak, step time, overhead."""
    from memsched.service import compare_policies

    tr = load_trace(trace)
    # The same checks as solve's.
    hw = SolveOptions.from_user(link=link, ranks_per_link=ranks_per_link, host_budget=host_budget)
    cmp = compare_policies(tr, parse_budget(budget), hw.link, hw.ranks_per_link, hw.host_budget)
    if as_json:
        _print_json(cmp.to_json())
        return
    t = Table(
        title=f"{tr.model} (batch {tr.batch_size}, {tr.n} layers) — budget {format_bytes(cmp.budget_bytes)}",
        caption=(
            f"static {format_bytes(cmp.static_bytes)}, "
            f"keep-all activations {format_bytes(cmp.keepall_activation_bytes)}"
        ),
    )
    host = hw.host_budget is not None  # the host peak column where a host budget asks about it (--json has it)
    for col, just in (
        ("policy", "left"),
        ("feasible", "center"),
        ("predicted peak", "right"),
        *([("host peak", "right")] if host else []),
        ("step time", "right"),
        ("overhead", "right"),
    ):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in cmp.rows:
        t.add_row(
            r.policy,
            "[green]yes[/]" if r.feasible else "[red]no[/]",
            format_bytes(r.peak_bytes),
            *([format_bytes(r.host_peak_bytes)] if host else []),
            format_seconds(r.step_s),
            f"{r.overhead_pct:+.1f}%",
        )
    out.print(t)


@import_app.command("pipedream")
def import_pipedream_cmd(
    graph: Annotated[Path, typer.Argument(help="PipeDream profiler graph.txt.")],
    batch_size: Annotated[int, typer.Option("--batch-size", help="Batch size the profile was taken at.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Trace JSON to write.")],
    device_memory: Annotated[
        str, typer.Option(help="Device memory capacity (the profile does not record it).")
    ] = "16GiB",
    h2d_bandwidth: Annotated[float, typer.Option(help="Pinned host->device bytes/s.")] = 12e9,
    d2h_bandwidth: Annotated[float, typer.Option(help="Pinned device->host bytes/s.")] = 12e9,
    copy_latency: Annotated[float, typer.Option(help="Per-copy latency, seconds.")] = 10e-6,
    optimizer_state_factor: Annotated[
        float, typer.Option(help="Optimizer state bytes per parameter byte (1 = SGD momentum, 2 = Adam).")
    ] = 1.0,
) -> None:
    """Import a PipeDream profile (keeps its DAG edges) into a memsched trace."""
    from memsched.service.importers import import_pipedream
    from memsched.units import parse_bytes

    check_outputs_spare_inputs({"--output": output}, {"profile": graph})
    tr = import_pipedream(
        graph,
        batch_size,
        device_memory_bytes=parse_bytes(device_memory, "--device-memory"),
        h2d_bytes_per_s=h2d_bandwidth,
        d2h_bytes_per_s=d2h_bandwidth,
        copy_latency_s=copy_latency,
        optimizer_state_factor=optimizer_state_factor,
    )
    save_model(tr, output)
    (err if _to_stdout(output) else out).print(
        f"wrote {output}: {tr.n} layers, static {format_bytes(tr.static.total)}, "
        f"keep-all peak {format_bytes(tr.baseline.peak_bytes)}"
    )


@app.command()
def plot(
    trace: Annotated[Path, typer.Argument(help="Trace JSON.")],
    schedule: Annotated[Path, typer.Argument(help="Schedule JSON.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="PNG to write.")] = Path("timeline.png"),
) -> None:
    """Plot memory against the budget over one step, above a Gantt chart of the three streams."""
    from memsched.schema import check_schedule
    from memsched.service.plot import plot_timeline

    check_outputs_spare_inputs({"--output": output}, {"trace": trace, "schedule": schedule})
    tr, sc = load_trace(trace), load_schedule(schedule)
    check_schedule(sc, tr)
    check_png(output, "--output")
    path = plot_timeline(tr, sc, output)
    (err if _to_stdout(output) else out).print(f"wrote {path}")


@app.command()
def solve(
    trace: Annotated[Path, typer.Argument(help="Trace JSON.")],
    budget: BudgetOpt,
    output: Annotated[Path, typer.Option("-o", "--output", help="Schedule JSON to write.")] = Path("schedule.json"),
    # One flag per SolveOptions field, its help that field's docstring (tests/unit/test_cli.py checks the match).
    solver: Annotated[str, typer.Option(cli_flag("solver"), help=option_help("solver"))] = _DEFAULT.solver,
    time_limit: Annotated[
        float, typer.Option(cli_flag("time_limit_s"), help=option_help("time_limit_s"))
    ] = _DEFAULT.time_limit_s,
    gap: Annotated[float, typer.Option(cli_flag("gap"), help=option_help("gap"))] = _DEFAULT.gap,
    window: Annotated[int | None, typer.Option(cli_flag("window"), help=option_help("window"))] = None,
    max_segment: Annotated[int | None, typer.Option(cli_flag("max_segment"), help=option_help("max_segment"))] = None,
    actions: Annotated[str | None, typer.Option(cli_flag("actions"), help=option_help("actions"))] = None,
    link: Annotated[str | None, typer.Option(cli_flag("link"), help=option_help("link"))] = None,
    ranks_per_link: Annotated[
        int | None, typer.Option(cli_flag("ranks_per_link"), help=option_help("ranks_per_link"))
    ] = None,
    host_budget: Annotated[str | None, typer.Option(cli_flag("host_budget"), help=option_help("host_budget"))] = None,
    export_model: Annotated[
        Path | None, typer.Option("--export-model", help="Write the MILP model here (LP, MPS or CP-SAT text).")
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            help="Solve on a memsched service at this URL. There --time-limit bounds the solve from when a worker "
            "starts it; this command waits up to "
            f"{SERVER_QUEUE_SLACK_S:g} s more for the queue and the transfers, then names the job to fetch later "
            "(memsched jobs wait).",
        ),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="MEMSCHED_API_KEY", help="Bearer key for --server.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Find the fastest schedule that fits the budget, and write it."""
    check_outputs_spare_inputs({"--output": output, "--export-model": export_model}, {"trace": trace})
    # SolveOptions checks the options itself (the same rules as the API's).
    options = SolveOptions.from_user(
        solver=solver,
        time_limit_s=time_limit,
        gap=gap,
        window=window,
        max_segment=max_segment,
        actions=[a.strip() for a in actions.split(",") if a.strip()] if actions is not None else None,
        link=link,
        ranks_per_link=ranks_per_link,
        host_budget=host_budget,
    )
    resources = SolveResources(export_model=export_model, started_at=process_started())
    tr = load_trace(trace)
    spec = parse_budget(budget)
    if server:
        from memsched.cli.api import solve_via_server

        if export_model is not None:
            raise MemschedError(
                "--export-model writes the model where the solve runs; it cannot be used with "
                "--server: drop one of them"
            )
        sc = solve_via_server(server, tr, budget, options, api_key)
    else:
        from memsched.service import solve_trace

        sc = solve_trace(tr, spec, options, resources)
    save_model(sc, output)
    p, r = sc.prediction, sc.solver
    if as_json:
        _print_json(
            {
                "output": str(output),
                "policy": sc.policy,
                "prediction": p.model_dump(),
                "solver": r.model_dump(mode="json"),
            },
            to_stderr=_to_stdout(output),
        )
        return
    counts = sc.action_counts()
    t = Table(title=f"{tr.model}: schedule under {format_bytes(sc.budget_bytes)} → {output}")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_row("policy / backend", f"{sc.policy} / {r.backend}")
    t.add_row("status", r.status.value)
    t.add_row("layers keep / offload / recompute", f"{counts['keep']} / {counts['offload']} / {counts['recompute']}")
    t.add_row("predicted peak", format_bytes(p.peak_bytes))
    if p.host_peak_bytes is not None:
        limit = f" (host budget {format_bytes(sc.host_budget_bytes)})" if sc.host_budget_bytes is not None else ""
        t.add_row("predicted host peak", format_bytes(p.host_peak_bytes) + limit)
    t.add_row("predicted step", f"{format_seconds(p.step_s)} ({p.overhead_pct:+.2f}% vs keep-all)")
    if r.best_bound_s is not None:
        t.add_row("best bound / gap", f"{format_seconds(r.best_bound_s)} / {100 * (r.gap or 0):.2f}%")
    t.add_row("solve wall time", f"{r.wall_s:.2f} s")
    if r.message:
        t.add_row("note", r.message)
    (err if _to_stdout(output) else out).print(t)


# The optional packages a command may need, by the extra that installs them (pyproject.toml): a core install
# answers a command that needs one with the pip line, not a traceback.
_EXTRA_OF = {
    "torch": "runtime",
    "transformers": "runtime",
    "fastapi": "api",
    "uvicorn": "api",
    "sqlalchemy": "api",
    "httpx": "api",
    "highspy": "highs",
}


def _register_parts() -> None:
    """The commands of the runtime and the service live beside the main app, one module each.
    Each imports its part only inside its commands: a core install lists them all and answers one whose extra
    is missing with the pip line (see `main`)."""
    from memsched.cli import api, export, runtime, sweep

    for module in (runtime, api, export, sweep):
        module.register(app)


_register_parts()


def _error_code(e: MemschedError) -> str:
    """A stable, machine-readable name for a user error, for scripts that asked for --json."""
    from memsched.errors import (
        InfeasibleBudgetError,
        InfeasibleHostBudgetError,
        ScheduleMismatchError,
        TraceFormatError,
        UserCodeError,
    )

    if isinstance(e, UserCodeError):
        return "user_code"
    if isinstance(e, InfeasibleBudgetError):
        return "infeasible_budget"
    if isinstance(e, InfeasibleHostBudgetError):
        return "infeasible_host_budget"
    if isinstance(e, TraceFormatError):
        return "bad_file"
    if isinstance(e, ScheduleMismatchError):
        return "schedule_mismatch"
    return "bad_input"


def _fail(exit_code: int, code: str, message: str, as_json: bool, *, prefix: str = "error", **extra: Any) -> None:
    """Report an error and exit. The sentence always goes to stderr; a command run with --json also prints a
    JSON error object on stdout, so a script that parses stdout gets an answer, not an empty string."""
    # escape: a message may hold brackets that are not markup, like pip's 'memsched[api]'.
    err.print(f"[bold red]{prefix}:[/] {escape(message)}", highlight=False, soft_wrap=True)
    if as_json:
        _print_json({"error": {"code": code, "message": message, "exit_code": exit_code, **extra}})
    sys.exit(exit_code)


def _process_started_at() -> float:
    """perf_counter() at this process's start, so that `solve`'s limit covers the interpreter's start and the
    imports too (0.6 s of a 3 s limit on a loaded 2-core machine, which the slack of limit x 1.1 + 0.5 s does not
    hold with the interpreter's exit on top). Linux gives the start in /proc, in clock ticks since boot, against
    /proc/uptime's seconds since boot; elsewhere it is when this module had loaded. A process that is not a fresh
    command (it started, or loaded this module, over _FRESH_PROCESS_S before this call: a program that calls `main`
    after other work, or again) counts from now: its limit must not be spent before the command began."""
    now = time.perf_counter()
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        started = now - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        started = _IMPORTED_AT
    return started if now - started <= _FRESH_PROCESS_S else now


def check_png(output: Path, flag: str) -> None:
    """A PNG goes to a path ending in .png, or to a device or a pipe (-o /dev/stdout, a FIFO), whatever its name."""
    piped = _to_stdout(output) or (output.exists() and not output.is_file() and not output.is_dir())
    if output.suffix.lower() != ".png" and not piped:
        raise MemschedError(f"{flag} {str(output)!r}: the picture is a PNG; give a path ending in .png")


def process_started() -> float | None:
    """When this command's process started (perf_counter), where `main` ran; what its limits count from."""
    return _PROCESS.get("started")


def main(argv: list[str] | None = None) -> None:
    _PROCESS["started"] = _process_started_at()
    logging.basicConfig(level=os.environ.get("MEMSCHED_LOG", "WARNING"), format="%(levelname)s %(name)s: %(message)s")
    args = sys.argv[1:] if argv is None else argv
    as_json = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
    try:
        # Standalone mode: typer/click report usage errors themselves (exit 2) and turn typer.Exit into
        # sys.exit; everything else reaches the handlers below.
        app(args=argv)
    except MemschedError as e:
        # Every error object has the same keys; min_feasible_bytes is null unless the budget was infeasible.
        _fail(
            2,
            _error_code(e),
            str(e),
            as_json,
            min_feasible_bytes=getattr(e, "min_feasible_bytes", None),
            budget_bytes=getattr(e, "budget_bytes", None),
            min_host_bytes=getattr(e, "min_host_bytes", None),
        )
    except ModuleNotFoundError as e:
        extra = _EXTRA_OF.get((e.name or "").split(".")[0])
        if extra is None or os.environ.get("MEMSCHED_DEBUG"):
            raise
        _fail(
            2,
            "missing_extra",
            f"this command needs {e.name}, which is in the {extra} extra: pip install 'memsched[{extra}]'",
            as_json,
            min_feasible_bytes=None,
            budget_bytes=None,
            min_host_bytes=None,
        )
    except SolverError as e:
        # A solve that failed where it ran (a server's job failed or was cancelled, a backend crashed): exit 1 as
        # documented, said as what it is, not as an internal error of this command.
        if os.environ.get("MEMSCHED_DEBUG"):
            raise
        _fail(1, "solve_failed", str(e), as_json, min_feasible_bytes=None, budget_bytes=None, min_host_bytes=None)
    except MemoryError:
        _fail(
            2,
            "out_of_memory",
            "this machine ran out of memory for the command; give it a smaller model, batch or sequence, or run "
            "it where more memory is free",
            as_json,
            min_feasible_bytes=None,
            budget_bytes=None,
            min_host_bytes=None,
        )
    except Exception as e:
        if os.environ.get("MEMSCHED_DEBUG"):
            raise
        _fail(
            1,
            "internal_error",
            f"{type(e).__name__}: {e} (set MEMSCHED_DEBUG=1 for the traceback)",
            as_json,
            prefix="internal error",
            min_feasible_bytes=None,
            budget_bytes=None,
            min_host_bytes=None,
        )


def run() -> NoReturn:
    """The `memsched` command (console script and `python -m memsched.cli`): `main`, then an exit that skips the
    interpreter's teardown. Unloading numba's compiled kernels and the modules takes 0.4-0.6 s after a solve on
    a 2-core machine (a 10 s solve: answer written at 9.93 s, process gone at 10.55 s), time the user waits for
    nothing and that `solve`'s limit promises to bound. Exit handlers still run (logging's flush, temporary
    directories) and the standard streams are flushed; every file memsched writes is closed before main
    returns. A command that leaves a thread or a child process behind (a server's pools as it stops) exits the usual
    way, which waits for them. An uncaught exception (MEMSCHED_DEBUG) leaves as Python's own, with its traceback."""
    try:
        main()
        code = 0
    except SystemExit as e:
        code = _exit_status(e.code)
    if _left_running():
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # what Python exits with where it cannot flush stdout at its exit (a closed pipe)
    os._exit(code)


def _left_running() -> bool:
    """Whether a thread other than this one, not a daemon, or a child process is still running: Python's own exit
    waits for them (concurrent.futures' pools join their workers there)."""
    main_thread = threading.main_thread()
    if any(t is not main_thread and t.is_alive() and not t.daemon for t in threading.enumerate()):
        return True
    mp = sys.modules.get("multiprocessing")
    return mp is not None and bool(mp.active_children())


def _exit_status(code: object) -> int:
    """The process status for `sys.exit(code)`, as Python's own exit derives it: None 0, an int itself, anything
    else printed to stderr and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
