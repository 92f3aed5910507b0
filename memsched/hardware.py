"""What-if hardware without re-tracing: the host links a plan may be made for (measured pinned-copy rates, not
spec sheets; docs/hardware.md gives each figure's source), and the device a schedule was planned for.

A core module: the options (memsched/options.py) validate `--link` with `parse_link`; the service rewrites a
trace's copy speeds with `what_if_device` before solving and records the result in Schedule.planned_for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from memsched.schema import DeviceInfo, PlannedDevice, Schedule, Trace


class LinkPreset(StrEnum):
    """A host link whose pinned-copy rates were measured (docs/hardware.md)."""

    PCIE3 = "pcie3"
    PCIE4 = "pcie4"
    PCIE5 = "pcie5"
    GH200 = "gh200"


@dataclass(frozen=True)
class LinkFigures:
    """The measured pinned-copy rates of one link, one GPU using it alone."""

    h2d_bytes_per_s: float
    """Host -> device (prefetch), bytes per second."""
    d2h_bytes_per_s: float
    """Device -> host (offload), bytes per second."""
    source: str
    """Where the figure was measured (docs/hardware.md has the details)."""


LINKS: dict[LinkPreset, LinkFigures] = {
    LinkPreset.PCIE3: LinkFigures(12e9, 12e9, "V100 on PCIe 3.0 x16, measured (BaM authors, ZaidQureshi/bam#54)"),
    LinkPreset.PCIE4: LinkFigures(25e9, 25e9, "A100 on PCIe 4.0 x16, measured peak (BaM paper, ZaidQureshi/bam#54)"),
    LinkPreset.PCIE5: LinkFigures(
        60.2e9, 61.1e9, "H100 SXM on a PCIe 5.0 host, memsched's own runtime copies (traces/resnet50-bf16-b256-h100)"
    ),
    LinkPreset.GH200: LinkFigures(
        375e9, 297e9, "GH200 NVLink-C2C cudaMemcpy, measured (KTH study of Grace Hopper, 2024)"
    ),
}
"""Each preset's figures (docs/hardware.md: sources, and the spread of the measurements behind them)."""

MAX_LINK_BYTES_PER_S = 1e15
"""The largest copy rate accepted (a petabyte a second: far beyond any link; a bigger number is a unit slip)."""
MIN_LINK_BYTES_PER_S = 1e6
"""The smallest copy rate accepted (a megabyte a second: below any host link; a smaller number is a unit slip, such
as GB/s given for bytes/s)."""

_LINK_HELP = "pcie3, pcie4, pcie5, gh200, or a copy rate in bytes/s such as 25e9"


def parse_link(value: object) -> LinkPreset | float:
    """A link as a user gave it: a preset's name or a positive rate in bytes/s (a number or its text).
    Raises ValueError naming what is accepted."""
    if isinstance(value, LinkPreset):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in LinkPreset._value2member_map_:
            return LinkPreset(text)
        try:
            value = float(text.removesuffix("b/s"))
        except ValueError:
            raise ValueError(f"unknown link; give {_LINK_HELP}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"a link is {_LINK_HELP}")
    rate = float(value)
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"a link's copy rate must be > 0 bytes/s; give {_LINK_HELP}")
    if rate > MAX_LINK_BYTES_PER_S:
        raise ValueError("that copy rate is beyond any link; give bytes per second, e.g. 25e9")
    if rate < MIN_LINK_BYTES_PER_S:
        raise ValueError(f"a copy rate of {rate:g} bytes/s is below any link; give bytes per second, e.g. 25e9")
    return rate


def what_if_device(trace: Trace, link: LinkPreset | float | None, ranks_per_link: int | None) -> PlannedDevice:
    """The device a plan is made for: the trace's, with its copy rates replaced by the link's (a preset, or one
    rate for both directions) and each divided among the `ranks_per_link` GPUs that share it."""
    dev = trace.device
    if link is None:
        h2d, d2h, name = dev.h2d_bytes_per_s, dev.d2h_bytes_per_s, "measured"
    elif isinstance(link, LinkPreset):
        fig = LINKS[link]
        h2d, d2h, name = fig.h2d_bytes_per_s, fig.d2h_bytes_per_s, link.value
    else:
        h2d, d2h, name = link, link, f"{link:.6g} B/s"
    share = ranks_per_link or 1
    return PlannedDevice(
        name=dev.name,
        link=name,
        ranks_per_link=share,
        h2d_bytes_per_s=h2d / share,
        d2h_bytes_per_s=d2h / share,
    )


def planned_trace(trace: Trace, planned: PlannedDevice | None) -> Trace:
    """The trace as the plan saw it: its copy rates those of `planned` (the trace itself when they agree)."""
    if planned is None:
        return trace
    dev = trace.device
    if (planned.h2d_bytes_per_s, planned.d2h_bytes_per_s) == (dev.h2d_bytes_per_s, dev.d2h_bytes_per_s):
        return trace
    device = DeviceInfo.model_validate(
        {**dev.model_dump(), "h2d_bytes_per_s": planned.h2d_bytes_per_s, "d2h_bytes_per_s": planned.d2h_bytes_per_s}
    )
    return trace.model_copy(update={"device": device})


def for_planned_trace(trace: Trace, schedule: Schedule) -> tuple[Trace, Schedule]:
    """The trace and schedule to simulate a schedule with: under the copy rates it was planned for (a what-if
    schedule names its trace's hash, not that of the rewritten trace, so the pair is re-keyed to match)."""
    tr = planned_trace(trace, schedule.planned_for)
    if tr is trace or schedule.trace_hash != trace.content_hash():  # a mismatch is the simulator's to report
        return trace, schedule
    return tr, schedule.model_copy(update={"trace_hash": tr.content_hash()})
