"""Timeline plot: device memory over one training step against the budget, above a Gantt chart of the
compute, device->host and host->device streams. Headless (Agg)."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from memsched.hardware import for_planned_trace
from memsched.io import write_bytes
from memsched.optimizer.simulate import COMPUTE, D2H, H2D, SimResult, simulate
from memsched.schema import Schedule, Trace
from memsched.units import format_bytes

# The static parts, darkest at the bottom.
_STATIC_GREYS = ["#8C8C8C", "#A6A6A6", "#BFBFBF", "#D9D9D9"]
# What fills the time between the last forward stage and the first backward one.
GAP_LABEL = "outside the traced layers:\nhead, loss, optimizer step"
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
    """Draw the schedule's simulated step; returns the written path ('-' writes the PNG to stdout)."""
    sim = simulate(*for_planned_trace(trace, schedule))  # on the link it was planned for
    title = title or default_title(trace, sim, schedule.budget_bytes, schedule.policy)
    return plot_sim(trace, sim, out_path, schedule.budget_bytes, title)


def memory_unit(nbytes: float) -> tuple[str, float]:
    """The binary unit that suits a plot whose largest value is `nbytes`: a 50 MiB model reads '50 MiB',
    not '0.05 GiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return unit, float(scale)
    return "B", 1.0


def default_title(trace: Trace, sim: SimResult, budget_bytes: int | None, policy: str | None = None) -> str:
    unit, scale = memory_unit(max(sim.peak_bytes, budget_bytes or 0))
    budget = f" of {budget_bytes / scale:.2f} {unit} budget" if budget_bytes is not None else ""
    return (
        f"{trace.model} (batch {trace.batch_size})" + (f" — {policy}" if policy else "") + ": "
        f"peak {sim.peak_bytes / scale:.2f} {unit}{budget}, step {sim.step_s * 1e3:.1f} ms "
        f"(+{sim.overhead_pct:.1f}% vs keep-all)"
    )


def static_parts(trace: Trace) -> list[tuple[str, int]]:
    """The static band's parts, each named for what it holds, in the order they are stacked (zeros left out)."""
    s = trace.static
    parts = [
        ("params", s.params),
        ("grads", s.grads),
        ("optimizer state", s.optimizer_state),
        # The tracer puts buffers and what the process holds at the step's start here; an importer the batch.
        ("other: buffers, the batch, what the process holds", s.other),
        ("saved before the traced layers (embeddings, stem)", s.saved_before_layers),
        ("saved by layers, held by the model's code", s.saved_held_by_code),
    ]
    return [(name, b) for name, b in parts if b > 0]


def plot_sim(
    trace: Trace, sim: SimResult, out_path: str | Path, budget_bytes: int | None, title: str | None = None
) -> Path:
    """Draw a simulated step and write it as a PNG (memsched.io.write_bytes: atomic for files, straight through
    for devices and pipes, '-' for stdout); returns the path written."""
    fig = timeline_figure(trace, sim, budget_bytes, title)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=130, bbox_inches="tight")
    finally:
        plt.close(fig)
    write_bytes(out_path, buf.getvalue())
    return Path(out_path)


def timeline_figure(trace: Trace, sim: SimResult, budget_bytes: int | None, title: str | None = None) -> Figure:
    """The figure plot_sim writes; the caller closes it (plt.close)."""
    fig, (ax_mem, ax_gantt) = plt.subplots(
        2, 1, figsize=(14, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 2], "hspace": 0.08}
    )
    unit, scale = memory_unit(max(sim.peak_bytes, budget_bytes or 0))
    ms = 1e3
    # Memory: a step function over stages (the cost model's peak within each stage).
    xs: list[float] = []
    ys: list[float] = []
    static = sim.static_bytes / scale
    for t in range(len(sim.stage_bytes)):
        xs += [sim.stage_start[t] * ms, sim.stage_end[t] * ms]
        y = static + sim.stage_bytes[t] / scale
        ys += [y, y]
    # The static band, stacked by part, each labelled with what it holds and its size: the parts add up to
    # the band.
    bottom = 0.0
    for k, (name, nbytes) in enumerate(static_parts(trace)):
        top = bottom + nbytes / scale
        ax_mem.fill_between(
            xs,
            bottom,
            top,
            color=_STATIC_GREYS[k % len(_STATIC_GREYS)],
            alpha=0.7,
            lw=0,
            label=f"static {name} ({format_bytes(nbytes)})",
        )
        bottom = top
    ax_mem.fill_between(
        xs, static, ys, color="#4C72B0", alpha=0.35, step=None, label="activations + copies + workspace"
    )
    ax_mem.plot(xs, ys, color="#2B4C7E", lw=1.4)
    if budget_bytes is not None:
        ax_mem.axhline(
            budget_bytes / scale, color="#C44E52", ls="--", lw=1.5, label=f"budget {budget_bytes / scale:.2f} {unit}"
        )
    peak_t = sim.peak_stage
    ax_mem.annotate(
        f"peak {sim.peak_bytes / scale:.2f} {unit}",
        xy=((sim.stage_start[peak_t] + sim.stage_end[peak_t]) / 2 * ms, sim.peak_bytes / scale),
        xytext=(0, -14),
        textcoords="offset points",
        ha="center",
        fontsize=9,
        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8},
    )
    n = trace.n
    fwd_end = sim.stage_end[n - 1] * ms
    bwd_start = sim.stage_start[n] * ms
    # Label the phases just above the static band, where the curve never is.
    ax_mem.text(fwd_end, static, "← forward ", va="bottom", ha="right", fontsize=9, color="#333333")
    ax_mem.text(bwd_start, static, " backward →", va="bottom", fontsize=9, color="#333333")
    ax_mem.axvline(fwd_end, color="#777777", lw=0.8, ls=":")
    total = sim.step_s * ms if sim.step_s > 0 else 1.0
    gap = bwd_start - fwd_end
    if gap > 0:
        # The step's time outside the traced layers (simulate.other_step_s): the model's head, the loss and
        # the optimizer step, placed between forward and backward where the loss is.
        ax_mem.axvline(bwd_start, color="#777777", lw=0.8, ls=":")
        for ax in (ax_mem, ax_gantt):
            ax.axvspan(fwd_end, bwd_start, color="#DDDDDD", alpha=0.5, lw=0, zorder=0)
        ax_gantt.text(
            (fwd_end + bwd_start) / 2,
            _ROWS[COMPUTE],
            f"{GAP_LABEL}\n{gap:.1f} ms",
            ha="center",
            va="center",
            fontsize=7,
            color="#333333",
            rotation=0 if gap >= total / 8 else 90,
            clip_on=True,
        )
    ax_mem.set_ylabel(f"device memory ({unit})")
    ax_mem.set_ylim(bottom=0)
    ax_mem.legend(loc="lower right", fontsize=8, framealpha=0.9)
    ax_mem.grid(alpha=0.3)
    ax_mem.set_title(title or default_title(trace, sim, budget_bytes), fontsize=11)
    # Gantt.
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
    return fig
