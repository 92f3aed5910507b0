"""Timeline plot: device memory over one training step against the budget, above a Gantt chart of the
compute, device->host and host->device streams. Headless (Agg)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from memsched.optimizer.simulate import COMPUTE, D2H, H2D, SimResult, simulate
from memsched.schema import Schedule, Trace

_GIB = float(2**30)
_COLORS = {
    "forward": "#4C72B0",
    "backward": "#55A868",
    "recompute": "#DD8452",
    "stall": "#C44E52",
    "offload": "#8172B3",
    "prefetch": "#937860",
}
_ROWS = {COMPUTE: 2, D2H: 1, H2D: 0}
_ROW_LABELS = ["host → device\n(prefetch)", "device → host\n(offload)", "compute"]


def _short(name: str) -> str:
    """Fit a module path into a Gantt box: keep its most specific components (transformer.h.3 -> h.3)."""
    if len(name) <= 14:
        return name
    parts = name.split(".")
    tail = ".".join(parts[-2:]) if len(parts) > 1 else name
    return tail if len(tail) <= 14 else "…" + tail[-13:]


def plot_timeline(trace: Trace, schedule: Schedule, out_path: str | Path, title: str | None = None) -> Path:
    """Draw the schedule's simulated step; returns the written path."""
    sim = simulate(trace, schedule)
    return plot_sim(trace, sim, out_path, schedule.budget_bytes, title or _title(trace, schedule, sim))


def _title(trace: Trace, schedule: Schedule, sim: SimResult) -> str:
    return (
        f"{trace.model} (batch {trace.batch_size}) — {schedule.policy}: peak {sim.peak_bytes / _GIB:.2f} GiB "
        f"of {schedule.budget_bytes / _GIB:.2f} GiB budget, step {sim.step_s * 1e3:.1f} ms "
        f"(+{sim.overhead_pct:.1f}% vs keep-all)"
    )


def plot_sim(trace: Trace, sim: SimResult, out_path: str | Path, budget_bytes: int | None, title: str) -> Path:
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax_mem, ax_gantt) = plt.subplots(
        2, 1, figsize=(14, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 2], "hspace": 0.08}
    )
    ms = 1e3
    # Memory: a step function over stages (the cost model's peak within each stage).
    xs: list[float] = []
    ys: list[float] = []
    static = sim.static_bytes / _GIB
    for t in range(len(sim.stage_bytes)):
        xs += [sim.stage_start[t] * ms, sim.stage_end[t] * ms]
        y = static + sim.stage_bytes[t] / _GIB
        ys += [y, y]
    ax_mem.fill_between(
        xs, 0, [static] * len(xs), color="#BBBBBB", alpha=0.6, label="static (params, grads, optimizer)"
    )
    ax_mem.fill_between(
        xs, static, ys, color="#4C72B0", alpha=0.35, step=None, label="activations + copies + workspace"
    )
    ax_mem.plot(xs, ys, color="#2B4C7E", lw=1.4)
    if budget_bytes is not None:
        ax_mem.axhline(
            budget_bytes / _GIB, color="#C44E52", ls="--", lw=1.5, label=f"budget {budget_bytes / _GIB:.2f} GiB"
        )
    peak_t = sim.peak_stage
    ax_mem.annotate(
        f"peak {sim.peak_bytes / _GIB:.2f} GiB",
        xy=((sim.stage_start[peak_t] + sim.stage_end[peak_t]) / 2 * ms, sim.peak_bytes / _GIB),
        xytext=(0, -14),
        textcoords="offset points",
        ha="center",
        fontsize=9,
        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8},
    )
    n = trace.n
    fwd_end = sim.stage_end[n - 1] * ms
    ax_mem.axvline(fwd_end, color="#777777", lw=0.8, ls=":")
    # Label the phases just above the static band, where the curve never is.
    ax_mem.text(fwd_end, static, " backward →", va="bottom", fontsize=9, color="#333333")
    ax_mem.text(fwd_end, static, "← forward ", va="bottom", ha="right", fontsize=9, color="#333333")
    ax_mem.set_ylabel("device memory (GiB)")
    ax_mem.set_ylim(bottom=0)
    ax_mem.legend(loc="lower right", fontsize=8, framealpha=0.9)
    ax_mem.grid(alpha=0.3)
    ax_mem.set_title(title, fontsize=11)
    # Gantt.
    total = sim.step_s * ms if sim.step_s > 0 else 1.0
    label_room = total / 45  # only label boxes wide enough to read
    for e in sim.events:
        row = _ROWS[e.stream]
        width = (e.end - e.start) * ms
        if width <= 0:
            continue
        ax_gantt.broken_barh(
            [(e.start * ms, width)], (row - 0.4, 0.8), color=_COLORS[e.kind], edgecolor="white", lw=0.3
        )
        if width >= label_room and n <= 64:
            ax_gantt.text(
                e.start * ms + width / 2,
                row,
                _short(trace.layers[e.layer].name),
                ha="center",
                va="center",
                fontsize=6,
                color="white",
                rotation=90 if width < label_room * 3 else 0,
                clip_on=True,
            )
    ax_gantt.set_yticks(range(3), _ROW_LABELS, fontsize=9)
    ax_gantt.set_ylim(-0.6, 2.6)
    ax_gantt.set_xlabel("time within one training step (ms)")
    ax_gantt.grid(axis="x", alpha=0.3)
    ax_gantt.legend(
        handles=[Patch(color=c, label=k) for k, c in _COLORS.items()],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.22),
        ncol=6,
        fontsize=8,
        frameon=False,
    )
    ax_gantt.set_xlim(0, total)
    fig.savefig(out, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return out
