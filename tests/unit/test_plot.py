"""The timeline plot reads right: units from the magnitude, the static band named part by part, the time
between forward and backward labelled, and the PNG written like every other output."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from helpers import tiny_trace
from memsched.optimizer.baselines import best_baseline
from memsched.optimizer.simulate import simulate
from memsched.schema import StaticBytes, Trace
from memsched.service.plot import GAP_LABEL, memory_unit, plot_timeline, timeline_figure

MIB = 2**20


def _trace(other_s: float = 0.0) -> Trace:
    # A MiB-sized model: 6.5 MiB static, activations of a few MiB.
    tr = tiny_trace([0.01, 0.02], [0.02, 0.04], [2 * MIB, 3 * MIB], other_s=other_s)
    static = StaticBytes(params=460 * 1024, grads=460 * 1024, optimizer_state=920 * 1024, other=int(4.7 * MIB))
    return tr.model_copy(update={"static": static})


@pytest.mark.parametrize(
    ("nbytes", "unit"), [(512, "B"), (3 * 1024, "KiB"), (50 * MIB, "MiB"), (1023 * MIB, "MiB"), (2**30, "GiB")]
)
def test_memory_unit_from_magnitude(nbytes: int, unit: str) -> None:
    assert memory_unit(nbytes)[0] == unit


def _texts(fig: plt.Figure) -> list[str]:
    return [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]


def test_mib_model_is_labelled_in_mib_and_static_parts_are_named() -> None:
    tr = _trace()
    sc = best_baseline(tr, 20 * MIB)
    sim = simulate(tr, sc)
    fig = timeline_figure(tr, sim, sc.budget_bytes)
    try:
        ax_mem = fig.axes[0]
        title = ax_mem.get_title()
        assert "GiB" not in title and f"peak {sim.peak_bytes / MIB:.2f} MiB of 20.00 MiB budget" in title
        assert ax_mem.get_ylabel() == "device memory (MiB)"
        legend = [t.get_text() for t in ax_mem.get_legend().get_texts()]
        assert legend[:4] == [
            "static params (460.00 KiB)",
            "static grads (460.00 KiB)",
            "static optimizer state (920.00 KiB)",
            "static other: buffers, the batch, what the process holds (4.70 MiB)",
        ]
        assert "budget 20.00 MiB" in legend
    finally:
        plt.close(fig)


def test_gap_between_forward_and_backward_is_labelled() -> None:
    tr = _trace(other_s=0.05)
    sc = best_baseline(tr, 20 * MIB)
    sim = simulate(tr, sc)
    fig = timeline_figure(tr, sim, sc.budget_bytes)
    try:
        assert f"{GAP_LABEL}\n50.0 ms" in _texts(fig)
    finally:
        plt.close(fig)
    # No time outside the layers, no label.
    tr0 = _trace()
    fig = timeline_figure(tr0, simulate(tr0, best_baseline(tr0, 20 * MIB)), 20 * MIB)
    try:
        assert not any(GAP_LABEL in t for t in _texts(fig))
    finally:
        plt.close(fig)


def test_plot_file_gets_the_umask_mode(tmp_path: Path) -> None:
    import os
    import stat

    tr = _trace()
    old = os.umask(0o022)
    try:
        out = plot_timeline(tr, best_baseline(tr, 20 * MIB), tmp_path / "t.png")
    finally:
        os.umask(old)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
