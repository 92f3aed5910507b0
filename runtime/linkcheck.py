"""Does the replay's link copy as fast as the plan assumed? A schedule records the copy rates it was planned for
(Schedule.planned_for: the trace's measured rates, or a what-if `--link`); on a GPU whose copies measure
differently the plan's timing is off (offloads finish late and stall, or prefetches could have started later),
so the runtime says so once, with both figures, and how to re-plan."""

from __future__ import annotations

import logging

import torch

from memsched.runtime.device import CopySpeed, measure_copy_speed
from memsched.schema import Action, PlannedDevice, Schedule

log = logging.getLogger(__name__)

TOLERANCE = 0.25
"""A measured rate more than this fraction away from the planned one is worth saying (copy rates of one link
vary by ~10% from run to run: the H100 traces here measured 56.9-62.1 GB/s)."""


def link_mismatch(planned: PlannedDevice, measured: CopySpeed, tolerance: float = TOLERANCE) -> str | None:
    """A sentence naming both figures where a direction's measured rate is off the planned one by more than
    `tolerance` (relative); None where both agree."""
    off = []
    for what, plan, got in (
        ("host->device", planned.h2d_bytes_per_s, measured.h2d_bytes_per_s),
        ("device->host", planned.d2h_bytes_per_s, measured.d2h_bytes_per_s),
    ):
        if abs(got - plan) > tolerance * plan:
            off.append(f"{what} {got / 1e9:.1f} GB/s measured here, {plan / 1e9:.1f} GB/s planned")
    if not off:
        return None
    share = f", {planned.ranks_per_link} ranks per link" if planned.ranks_per_link > 1 else ""
    return (
        f"this schedule was planned for link {planned.link!r}{share}, but its copies run at a different speed "
        f"({'; '.join(off)}): its predicted step time and stalls do not hold here; re-plan with "
        f"--link {measured.h2d_bytes_per_s:.3g} (or re-trace on this machine)"
    )


def check_link(schedule: Schedule, device: torch.device) -> str | None:
    """Measure this device's pinned copies once and warn (logging) if they differ from what `schedule` was
    planned for. Only on CUDA and only for a plan that offloads: elsewhere no copy speed shapes the step."""
    planned = schedule.planned_for
    if planned is None or device.type != "cuda" or not any(a.action == Action.OFFLOAD for a in schedule.actions):
        return None
    msg = link_mismatch(planned, measure_copy_speed(device, repeats=3))
    if msg:
        log.warning("%s", msg)
    return msg
