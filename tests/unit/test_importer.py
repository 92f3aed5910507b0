from __future__ import annotations

import pytest

from helpers import require_pipedream
from memsched.errors import TraceFormatError
from memsched.optimizer.baselines import keep_all
from memsched.optimizer.simulate import simulate
from memsched.service import compare_policies
from memsched.service.importers import import_pipedream

BATCH = {"alexnet": 256, "resnet18": 256, "vgg16": 128, "resnet50": 128, "densenet121": 64, "gnmt": 64}


@pytest.mark.parametrize("model", sorted(BATCH))
def test_shared_profiles_import_validate_simulate_compare(model):
    path = require_pipedream() / f"{model}.graph.txt"
    tr = import_pipedream(path, BATCH[model])
    assert tr.source == "import:pipedream" and tr.n > 10
    sim = simulate(tr, keep_all(tr))
    assert sim.peak_bytes == tr.baseline.peak_bytes
    assert sim.step_s == pytest.approx(sum(x.forward_s + x.backward_s for x in tr.layers))
    cmp = compare_policies(tr, "50%")
    assert len(cmp.rows) == 5
    assert any(r.feasible for r in cmp.rows) or model in ("alexnet", "vgg16", "gnmt", "resnet18")


def test_dag_edges_are_kept():
    tr = import_pipedream(require_pipedream() / "resnet50.graph.txt", 128)
    adds = [x for x in tr.layers if len(x.deps) > 1 and x.kind == "Add"]
    assert len(adds) == 16  # one residual Add per bottleneck block
    skips = [x for x in tr.layers for d in x.deps if tr.layers.index(x) - d > 1]
    assert skips


def test_malformed_profile_names_the_line(tmp_path):
    p = tmp_path / "g.txt"
    p.write_text(
        "node1 -- Conv2d(3, 64) -- forward_compute_time=1.0, backward_compute_time=oops, activation_size=8.0, parameter_size=0.0\n"
    )
    with pytest.raises(TraceFormatError, match=r"g.txt:1: backward_compute_time 'oops' is not a number"):
        import_pipedream(p, 8)
    p.write_text("garbage\n")
    with pytest.raises(TraceFormatError, match="not a PipeDream node or edge line"):
        import_pipedream(p, 8)
    p.write_text(
        "node1 -- ReLU -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=8.0, parameter_size=0.0\n"
        "\tnode1 -- node2\n"
    )
    with pytest.raises(TraceFormatError, match="names node2, which has no node line"):
        import_pipedream(p, 8)


def test_cycle_is_rejected(tmp_path):
    p = tmp_path / "g.txt"
    line = "node{} -- ReLU -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=8.0, parameter_size=0.0\n"
    p.write_text(line.format(1) + line.format(2) + "\tnode1 -- node2\n\tnode2 -- node1\n")
    with pytest.raises(TraceFormatError, match="cycle"):
        import_pipedream(p, 8)
