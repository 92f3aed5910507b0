"""The fluid beam alone under each ranking (optimizer/dp/sweep.py, BeamRank): for each trace, budget and width,
the simulator's cost of the best decoded plan, the sweep's own cost of it and the beam's time. Writes
bench/results/beam_rank.{md,json} naming the machine, the versions and the command.

    taskset -c 1 python bench/beam_rank_bench.py [--shared ../shared]

The beams run without a threshold (no incumbent), as the first round of a solve does; each row runs both rankings
one after the other in this process, so that their times are comparable (the kernels are compiled first).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from solver_bench import _bench_trace, _meta, pct_budget, write_results

from memsched.optimizer.dp import BeamRank, beam_search, build_problem
from memsched.optimizer.synthetic import make_trace

TRACES = (
    "synthetic/chain-200",
    "pipedream/resnet50",
    "pipedream-outputs/resnet50",
    "pipedream/densenet121",
    "traces/resnet50-bf16-b256-h100",
    "traces/bert-large-bf16-b32-s512-h100",
    "traces/gpt2-medium-bf16-b20-s1024-h100",
)
"""One-tensor-per-layer profiles (a synthetic chain, PipeDream imports, one under another byte convention) and the
tracer's GPU traces, whose blocks offload many tensors at once."""
PCTS = (75, 50, 25)
WIDTHS = (24, 96, 384)


def _row(key: str, pct: int, width: int, pipedream: Path) -> dict[str, object]:
    trace = _bench_trace(key, pipedream)
    budget = pct_budget(trace, pct)
    p = build_problem(trace, budget)
    row: dict[str, object] = {"trace": f"{key}@{pct}%", "layers": trace.n, "budget_bytes": budget, "width": width}
    for rank in BeamRank:
        began = time.perf_counter()
        out = beam_search(trace, budget, time.perf_counter() + 600.0, width=width, problem=p, rank=rank)
        row[rank.value] = {
            "simulated_s": out.schedules[0].overhead_s if out.schedules else None,
            "swept_s": out.swept_s,
            "wall_s": round(time.perf_counter() - began, 3),
            "timed_out": out.timed_out,
        }
    return row


def _cell(side: object) -> str:
    assert isinstance(side, dict)
    sim = "none" if side["simulated_s"] is None else f"{side['simulated_s']:.5f}"
    swept = "" if side["swept_s"] is None else f"{side['swept_s']:.5f}"
    return f"{sim} | {swept} | {side['wall_s']}"


def _table(meta: dict[str, object], rows: list[dict[str, object]]) -> list[str]:
    lines = [
        "",
        "Each beam's best decoded plan as the simulator prices it, the sweep's own cost of that plan, and the wall",
        "time, both rankings in one process one after the other (no threshold).",
        "",
        "| trace | n | width | drained: simulated s | drained: swept s | drained: wall s | bound: simulated s "
        "| bound: swept s | bound: wall s | bound / drained |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, b = r[BeamRank.DRAINED.value], r[BeamRank.BOUND.value]
        assert isinstance(a, dict) and isinstance(b, dict)
        ratio = (
            f"{b['simulated_s'] / a['simulated_s']:.3f}" if a["simulated_s"] and b["simulated_s"] is not None else ""
        )
        lines.append(f"| {r['trace']} | {r['layers']} | {r['width']} | {_cell(a)} | {_cell(b)} | {ratio} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    default_shared = os.environ.get("MEMSCHED_SHARED", str(Path(__file__).resolve().parents[2] / "shared"))
    ap.add_argument("--shared", default=default_shared)
    args = ap.parse_args()
    pipedream = Path(args.shared) / "data" / "pipedream"
    warm = make_trace(30, 1)
    for rank in BeamRank:  # compile the kernels outside the rows
        beam_search(warm, pct_budget(warm, 30), time.perf_counter() + 60.0, width=8, rank=rank)
    rows = [_row(key, pct, width, pipedream) for key in TRACES for pct in PCTS for width in WIDTHS]
    write_results(_meta(), rows, stem="beam_rank", table=_table)


if __name__ == "__main__":
    main()
