"""The CLI's contract: tables and --json, exit 0 / 2 (user error, one line, no traceback) / 1 (internal)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

from helpers import require_pipedream, tiny_trace
from memsched.cli import main
from memsched.io import save_model


def run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    captured = capsys.readouterr()
    return e.value.code, captured.out, captured.err


@pytest.fixture
def trace_file(tmp_path):
    tr = tiny_trace(
        [0.01, 0.02, 0.03, 0.02],
        [0.02, 0.04, 0.06, 0.04],
        [1000, 2000, 3000, 2000],
        output=[100] * 4,
        inputs=[0, 100, 100, 100],
        static=500,
        bandwidth=1e6,
    )
    p = tmp_path / "trace.json"
    save_model(tr, p)
    return p


def test_compare_table_and_json(trace_file, capsys):
    code, out, _ = run(["compare", trace_file, "--budget", "50%"], capsys)
    assert code == 0
    for policy in ("keep-all", "checkpoint-all", "sqrt-segments", "offload-all-sync", "offload-all-overlapped"):
        assert policy in out
    code, out, _ = run(["compare", trace_file, "--budget", "50%", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and len(doc["rows"]) == 5
    assert {"policy", "feasible", "peak_bytes", "step_s", "overhead_pct"} <= set(doc["rows"][0])


def test_solve_simulate_plot_validate(trace_file, tmp_path, capsys):
    sched = tmp_path / "s.json"
    code, out, err = run(["solve", trace_file, "--budget", "60%", "-o", sched, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["prediction"]["peak_bytes"] > 0
    code, out, _ = run(["simulate", trace_file, sched, "--json"], capsys)
    sim = json.loads(out)
    assert code == 0 and sim["feasible"] and sim["overhead_s"] == pytest.approx(doc["prediction"]["overhead_s"])
    png = tmp_path / "t.png"
    code, out, _ = run(["plot", trace_file, sched, "-o", png], capsys)
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out, _ = run(["validate", sched, "--trace", trace_file], capsys)
    assert code == 0 and "ok" in out
    code, out, _ = run(["validate", trace_file], capsys)
    assert code == 0 and "4 layers" in out


def test_impossible_budget_exits_2_naming_the_minimum(trace_file, capsys):
    code, out, err = run(["solve", trace_file, "--budget", "100B"], capsys)
    assert code == 2
    assert "budget" in err and "smallest feasible budget" in err and "Traceback" not in err


def test_malformed_trace_exits_2_naming_the_field(tmp_path, trace_file, capsys):
    doc = json.loads(trace_file.read_text())
    doc["layers"][2]["backward_s"] = -1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    code, _, err = run(["compare", bad, "--budget", "50%"], capsys)
    assert code == 2 and "layers[2].backward_s" in err and "Traceback" not in err
    bad.write_text("{not json")
    code, _, err = run(["validate", bad], capsys)
    assert code == 2 and "not valid JSON" in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--budget", "lots"], "cannot read 'lots'"),
        (["--budget", "50%", "--solver", "magic"], "solver: Input should be 'auto', 'dp'"),
        (["--budget", "50%", "--time-limit", "0"], "time_limit_s: Input should be greater than 0"),
        (["--budget", "50%", "--window", "0"], "window: Input should be greater than or equal to 1"),
        (["--budget", "50%", "--export-model", "m.lp", "--server", "http://127.0.0.1:9"], "--export-model"),
    ],
)
def test_bad_options_exit_2(trace_file, capsys, args, needle):
    code, _, err = run(["solve", trace_file, *args], capsys)
    assert code == 2 and needle in err and "Traceback" not in err


def test_solve_has_a_flag_for_every_solve_option():
    # SolveOptions is the one definition of the options: the CLI must expose each field, with its docstring.
    import typer.main

    from memsched.cli import app
    from memsched.options import SolveOptions, cli_flag, option_help

    command = next(c for c in typer.main.get_command(app).commands.values() if c.name == "solve")
    flags = {opt: p for p in command.params for opt in p.opts}
    for name in SolveOptions.model_fields:
        assert cli_flag(name) in flags, f"memsched solve has no {cli_flag(name)} for SolveOptions.{name}"
        assert flags[cli_flag(name)].help == option_help(name) != ""


def test_schedule_for_another_trace_exits_2(trace_file, tmp_path, capsys):
    sched = tmp_path / "s.json"
    assert run(["solve", trace_file, "--budget", "80%", "-o", sched], capsys)[0] == 0
    other = tmp_path / "other.json"
    save_model(tiny_trace([1, 1, 1, 1], [1, 1, 1, 1], [1, 2, 3, 4]), other)
    code, _, err = run(["simulate", other, sched], capsys)
    assert code == 2 and "trace_hash" in err


def test_schema_command(capsys):
    code, out, _ = run(["schema", "schedule"], capsys)
    assert code == 0 and json.loads(out)["title"] == "Schedule"
    code, _, err = run(["schema", "plan"], capsys)
    assert code == 2 and "use 'trace' or 'schedule'" in err


def test_console_script_import_and_compare_under_5s(tmp_path):
    """The issue's 'done when': import the PipeDream ResNet-50 profile, then compare at 50% in < 5 s."""
    graph = require_pipedream() / "resnet50.graph.txt"
    exe = shutil.which("memsched") or f"{sys.executable} -m memsched.cli"
    r50 = tmp_path / "r50.json"
    r = subprocess.run(
        [*exe.split(), "import", "pipedream", str(graph), "--batch-size", "128", "-o", str(r50)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    t0 = time.perf_counter()
    r = subprocess.run([*exe.split(), "compare", str(r50), "--budget", "50%"], capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr
    assert "sqrt-segments" in r.stdout
    assert elapsed < 5, f"compare took {elapsed:.1f} s"
    r = subprocess.run([*exe.split(), "compare", str(r50), "--budget", "1MiB"], capture_output=True, text=True)
    assert r.returncode == 0  # compare reports infeasible rows, it does not fail
    r = subprocess.run(
        [*exe.split(), "solve", str(r50), "--budget", "1MiB", "-o", str(tmp_path / "s.json")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "smallest feasible budget" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("missing", "argv", "extra"),
    [
        ("httpx", ["solve", "{trace}", "--budget", "60%", "--server", "http://127.0.0.1:9", "-o", "{out}"], "api"),
        ("torch", ["trace", "gpt2", "--small", "--layers", "2", "-o", "{out}"], "runtime"),
        ("uvicorn", ["serve"], "api"),
    ],
)
def test_a_command_whose_extra_is_missing_names_it(trace_file, tmp_path, missing, argv, extra):
    # A core install lacks the package: None in sys.modules makes importing it fail as a missing module does.
    args = [a.format(trace=trace_file, out=tmp_path / "out.json") for a in argv]
    code = f"import sys; sys.modules[{missing!r}] = None; from memsched.cli import main; main({args!r})"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert f"pip install 'memsched[{extra}]'" in p.stderr


@pytest.mark.parametrize(
    ("budget", "needle"),
    [("1e400", "larger than any memory"), ("0.5", "did you mean 50%?"), ("99999999TiB", "larger than any memory")],
)
def test_budget_typos_exit_2_naming_the_fix(trace_file, capsys, budget, needle):
    code, out, err = run(["solve", trace_file, "--budget", budget], capsys)
    assert code == 2, err
    assert needle in " ".join(err.split()) and "internal error" not in err and out == ""


def test_json_infeasible_budget_prints_a_json_error_on_stdout(trace_file, tmp_path, capsys):
    code, out, err = run(["solve", trace_file, "--budget", "100B", "--json", "-o", tmp_path / "s.json"], capsys)
    assert code == 2
    doc = json.loads(out)["error"]
    assert doc["code"] == "infeasible_budget" and doc["exit_code"] == 2 and doc["budget_bytes"] == 100
    assert doc["min_feasible_bytes"] > 100 and f"({doc['min_feasible_bytes']} bytes)" in doc["message"]
    assert "smallest feasible budget" in err  # the sentence for a person stays on stderr
    assert not (tmp_path / "s.json").exists()
    # Every user error has the same shape under --json; without --json stdout stays empty.
    code, out, _ = run(["compare", tmp_path / "missing.json", "--budget", "50%", "--json"], capsys)
    assert code == 2 and json.loads(out)["error"] == {
        "code": "bad_file",
        "message": f"trace file {str(tmp_path / 'missing.json')!r} does not exist; check the path",
        "exit_code": 2,
        "min_feasible_bytes": None,
        "budget_bytes": None,
        "min_host_bytes": None,
    }
    code, out, _ = run(["solve", trace_file, "--budget", "100B"], capsys)
    assert code == 2 and out == ""


def test_output_dash_writes_the_schedule_to_stdout(trace_file, capsys):
    code, out, err = run(["solve", trace_file, "--budget", "60%", "-o", "-", "--json"], capsys)
    assert code == 0, err
    sched = json.loads(out)  # stdout holds the schedule alone; the summary went to stderr
    assert set(sched["actions"][0]) >= {"action"} and json.loads(err)["output"] == "-"


def test_trace_prints_every_static_part(tmp_path, capsys):
    pytest.importorskip("transformers")
    from memsched.io import load_trace
    from memsched.units import format_bytes

    path = tmp_path / "t.json"
    args = ["trace", "gpt2", "--small", "--layers", 2, "--batch", 1, "--seq-len", 8, "--steps", 1, "--warmup", 0]
    code, out, err = run([*args, "-o", path], capsys)
    assert code == 0, err
    s = load_trace(path).static
    assert s.other > 0  # buffers and the batch: the part the line used to leave out
    assert s.saved_before_layers > 0  # the embeddings' saved activations
    text = " ".join(out.split())
    parts = (
        f"static {format_bytes(s.total)} (params {format_bytes(s.params)}, grads {format_bytes(s.grads)}, "
        f"optimizer {format_bytes(s.optimizer_state)}, other {format_bytes(s.other)}: buffers and what the process "
        f"holds at the step's start, saved before the layers {format_bytes(s.saved_before_layers)} and held by the "
        f"model's code {format_bytes(s.saved_held_by_code)}: activations no schedule moves)"
    )
    assert parts in text
    assert s.params + s.grads + s.optimizer_state + s.other + s.saved_before_layers + s.saved_held_by_code == s.total


def test_an_output_that_is_an_input_is_refused_before_any_work(trace_file, tmp_path, capsys):
    """`solve t.json -o t.json` replaced the trace with the schedule (exit 0); so did sweep and export on their
    inputs. Each command refuses, naming the flag, and the input is left as it was, through a link too."""
    before = trace_file.read_bytes()
    link = tmp_path / "link.json"
    link.symlink_to(trace_file)
    for argv, flag in (
        (["solve", trace_file, "--budget", "80%", "-o", trace_file], "--output"),
        (["solve", trace_file, "--budget", "80%", "-o", link], "--output"),
        (["sweep", trace_file, "--points", "2", "--html", trace_file], "--html"),
    ):
        code, _, err = run(argv, capsys)
        assert code == 2 and f"{flag} " in err and "is the trace this command reads" in err, err
    assert trace_file.read_bytes() == before
    sched = tmp_path / "s.json"
    assert run(["solve", trace_file, "--budget", "80%", "-o", sched], capsys)[0] == 0
    kept = sched.read_bytes()
    for argv, what in (
        (["export", sched, "--format", "sac", "-o", sched], "schedule"),
        (["plot", trace_file, sched, "-o", sched], "schedule"),
    ):
        code, _, err = run(argv, capsys)
        assert code == 2 and f"is the {what} this command reads" in err, err
    assert sched.read_bytes() == kept
    # A new path, and a device, are written as before.
    assert run(["export", sched, "--format", "sac", "--trace", trace_file, "-o", tmp_path / "sac.json"], capsys)[0] == 0
    assert run(["solve", trace_file, "--budget", "80%", "-o", "/dev/null"], capsys)[0] == 0


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--copy-latency", "nan", "--copy-latency must be seconds from 0 to 1"),
        ("--d2h-bandwidth", "inf", "--d2h-bandwidth must be a finite rate above 0"),
        ("--h2d-bandwidth", "0", "--h2d-bandwidth must be a finite rate above 0"),
        ("--optimizer-state-factor", "nan", "--optimizer-state-factor must be"),
        ("--optimizer-state-factor", "1e300", "--optimizer-state-factor must be"),
    ],
)
def test_import_rates_and_factors_that_are_no_numbers_exit_2(tmp_path, capsys, flag, value, needle):
    graph = require_pipedream() / "alexnet.graph.txt"
    out = tmp_path / "a.json"
    code, _, err = run(["import", "pipedream", graph, "--batch-size", "64", flag, value, "-o", out], capsys)
    assert code == 2 and needle in err and not out.exists(), err


def test_a_trace_or_link_whose_copy_times_overflow_exits_2_as_the_api_answers_422(trace_file, tmp_path, capsys):
    """`compare --link 1e-300 --json` printed `Infinity` (not JSON) and `solve` ran on; the REST service refused the
    same input. The rule has one home (service.check_computable): every front end refuses, naming the units."""
    code, _, err = run(["compare", trace_file, "--budget", "80%", "--link", "1e-300"], capsys)
    assert code == 2 and "below any link" in err
    doc = json.loads(trace_file.read_text())
    doc["device"]["h2d_bytes_per_s"] = 1e-300
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(doc))
    for argv in (
        ["compare", slow, "--budget", "80%", "--json"],
        ["solve", slow, "--budget", "80%", "-o", tmp_path / "s"],
    ):
        code, out, err = run(argv, capsys)
        assert code == 2 and "copy times (saved bytes / bandwidth) add up to" in out + err, out + err
        if "--json" in argv:
            assert "Infinity" not in out and json.loads(out)["error"]["exit_code"] == 2


def test_files_no_reader_can_take_and_paths_no_file_can_take_exit_2(trace_file, tmp_path, capsys):
    """A 5,000-digit integer, JSON nested 100,000 deep, and an output in /proc ended in `internal error` (exit 1):
    each is the user's to fix, in one line; `validate TRACE --trace X` ignored --trace."""
    doc = trace_file.read_text()
    bigint = tmp_path / "bigint.json"
    bigint.write_text(doc.replace('"batch_size": 1', '"batch_size": ' + "9" * 5000, 1))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for path, needle in ((bigint, "thousands of digits"), (deep, "nests its JSON too deeply")):
        for argv in (["validate", path], ["solve", path, "--budget", "80%", "-o", tmp_path / "s.json"]):
            code, _, err = run(argv, capsys)
            assert code == 2 and needle in err, err
    code, _, err = run(["solve", trace_file, "--budget", "80%", "-o", "/proc/self/x.json"], capsys)
    assert code == 2 and "cannot write '/proc/self/x.json'" in err
    code, _, err = run(["validate", trace_file, "--trace", trace_file], capsys)
    assert code == 2 and "drop --trace" in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["gpt2", "--dropout", "2"], "--dropout must be a probability"),
        (["gpt2", "--dropout", "nan"], "--dropout must be a probability"),
        (["resnet50", "--seq-len", "16"], "does not use --seq-len 16"),
        (["resnet50", "--dropout", "0.1"], "does not use --dropout 0.1"),
        (["vit-base", "--seq-len", "16"], "does not use --seq-len 16"),
    ],
)
def test_built_in_model_flags_it_cannot_use_exit_2(tmp_path, capsys, argv, needle):
    """`--dropout 2` was an internal error (transformers' ValueError); an image model dropped --seq-len in silence."""
    out = tmp_path / "t.json"
    code, _, err = run(["trace", *argv, "--small", "--layers", "4", "--batch-size", "1", "-o", out], capsys)
    assert code == 2 and needle in err and not out.exists(), err


def test_serve_refuses_what_would_fail_its_start_in_one_line(tmp_path, capsys):
    """A database that cannot be reached, a port in use, an unknown host or log level: a traceback from the app's
    startup and exit 3 (uvicorn's), or `internal error: KeyError`; now one line and exit 2, before uvicorn starts."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        db = f"sqlite:///{tmp_path / 'm.db'}"
        for argv, needle in (
            (["--database-url", "bogus"], "is not a database URL"),
            (["--database-url", "postgresql+psycopg://u:secret@127.0.0.1:1/db"], "cannot reach the database"),
            (["--database-url", db, "--log-level", "bogus"], "log_level: give one of debug"),
            (["--database-url", db, "--host", "127.0.0.1", "--port", str(port)], "cannot listen on 127.0.0.1"),
        ):
            code, _, err = run(["serve", *argv], capsys)
            assert code == 2 and needle in err and "secret" not in err and "Traceback" not in err, err


def test_a_trace_the_api_refuses_the_cli_refuses_too(trace_file, tmp_path, capsys):
    """Byte counts given as strings or booleans were read (lax) by the CLI and refused by the REST service; sizes
    each in range that add up past any device passed `validate` and were then blamed on the budget; a PipeDream
    profile with activation_size=1e300 was an internal error."""
    doc = json.loads(trace_file.read_text())
    cases = []
    for value, needle in (("1000", "valid integer"), (True, "valid integer"), (2**62, "beyond any device")):
        bad = json.loads(json.dumps(doc))
        bad["layers"][0]["saved_bytes"] = value
        bad["layers"][0]["saved_tensor_bytes"] = []
        cases.append((bad, needle))
    for i, (bad, needle) in enumerate(cases):
        path = tmp_path / f"bad{i}.json"
        path.write_text(json.dumps(bad))
        code, _, err = run(["validate", path], capsys)
        assert code == 2 and needle in err, err
    graph = tmp_path / "g.txt"
    graph.write_text(
        "node1 -- Input -- forward_compute_time=0.0, backward_compute_time=0.0, activation_size=1e300, "
        "parameter_size=0.0\n"
        "node2 -- Conv2d(3, 64) -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=1e300, "
        "parameter_size=100.0\n\tnode1 -- node2\n"
    )
    code, _, err = run(["import", "pipedream", graph, "--batch-size", "1", "-o", tmp_path / "g.json"], capsys)
    assert code == 2 and "beyond any device" in err, err


def test_inputs_in_the_wrong_place_are_named_for_what_they_are(trace_file, tmp_path, capsys):
    """A folder given as a trace was 'does not exist'; a schedule where the trace is due, ten 'Field required'
    lines; a sweep's --png x.jpg wrote a PNG into x.jpg; layer 0's dep was told to be in '0..-1'."""
    code, _, err = run(["validate", tmp_path], capsys)
    assert code == 2 and "is a directory" in err
    sched = tmp_path / "s.json"
    assert run(["solve", trace_file, "--budget", "80%", "-o", sched], capsys)[0] == 0
    code, _, err = run(["simulate", sched, trace_file], capsys)
    assert code == 2 and "is a schedule file, where a trace file is due" in err and err.count("\n") <= 2, err
    code, _, err = run(["sweep", trace_file, "--points", "2", "--png", tmp_path / "x.jpg"], capsys)
    assert code == 2 and "--png" in err and ".png" in err and not (tmp_path / "x.jpg").exists()
    doc = json.loads(trace_file.read_text())
    doc["layers"][0]["deps"] = [0]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    code, _, err = run(["validate", bad], capsys)
    assert code == 2 and "layer 0 has no earlier layer" in err and "0..-1" not in err, err


def test_flags_that_would_do_nothing_are_refused(trace_file, tmp_path, capsys):
    """`simulate --timeline` without --json was ignored; `export --format checkpoint -o x.toml` wrote JSON."""
    sched = tmp_path / "s.json"
    assert run(["solve", trace_file, "--budget", "80%", "-o", sched], capsys)[0] == 0
    code, _, err = run(["simulate", trace_file, sched, "--timeline"], capsys)
    assert code == 2 and "give --json too" in err
    code, _, err = run(["export", sched, "--format", "checkpoint", "-o", tmp_path / "x.toml"], capsys)
    assert code == 2 and "only torchtitan has TOML" in err and not (tmp_path / "x.toml").exists()
