"""The one measurement of keep-all against a schedule (`measure_side_by_side`): what it runs, in which order,
and what it reports; and the pieces around it (the steady CPU heap, Kineto's stderr markers). No timings are
asserted: only which steps ran and how the figures are derived from them."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from memsched.errors import MemschedError
from memsched.runtime import ScheduledModel, keep_all_schedule, measure
from memsched.runtime.measure import KEEP_ALL, SCHEDULED, measure_side_by_side
from memsched.schema import Action, LayerAction, OffloadPlan


class Block(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x)
        return x.square().sum()


def _offload_schedule():
    sched = keep_all_schedule(["blocks.0", "blocks.1", "blocks.2"])
    sched.policy = "test-offload"
    sched.actions[1] = LayerAction(
        layer="blocks.1",
        action=Action.OFFLOAD,
        offload=OffloadPlan(tensors=[0, 1], bytes=0, done_by_layer=1, prefetch_at_layer=1),
    )
    return sched


def test_side_by_side_interleaves_steps_and_reports_both_series():
    torch.manual_seed(0)
    net, x = Net(), torch.randn(64, 16)
    sched = _offload_schedule()
    ran: list[str] = []

    def step(model: ScheduledModel) -> None:
        ran.append(KEEP_ALL if model.schedule.policy == "keep-all" else SCHEDULED)
        model(x).backward()

    got = measure_side_by_side(net, step, sched, steps=5, warmup=2)
    k, s = got.keep_all, got.scheduled
    assert k is not None and s is not None
    alternating = [KEEP_ALL, SCHEDULED]
    # Warm-up and timed steps alternate keep-all / scheduled; then each side's memory step (primed: two runs).
    assert ran == alternating * (2 + 5) + [KEEP_ALL] * 2 + [SCHEDULED] * 2
    assert got.order == alternating * 5
    assert len(k.step_times_s) == len(s.step_times_s) == 5
    assert k.step_s == statistics.median(k.step_times_s) and s.step_s == statistics.median(s.step_times_s)
    assert got.ratio == s.step_s / k.step_s
    pairs = [b / a for a, b in zip(k.step_times_s, s.step_times_s, strict=True)]
    assert got.paired_ratio == statistics.median(pairs)
    assert k.threads == s.threads == torch.get_num_threads()
    # The schedule's host copies are its own: keep-all's memory step neither counts them as device bytes
    # nor reports them, so its peak is the one keep-all measures alone.
    assert s.host_bytes > 0 and k.host_bytes == 0
    assert s.pool is not None and s.pool.allocated_buffers == 2  # one pool for all its steps: reused
    alone = measure(net, lambda m: m(x).backward(), None, steps=1, warmup=1)
    assert k.peak_bytes == alone.peak_bytes
    assert s.peak_bytes < k.peak_bytes  # blocks.1's two saved tensors leave the device


def test_side_by_side_one_side_and_bad_arguments():
    net, x = Net(), torch.randn(8, 16)
    only = measure_side_by_side(net, lambda m: m(x).backward(), _offload_schedule(), baseline=False, steps=2, warmup=0)
    assert only.keep_all is None and only.scheduled is not None and only.order == [SCHEDULED] * 2
    assert only.ratio is None and only.paired_ratio is None
    with pytest.raises(MemschedError, match="nothing to measure"):
        measure_side_by_side(net, lambda m: m(x).backward(), None, baseline=False)
    with pytest.raises(MemschedError, match="steps must be >= 1"):
        measure_side_by_side(net, lambda m: m(x).backward(), None, steps=0)


class _CachedNet(Net):
    """Net with a transformers-style KV cache switch (config.use_cache, a `use_cache` argument), on by default."""

    class config:  # the attribute transformers models carry
        use_cache = True

    def forward(self, x: torch.Tensor, use_cache: bool | None = None) -> torch.Tensor:
        return super().forward(x)


def test_one_measurement_says_each_replay_warning_once(caplog):
    """The measurement applies its schedules around every step (11 applications here); the replay's warning that
    it turns the KV cache off is said once, not once per application, and only while measuring."""
    net, x = _CachedNet(), torch.randn(8, 16)
    with caplog.at_level("WARNING", logger="memsched"):
        measure_side_by_side(net, lambda m: m(x).backward(), _offload_schedule(), steps=3, warmup=1)
    said = [r for r in caplog.records if "use_cache=True" in r.getMessage()]
    assert len(said) == 1
    caplog.clear()
    with caplog.at_level("WARNING", logger="memsched"), ScheduledModel(net, _offload_schedule()) as sm:
        sm(x).backward()
    assert sum("use_cache=True" in r.getMessage() for r in caplog.records) == 1  # a later application says it


def test_keep_all_memory_can_be_skipped():
    net, x = Net(), torch.randn(8, 16)
    got = measure_side_by_side(
        net, lambda m: m(x).backward(), _offload_schedule(), steps=1, warmup=0, keep_all_memory=False
    )
    assert got.keep_all is not None and got.keep_all.peak_bytes == 0 and len(got.keep_all.step_times_s) == 1
    assert got.scheduled is not None and got.scheduled.peak_bytes > 0


def test_kineto_markers_are_dropped_and_other_stderr_lines_kept(capfd):
    from memsched.runtime.memory import kineto_markers_dropped, measure_step_memory

    with kineto_markers_dropped():
        os.write(2, b"USDT:2026-11-23 23:44:53 6083:6083 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"ERROR: something real\n")
        os.write(2, b"USDT:2026-11-23 23:44:53 6083:6083 SyncActivityProfilerHandler.cpp:59] profiler_stop\n")
    assert capfd.readouterr().err == "ERROR: something real\n"
    # The real profiler, as the CPU memory measurement runs it: nothing of Kineto's reaches stderr.
    measure_step_memory(lambda: torch.ones(1000).sum(), torch.device("cpu"))
    assert "profiler_start" not in capfd.readouterr().err


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_steady_host_allocator_is_applied_once_on_glibc():
    from memsched.runtime.hostalloc import steady_host_allocator

    assert steady_host_allocator() is True
    assert steady_host_allocator() is True  # idempotent: the process-wide setting is made once


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_large_blocks_fault_nothing_after_warm_up() -> None:
    """A 256 MiB tensor (65,536 pages, far above glibc's 32 MiB mmap ceiling) allocated and freed 8 times
    after 4 warm-up uses: with the steady allocator its pages stay in the process, so the repeats fault almost
    nothing (by default each one maps fresh pages: 8 x 65,536 faults). Measured: the first 2-4 uses fault, then
    none; the bound allows one more whole block. In a fresh interpreter: the setting is process-wide."""
    code = textwrap.dedent("""
        import resource, torch
        from memsched.runtime.hostalloc import steady_host_allocator
        assert steady_host_allocator()
        def faults():
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(4):
            x = torch.ones(64 << 20); del x
        f0 = faults()
        for _ in range(8):
            x = torch.ones(64 << 20); del x
        print(faults() - f0)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert int(out.stdout.strip()) < 2 * 65_536


def test_measure_prices_the_schedule_it_is_given_against_the_trace_it_is_given(caplog):
    """Issue 25 item 4: the prediction compared with is the simulation of the schedule's actions against
    the trace, not the one stored in the file; a stored prediction that differs is said."""
    from helpers import tiny_trace
    from memsched.optimizer.decisions import KEEP, recompute
    from memsched.optimizer.simulate import make_schedule, simulate
    from memsched.schema import SolverRecord, SolverStatus
    from memsched.service.measure import predictions

    tr = tiny_trace([1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [10, 20, 30], static=5)
    rec = SolverRecord(backend="test", status=SolverStatus.HEURISTIC)
    sched = make_schedule(tr, [KEEP, recompute(), KEEP], 100, "test", rec)
    p = predictions(tr, sched)
    assert (p.sched_peak, p.sched_step, p.note) == (sched.prediction.peak_bytes, sched.prediction.step_s, None)
    # Edited by hand: layer 0 recomputed too, the stored prediction left as it was.
    edited = sched.model_copy(deep=True)
    edited.actions[0] = LayerAction(layer=tr.layers[0].name, action=Action.RECOMPUTE, recompute_group=0)
    sim = simulate(tr, edited)
    assert sim.step_s != sched.prediction.step_s
    with caplog.at_level("WARNING"):
        p = predictions(tr, edited)
    assert (p.sched_peak, p.sched_step) == (sim.peak_bytes, sim.step_s)
    assert p.overhead_pct == sim.overhead_pct
    assert p.note is not None and "differs from its actions simulated against this trace" in p.note
    assert p.note in caplog.text


def test_worst_stage_names_the_stage_layer_and_bytes_that_depart_most_from_the_plan():
    """Fabricated numbers: 2 layers, static 100. The predicted stage peaks are static + the simulator's stage
    bytes; 'pre' folds into F0 and the optimizer step into B0 (as the tracer attributes them)."""
    from memsched.service.measure import (
        measured_stage_peaks,
        predicted_stage_peaks,
        stage_name,
        worst_stage,
    )

    assert [stage_name(2, t) for t in range(4)] == [("F0", 0), ("F1", 1), ("B1", 1), ("B0", 0)]
    predicted = predicted_stage_peaks(100, [10, 50, 40, 20])
    assert predicted == {"F0": 110, "F1": 150, "B1": 140, "B0": 120}
    measured = measured_stage_peaks({"pre": 118, "F0": 105, "F1": 150, "B1": 149, "B0": 90, "optimizer": 121})
    assert measured == {"F0": 118, "F1": 150, "B1": 149, "B0": 121}
    w = worst_stage(predicted, measured, ["blocks.0", "blocks.1"])
    assert w is not None
    assert (w.stage, w.layer, w.predicted_bytes, w.measured_bytes, w.difference_bytes) == (
        "B1",
        "blocks.1",
        140,
        149,
        9,
    )
    assert w.departure == pytest.approx(9 / 150) and w.notable  # 6% of the predicted peak
    assert w.to_json()["difference_bytes"] == 9 and w.to_json()["layer"] == "blocks.1"

    # No stage above the plan: the largest shortfall, not notable under 5% of the peak; the earlier of equals.
    w = worst_stage(predicted, {"F0": 110, "F1": 147, "B1": 137, "B0": 120}, ["a", "b"])
    assert w is not None and (w.stage, w.layer, w.difference_bytes, w.notable) == ("F1", "b", -3, False)
    # A small excess beats a larger shortfall: what breaks a budget is what the user must hear about.
    w = worst_stage(predicted, {"F0": 111, "F1": 100, "B1": 140, "B0": 120}, ["a", "b"])
    assert w is not None and (w.stage, w.layer, w.difference_bytes) == ("F0", "a", 1)
    # Nothing to compare (no trace, or no measured stage): no answer rather than a made-up one.
    assert worst_stage({}, measured, ["a", "b"]) is None
    assert worst_stage(predicted, {}, ["a", "b"]) is None
