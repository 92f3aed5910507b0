"""Helpers for bench/gpu/run.sh (run as `python3 bench/gpu/gpu_tools.py SUBCOMMAND ...`).

    env OUT.json [--dry-run]                 machine, driver, versions, git commit
    failures RUN_DIR                         number of failed or time-skipped steps (run.sh's exit status)
    gpu-tag                                  'h100' / 'h200' / ... ('cpu' without CUDA): the file-name suffix
    acts TRACE [--min-gib G] [--max-fill F]  activation bytes of a trace; suggests a batch if below G GiB
    row TRACE --file NAME --command CMD      one traces/README.md table row
    report RUN_DIR --command CMD             results/gpu-<gpu>-<date>.md + .json from everything the run wrote
    import TARBALL [--repo DIR]              (developer machine) unpack a run into traces/ and bench/results/

Kept out of memsched/: these are benchmark plumbing, not product code. Standard library + memsched only, so
`env` and `gpu-tag` work before anything else is importable and `report` works with whatever the run produced.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GIB = float(2**30)
PEAK_TARGET, STEP_TARGET = 0.05, 0.10
# Published points (the seed papers' results): (who, oversubscription, slowdown % or a note).
PUBLISHED = [
    ("vDNN (VGG-16 b=256, 12 GB)", "~2.3x", "+18%"),
    ("PoocH", "~3x", "+38%"),
    ("Hayakawa & Narihira", "7.5x", "55% of in-core speed (+82%)"),
    ("MONeT (ResNet-50, recompute only)", "0.4x memory (15.1 -> 6.0 GB)", "+9.3%"),
    ("memsched target", "2x", "<= +5%"),
    ("memsched target", "4x", "<= +20%"),
]


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _torch_facts() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"torch": None}
    facts: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(
            gpu=torch.cuda.get_device_name(0),
            gpu_memory_bytes=int(props.total_memory),
            gpu_multiprocessors=int(props.multi_processor_count),
            bf16_supported=bool(torch.cuda.is_bf16_supported()),
        )
    return facts


def gpu_tag() -> str:
    name = str(_torch_facts().get("gpu") or "")
    if not name:
        return "cpu"
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]*)\b", name.replace("NVIDIA", ""))
    return (m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")).lower()


def cmd_env(out: Path, dry_run: bool) -> None:
    info: dict[str, Any] = {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "dry_run": dry_run,
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        # The device machine gets a copy of the working tree, maybe without .git: the caller names the commit.
        "git_commit": os.environ.get("MEMSCHED_COMMIT") or _run(["git", "-C", str(REPO), "rev-parse", "HEAD"]) or None,
        "git_dirty": bool(_run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"])),
        **_torch_facts(),
        "gpu_tag": gpu_tag(),
    }
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,pci.bus_id", "--format=csv,noheader"])
    info["nvidia_smi"] = smi or None
    if smi:
        parts = [p.strip() for p in smi.splitlines()[0].split(",")]
        info["driver"] = parts[1] if len(parts) > 1 else None
        info["nvidia_smi_full"] = _run(["nvidia-smi"])
    for mod in ("transformers", "pydantic", "pydantic_core", "pulp", "typer", "numpy", "memsched"):
        try:
            info[f"{mod}_version"] = getattr(__import__(mod), "__version__", "?")
        except Exception as e:  # noqa: BLE001 - an absent or broken package is a fact to record, not a failure
            info[f"{mod}_version"] = f"unavailable ({type(e).__name__})"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps({k: v for k, v in info.items() if k != "nvidia_smi_full"}, indent=2))


def _load_trace(path: Path) -> Any:
    from memsched.io import load_trace

    return load_trace(path)


def cmd_acts(path: Path, min_gib: float, max_fill: float) -> None:
    """Print the trace's activation bytes; when below min_gib, the batch that would reach it (rounded up to
    a multiple of 4) if its estimated keep-all peak fits max_fill of the device memory, else none."""
    from memsched.optimizer.baselines import keep_all
    from memsched.optimizer.budget import keepall_activation_peak
    from memsched.optimizer.simulate import simulate

    tr = _load_trace(path)
    saved = sum(x.saved_bytes for x in tr.layers)
    sim_peak = simulate(tr, keep_all(tr), with_events=False).peak_bytes
    doc: dict[str, Any] = {
        "trace": str(path),
        "batch_size": tr.batch_size,
        "saved_activation_bytes": saved,
        "saved_activation_gib": saved / GIB,
        "keepall_activation_peak_bytes": keepall_activation_peak(tr),
        "static_bytes": tr.static.total,
        "keepall_peak_bytes": tr.baseline.peak_bytes,
        # What the tracer measured in core against what the simulator says keep-all peaks at: on CUDA the
        # difference is memory outside the cost model (e.g. the LM head's and loss's transients).
        "simulated_keepall_peak_bytes": sim_peak,
        "unmodelled_bytes": tr.baseline.peak_bytes - sim_peak,
        "device_memory_bytes": tr.device.memory_bytes,
        "min_gib": min_gib,
        "meets_min": saved >= min_gib * GIB,
        "suggest_batch": None,
    }
    if not doc["meets_min"] and saved > 0:
        b = tr.batch_size
        want = math.ceil(b * min_gib * GIB * 1.05 / saved / 4) * 4  # 5% margin, a multiple of 4
        # Batch-proportional part of the peak: everything but parameters, gradients and optimizer state.
        fixed = tr.static.params + tr.static.grads + tr.static.optimizer_state
        est_peak = fixed + (tr.baseline.peak_bytes - fixed) * want / b
        doc["suggest_estimated_peak_bytes"] = int(est_peak)
        if est_peak <= max_fill * tr.device.memory_bytes:
            doc["suggest_batch"] = want
    print(json.dumps(doc))


def cmd_row(path: Path, file: str, command: str) -> None:
    tr = _load_trace(path)
    fw = tr.framework
    torch_v = fw.get("torch", "?") + (f", CUDA {fw['cuda']}" if "cuda" in fw else "")
    tf_v = f" (transformers {fw['transformers']})" if "transformers" in fw else ""
    saved = sum(x.saved_bytes for x in tr.layers)
    model = f"{tr.model} ({tr.n} layers; activations {saved / GIB:.1f} GiB, static {tr.static.total / GIB:.2f} GiB)"
    print(
        f"| `{file}` | {model} | {tr.batch_size} | {tr.seq_len or '-'} | {tr.dtype} | {tr.device.name} | "
        f"{torch_v}{tf_v} | `{command}` |"
    )


# ---------------------------------------------------------------- report


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _status(run: Path) -> list[dict[str, str]]:
    rows = []
    p = run / "status.tsv"
    if p.is_file():
        for line in p.read_text().splitlines():
            f = line.split("\t")
            if len(f) >= 4:
                rows.append({"stage": f[0], "item": f[1], "rc": f[2], "seconds": f[3], "note": "\t".join(f[4:])})
    return rows


def failures(status: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(failed, skipped for time) steps. An infeasible budget is an answer (the smallest feasible one is then
    solved and measured), and a step followed by a 'note' row (re-traced after an out-of-memory) was retried:
    neither counts; the retry's own row does."""
    retried = {r["item"] for r in status if r["rc"] == "note"}
    failed = [
        r
        for r in status
        if r["rc"] not in ("0", "skip", "note") and "is infeasible" not in r["note"] and r["item"] not in retried
    ]
    skipped = [r for r in status if r["rc"] == "skip" and r["note"].startswith("time budget")]
    return failed, skipped


def _pytest_summary(run: Path) -> str | None:
    log = run / "logs" / "tests.log"
    if not log.is_file():
        return None
    final = re.compile(r"\b\d+ (passed|failed|skipped|errors?|deselected)\b.* in [\d.]+s")
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if final.search(ln)]
    return lines[-1].strip("= ") if lines else None


def _gib(x: Any) -> str:
    if x is None:
        return "-"
    from memsched.units import format_bytes

    return str(format_bytes(int(x)))


def _ratio(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}"


def _pct(x: Any) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def _ms(x: Any) -> str:
    return "-" if x is None else f"{1e3 * x:.1f}"


def _yes(x: Any) -> str:
    return "-" if x is None else ("yes" if x else "**NO**")


def cmd_report(run: Path, command: str) -> Path:
    env = _read_json(run / "env.json") or {}
    measures = []
    for p in sorted((run / "measure").glob("*.json")):
        doc = _read_json(p)
        if isinstance(doc, dict):
            doc["_file"] = p.name
            measures.append(doc)
    solves: dict[str, Any] = {}
    for p in sorted((run / "schedules").glob("*.schedule.json")):
        sc = _read_json(p)
        if isinstance(sc, dict):
            solves[p.name.removesuffix(".schedule.json")] = {
                "policy": sc.get("policy"),
                "budget_bytes": sc.get("budget_bytes"),
                "prediction": sc.get("prediction"),
                "solver": sc.get("solver"),
            }
    acts = {p.name.removesuffix(".json"): _read_json(p) for p in sorted((run / "traces").glob("*.acts.json"))}
    status = _status(run)
    tag = env.get("gpu_tag") or "unknown"
    date = str(env.get("date_utc", dt.datetime.now(dt.UTC).isoformat()))[:10]
    dry = bool(env.get("dry_run"))
    out_dir = run / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"gpu-{tag}-{date}" + ("-DRY-RUN" if dry else "")
    scheduled = [m for m in measures if m.get("scheduled")]
    keepalls = [m for m in measures if not m.get("scheduled")]

    md = [f"# GPU evidence: traces and measured replays — {env.get('gpu') or 'no GPU'} ({date})\n"]
    if dry:
        md.append(
            "**CPU DRY RUN — not GPU evidence.** Tiny configs on the CPU; memory is the saved-tensor ledger, "
            "not max_memory_allocated. This file only proves the pipeline.\n"
        )
    md.append("## Machine and command\n")
    md.append(f"- GPU: {env.get('gpu') or '-'} ({_gib(env.get('gpu_memory_bytes'))}), driver {env.get('driver')}")
    md.append(
        f"- torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), Python {env.get('python')}, "
        f"transformers {env.get('transformers_version')}, pydantic {env.get('pydantic_version')}, "
        f"pulp {env.get('pulp_version')}"
    )
    md.append(f"- memsched commit {env.get('git_commit')}{' (+uncommitted changes)' if env.get('git_dirty') else ''}")
    md.append(f"- command: `{command}`")
    tests = _pytest_summary(run)
    md.append(f"- gpu-marked tests (`pytest -m gpu tests/gpu`): {tests or 'not run'}\n")

    md.append("## Replays: predicted vs measured\n")
    md.append(
        f"Peak = `{scheduled[0]['peak_source'] if scheduled else 'cuda-allocator'}`. Targets: measured "
        f"peak within {PEAK_TARGET:.0%} of predicted, step time within {STEP_TARGET:.0%}, peak <= budget. "
        "Oversubscription = measured keep-all peak / budget (whole device); activation oversubscription = keep-all "
        "activations / the budget's room for activations (2x at 50%, 4x at 25% by construction).\n"
    )
    md.append(
        "| trace | budget % | policy (keep/offload/recompute) | budget | predicted peak | measured peak "
        "| peak ratio | fits | predicted step ms | measured step ms | step ratio | keep-all step ms | slowdown "
        "| predicted slowdown | oversub. | act. oversub. | solver (status, gap, wall) |"
    )
    md.append("| " + " | ".join(["---"] * 17) + " |")
    raised = {r["item"].removesuffix("-at-min-feasible") for r in status if r["item"].endswith("-at-min-feasible")}
    for m in scheduled:
        s, k = m["scheduled"], m.get("keep_all") or {}
        tstem, pct = m["_file"].removesuffix(".json").rsplit("-", 1)
        label = f"{pct}%" + (" (infeasible: min feasible)" if f"{tstem}/solve-{pct}%" in raised else "")
        r = s["ratio_measured_over_predicted"]
        a = m.get("actions", {})
        mix = f"{a.get('keep', 0)}/{a.get('offload', 0)}/{a.get('recompute', 0)}"
        sv = (solves.get(m["_file"].removesuffix(".json")) or {}).get("solver") or {}
        gap = sv.get("gap")
        solver = (
            f"{sv.get('backend', '-')} {sv.get('status', '-')}, "
            f"{'-' if gap is None else f'{100 * gap:.1f}%'}, {sv.get('wall_s', 0) or 0:.1f} s"
        )
        md.append(
            f"| {tstem} | {label} "
            f"| {m['policy']} ({mix}) | {_gib(m['budget_bytes'])} | {_gib(s['predicted_peak_bytes'])} "
            f"| {_gib(s['measured_peak_bytes'])} | {_ratio(r['peak'])} | {_yes(m.get('fits_budget'))} "
            f"| {_ms(s['predicted_step_s'])} | {_ms(s['measured_step_s'])} | {_ratio(r['step'])} "
            f"| {_ms(k.get('measured_step_s'))} | {_pct(m.get('slowdown_pct'))} "
            f"| {_pct(m.get('predicted_slowdown_pct'))} "
            f"| {_ratio(m.get('oversubscription'))} | {_ratio(m.get('activation_oversubscription'))} | {solver} |"
        )
    # Keep-all against the simulator's keep-all prediction: alone (`measure --keep-all`) and beside each schedule.
    krows = [(m["_file"].removesuffix("-keepall.json"), "alone", m["keep_all"]) for m in keepalls]
    for m in scheduled:
        if m.get("keep_all"):
            tstem, pct = m["_file"].removesuffix(".json").rsplit("-", 1)
            krows.append((tstem, f"beside {pct}%", m["keep_all"]))
    if krows:
        md.append("\nIn-core keep-all (prediction: the simulator's keep-all on the trace):\n")
        md.append(
            "| trace | run | predicted peak | measured peak | ratio | predicted step ms | measured step ms | ratio |"
        )
        md.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, how, k in sorted(krows, key=lambda r: r[:2]):
            r = k["ratio_measured_over_predicted"]
            md.append(
                f"| {name} | {how} | {_gib(k['predicted_peak_bytes'])} | {_gib(k['measured_peak_bytes'])} "
                f"| {_ratio(r['peak'])} | {_ms(k['predicted_step_s'])} | {_ms(k['measured_step_s'])} "
                f"| {_ratio(r['step'])} |"
            )
    if acts:
        md.append("\n## Traces\n")
        md.append(
            "| trace | batch | saved activations | static | keep-all peak (traced) | keep-all peak (simulated) "
            "| activations >= target |"
        )
        md.append("| --- | --- | --- | --- | --- | --- | --- |")
        for name, a in acts.items():
            if a:
                md.append(
                    f"| {name.removesuffix('.acts')} | {a['batch_size']} | {_gib(a['saved_activation_bytes'])} "
                    f"| {_gib(a['static_bytes'])} | {_gib(a['keepall_peak_bytes'])} "
                    f"| {_gib(a.get('simulated_keepall_peak_bytes'))} "
                    f"| {_yes(a['meets_min']) if a['min_gib'] else '-'} ({a['min_gib']:g} GiB) |"
                )
    md.append("\n## Published numbers to compare with\n")
    md.append("| who | oversubscription | slowdown |")
    md.append("| --- | --- | --- |")
    md.extend(f"| {a} | {b} | {c} |" for a, b, c in PUBLISHED)
    peers = run / "peers" / "peers.md"
    md.append(
        "\n## Peer benchmark\n\n"
        + (
            f"`python3 -m bench.peers` on the same GPU: see `peers/peers.md` in the run folder ({peers.stat().st_size} "
            "bytes) and `peers/peers-*.json`."
            if peers.is_file()
            else "not run (or it failed: see the status table)."
        )
    )
    md.append("\n## Every step of the run\n")
    md.append("| stage | item | exit | seconds | note |")
    md.append("| --- | --- | --- | --- | --- |")
    md.extend(f"| {r['stage']} | {r['item']} | {r['rc']} | {r['seconds']} | {r['note']} |" for r in status)
    failed, skipped = failures(status)
    md.append(
        f"\n{len(failed)} step(s) failed or timed out; {len(skipped)} skipped for lack of time."
        if failed or skipped
        else "\nEvery step passed (an infeasible budget is an answer: its smallest feasible budget was measured)."
    )
    text = "\n".join(md) + "\n"
    (out_dir / f"{stem}.md").write_text(text)
    doc = {
        "env": {k: v for k, v in env.items() if k != "nvidia_smi_full"},
        "command": command,
        "tests": tests,
        "measurements": measures,
        "solves": solves,
        "traces": acts,
        "status": status,
        "published": [{"who": a, "oversubscription": b, "slowdown": c} for a, b, c in PUBLISHED],
    }
    (out_dir / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(out_dir / f"{stem}.md")
    return out_dir / f"{stem}.md"


# ---------------------------------------------------------------- import (developer machine)


def cmd_import(tarball: Path, repo: Path) -> None:
    """Unpack a run's tarball: traces -> traces/ (+ README rows), the report -> bench/results/, the rest
    (measurements, schedules, peers, logs, env) -> bench/results/<report name>/. Prints what to commit.
    Refuses a dry run's tarball: dry-run output is not GPU evidence."""
    with tarfile.open(tarball) as tf:
        names = tf.getnames()
        root = names[0].split("/")[0]
        dest = Path("/tmp") / f"gpu-import-{dt.datetime.now(dt.UTC):%H%M%S}"
        tf.extractall(dest, filter="data")
    run = dest / root
    env = _read_json(run / "env.json") or {}
    if env.get("dry_run"):
        raise SystemExit(f"{tarball}: a --cpu-dry-run tarball; its files are not GPU evidence and are not imported")
    added: list[Path] = []
    for p in sorted((run / "traces").glob("*.json")):
        if p.name.endswith(".acts.json"):
            continue
        target = repo / "traces" / p.name
        shutil.copy2(p, target)
        added.append(target)
    rows = run / "traces" / "README.rows.md"
    readme = repo / "traces" / "README.md"
    if rows.is_file():
        existing = readme.read_text()
        new = [r for r in rows.read_text().splitlines() if r.strip() and r not in existing]
        if new:
            readme.write_text(existing.rstrip("\n") + "\n" + "\n".join(new) + "\n")
            added.append(readme)
    results = sorted((run / "results").glob("gpu-*.md"))
    stem = results[-1].name.removesuffix(".md") if results else f"gpu-{env.get('gpu_tag', 'unknown')}"
    res_dir = repo / "bench" / "results" / stem  # the run's details; the report itself sits in bench/results/
    res_dir.mkdir(parents=True, exist_ok=True)
    for p in sorted((run / "results").glob("gpu-*")):
        shutil.copy2(p, repo / "bench" / "results" / p.name)
        added.append(repo / "bench" / "results" / p.name)
    for sub in ("measure", "schedules", "peers", "logs"):
        for p in sorted((run / sub).glob("*")):
            if p.is_file() and p.suffix in (".json", ".md", ".png", ".log", ".txt"):
                (res_dir / sub).mkdir(exist_ok=True)
                shutil.copy2(p, res_dir / sub / p.name)
        if (res_dir / sub).is_dir():
            added.append(res_dir / sub)
    for name in ("env.json", "status.tsv"):
        if (run / name).is_file():
            shutil.copy2(run / name, res_dir / name)
            added.append(res_dir / name)
    print(f"unpacked to {run}")
    print("git add " + " ".join(str(p.relative_to(repo)) for p in added))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_tools.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("env")
    e.add_argument("out", type=Path)
    e.add_argument("--dry-run", action="store_true")
    sub.add_parser("gpu-tag")
    f = sub.add_parser("failures", help="print the number of failed + time-skipped steps of a run")
    f.add_argument("run", type=Path)
    a = sub.add_parser("acts")
    a.add_argument("trace", type=Path)
    a.add_argument("--min-gib", type=float, default=0.0)
    a.add_argument("--max-fill", type=float, default=0.8)
    r = sub.add_parser("row")
    r.add_argument("trace", type=Path)
    r.add_argument("--file", required=True)
    r.add_argument("--command", required=True)
    rep = sub.add_parser("report")
    rep.add_argument("run", type=Path)
    rep.add_argument("--command", default="")
    i = sub.add_parser("import")
    i.add_argument("tarball", type=Path)
    i.add_argument("--repo", type=Path, default=REPO)
    ns = p.parse_args(argv)
    if ns.cmd == "env":
        cmd_env(ns.out, ns.dry_run)
    elif ns.cmd == "gpu-tag":
        print(gpu_tag())
    elif ns.cmd == "failures":
        failed, skipped = failures(_status(ns.run))
        print(len(failed) + len(skipped))
    elif ns.cmd == "acts":
        cmd_acts(ns.trace, ns.min_gib, ns.max_fill)
    elif ns.cmd == "row":
        cmd_row(ns.trace, ns.file, ns.command)
    elif ns.cmd == "report":
        cmd_report(ns.run, ns.command)
    else:
        cmd_import(ns.tarball, ns.repo)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
