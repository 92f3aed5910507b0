"""Validation of the Trace / Schedule contract: every rejection names the field path and the fix."""

from __future__ import annotations

import json
import math

import pytest

from helpers import tiny_trace
from memsched.errors import MemschedError, ScheduleMismatchError, TraceFormatError
from memsched.io import load_schedule, load_trace, parse_model, save_model
from memsched.optimizer.baselines import best_baseline
from memsched.schema import Schedule, Trace, check_schedule, json_schema


@pytest.fixture
def trace_doc():
    return tiny_trace([1, 2, 3], [2, 4, 6], [10, 20, 30], output=[1, 2, 3]).model_dump(mode="json")


def reject(doc, *needles, model=Trace):
    with pytest.raises(TraceFormatError) as e:
        parse_model(model, doc, "trace")
    for n in needles:
        assert n in str(e.value), str(e.value)
    return str(e.value)


def test_round_trip(tmp_path, trace_doc):
    tr = parse_model(Trace, trace_doc, "trace")
    save_model(tr, tmp_path / "t.json")
    again = load_trace(tmp_path / "t.json")
    assert again == tr and again.content_hash() == tr.content_hash()


@pytest.mark.parametrize("value", [-1.0, math.inf, math.nan])
def test_rejects_negative_or_non_finite_times(trace_doc, value):
    trace_doc["layers"][1]["forward_s"] = value
    reject(trace_doc, "layers[1].forward_s", "fix:")


def test_rejects_negative_sizes(trace_doc):
    trace_doc["layers"][2]["saved_bytes"] = -5
    reject(trace_doc, "layers[2].saved_bytes", ">= 0")


def test_rejects_duplicate_layer_names(trace_doc):
    trace_doc["layers"][2]["name"] = "layer0"
    reject(trace_doc, "layers[2].name", "repeats layers[0].name", "unique")


@pytest.mark.parametrize(
    ("deps", "needle"), [([2], "points forward or at itself"), ([5], "points forward"), ([-1], "out of range")]
)
def test_rejects_bad_dependencies(trace_doc, deps, needle):
    trace_doc["layers"][1]["deps"] = deps
    reject(trace_doc, "layers[1].deps[0]", needle, "earlier layers")


def test_rejects_empty_trace(trace_doc):
    trace_doc["layers"] = []
    reject(trace_doc, "layers", "no layers")


def test_rejects_unknown_schema_version(trace_doc):
    trace_doc["schema_version"] = "99"
    reject(trace_doc, "schema_version", "'99'", "upgrade memsched")


def test_rejects_unknown_fields(trace_doc):
    trace_doc["layers"][0]["forward_ms"] = 3
    reject(trace_doc, "layers[0].forward_ms", "remove the field")


def test_rejects_saved_tensor_sum_mismatch(trace_doc):
    trace_doc["layers"][0]["saved_tensor_bytes"] = [3, 4]
    reject(trace_doc, "saved_tensor_bytes sum to 7", "saved_bytes is 10")


def _schedule(tr):
    return best_baseline(tr, 10**6)


def test_schedule_rejects_budget_not_positive():
    tr = tiny_trace([1], [1], [5])
    doc = _schedule(tr).model_dump(mode="json")
    doc["budget_bytes"] = 0
    reject(doc, "budget_bytes", "greater than 0", model=Schedule)


def test_schedule_rejects_unknown_version():
    tr = tiny_trace([1], [1], [5])
    doc = _schedule(tr).model_dump(mode="json")
    doc["schema_version"] = "0"
    reject(doc, "schema_version", "unknown schedule schema_version", model=Schedule)


def test_schedule_must_match_trace_hash_and_names():
    tr = tiny_trace([1, 2], [1, 2], [5, 6])
    sched = _schedule(tr)
    check_schedule(sched, tr)
    other = tiny_trace([1, 2], [1, 3], [5, 6])
    with pytest.raises(ScheduleMismatchError, match="trace_hash .* does not match"):
        check_schedule(sched, other)
    renamed = tr.model_copy(deep=True)
    renamed.layers[1].name = "head"
    with pytest.raises(ScheduleMismatchError, match=r"layer_names\[1\] is 'layer1' but the trace's layer 1 is 'head'"):
        check_schedule(sched, renamed)
    longer = tiny_trace([1, 2, 3], [1, 2, 3], [5, 6, 7])
    with pytest.raises(ScheduleMismatchError, match="2 layers but the trace has 3"):
        check_schedule(sched, longer)


def test_schedule_actions_must_match_names():
    tr = tiny_trace([1, 2], [1, 2], [5, 6])
    doc = _schedule(tr).model_dump(mode="json")
    doc["actions"][0]["layer"] = "zzz"
    reject(doc, "actions[0].layer is 'zzz'", model=Schedule)


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(TraceFormatError, match="does not exist"):
        load_trace(tmp_path / "missing.json")
    p = tmp_path / "broken.json"
    p.write_text('{"layers": [')
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        load_schedule(p)
    assert issubclass(TraceFormatError, MemschedError)


def test_json_schema_is_exported_and_committed():
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    for kind in ("trace", "schedule"):
        committed = json.loads((docs / f"{kind}.schema.json").read_text())
        assert committed == json_schema(kind), (
            f"docs/{kind}.schema.json is stale: run memsched schema {kind} -o docs/{kind}.schema.json"
        )


@pytest.mark.parametrize(("step_s", "needle"), [(0.0, "must be > 0"), (1.0, "less than 1/2 of the layers")])
def test_rejects_a_baseline_step_below_its_layers(trace_doc, step_s, needle):
    # The layers' forward + backward sum to 18 s: a 0 s or 1 s step did not include them.
    trace_doc["baseline"]["step_s"] = step_s
    msg = reject(trace_doc, "baseline.step_s", needle, "fix:")
    assert "18 s" in msg


def test_accepts_a_baseline_step_somewhat_below_its_layers(trace_doc):
    # Per-layer timing may read high: 0.6x of the parts is still one measured step.
    trace_doc["baseline"]["step_s"] = 18 * 0.6
    assert parse_model(Trace, trace_doc, "trace").baseline.step_s == pytest.approx(10.8)
