"""The cost model on plans the solver did not choose (issue 25 item 2, small version): a tiny GPT-2 traced on
the CPU, then keep-all, checkpoint-every-block and three random recompute-only plans replayed by the runtime.
The measured whole-step peak is within 5% of the simulator's for every plan (memory only: the step times of
a shared CPU are not asserted; bench/costmodel_validation.py measures them)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # bench/ is a folder of the checkout, not an installed package
    sys.path.insert(0, str(REPO))

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bench.costmodel_validation import random_recompute_plan  # noqa: E402
from memsched.optimizer.baselines import checkpoint_all, keep_all  # noqa: E402
from memsched.optimizer.decisions import KEEP  # noqa: E402
from memsched.optimizer.simulate import make_schedule, simulate  # noqa: E402
from memsched.runtime import trace, workload  # noqa: E402
from memsched.runtime.measure import measure_side_by_side  # noqa: E402
from memsched.schema import SolverRecord, SolverStatus  # noqa: E402

PEAK_WITHIN = 0.05


def test_measured_peak_within_5pct_of_predicted_on_plans_not_chosen() -> None:
    torch.manual_seed(0)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        w = workload("gpt2", small=True, batch_size=2, seq_len=64)
        tr = trace(
            w.model,
            w.step,
            model_id=w.model_id,
            batch_size=2,
            seq_len=64,
            optimizer=w.optimizer,
            steps=1,
            warmup=1,
            measure_bandwidth=False,
        )
        rng = random.Random(25)
        plans = {"keep-all": keep_all(tr), "checkpoint-all": checkpoint_all(tr)}
        while len(plans) < 5:
            plan = random_recompute_plan(tr.n, rng)
            if any(d.action != KEEP.action for d in plan):
                plans[f"random-{len(plans) - 1}"] = plan
        rec = SolverRecord(backend="test", status=SolverStatus.HEURISTIC)
        for name, plan in plans.items():
            sched = make_schedule(tr, plan, 10**12, name, rec)
            predicted = simulate(tr, sched).peak_bytes
            got = measure_side_by_side(
                w.model, w.step, sched, baseline=False, trace=tr, optimizer=w.optimizer, steps=1, warmup=1
            )
            assert got.scheduled is not None
            measured = got.scheduled.peak_bytes
            assert abs(measured / predicted - 1) <= PEAK_WITHIN, (name, measured, predicted)
            # Above the static bytes too (what plans move): the loss point's rule is what keeps a recomputed
            # last layer's bytes from being charged beside the loss (issue 25: 40% over on checkpoint-all).
            static = tr.static.total
            assert abs((measured - static) / (predicted - static) - 1) <= PEAK_WITHIN, (name, measured, predicted)
    finally:
        torch.set_num_threads(previous)
