"""The sweep's PNG: overhead against budget, the bound band beneath it, the knees and where overhead ends."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from memsched.io import write_bytes
from memsched.service.plot import memory_unit
from memsched.service.sweep import SweepResult
from memsched.units import format_bytes


def plot_sweep(result: SweepResult, out_path: str | Path) -> Path:
    """Write the curve as a PNG ('-' writes it to stdout); returns the path written."""
    unit, scale = memory_unit(result.hi_bytes)
    pct = 100.0 / result.keepall_step_s if result.keepall_step_s > 0 else 0.0
    xs = [p.budget_bytes / scale for p in result.points]
    ys = [p.overhead_s * pct for p in result.points]
    # Without a bound the band reaches 0: nothing better is ruled out.
    lows = [(p.bound_s if p.bound_s is not None else 0.0) * pct for p in result.points]
    fig, ax = plt.subplots(figsize=(10, 5.5))
    try:
        ax.fill_between(xs, lows, ys, color="#4C72B0", alpha=0.2, lw=0, label="between best schedule and lower bound")
        ax.plot(xs, ys, "-o", color="#2B4C7E", ms=4, lw=1.5, label="best schedule found")
        for k in result.knees:
            ax.plot(k.budget_bytes / scale, k.overhead_s * pct, "D", color="#C44E52", ms=8)
            ax.annotate(
                f"knee {format_bytes(k.budget_bytes)}",
                (k.budget_bytes / scale, k.overhead_s * pct),
                xytext=(8, 8),
                textcoords="offset points",
                fontsize=9,
                color="#C44E52",
            )
        if result.zero_overhead_bytes is not None:
            ax.axvline(
                result.zero_overhead_bytes / scale, color="#55A868", ls="--", lw=1, label="no overhead from here"
            )
        ax.axvline(result.static_bytes / scale, color="#8C8C8C", ls=":", lw=1, label="static bytes")
        ax.set_xlabel(f"device-memory budget ({unit})")
        ax.set_ylabel("step-time overhead vs keep-all (%)")
        ax.set_title(f"{result.model}: step time against memory ({len(result.points)} solved budgets)", fontsize=11)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    write_bytes(out_path, buf.getvalue())
    return Path(out_path)
