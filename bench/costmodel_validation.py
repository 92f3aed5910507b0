"""The cost model on plans the solver did not choose (issue 25 item 2): predicted against measured per plan.

The solver's own plans are the ones the simulator was tuned on; this bench replays plans nobody optimised.
Per model (the four built-in workloads at bench/fidelity.py's shapes, and the conformance zoo of
bench/zoo.py): trace one step (one torch thread), then build, simulate and replay

- baselines: keep-all, checkpoint-every-block, sqrt(n) segments;
- random recompute: `--random` seeded random keep/recompute plans (`random_recompute_plan`);
- offload (emulated on the CPU): `--offload` seeded random keep/offload/recompute plans (`random_mixed_plan`),
  the copies' timing filled in by the simulator (`default_timing`: synchronous on the CPU, where a copy is a
  memcpy on the compute thread, so "offload" here prices a host copy, not a PCIe transfer).

Each plan is replayed by memsched.runtime.measure.measure_side_by_side (keep-all's steps interleaved with the
plan's in one process): the whole-step peak (every live CPU tensor byte) and the step-time overhead against
the keep-all steps beside it. Targets (issue 25): whole-step peak within 5%, overhead within 5 points, on
every plan; the bytes above static (what plans move) are reported too, since a whole-step ratio hides errors
behind large parameters.

    .venv/bin/python -m bench.costmodel_validation                       # every model (~1 h on 2 cores)
    .venv/bin/python -m bench.costmodel_validation --small --models gpt2 bn-cnn --random 2 --offload 1

Writes bench/results/costmodel_validation.{md,json,png}.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import logging
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memsched.errors import MemschedError
from memsched.optimizer.baselines import checkpoint_all, keep_all, sqrt_segments
from memsched.optimizer.decisions import KEEP, Decision, offload_all, offload_subset, recompute
from memsched.schema import Action

if TYPE_CHECKING:
    from memsched.runtime import Workload
    from memsched.schema import Trace

log = logging.getLogger("bench.costmodel_validation")

BUILTIN = ("gpt2", "bert-base", "vit-base", "resnet50")
ZOO = ("llama", "gpt2", "bert", "vit", "bn-cnn", "unet", "shared", "tied")
MODELS = (*BUILTIN, *(f"zoo-{z}" for z in ZOO))
SMALL_ZOO_SHAPE = {"batch_size": 2, "seq_len": 64}
"""--small on a zoo model: the factory's widths are fixed (bench/zoo.py), so the batch (and the sequence, where the
factory takes one) shrink."""
BASELINE, RANDOM, OFFLOAD = "baseline", "random recompute", "offload (emulated on the CPU)"
GROUPS = (BASELINE, RANDOM, OFFLOAD)
PEAK_TARGET = 0.05
OVERHEAD_TARGET_POINTS = 5.0
MAX_DRAWS = 1000
"""Draws per random plan before giving up (a model too short to hold that many distinct plans)."""
OUT = Path(__file__).resolve().parent / "results"


# -- random plans: the one home of the generators (tests/integration/test_costmodel_plans.py uses them too) ----


def random_recompute_plan(n: int, rng: random.Random) -> list[Decision]:
    """Each layer kept or recomputed; recomputed runs split into segments at random."""
    out: list[Decision] = []
    start = -1
    for i in range(n):
        if rng.random() < 0.5:
            out.append(KEEP)
            start = -1
            continue
        if start < 0 or rng.random() < 0.5:
            start = i
        out.append(recompute(group=start))
    return out


def random_mixed_plan(trace: Trace, rng: random.Random) -> list[Decision]:
    """Each layer kept, offloaded or recomputed (a third each); an offload moves every saved tensor of the layer
    or, half the time, a random proper subset; recomputed runs split into segments at random. Offload timing
    is left unset (-1): the simulator's `default_timing` fills it in."""
    out: list[Decision] = []
    start = -1
    for i, layer in enumerate(trace.layers):
        r = rng.random()
        if r < 1 / 3:
            out.append(KEEP)
            start = -1
        elif r < 2 / 3 and layer.tensors:
            k = len(layer.tensors)
            if k == 1 or rng.random() < 0.5:
                out.append(offload_all(trace, i))
            else:
                subset = tuple(sorted(rng.sample(range(k), rng.randint(1, k - 1))))
                out.append(offload_subset(trace, i, subset))
            start = -1
        else:
            if start < 0 or rng.random() < 0.5:
                start = i
            out.append(recompute(group=start))
    return out


def plans_for(trace: Trace, n_random: int, n_offload: int, seed: int) -> list[tuple[str, str, list[Decision]]]:
    """(name, group, decisions) for every plan of one model, reproducible from `seed` and the model's id. A draw
    that the simulator refuses, that repeats an earlier plan or that lacks its group's action is drawn again."""
    from memsched.optimizer.simulate import simulate

    plans = [
        ("keep-all", BASELINE, keep_all(trace)),
        ("checkpoint-all", BASELINE, checkpoint_all(trace)),
        ("sqrt-segments", BASELINE, sqrt_segments(trace)),
    ]
    seen = {tuple(p) for _, _, p in plans}
    rng = random.Random(f"{seed}:{trace.model}")
    for group, count, draw, needs in (
        (RANDOM, n_random, lambda: random_recompute_plan(trace.n, rng), Action.RECOMPUTE),
        (OFFLOAD, n_offload, lambda: random_mixed_plan(trace, rng), Action.OFFLOAD),
    ):
        for k in range(count):
            for _ in range(MAX_DRAWS):
                plan = draw()
                if tuple(plan) in seen or all(d.action != needs for d in plan):
                    continue
                try:
                    simulate(trace, plan, with_events=False)
                except MemschedError as e:
                    log.info("%s: invalid draw (%s), drawing again", trace.model, e)
                    continue
                break
            else:
                log.warning("%s: no new valid %s plan in %d draws; %d of %d", trace.model, group, MAX_DRAWS, k, count)
                break
            seen.add(tuple(plan))
            tag = "random" if group == RANDOM else "offload"
            plans.append((f"{tag}-{k + 1}", group, plan))
    return plans


# -- one row per plan ----------------------------------------------------------------------------------------


@dataclass
class Row:
    """One plan of one model: predicted against measured."""

    model: str
    """The trace's model id."""
    plan: str
    """'keep-all', 'random-3', 'offload-2', ..."""
    group: str
    """BASELINE, RANDOM or OFFLOAD."""
    actions: dict[str, int]
    """Layers per action."""
    static_bytes: int
    """The trace's static bytes (params, grads, optimizer state)."""
    predicted_peak_bytes: int
    """simulate(trace, schedule).peak_bytes."""
    predicted_overhead_pct: float
    """The simulator's overhead over its keep-all step, in percent."""
    predicted_host_bytes: int
    """Bytes the plan's offloads copy to the host (0 without offloads)."""
    measured_peak_bytes: int | None = None
    """The replayed step's whole-step peak (every live CPU tensor byte); None when the replay failed."""
    measured_host_bytes: int | None = None
    """The host buffer pool's bytes after the replay."""
    measured_overhead_pct: float | None = None
    """100 x (median plan step / median keep-all step - 1), steps interleaved."""
    paired_overhead_pct: float | None = None
    """100 x (median over rounds of plan step / the keep-all step beside it - 1)."""
    worst_stage: dict[str, Any] | None = None
    """Where the measured per-stage peak departs most from the simulator's, by `memsched measure`'s rule: the
    largest excess, else the largest shortfall (StageDeparture.to_json())."""
    predicted_stage_peak_bytes: dict[str, int] = field(default_factory=dict)
    """The simulator's whole-step bytes per stage ('F3', 'B3': static + the stage's bytes)."""
    measured_stage_peak_bytes: dict[str, int] = field(default_factory=dict)
    """The measured whole-step peak per stage, on the simulator's stages (measured_stage_peaks)."""
    error: str | None = None
    """The replay's failure, one line; the measured fields are then None."""
    step_times_s: list[float] = field(default_factory=list)
    """The plan's timed steps."""
    keepall_step_times_s: list[float] = field(default_factory=list)
    """The keep-all steps taken beside them."""

    @property
    def peak_ratio(self) -> float | None:
        return None if self.measured_peak_bytes is None else self.measured_peak_bytes / self.predicted_peak_bytes

    @property
    def above_static_ratio(self) -> float | None:
        if self.measured_peak_bytes is None:
            return None
        return (self.measured_peak_bytes - self.static_bytes) / (self.predicted_peak_bytes - self.static_bytes)

    @property
    def largest_departure(self) -> tuple[str, int] | None:
        """(stage, measured - predicted bytes) of the stage furthest from its prediction either way: a shortfall
        that `worst_stage` passes over for a smaller excess elsewhere shows here."""
        p, m = self.predicted_stage_peak_bytes, self.measured_stage_peak_bytes
        common = [k for k in p if k in m]
        if not common:
            return None
        k = max(common, key=lambda s: abs(m[s] - p[s]))
        return k, m[k] - p[k]

    def overhead_error(self, paired: bool = True) -> float | None:
        """Measured minus predicted overhead, in points."""
        m = self.paired_overhead_pct if paired else self.measured_overhead_pct
        return None if m is None else m - self.predicted_overhead_pct

    def checks(self) -> dict[str, bool]:
        """The targets; a failed replay meets none."""
        pr, ar, op, om = self.peak_ratio, self.above_static_ratio, self.overhead_error(), self.overhead_error(False)
        return {
            "peak_within_5pct": pr is not None and abs(pr - 1) <= PEAK_TARGET,
            "above_static_within_5pct": ar is not None and abs(ar - 1) <= PEAK_TARGET,
            "overhead_within_5_points_paired": op is not None and abs(op) <= OVERHEAD_TARGET_POINTS,
            "overhead_within_5_points_medians": om is not None and abs(om) <= OVERHEAD_TARGET_POINTS,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "largest_departure": self.largest_departure,
            "peak_ratio": self.peak_ratio,
            "above_static_ratio": self.above_static_ratio,
            "overhead_error_points_paired": self.overhead_error(),
            **self.checks(),
        }


# -- measuring ------------------------------------------------------------------------------------------------


def build(name: str, small: bool) -> Workload:
    """The workload: a built-in at bench/fidelity.py's shape, or a bench/zoo.py factory ('zoo-llama')."""
    if name.startswith("zoo-"):
        from bench import zoo

        factory = zoo.ZOO[name[4:]]
        params = inspect.signature(factory).parameters
        return factory(**{k: v for k, v in SMALL_ZOO_SHAPE.items() if small and k in params})
    from bench.fidelity import SHAPES
    from memsched.runtime import builtin_workload

    batch, seq = (2, 128) if small else SHAPES[name]
    return builtin_workload(name, batch_size=batch, seq_len=seq, small=small, dropout=0.0)


def run_model(name: str, small: bool, n_random: int, n_offload: int, seed: int, steps: int, warmup: int) -> list[Row]:
    from memsched.optimizer.simulate import make_schedule, simulate
    from memsched.runtime import trace_workload
    from memsched.runtime.measure import measure_side_by_side
    from memsched.schema import SolverRecord, SolverStatus
    from memsched.service.measure import measured_stage_peaks, predicted_stage_peaks, worst_stage

    gc.collect()
    w = build(name, small)
    t0 = time.perf_counter()
    tr, _ = trace_workload(w, steps=steps, warmup=warmup)
    log.info("%s: traced in %.0f s, %d layers", tr.model, time.perf_counter() - t0, tr.n)
    record = SolverRecord(backend="validation", status=SolverStatus.HEURISTIC)
    rows: list[Row] = []
    for i, (plan_name, group, plan) in enumerate(plans_for(tr, n_random, n_offload, seed)):
        sched = make_schedule(tr, plan, 10**12, plan_name, record)
        sim = simulate(tr, sched)
        row = Row(
            model=tr.model,
            plan=plan_name,
            group=group,
            actions=sched.action_counts(),
            static_bytes=tr.static.total,
            predicted_peak_bytes=sim.peak_bytes,
            predicted_overhead_pct=sim.overhead_pct,
            predicted_host_bytes=sum(d.offload_bytes for d in sim.decisions if d.action == Action.OFFLOAD),
        )
        gc.collect()  # the CPU peak counts every live tensor: nothing of the previous plan may survive
        try:
            got = measure_side_by_side(
                w.model,
                w.step,
                sched,
                trace=tr,
                optimizer=w.optimizer,
                steps=steps,
                warmup=warmup,
                keep_all_memory=i == 0,
            )
        except Exception as e:  # (a crashed replay is a result: recorded, never swallowed)
            row.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
            log.warning("%s %s: replay failed: %s", tr.model, plan_name, row.error, exc_info=True)
            rows.append(row)
            continue
        s, k = got.scheduled, got.keep_all
        assert s is not None and k is not None
        row.measured_peak_bytes = s.peak_bytes
        row.measured_host_bytes = s.host_bytes
        row.measured_overhead_pct = None if got.ratio is None else 100 * (got.ratio - 1)
        row.paired_overhead_pct = None if got.paired_ratio is None else 100 * (got.paired_ratio - 1)
        row.predicted_stage_peak_bytes = predicted_stage_peaks(tr.static.total, sim.stage_bytes)
        row.measured_stage_peak_bytes = measured_stage_peaks(s.stage_peak_bytes)
        ws = worst_stage(row.predicted_stage_peak_bytes, row.measured_stage_peak_bytes, tr.layer_names)
        row.worst_stage = None if ws is None else ws.to_json()
        row.step_times_s, row.keepall_step_times_s = list(s.step_times_s), list(k.step_times_s)
        log.info(
            "%s %s: peak %.3f, above static %.3f, overhead %+.1f%% predicted / %+.1f%% paired",
            tr.model,
            plan_name,
            row.peak_ratio,
            row.above_static_ratio,
            row.predicted_overhead_pct,
            row.paired_overhead_pct or 0.0,
        )
        rows.append(row)
    return rows


# -- results --------------------------------------------------------------------------------------------------


def _mib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:.1f}"


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _worst(r: Row) -> str:
    """`worst_stage` (excess first), and the largest departure either way when that is another stage."""
    ws, big = r.worst_stage, r.largest_departure
    if ws is None:
        return "-"
    out = f"{ws['stage']}: {ws['difference_bytes'] / 2**20:+.2f} MiB ({100 * ws['fraction_of_predicted_peak']:+.2f}%)"
    if big is not None and big[0] != ws["stage"]:
        out += f"; largest either way {big[0]}: {big[1] / 2**20:+.2f} MiB"
    return out


def _extreme(values: list[float | None], centre: float) -> float | None:
    """The value furthest from `centre` (None when nothing was measured)."""
    got = [v for v in values if v is not None]
    return max(got, key=lambda v: abs(v - centre)) if got else None


def write_markdown(rows: list[Row], meta: dict[str, Any], path: Path) -> None:
    lines = [
        "# The cost model on plans the solver did not choose (issue 25 item 2)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Commit: {meta['commit']}; date {meta['date_utc']}; wall time {meta['wall_s']:.0f} s  ",
        f"Machine: {meta['machine']}  ",
        f"Versions: {meta['versions']}; torch threads 1 (trace and replay)  ",
        f"Steps: {meta['steps']} timed rounds per plan after {meta['warmup']} warm-up rounds (keep-all and the plan "
        f"alternating); random plans: seed {meta['seed']}, {meta['random']} recompute and {meta['offload']} "
        "offload plans per model.",
        "",
        "Plans are built by hand (memsched.optimizer.baselines, or drawn at random by this bench), turned into a "
        "Schedule by `make_schedule` and replayed by `measure_side_by_side`. Peak: every live CPU tensor byte of "
        "the step (`cpu-all-tensors`); predicted = `simulate(trace, schedule).peak_bytes`. Above static: the "
        "peak minus the trace's static bytes (parameters, gradients, optimizer state), the part a plan moves. "
        "Overhead: the simulator's `overhead_pct` against the measured one, `paired` = median over rounds of "
        "plan step / the keep-all step beside it, `medians` = median plan step / median keep-all step (step clock: "
        "process CPU time of the one thread). Worst stage: the stage whose measured whole-step peak departs most "
        "from the simulator's (memsched.service.measure.worst_stage: the largest excess, else the largest "
        "shortfall), as MiB and % of the predicted peak, and the largest departure either way where it is "
        "another stage. "
        "Offload on the CPU is emulated: the copies are host memcpys on the compute thread (synchronous timing), "
        "and the host copies are not device bytes (not in the peak). "
        "The machine was shared with another benchmark during the run: step times are indicative; peaks are byte "
        "counts and do not depend on the load.",
        "",
    ]
    for name, why in meta.get("failed_models", {}).items():
        lines += [f"**{name} failed before its plans were measured**: {why}", ""]
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        lines += [
            f"## {model}",
            "",
            f"Static {_mib(mine[0].static_bytes)} MiB.",
            "",
            "| plan | group | actions (k/r/o) | predicted peak MiB | measured peak MiB | ratio | above static "
            "pred / meas MiB | above-static ratio | host MiB pred / meas | overhead predicted | paired | medians "
            "| worst stage |",
            "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
        ]
        for r in mine:
            a = r.actions
            acts = f"{a.get('keep', 0)}/{a.get('recompute', 0)}/{a.get('offload', 0)}"
            if r.error is not None:
                lines.append(
                    f"| {r.plan} | {r.group} | {acts} | {_mib(r.predicted_peak_bytes)} | **replay failed**: "
                    f"{r.error.replace('|', '/')} | | | | | {r.predicted_overhead_pct:+.1f}% | | | |"
                )
                continue
            assert r.measured_peak_bytes is not None
            host = "-" if r.group != OFFLOAD else f"{_mib(r.predicted_host_bytes)} / {_mib(r.measured_host_bytes)}"
            lines.append(
                f"| {r.plan} | {r.group} | {acts} | {_mib(r.predicted_peak_bytes)} | {_mib(r.measured_peak_bytes)} "
                f"| {_f(r.peak_ratio, '.3f')} | {_mib(r.predicted_peak_bytes - r.static_bytes)} / "
                f"{_mib(r.measured_peak_bytes - r.static_bytes)} | {_f(r.above_static_ratio, '.3f')} | {host} "
                f"| {r.predicted_overhead_pct:+.1f}% | {_f(r.paired_overhead_pct, '+.1f')}% "
                f"| {_f(r.measured_overhead_pct, '+.1f')}% | {_worst(r)} |"
            )
        lines.append("")
    lines += [
        "## Summary",
        "",
        "Worst per model and group: the peak ratio and above-static ratio furthest from 1, the overhead error "
        "(measured paired - predicted, points) furthest from 0.",
        "",
        "| model | group | plans | failed | worst peak ratio | worst above-static ratio | worst overhead error |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for model in dict.fromkeys(r.model for r in rows):
        for group in GROUPS:
            sel = [r for r in rows if r.model == model and r.group == group]
            if not sel:
                continue
            lines.append(
                f"| {model} | {group} | {len(sel)} | {sum(r.error is not None for r in sel)} "
                f"| {_f(_extreme([r.peak_ratio for r in sel], 1), '.3f')} "
                f"| {_f(_extreme([r.above_static_ratio for r in sel], 1), '.3f')} "
                f"| {_f(_extreme([r.overhead_error() for r in sel], 0), '+.1f')} |"
            )
    lines.append("")
    for group in GROUPS:
        sel = [r for r in rows if r.group == group]
        if sel:
            met = {c: sum(r.checks()[c] for r in sel) for c in sel[0].checks()}
            lines.append(f"Targets met, {group}: " + ", ".join(f"{c} {n}/{len(sel)}" for c, n in met.items()) + "  ")
    misses = [r for r in rows if not all(r.checks().values())]
    lines += ["", f"Misses ({len(misses)} of {len(rows)} plans miss at least one target):", ""]
    for r in misses:
        failed = [c for c, ok in r.checks().items() if not ok]
        what = (
            r.error
            if r.error is not None
            else f"peak {_f(r.peak_ratio, '.3f')}, above static {_f(r.above_static_ratio, '.3f')}, overhead "
            f"{r.predicted_overhead_pct:+.1f}% predicted / {_f(r.paired_overhead_pct, '+.1f')}% paired / "
            f"{_f(r.measured_overhead_pct, '+.1f')}% medians; worst stage {_worst(r)}"
        )
        lines.append(f"- {r.model} {r.plan} ({r.group}): {', '.join(failed)}: {what}")
    lines += ["", "![predicted vs measured](costmodel_validation.png)", ""]
    path.write_text("\n".join(lines))


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.measured_peak_bytes is not None]
    if not ok:
        return
    models = list(dict.fromkeys(r.model for r in ok))
    cmap = plt.get_cmap("tab20")
    colour = {m: cmap(i % 20) for i, m in enumerate(models)}
    marker = {BASELINE: "o", RANDOM: "^", OFFLOAD: "s"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 6))
    for r in ok:
        assert r.measured_peak_bytes is not None
        p = (r.predicted_peak_bytes - r.static_bytes) / 2**20
        m = (r.measured_peak_bytes - r.static_bytes) / 2**20
        left.scatter(p, m, color=colour[r.model], marker=marker[r.group], s=28, alpha=0.8)
        if r.paired_overhead_pct is not None:
            right.scatter(
                r.predicted_overhead_pct, r.paired_overhead_pct, color=colour[r.model], marker=marker[r.group], s=28
            )
    xs = [(r.predicted_peak_bytes - r.static_bytes) / 2**20 for r in ok]
    lo, hi = min(xs) * 0.8, max(xs) * 1.25
    left.plot([lo, hi], [lo, hi], "k--", lw=1)
    left.fill_between([lo, hi], [lo * (1 - PEAK_TARGET), hi * (1 - PEAK_TARGET)], [lo * 1.05, hi * 1.05], alpha=0.15)
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("predicted peak above static (MiB)")
    left.set_ylabel("measured peak above static (MiB)")
    left.set_title("peak above static: band = ±5%")
    pts = [v for r in ok for v in (r.predicted_overhead_pct, r.paired_overhead_pct) if v is not None]
    lo, hi = min(pts) - 5, max(pts) + 5
    right.plot([lo, hi], [lo, hi], "k--", lw=1)
    band = OVERHEAD_TARGET_POINTS
    right.fill_between([lo, hi], [lo - band, hi - band], [lo + band, hi + band], alpha=0.15)
    right.set_xlabel("predicted overhead (%)")
    right.set_ylabel("measured overhead, paired (%)")
    right.set_title("overhead: band = ±5 points")
    handles = [plt.Line2D([], [], color=colour[m], marker="o", ls="", label=m) for m in models]
    handles += [plt.Line2D([], [], color="grey", marker=marker[g], ls="", label=g) for g in GROUPS]
    fig.legend(handles=handles, loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(rows: list[Row], meta: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "rows": [r.to_json() for r in rows]}
    (out / "costmodel_validation.json").write_text(json.dumps(doc, indent=2) + "\n")
    write_markdown(rows, meta, out / "costmodel_validation.md")
    plot(rows, out / "costmodel_validation.png")


def render(out: Path) -> None:
    """The markdown and the plot again, from the JSON of a run."""
    doc = json.loads((out / "costmodel_validation.json").read_text())
    names = set(Row.__dataclass_fields__)
    rows = [Row(**{k: v for k, v in r.items() if k in names}) for r in doc["rows"]]
    write_markdown(rows, doc["meta"], out / "costmodel_validation.md")
    plot(rows, out / "costmodel_validation.png")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--small", action="store_true", help="tiny widths (built-ins) / tiny batches (zoo): a smoke run")
    p.add_argument("--random", type=int, default=10, help="random recompute plans per model")
    p.add_argument("--offload", type=int, default=5, help="random keep/offload/recompute plans per model")
    p.add_argument("--seed", type=int, default=25)
    p.add_argument("--steps", type=int, default=3, help="timed rounds per plan (and trace steps)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up rounds per plan (and trace warm-up)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--render", action="store_true", help="only rewrite the markdown and the plot from the JSON")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("memsched").setLevel(logging.WARNING)
    if a.render:
        render(a.out)
        return
    import torch
    from transformers.utils import logging as tf_logging

    from bench.solver_bench import _meta

    tf_logging.set_verbosity_error()
    torch.set_num_threads(1)
    meta: dict[str, Any] = {
        **_meta(("memsched", "torch", "transformers")),
        "steps": a.steps,
        "warmup": a.warmup,
        "seed": a.seed,
        "random": a.random,
        "offload": a.offload,
        "small": a.small,
    }
    t0 = time.perf_counter()
    rows: list[Row] = []
    meta["failed_models"] = {}
    for name in a.models:
        try:
            rows += run_model(name, a.small, a.random, a.offload, a.seed, a.steps, a.warmup)
        except Exception as e:  # (a model that cannot be traced is a result too)
            meta["failed_models"][name] = f"{type(e).__name__}: {str(e).strip()[:300]}"
            log.exception("%s: failed before its plans were measured", name)
        meta["wall_s"] = time.perf_counter() - t0
        write_results(rows, meta, a.out)  # after every model: a cut-off run still leaves its results
    log.info("wrote %s (%.0f s)", a.out / "costmodel_validation.md", time.perf_counter() - t0)


if __name__ == "__main__":
    main()
