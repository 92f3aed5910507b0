"""Run every approach on one model, in this process, and write bench/results/peers-<model>.json.

Per run: warm-up steps (compilation happens here), the grads zeroed in place, one profiled step (its peak and
its gradients, compared with keep-all's), then N timed steps (median). Keep-all runs first: its peak defines
the budgets and its gradients are the reference.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench.peers.approaches import APPROACHES, BUDGETED, NotAvailable
from bench.peers.measure import compare_grads, grads_of, median, peak_activation_bytes, step_times, zero_grads
from bench.peers.models import ModelSpec, build

log = logging.getLogger(__name__)

BUDGETS = (0.75, 0.50, 0.25)
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Settings:
    model: str
    batch_size: int
    size: int
    steps: int = 3
    warmup: int = 1
    budgets: tuple[float, ...] = BUDGETS
    approaches: tuple[str, ...] = tuple(APPROACHES)
    device: str = "cpu"
    threads: int | None = None
    solve_time_limit_s: float = 60.0
    compile_reference: bool = False
    """Also run torch.compile at budget 1.0, so its backend's own cost is separated from recomputation."""
    command: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(device: torch.device) -> dict[str, Any]:
    import transformers

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "bench", "runtime", "optimizer", "memsched"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit, dirty = "unknown", ""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "memsched_commit": commit + (" (+uncommitted changes)" if dirty else ""),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def _measure(
    spec: ModelSpec, step: Any, device: torch.device, s: Settings, ref: dict[str, torch.Tensor] | None
) -> dict[str, Any]:
    for _ in range(s.warmup):
        step()
    zero_grads(spec.model)
    peak = peak_activation_bytes(step, device)
    grads = grads_of(spec.model)
    # One untimed step after the profiled one: the first step after the profiler runs up to 1.6x slower on the
    # CPU (GPT-2, b1 x 512: 4.6 s against 2.9 s), which made a 2-step median a coin toss between approaches.
    step()
    times, cpu = step_times(step, device, s.steps)
    out: dict[str, Any] = {
        "peak_bytes": peak.peak_bytes,
        "forward_end_bytes": peak.forward_end_bytes,
        "step_s": median(times),
        "cpu_s": median(cpu),
        "times_s": times,
        "cpu_times_s": cpu,
    }
    if ref is None:
        out["_grads"] = grads
    else:
        out["grad"] = compare_grads(grads, ref).to_json()
    return out


def run_one(
    spec: ModelSpec,
    name: str,
    fraction: float | None,
    device: torch.device,
    s: Settings,
    ref: dict[str, torch.Tensor] | None,
) -> dict[str, Any]:
    row: dict[str, Any] = {"approach": name, "budget": fraction, "status": "ok", "notes": []}
    t0 = time.perf_counter()
    try:
        with APPROACHES[name](spec, 1.0 if fraction is None else fraction) as prepared:
            row.update(_measure(spec, prepared.step, device, s, ref))
            row["notes"] = prepared.notes
            row["extra"] = prepared.extra
            if prepared.measure_fn is not None:
                row["extra"].update(prepared.measure_fn())
    except NotAvailable as e:
        row.update(status="not available", reason=str(e))
    except Exception as e:  # a peer that crashes is a result, recorded with its reason
        log.warning("%s at %s failed: %s", name, fraction, _first_line(e))
        log.debug("traceback", exc_info=True)
        row.update(status="failed", reason=_first_line(e))
    finally:
        zero_grads(spec.model)
        gc.collect()
    row["wall_s"] = time.perf_counter() - t0
    log.info("%s %s: %s", name, fraction, {k: v for k, v in row.items() if k not in ("times_s", "extra", "_grads")})
    return row


def run_model(s: Settings, out_dir: Path) -> Path:
    device = torch.device(s.device)
    if s.threads:
        torch.set_num_threads(s.threads)
    spec = build(s.model, s.batch_size, s.size, device)
    spec.cache["solve_time_limit_s"] = s.solve_time_limit_s
    rows: list[dict[str, Any]] = []
    keep = run_one(spec, "keep-all", None, device, s, None)
    if keep["status"] != "ok":
        raise RuntimeError(f"keep-all failed on {s.model}: {keep.get('reason')}")
    ref = keep.pop("_grads")
    keep["grad"] = {"ok": True, "bitwise": True, "max_rel_err": 0.0, "worst_param": "", "missing": 0}
    rows.append(keep)
    for name in s.approaches:
        if name == "keep-all":
            continue
        fractions: tuple[float | None, ...] = s.budgets if name in BUDGETED else (None,)
        if name == "torch.compile-budget" and s.compile_reference:
            fractions = (1.0, *s.budgets)
        for fraction in fractions:
            rows.append(run_one(spec, name, fraction, device, s, ref))
    # The machine may be shared: time keep-all again at the end and pool both samples, so a load change
    # during the run shows up as spread in keep-all's own times instead of silently skewing every ratio.
    with APPROACHES["keep-all"](spec, 1.0) as plain:
        keep["times_end_s"], keep["cpu_times_end_s"] = step_times(plain.step, device, s.steps)
    keep["step_s"] = median(keep["times_s"] + keep["times_end_s"])
    keep["cpu_s"] = median(keep["cpu_times_s"] + keep["cpu_times_end_s"])
    zero_grads(spec.model)
    result = {
        "model": s.model,
        "shape": spec.shape,
        "n_blocks": len(spec.block_paths),
        "block_paths": [spec.block_paths[0], spec.block_paths[-1]],
        "params": sum(p.numel() for p in spec.model.parameters()),
        "settings": {
            "steps": s.steps,
            "warmup": s.warmup,
            "budgets": list(s.budgets),
            "device": s.device,
            "solve_time_limit_s": s.solve_time_limit_s,
        },
        "command": s.command,
        "machine": machine_info(device),
        "keepall_peak_bytes": keep["peak_bytes"],
        "keepall_step_s": keep["step_s"],
        "keepall_cpu_s": keep["cpu_s"],
        "rows": rows,
    }
    _derive(result)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"peers-{s.model}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    _save_memsched_artifacts(spec, out_dir)
    return path


def _derive(result: dict[str, Any]) -> None:
    """Ratios to keep-all and fits-the-budget, per budget for the approaches that take none."""
    kp, kt = result["keepall_peak_bytes"], result["keepall_step_s"]
    budgets = result["settings"]["budgets"]
    for r in result["rows"]:
        if r["status"] != "ok":
            continue
        peak = r["peak_bytes"] + r.get("extra", {}).get("pool_resident_bytes", 0) * (
            result["settings"]["device"] == "cpu"
        )
        r["effective_peak_bytes"] = peak
        r["peak_ratio"] = peak / kp if kp else None
        r["time_ratio"] = r["step_s"] / kt if kt else None
        kc = result.get("keepall_cpu_s")
        r["cpu_ratio"] = r["cpu_s"] / kc if kc and r.get("cpu_s") is not None else None
        fr = [r["budget"]] if r["budget"] is not None else budgets
        r["fits"] = {str(b): bool(peak <= b * kp) for b in fr}


def _save_memsched_artifacts(spec: ModelSpec, out_dir: Path) -> None:
    tr = spec.cache.get("memsched_trace")
    if tr is None:
        return
    (out_dir / f"peers-{spec.name}.trace.json").write_text(tr.model_dump_json(indent=1) + "\n")
    for key, tag in (("memsched_schedules", "memsched"), ("memsched_schedules_recompute_only", "memsched-recompute")):
        for frac, sc in spec.cache.get(key, {}).items():
            (out_dir / f"peers-{spec.name}-{tag}-{round(frac * 100)}.schedule.json").write_text(
                sc.model_dump_json(indent=1) + "\n"
            )
