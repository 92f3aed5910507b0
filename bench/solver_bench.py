"""Solver benchmark: solve time and gap against layer count, chains and DAGs, and the PipeDream traces,
for each backend. Writes bench/results/solver_bench.{md,json} naming the machine, versions and command.

    python bench/solver_bench.py --targets [--shared ../shared]   # the exact-search targets (default flow)
    python bench/solver_bench.py [--quick] [--shared ../shared]   # every backend on synthetic sizes
    taskset -c 1 python bench/solver_bench.py --lagrange --before DIR [--after DIR]  # keep/recompute, two checkouts
    taskset -c 1 python bench/solver_bench.py --issue22 --before DIR [--after DIR]   # long traces, default actions
    taskset -c 1 python bench/solver_bench.py --minute --before DIR [--after DIR]    # DenseNet-121 at 60 s
    taskset -c 1 python bench/solver_bench.py --stalls --before DIR [--after DIR]    # stall-heavy traces, <= 300 layers
    taskset -c 1 python bench/solver_bench.py --conventions --before DIR [--after DIR]  # other byte conventions
    taskset -c 1 python bench/solver_bench.py --saved-twice --before DIR [--after DIR]  # ResNets, shared inputs
    taskset -c 1 python bench/solver_bench.py --many-tensors --before DIR [--after DIR]  # GPU traces, relaxed ranges
    taskset -c 1 python bench/solver_bench.py --between --before DIR [--after DIR]  # decoders between the budgets
    taskset -c 1 python bench/solver_bench.py --short --before DIR [--after DIR]  # 40-100-layer synthetic traces

Every row solves through memsched.optimizer.solve (warm start, fallback and the baseline guard included)
and reports the simulator's overhead of the returned schedule, the solver's proven bound and the gap.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from memsched.errors import InfeasibleBudgetError, MemschedError
from memsched.io import load_trace
from memsched.optimizer.baselines import evaluate_baselines
from memsched.optimizer.budget import budget_between, keepall_activation_peak, min_feasible_budget
from memsched.optimizer.heuristic import heuristic
from memsched.optimizer.solve import solve
from memsched.optimizer.synthetic import make_trace
from memsched.options import SolveOptions
from memsched.schema import Trace
from memsched.service.importers import import_pipedream

RESULTS = Path(__file__).resolve().parent / "results"


def pct_budget(trace: Trace, pct: float) -> int:
    """static + pct% of the keep-all activation peak, raised to the minimum if needed. The CLI's 'N%' where the trace
    has no saved_static bytes; where it has (the H200 traces), `memsched solve -b N%` (`resolve_budget`: resident
    bytes + N% of the step's activations) gives less (ResNet-50 on the H200 at 75%: 8.81 against 9.14 GB). Kept so
    that the result files stay comparable with earlier runs."""
    b = trace.static.total + round(keepall_activation_peak(trace) * pct / 100)
    return max(b, min_feasible_budget(trace))


def run_one(
    name: str, trace: Trace, budget: int, backend: str, limit: float, actions: list[str] | None = None
) -> dict[str, object]:
    t0 = time.perf_counter()
    h = heuristic(trace, budget)
    heur_s = time.perf_counter() - t0
    base = min((r.sim.overhead_s for r in evaluate_baselines(trace, budget) if r.feasible), default=None)
    t0 = time.perf_counter()
    options = SolveOptions.from_user(solver=backend, time_limit_s=limit, gap=0.01, actions=actions)
    sched = solve(trace, budget, options)
    wall = time.perf_counter() - t0
    rec = sched.solver
    row = {
        "trace": name,
        "layers": trace.n,
        "budget_bytes": budget,
        "backend": backend,
        "time_limit_s": limit,
        "wall_s": round(wall, 3),
        "status": rec.status.value,
        "returned": rec.backend,
        "overhead_s": sched.prediction.overhead_s,
        "overhead_pct": round(sched.prediction.overhead_pct, 3),
        "bound_s": rec.best_bound_s,
        "gap": rec.gap,
        "heuristic_overhead_s": h.sim.overhead_s,
        "heuristic_s": round(heur_s, 4),
        "best_baseline_overhead_s": base,
        "message": rec.message,
        "details": rec.details,
    }
    logging.info("%s", {k: row[k] for k in ("trace", "backend", "wall_s", "status", "overhead_s", "gap")})
    return row


def _commit(root: Path | None = None) -> str:
    """The checkout's commit (+ '-dirty' with uncommitted changes), or 'unknown' outside git; by default this
    file's checkout."""
    root = root or Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def _meta(packages: tuple[str, ...] = ("memsched", "pulp", "ortools", "highspy")) -> dict[str, object]:
    """What a results file names: the command, the commit, the machine and the versions of `packages`
    (bench/sweep_bench.py uses it too)."""
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": _commit(),
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "processor": platform.processor(),
            "load_avg_at_start": os.getloadavg(),
        },
        "versions": {p: version(p) for p in packages},
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def results_header(title: str, meta: dict[str, object]) -> list[str]:
    """A results file's first lines: its title, then the command, commit, machine, versions and date of `_meta`."""
    return [
        f"# {title}",
        "",
        f"Command: `{meta['command']}` at commit {meta.get('commit', 'unknown')}  ",
        f"Machine: {meta['machine']}  ",
        f"Versions: {meta['versions']}  ",
        f"Date: {meta['date_utc']}",
    ]


def kept_notes(md: Path) -> str:
    """The hand-written notes of an earlier results file (from its first '## ' heading on), kept under a new run."""
    old = md.read_text() if md.exists() else ""
    return old[old.index("\n## ") :] if "\n## " in old else ""


def heuristic_bench() -> None:
    """The heuristic's wall time on 5,000-layer chains and DAGs at tight, middle and loose budgets."""
    rows = []
    for dag in (False, True):
        t = make_trace(5000, 1, dag=dag)
        for frac in (0.0, 0.1, 0.5, 0.9):
            budget = budget_between(t, frac)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                h = heuristic(t, budget)
                times.append(time.perf_counter() - t0)
            rows.append(
                {
                    "trace": f"synthetic/{'dag' if dag else 'chain'}-5000",
                    "budget_frac": frac,
                    "best_s": round(min(times), 4),
                    "median_s": round(sorted(times)[1], 4),
                    "feasible": h.sim.feasible,
                    "overhead_pct": round(h.sim.overhead_pct, 3),
                }
            )
            logging.info("%s", rows[-1])
    meta = _meta()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "solver_heuristic.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        *results_header("Heuristic timing (5,000 layers)", meta),
        "",
        "Budget = min feasible + frac x (keep-all peak - min feasible). Best and median of 3 runs.",
        "",
        "| trace | budget frac | best s | median s | feasible | overhead % |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['trace']} | {r['budget_frac']} | {r['best_s']} | {r['median_s']} | {r['feasible']} | "
        f"{r['overhead_pct']} |"
        for r in rows
    ]
    (RESULTS / "solver_heuristic.md").write_text("\n".join(lines) + "\n")


PREVIOUS = RESULTS / "solver_bench_previous.json"
_BATCH = {"alexnet": 256, "resnet18": 256, "vgg16": 128, "densenet121": 64, "gnmt": 64, "resnet50": 128}


def _previous_overheads() -> dict[str, float]:
    """Best overhead per trace row of the run before the exact search (any backend): the comparison column."""
    if not PREVIOUS.exists():
        return {}
    best: dict[str, float] = {}
    for r in json.loads(PREVIOUS.read_text())["rows"]:
        name, value = str(r["trace"]), float(r["overhead_s"])
        best[name] = min(best.get(name, value), value)
    return best


TRACES = Path(__file__).resolve().parents[1] / "traces"
DECODER_GPU_TRACES = ("gpt2-medium-bf16-b20-s1024-h100.json", "bert-large-bf16-b32-s512-h100.json")
"""Real GPU traces of transformer blocks in traces/ (19-22 saved tensors per block)."""
DECODER_CPU_MODELS = (("llama", 4), ("llama", 16), ("llama", 48), ("gpt2", 4), ("gpt2", 16))
"""(model, blocks) traced here on the CPU with `memsched trace MODEL --small --layers N` (17-22 saved tensors
per block); solved with offload emulated (--actions keep,offload,recompute), since on the CPU an offload
lowers no peak and the default plans leave it out."""
_EMULATED = ["keep", "offload", "recompute"]
DECODER_LIMIT_S = 10.0


DECODER_SUBMODULE_MODELS = (("llama", 48), ("gpt2", 96))
"""(model, blocks) traced per sub-module (attention and MLP apart: 96 and 192 layers), issue 22's second row."""
SUBMODULE_PATTERNS = {
    "llama": (r"model\.layers\.\d+\.self_attn$", r"model\.layers\.\d+\.mlp$"),
    "gpt2": (r"transformer\.h\.\d+\.attn$", r"transformer\.h\.\d+\.mlp$"),
}
"""`--layer-pattern`s that select each block's attention and MLP as layers of their own."""


def trace_cpu_decoder(model: str, layers: int, out_dir: Path, per_submodule: bool = False) -> Path:
    """Record a small CPU trace with the tracer (one torch thread; about 5-40 s each); `per_submodule`: each
    block's attention and MLP as layers of their own (SUBMODULE_PATTERNS)."""
    path = out_dir / f"{model}-small{layers}{'-sub' if per_submodule else ''}-b8-s128-cpu.json"
    if not path.exists():
        cmd = ["memsched", "trace", model, "--small", "--layers", str(layers), "--batch-size", "8"]
        cmd += ["--seq-len", "128", "--steps", "3", "--warmup", "1", "--threads", "1", "-o", str(path)]
        for pattern in SUBMODULE_PATTERNS[model] if per_submodule else ():
            cmd += ["--layer-pattern", pattern]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    return path


def decoder_jobs(trace_dir: Path) -> list[tuple[str, Trace, int, float, list[str] | None]]:
    """Issue 22's rows 'tracer traces of transformers decoders, 75/50/25%' and 'the same models traced per
    sub-module': the GPU traces in traces/, and small CPU traces recorded now (offload emulated), per block and
    per sub-module."""
    jobs: list[tuple[str, Trace, int, float, list[str] | None]] = []
    for name in DECODER_GPU_TRACES:
        t = Trace.model_validate_json((TRACES / name).read_text())
        jobs += [(f"traces/{name}@{pct}%", t, pct_budget(t, pct), DECODER_LIMIT_S, None) for pct in (75, 50, 25)]
    for model, layers in DECODER_CPU_MODELS:
        path = trace_cpu_decoder(model, layers, trace_dir)
        t = Trace.model_validate_json(path.read_text())
        jobs += [
            (f"{model}-small{layers} (cpu, offload emulated)@{pct}%", t, pct_budget(t, pct), DECODER_LIMIT_S, _EMULATED)
            for pct in (75, 50, 25)
        ]
    for model, blocks in DECODER_SUBMODULE_MODELS:
        path = trace_cpu_decoder(model, blocks, trace_dir, per_submodule=True)
        t = Trace.model_validate_json(path.read_text())
        jobs += [
            (
                f"{model}-small{blocks} per sub-module ({t.n} layers, cpu, offload emulated)@{pct}%",
                t,
                pct_budget(t, pct),
                DECODER_LIMIT_S,
                _EMULATED,
            )
            for pct in (75, 50, 25)
        ]
    return jobs


def decoders_bench(trace_dir: Path) -> None:
    """Only the decoder rows, into solver_bench_decoders.{md,json} (the targets' other rows take ~20 min)."""
    trace_dir.mkdir(parents=True, exist_ok=True)
    jobs = decoder_jobs(trace_dir)
    meta = _meta()
    solve(make_trace(8, 1), budget_between(make_trace(8, 1), 0.2))  # compile the DP's kernels outside the rows
    rows = []
    for name, trace, budget, limit, actions in jobs:
        row = run_one(name, trace, budget, "auto", limit, actions)
        row["within_limit"] = float(row["wall_s"]) <= limit * 1.1 + 0.5  # type: ignore[arg-type]
        rows.append(row)
    meta["load_avg_at_end"] = os.getloadavg()
    write_results(meta, rows, previous=True, stem="solver_bench_decoders")


def targets_bench(pipedream: Path, trace_dir: Path) -> None:
    """The default flow (auto) on the rows the exact search is measured by."""
    rows: list[dict[str, object]] = []
    jobs: list[tuple[str, Trace, int, float, list[str] | None]] = []
    if pipedream.is_dir():
        rn = import_pipedream(pipedream / "resnet50.graph.txt", 128)
        for pct in (25, 50):
            jobs.append((f"pipedream/resnet50@{pct}%", rn, pct_budget(rn, pct), 10.0, None))
        for model in sorted(_BATCH):
            t = import_pipedream(pipedream / f"{model}.graph.txt", _BATCH[model])
            jobs += [(f"pipedream/{model}@{pct}%", t, pct_budget(t, pct), 30.0, None) for pct in (75, 50, 25)]
    for dag in (False, True):
        t = make_trace(1000, 1, dag=dag)
        jobs.append((f"synthetic/{'dag' if dag else 'chain'}-1000@20%", t, pct_budget(t, 20), 60.0, None))
    trace_dir.mkdir(parents=True, exist_ok=True)
    jobs += decoder_jobs(trace_dir)
    previous = _previous_overheads()
    meta = _meta()  # the commit and load at the start: the code that runs is the code loaded now
    solve(make_trace(8, 1), budget_between(make_trace(8, 1), 0.2))  # compile the DP's kernels outside the rows
    for name, trace, budget, limit, actions in jobs:
        row = run_one(name, trace, budget, "auto", limit, actions)
        row["previous_overhead_s"] = previous.get(name)
        row["within_limit"] = float(row["wall_s"]) <= limit * 1.1 + 0.5  # type: ignore[arg-type]
        rows.append(row)
    meta["load_avg_at_end"] = os.getloadavg()
    write_results(meta, rows, previous=True)


LAGRANGE_ACTIONS = ["keep", "recompute"]
LAGRANGE_ROWS: tuple[tuple[str, float, float], ...] = (
    *(("pipedream/densenet121", pct, limit) for limit in (30.0, 10.0) for pct in (75, 50, 25)),
    *(("pipedream/resnet50", pct, 10.0) for pct in (75, 50, 25)),
    *((f"synthetic/{shape}-1000", 20, limit) for limit in (60.0, 10.0) for shape in ("chain", "dag")),
    *(("synthetic/chain-200", pct, 10.0) for pct in (50, 20)),
)
"""(trace, % of the keep-all activation peak, time limit s): the keep / recompute rows on which the Lagrangian
bound (optimizer/dp/lagrange.py, commit 05fc549) is measured against the code before it."""
ISSUE22_ROWS: tuple[tuple[str, float, float], ...] = (
    *(("pipedream/densenet121", pct, limit) for limit in (30.0, 10.0) for pct in (75, 50, 25)),
    *((f"synthetic/{shape}-1000", 20, limit) for limit in (60.0, 10.0) for shape in ("chain", "dag")),
    *((f"synthetic/{shape}-200", pct, 10.0) for pct in (20, 50) for shape in ("chain", "dag")),
    *(("pipedream/resnet50", pct, 10.0) for pct in (50, 25)),
)
"""(trace, %, time limit s): issue 22's long traces with the default actions (offload included where the device
allows it), and PipeDream ResNet-50 at 50% / 25% as a regression check (proven before)."""

MINUTE_ROWS: tuple[tuple[str, float, float], ...] = tuple(("pipedream/densenet121", pct, 60.0) for pct in (75, 50, 25))
"""(trace, %, time limit s): issue 22's 60 s targets on DenseNet-121 (gap <= 5%), where the exact DP's climb on a
long trace has the time for more than one step."""


STALL_ROWS: tuple[tuple[str, float, float], ...] = (
    *(("pipedream/resnet50", pct, 10.0) for pct in (12, 17, 19, 22.5, 26, 34, 41, 56)),
    *(("pipedream/resnet50", pct, 5.0) for pct in (12, 19, 26, 41)),
    *((f"pipedream/{name}", 25, 10.0) for name in ("resnet18", "vgg16", "alexnet", "gnmt")),
    *((f"synthetic/{shape}-200", 20, 10.0) for shape in ("chain", "dag")),
    *(("traces/gpt2-medium-bf16-b20-s1024-h100", pct, 10.0) for pct in (75, 50)),
    *(("traces/bert-large-bf16-b32-s512-h100", pct, 10.0) for pct in (75, 50, 25)),
    *(("traces/resnet50-bf16-b256-h100", pct, 10.0) for pct in (75, 50)),
    *(("traces/resnet50-bf16-b256-h100-retraced", pct, 10.0) for pct in (75, 50, 25)),
)
"""(trace, %, time limit s): traces of up to 300 layers whose copies run beside compute, where stalls shape the
plans (the FIFO beam, optimizer/dp/fifo.py): PipeDream ResNet-50 at the budgets of the sweep's lower half
(12-56% = 1.6-6.0 GiB), the other PipeDream profiles at 25%, the 200-layer synthetic traces at 20%, and the H100
traces in traces/ (the retraced ResNet-50 has saved-twice bytes: Layer.shared_input_bytes)."""

CONVENTION_ROWS: tuple[tuple[str, float, float], ...] = tuple(
    (f"{kind}/resnet50", pct, 10.0)
    for kind in ("pipedream-outputs", "pipedream-outputs-lat100us")
    for pct in (75, 50, 25, 19)
)
"""(trace, %, time limit s): issue 22's row of ResNet-50-class networks with copy latency under another byte
convention than the importer's: every layer saves exactly its own output (`outputs_saved`), with the importer's
10 us copy latency and with 100 us."""

SAVED_TWICE_ROWS: tuple[tuple[str, float, float], ...] = tuple(
    (f"traces/{name}", pct, 10.0)
    for name in ("resnet50-bf16-b256-h100-retraced", "resnet50-b4-cpu", "resnet50-sub-b2-cpu")
    for pct in (75, 50, 25)
)
"""(trace, %, time limit s): traces with saved-twice bytes (Layer.shared_input_bytes: every ResNet the tracer
records), where the DP and the MILP price what a kept layer holds after a recomputed producer: ResNet-50 on the
H100 (16 blocks) and on the CPU per block (16) and per convolution stack and shortcut (64 layers)."""

MANY_TENSOR_ROWS: tuple[tuple[str, float, float], ...] = tuple(
    (f"traces/{name}", pct, 10.0)
    for name in (
        "resnet50-bf16-b256-h100",
        "resnet50-bf16-b256-h200",
        "bert-large-bf16-b32-s512-h100",
        "bert-large-bf16-b32-s512-h200",
        "gpt2-medium-bf16-b20-s1024-h200",
    )
    for pct in (75, 50, 25)
)
"""(trace, %, time limit s): the GPU traces the tracer recorded, whose blocks save 12-22 tensors (more subsets than
the DP tries: its proving sweeps run on relaxed byte ranges), on the H100 and the H200. The H100 decoders' 75 / 50%
rows are also in STALL_ROWS."""

BETWEEN_ROWS: tuple[tuple[str, float, float], ...] = tuple(
    (f"traces/{name}", pct, limit)
    for limit in (2.0, 10.0)
    for name in (
        "gpt2-medium-bf16-b20-s1024-h100",
        "gpt2-medium-bf16-b20-s1024-h200",
        "bert-large-bf16-b32-s512-h100",
        "bert-large-bf16-b32-s512-h200",
    )
    for pct in (65, 55, 45, 35)
)
"""(trace, %, time limit s): the recorded decoders at budgets between the targets' 75 / 50 / 25%, at issue 22's
2 s goal and at 10 s. A user's budget is whatever their device leaves; at 70 / 60 / 40 / 30% these traces are
proven within 2 s, at 65 / 55 / 45 / 35% mostly not (stop 74's note in solver_bench_between.md)."""

SHORT_ROWS: tuple[tuple[str, float, float], ...] = tuple(
    (f"synthetic/{shape}-{n}", pct, 10.0) for pct in (20, 35) for n in (40, 60, 80, 100) for shape in ("chain", "dag")
)
"""(trace, %, time limit s): synthetic chains and DAGs of 40-100 layers, where `auto` runs the exact-window MILP
after the exact DP (AUTO_MILP_MAX_LAYERS)."""


def outputs_saved(trace: Trace, latency_s: float | None = None) -> Trace:
    """The same network under another byte convention: every layer saves exactly its own output, as a framework
    that stashes each node's result does, instead of the importer's rule per kind of layer (inputs of
    convolutions and norms, outputs of activations). `latency_s`: the copies' latency instead of the trace's."""
    layers = [
        layer.model_copy(
            update={
                "saved_bytes": layer.output_bytes,
                "saved_tensor_bytes": [layer.output_bytes] if layer.output_bytes else [],
                "output_saved_bytes": layer.output_bytes,
                "input_saved_bytes": None,
                "shared_input_bytes": None,
            }
        )
        for layer in trace.layers
    ]
    device = trace.device if latency_s is None else trace.device.model_copy(update={"copy_latency_s": latency_s})
    out = trace.model_copy(update={"layers": layers, "device": device, "model": f"{trace.model} (outputs saved)"})
    return Trace.model_validate(out.model_dump())


@dataclass(frozen=True)
class SideBySide:
    """A before / after comparison: each row solved by two checkouts, each side in a process of its own."""

    rows: tuple[tuple[str, float, float], ...]
    actions: list[str] | None
    """None: the default actions (no `actions=`)."""
    stem: str
    warm: tuple[tuple[int, float], ...]
    """(layers, time limit s) of the synthetic chains solved before the row, to compile or load the kernels
    outside it (the install's jit step leaves the Lagrangian's out)."""


SIDE_BY_SIDE = {
    "lagrange": SideBySide(LAGRANGE_ROWS, LAGRANGE_ACTIONS, "solver_bench_lagrange", ((30, 2.0),)),
    # 160 layers: the link windows' Lagrangian runs on traces of 150-2,000 layers with copies beside compute.
    "issue22": SideBySide(ISSUE22_ROWS, None, "solver_bench_issue22", ((30, 2.0), (160, 1.0))),
    "minute": SideBySide(MINUTE_ROWS, None, "solver_bench_minute", ((30, 2.0), (160, 1.0))),
    "stalls": SideBySide(STALL_ROWS, None, "solver_bench_stalls", ((30, 2.0), (160, 1.0))),
    "conventions": SideBySide(CONVENTION_ROWS, None, "solver_bench_conventions", ((30, 2.0), (160, 1.0))),
    "saved_twice": SideBySide(SAVED_TWICE_ROWS, None, "solver_bench_saved_twice", ((30, 2.0),)),
    "many_tensors": SideBySide(MANY_TENSOR_ROWS, None, "solver_bench_many_tensors", ((30, 2.0),)),
    "between": SideBySide(BETWEEN_ROWS, None, "solver_bench_between", ((30, 2.0),)),
    "short": SideBySide(SHORT_ROWS, None, "solver_bench_short", ((30, 2.0),)),
}
_NO_PLAN = {"infeasible", "refused"}
"""side_row statuses without a schedule."""
_BOUND_FROM = re.compile(r"lower bound \S+ s from (\S+)")


def _bench_trace(key: str, pipedream: Path) -> Trace:
    kind, name = key.split("/")
    if kind == "pipedream":
        return import_pipedream(pipedream / f"{name}.graph.txt", _BATCH[name])
    if kind.startswith("pipedream-outputs"):  # pipedream-outputs[-latNus]: outputs_saved
        latency = (
            float(kind.removeprefix("pipedream-outputs-lat").removesuffix("us")) * 1e-6 if "-lat" in kind else None
        )
        return outputs_saved(import_pipedream(pipedream / f"{name}.graph.txt", _BATCH[name]), latency)
    if kind == "traces":  # a trace recorded by the tracer, in this project's traces/
        return load_trace(Path(__file__).resolve().parents[1] / "traces" / f"{name}.json")
    shape, n = name.split("-")
    return make_trace(int(n), 1, dag=shape == "dag")


def side_row(mode: str, i: int, pipedream: Path) -> dict[str, object]:
    """Row i of SIDE_BY_SIDE[mode], solved by the memsched this interpreter imports: each side runs it in a
    process of its own (its venv's python on this file), so that neither side's JIT state or heap is the other's."""
    spec = SIDE_BY_SIDE[mode]
    key, pct, limit = spec.rows[i]
    for layers, warm_limit in spec.warm:
        warm = make_trace(layers, 1)
        options = SolveOptions.from_user(time_limit_s=warm_limit, actions=spec.actions)
        solve(warm, budget_between(warm, 0.2), options)
    trace = _bench_trace(key, pipedream)
    budget = pct_budget(trace, pct)
    name = f"{key}@{pct:g}%"
    code = str(Path(sys.modules[solve.__module__].__file__ or "?").parents[1])
    head = {"trace": name, "layers": trace.n, "budget_bytes": budget, "time_limit_s": limit, "code": code}
    try:
        row = run_one(name, trace, budget, "auto", limit, spec.actions)
    except InfeasibleBudgetError as e:
        # pct_budget raises to the smallest budget with offload; keep / recompute alone may need more.
        return {**head, "status": "infeasible", "min_feasible_bytes": e.min_feasible_bytes, "min_proven": e.proven}
    except MemschedError as e:
        # Refused without a proof either way (check_feasible: the DP neither found a plan nor ruled one out).
        return {**head, "status": "refused", "message": str(e)}
    found = _BOUND_FROM.search(" ".join(row["details"]))  # type: ignore[arg-type]
    row["bound_from"] = found.group(1) if found else "none"
    row["within_limit"] = float(row["wall_s"]) <= limit * 1.1 + 0.5  # type: ignore[arg-type]
    row["code"] = code
    return row


def side_by_side_bench(mode: str, pipedream: Path, before: Path, after: Path | None) -> None:
    """Each row of SIDE_BY_SIDE[mode] with `before`'s checkout (its .venv) and then with `after`'s (default: this
    interpreter's), one after the other (run the whole command under taskset -c 1 so that both sides get the same
    core). A pinned `after` checkout keeps commits landing in this one during the run out of the numbers."""
    spec = SIDE_BY_SIDE[mode]
    meta = _meta()
    meta["mode"] = mode
    meta["actions"] = spec.actions
    here = Path(__file__).resolve().parents[1]
    pythons = {"before": before / ".venv" / "bin" / "python", "after": Path(sys.executable)}
    if after is not None:
        pythons["after"] = after / ".venv" / "bin" / "python"
    for side, checkout in (("before", before), ("after", after or here)):
        meta[side] = {"checkout": str(checkout), "commit": _commit(checkout)}
    meta["cpu_affinity"] = sorted(os.sched_getaffinity(0))
    rows: list[dict[str, object]] = []
    for i in range(len(spec.rows)):
        sides: dict[str, dict[str, object]] = {}
        for side, python in pythons.items():
            cmd = [str(python), __file__, "--side-row", mode, str(i), "--shared", str(pipedream.parents[1])]
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
            sides[side] = json.loads(out.splitlines()[-1])
            logging.info("%s %s: %s", side, sides[side]["trace"], sides[side]["status"])
        rows.append({**sides["after"], "before": sides["before"]})
    meta["load_avg_at_end"] = os.getloadavg()
    write_results(meta, rows, stem=spec.stem, table=_side_by_side_table)


def _bound_above_answer(r: dict[str, object], b: dict[str, object]) -> list[str]:
    """The sides whose proven bound exceeds the smaller of the two sides' overheads (a bug: a bound is never above
    an answer), beyond a relative 1e-9."""
    sides = [(s, x) for s, x in (("before", b), ("after", r)) if x["status"] not in _NO_PLAN]
    if not sides:
        return []
    best = min(float(x["overhead_s"]) for _, x in sides)  # type: ignore[arg-type]
    return [
        f"{s} bound {float(x['bound_s']):.6g} s > {best:.6g} s"  # type: ignore[arg-type]
        for s, x in sides
        if x["bound_s"] is not None and float(x["bound_s"]) > best * (1 + 1e-9)  # type: ignore[arg-type]
    ]


def _side_by_side_table(meta: dict[str, object], rows: list[dict[str, object]]) -> list[str]:
    """The before / after columns of a side-by-side run (wall ok: wall <= 1.1 limit + 0.5 s)."""

    def cells(r: dict[str, object]) -> list[str]:
        if r["status"] == "infeasible":
            return ["infeasible", f"smallest feasible {r['min_feasible_bytes']} B", "", ""]
        if r["status"] == "refused":
            return ["refused", "no plan found or ruled out (an error to the user)", "", ""]
        gap = f"{100 * float(r['gap']):.2f}%" if r["gap"] is not None else ""  # type: ignore[arg-type]
        bound = f"{float(r['bound_s']):.5f}" if r["bound_s"] is not None else ""  # type: ignore[arg-type]
        over = f"{float(r['overhead_s']):.5f}"  # type: ignore[arg-type]
        ok = "yes" if r["within_limit"] else "NO"
        return [str(r["status"]), f"{over} / {bound} / {gap}", str(r["bound_from"]), f"{r['wall_s']} ({ok})"]

    def gain(r: dict[str, object], b: dict[str, object]) -> str:
        if {r["status"], b["status"]} & _NO_PLAN or not float(b["overhead_s"]):  # type: ignore[arg-type]
            return ""
        return f"{100 * (float(r['overhead_s']) / float(b['overhead_s']) - 1):+.2f}%"  # type: ignore[arg-type]

    before, after = meta["before"], meta["after"]
    assert isinstance(before, dict) and isinstance(after, dict)
    acts = meta.get("actions", LAGRANGE_ACTIONS)
    actions = "default actions (no `actions=`)" if acts is None else "actions " + " / ".join(acts)  # type: ignore[arg-type]
    lines = [
        "",
        f"Before: {before['checkout']} at commit {before['commit']}; after: {after['checkout']} at commit "
        f"{after['commit']} (each with its own .venv; this file ran in both). Each row runs both "
        f"sides one after the other, each in a process of its own, on CPU affinity {meta['cpu_affinity']}. "
        f"{actions[0].upper() + actions[1:]}, solver auto, gap 1%. Cells: overhead s / bound s / gap; wall s "
        "(wall <= 1.1 x limit + 0.5 s). Gain: after / before - 1 of the overhead (negative is better).",
        "",
        "| trace | n | budget B | limit s | before: status | before: overhead / bound / gap | before: bound "
        "from | before: wall s | after: status | after: overhead / bound / gap | after: bound from | after: wall "
        "s | gain |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    above: list[str] = []
    wrong: list[str] = []
    for r in rows:
        b = r["before"]
        assert isinstance(b, dict)
        head = [str(r["trace"]), str(r["layers"]), str(r["budget_bytes"]), str(r["time_limit_s"])]
        lines.append("| " + " | ".join([*head, *cells(b), *cells(r), gain(r, b)]) + " |")
        above += [f"{r['trace']} ({r['time_limit_s']} s): {x}" for x in _bound_above_answer(r, b)]
        statuses = {str(r["status"]), str(b["status"])}
        if "infeasible" in statuses and not statuses <= _NO_PLAN:
            wrong.append(f"{r['trace']} ({r['time_limit_s']} s)")
    lines += [
        "",
        "Bounds above the smaller of the two sides' overheads (a bug if any): "
        + ("; ".join(above) if above else "none."),
        "",
        "Budgets refused as infeasible on one side where the other found a plan (a bug if any): "
        + ("; ".join(wrong) if wrong else "none."),
    ]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    default_shared = os.environ.get("MEMSCHED_SHARED", str(Path(__file__).resolve().parents[2] / "shared"))
    ap.add_argument("--shared", default=default_shared)
    ap.add_argument("--backends", default="cbc,highs,cpsat")
    ap.add_argument("--heuristic", action="store_true", help="only time the heuristic on 5,000 layers")
    ap.add_argument(
        "--targets",
        action="store_true",
        help="the default flow (auto) on every PipeDream profile at 75/50/25%% (30 s), ResNet-50 at "
        "10 s, and 1,000-layer chain/DAG at 20%% (60 s), beside the previous run's rows",
    )
    ap.add_argument(
        "--append-tight",
        type=float,
        metavar="PCT",
        help="append 1,000-layer rows at PCT%% (60 s each) to the existing results",
    )
    ap.add_argument(
        "--rerun-resnet50",
        action="store_true",
        help="re-run only the PipeDream ResNet-50 rows (50%%, 25%%; 10 s) and replace them in the "
        "existing results, keeping every other row and the notes below the table",
    )
    ap.add_argument(
        "--decoders",
        action="store_true",
        help="only the transformer rows of issue 22 (traces/ GPU traces and small CPU decoders traced now, "
        "75/50/25%%, 10 s): writes solver_bench_decoders.{md,json}",
    )
    ap.add_argument(
        "--trace-dir",
        default=str(Path(tempfile.gettempdir()) / "memsched-bench-traces"),
        help="where the CPU decoder traces are recorded (reused when present)",
    )
    ap.add_argument(
        "--lagrange",
        action="store_true",
        help="keep / recompute rows (LAGRANGE_ROWS) with --before's checkout and this one: writes "
        "solver_bench_lagrange.{md,json}",
    )
    ap.add_argument(
        "--issue22",
        action="store_true",
        help="issue 22's long traces (ISSUE22_ROWS) with the default actions, with --before's checkout and "
        "--after's: writes solver_bench_issue22.{md,json}",
    )
    ap.add_argument(
        "--minute",
        action="store_true",
        help="DenseNet-121 at 75/50/25%% with 60 s (MINUTE_ROWS), with --before's checkout and --after's: writes "
        "solver_bench_minute.{md,json}",
    )
    ap.add_argument(
        "--stalls",
        action="store_true",
        help="traces of up to 300 layers where stalls shape the plans (STALL_ROWS), with --before's checkout and "
        "--after's: writes solver_bench_stalls.{md,json}",
    )
    ap.add_argument(
        "--conventions",
        action="store_true",
        help="ResNet-50 with every layer's output saved, 10 / 100 us copy latency (CONVENTION_ROWS), with "
        "--before's checkout and --after's: writes solver_bench_conventions.{md,json}",
    )
    ap.add_argument(
        "--saved-twice",
        action="store_true",
        help="ResNet-50 traces with saved-twice bytes (SAVED_TWICE_ROWS), with --before's checkout and --after's: "
        "writes solver_bench_saved_twice.{md,json}",
    )
    ap.add_argument(
        "--many-tensors",
        action="store_true",
        help="GPU traces whose blocks save many tensors (MANY_TENSOR_ROWS), with --before's checkout and --after's: "
        "writes solver_bench_many_tensors.{md,json}",
    )
    ap.add_argument(
        "--between",
        action="store_true",
        help="the recorded decoders at budgets between 75 / 50 / 25%% (BETWEEN_ROWS), 2 s and 10 s, with --before's "
        "checkout and --after's: writes solver_bench_between.{md,json}",
    )
    ap.add_argument(
        "--short",
        action="store_true",
        help="synthetic chains and DAGs of 40-100 layers at 20 / 35%% (SHORT_ROWS), with --before's checkout and "
        "--after's: writes solver_bench_short.{md,json}",
    )
    ap.add_argument("--before", type=Path, help="a checkout with its own .venv (the code before a change)")
    ap.add_argument("--after", type=Path, help="a checkout with its own .venv (default: this interpreter's code)")
    # One side of one row of a side-by-side mode: JSON on stdout.
    ap.add_argument("--side-row", nargs=2, metavar=("MODE", "I"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.heuristic:
        heuristic_bench()
        return
    if args.side_row is not None:
        mode, i = args.side_row
        print(json.dumps(side_row(mode, int(i), Path(args.shared) / "data" / "pipedream")))
        return
    modes = [m for m in SIDE_BY_SIDE if getattr(args, m)]
    if len(modes) > 1:
        ap.error("give one of --" + " / --".join(SIDE_BY_SIDE))
    if modes:
        mode = modes[0]
        if args.before is None:
            ap.error(f"--{mode} needs --before")
        after = args.after.resolve() if args.after else None
        side_by_side_bench(mode, Path(args.shared) / "data" / "pipedream", args.before.resolve(), after)
        return
    if args.decoders:
        decoders_bench(Path(args.trace_dir))
        return
    if args.targets:
        targets_bench(Path(args.shared) / "data" / "pipedream", Path(args.trace_dir))
        return
    if args.rerun_resnet50:
        old = json.loads((RESULTS / "solver_bench.json").read_text())
        rn = import_pipedream(Path(args.shared) / "data" / "pipedream" / "resnet50.graph.txt", 128)
        fresh = {
            (f"pipedream/resnet50@{pct}%", b): run_one(f"pipedream/resnet50@{pct}%", rn, pct_budget(rn, pct), b, 10.0)
            for pct in (50, 25)
            for b in args.backends.split(",")
        }
        rows = [fresh.pop((str(r["trace"]), str(r["backend"])), r) for r in old["rows"]]
        rows = list(fresh.values()) + rows  # new (trace, backend) pairs first
        meta = old["meta"]
        meta["rerun_resnet50"] = {"command": " ".join([Path(sys.executable).name, *sys.argv]), **_meta()}
        write_results(meta, rows)
        return
    if args.append_tight is not None:
        old = json.loads((RESULTS / "solver_bench.json").read_text())
        rows = old["rows"]
        for dag in (False, True):
            t = make_trace(1000, 1, dag=dag)
            for b in args.backends.split(","):
                name = f"synthetic/{'dag' if dag else 'chain'}-1000@{args.append_tight:g}%"
                rows.append(run_one(name, t, pct_budget(t, args.append_tight), b, 60.0))
        meta = old["meta"]
        meta["appended"] = {"command": " ".join([Path(sys.executable).name, *sys.argv]), **_meta()}
        write_results(meta, rows)
        return
    backends = args.backends.split(",")
    rows = []
    pipedream = Path(args.shared) / "data" / "pipedream"
    # Targets first: ResNet-50 (batch 128) at 50% and 25% of its activation memory, 10 s each.
    if pipedream.is_dir():
        rn = import_pipedream(pipedream / "resnet50.graph.txt", 128)
        for pct in (50, 25):
            for b in backends:
                rows.append(run_one(f"pipedream/resnet50@{pct}%", rn, pct_budget(rn, pct), b, 10.0))
        for model, batch in (("alexnet", 256), ("resnet18", 256), ("vgg16", 128), ("densenet121", 64), ("gnmt", 64)):
            t = import_pipedream(pipedream / f"{model}.graph.txt", batch)
            rows.append(run_one(f"pipedream/{model}@50%", t, pct_budget(t, 50), "cbc", 10.0))
    sizes = (20, 50) if args.quick else (20, 50, 100, 200, 500, 1000)
    for n in sizes:
        for dag in (False, True):
            t = make_trace(n, 1, dag=dag)
            budget = pct_budget(t, 40)
            for b in backends:
                limit = 60.0 if n >= 1000 else 10.0
                if n >= 500 and b != "cbc":
                    limit = 10.0  # time box: the 60 s target is for the default backend
                rows.append(run_one(f"synthetic/{'dag' if dag else 'chain'}-{n}@40%", t, budget, b, limit))
    meta = _meta()
    write_results(meta, rows)


def write_results(
    meta: dict[str, object],
    rows: list[dict[str, object]],
    previous: bool = False,
    stem: str = "solver_bench",
    table: Callable[[dict[str, object], list[dict[str, object]]], list[str]] | None = None,
) -> None:
    """Write the JSON and the markdown table; hand-written notes below the table (from the first '## '
    heading of the existing markdown on) are kept. `previous`: add the previous run's overhead and the
    time-limit check (limit x 1.1 + 0.5 s) as columns. `table`: the lines after the header instead of the
    default table."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    md = RESULTS / f"{stem}.md"
    notes = kept_notes(md)
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = results_header("Solver benchmark", meta)
    if "appended" in meta:
        app = meta["appended"]
        assert isinstance(app, dict)
        lines += ["", f"Rows appended by `{app['command']}` on {app['date_utc']}."]
    if "rerun_resnet50" in meta:
        rr = meta["rerun_resnet50"]
        assert isinstance(rr, dict)
        lines += [
            "",
            f"ResNet-50 rows re-run by `{rr['command']}` on {rr['date_utc']} "
            f"(load average at start {rr['machine']['load_avg_at_start']}).",
        ]
    if table is not None:
        md.write_text("\n".join(lines + table(meta, rows)) + "\n" + notes)
        return
    extra_head = " previous s | wall <= 1.1 limit + 0.5 |" if previous else ""
    lines += [
        "",
        "| trace | n | backend | limit s | wall s | status | returned | overhead s | bound s | gap "
        "| heuristic s (overhead) | best baseline s |" + extra_head,
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if previous else ""),
    ]
    for r in rows:
        gap = "" if r["gap"] is None else f"{100 * float(r['gap']):.2f}%"  # type: ignore[arg-type]
        bound = "" if r["bound_s"] is None else f"{float(r['bound_s']):.5f}"  # type: ignore[arg-type]
        base = "" if r["best_baseline_overhead_s"] is None else f"{float(r['best_baseline_overhead_s']):.5f}"  # type: ignore[arg-type]
        line = (
            f"| {r['trace']} | {r['layers']} | {r['backend']} | {r['time_limit_s']} | {r['wall_s']} | "
            f"{r['status']} | {r['returned']} | {float(r['overhead_s']):.5f} | {bound} | {gap} | "  # type: ignore[arg-type]
            f"{r['heuristic_s']} ({float(r['heuristic_overhead_s']):.5f}) | {base} |"  # type: ignore[arg-type]
        )
        if previous:
            prev = r.get("previous_overhead_s")
            line += f" {'' if prev is None else f'{float(prev):.5f}'} | {'yes' if r['within_limit'] else 'NO'} |"  # type: ignore[arg-type]
        lines.append(line)
    md.write_text("\n".join(lines) + "\n" + notes)


if __name__ == "__main__":
    main()
