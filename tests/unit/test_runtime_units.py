"""Runtime pieces without a training loop: layer discovery, host pool, ledger, schedule/model mismatches."""

from __future__ import annotations

import contextlib
import copy
import pickle

import pytest
import torch
from torch import nn

from memsched.errors import MemschedError, ScheduleMismatchError
from memsched.runtime import HostBufferPool, SavedLedger, apply_schedule, find_layers, keep_all_schedule
from memsched.runtime.wrapping import is_wrapped
from memsched.schema import Action, Baseline, DeviceInfo, Layer, LayerAction, OffloadPlan, Schedule, Trace


class Block(nn.Module):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(n))
        self.head = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))  # mixed classes: not blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h).sum()


BLOCKS = ["blocks.0", "blocks.1", "blocks.2"]


def test_default_layers_are_the_repeated_blocks():
    assert [n for n, _ in find_layers(Net())] == ["blocks.0", "blocks.1", "blocks.2"]


def test_layer_patterns_override_and_errors_name_the_fix():
    assert [n for n, _ in find_layers(Net(), [r"blocks\.[02]", "head"])] == ["blocks.0", "blocks.2", "head"]
    with pytest.raises(MemschedError, match="no module name matches"):
        find_layers(Net(), ["nothing"])
    with pytest.raises(MemschedError, match="not a valid regular expression"):
        find_layers(Net(), ["("])
    with pytest.raises(MemschedError, match="found no repeated blocks"):
        find_layers(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))


def test_pool_reuses_exact_sizes():
    pool = HostBufferPool(pin_memory=False)
    a = pool.acquire(100)
    b = pool.acquire(100)
    pool.release(a)
    c = pool.acquire(100)
    assert c is a
    pool.release(b)
    pool.release(c)
    s = pool.stats()
    assert (s.allocated_bytes, s.allocated_buffers, s.in_use_buffers, s.reuses) == (200, 2, 0, 1)
    pool.clear()
    assert pool.stats().allocated_bytes == 0


def test_ledger_counts_storages_once_until_they_die():
    led = SavedLedger()
    x = torch.zeros(10)  # 40 bytes
    led.mark("F0")
    led.note(x, 0)
    led.note(x[2:], 0)  # a view: same storage
    led.note(x.view(2, 5), 1)
    assert led.live_bytes == 40
    y = torch.zeros(5)
    led.mark("F1")
    led.note(y, 1)
    del x
    assert led.live_bytes == 20
    led.mark("B1")
    st = led.stats()
    assert st.peak_bytes == 60 and st.stage_peak_bytes == {"F0": 40, "F1": 60, "B1": 20}
    assert st.per_layer_bytes == {0: 40, 1: 20}


def test_schedule_naming_a_missing_layer_is_rejected():
    sched = keep_all_schedule(["blocks.0", "blocks.1", "blocks.7"])
    with pytest.raises(ScheduleMismatchError, match=r"'blocks.7' is not a module .* repeated blocks are 3"):
        apply_schedule(Net(), sched)


def test_schedule_with_other_layer_patterns_is_rejected():
    sched = keep_all_schedule(["blocks.0", "blocks.1"])
    with pytest.raises(ScheduleMismatchError, match="are not the schedule's"):
        apply_schedule(Net(), sched, layers=[r"blocks\.\d"])


def test_schedule_for_another_trace_is_rejected():
    tr = Trace(
        model="tiny",
        batch_size=1,
        device=DeviceInfo(name="cpu", memory_bytes=10**9, h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9),
        baseline=Baseline(step_s=1.0, peak_bytes=0),
        layers=[Layer(name=f"layer{i}", forward_s=0.1, backward_s=0.2, saved_bytes=10) for i in range(3)],
    )
    sched = keep_all_schedule(["blocks.0", "blocks.1", "blocks.2"])
    with pytest.raises(ScheduleMismatchError, match="layer_names"):
        apply_schedule(Net(), sched, trace=tr)
    tr2 = tr.model_copy(
        update={"layers": [x.model_copy(update={"name": f"blocks.{i}"}) for i, x in enumerate(tr.layers)]}
    )
    with pytest.raises(ScheduleMismatchError, match="trace_hash"):
        apply_schedule(Net(), sched, trace=tr2)


def test_nested_layers_and_double_application_are_rejected():
    with pytest.raises(ScheduleMismatchError, match="nested"):
        apply_schedule(Net(), keep_all_schedule(["blocks.0", "blocks.0.up"]))
    net = Net()
    with (
        apply_schedule(net, keep_all_schedule(BLOCKS)),
        pytest.raises(ScheduleMismatchError, match="already applied"),
    ):
        apply_schedule(net, keep_all_schedule(BLOCKS))
    apply_schedule(net, keep_all_schedule(BLOCKS)).remove()  # fine again once removed


def test_offload_stage_out_of_range_is_rejected():
    sched = keep_all_schedule(BLOCKS)
    sched.actions[1] = LayerAction(
        layer="blocks.1",
        action=Action.OFFLOAD,
        offload=OffloadPlan(tensors=[0], bytes=1, done_by_layer=3, prefetch_at_layer=1),
    )
    with pytest.raises(ScheduleMismatchError, match=r"done_by_layer = 3 must be in \[1, 2\]"):
        apply_schedule(Net(), sched)


def test_custom_model_replays_with_identical_gradients():
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(5, 4)
    net(x).backward()
    ref = {n: p.grad.clone() for n, p in net.named_parameters()}
    sched = keep_all_schedule([f"blocks.{i}" for i in range(3)])
    sched.actions[1] = LayerAction(
        layer="blocks.1",
        action=Action.OFFLOAD,
        offload=OffloadPlan(tensors=[0, 1], bytes=0, done_by_layer=1, prefetch_at_layer=2),
    )
    sched.actions[2] = LayerAction(layer="blocks.2", action=Action.RECOMPUTE)
    net.zero_grad()
    with apply_schedule(net, sched) as sm:
        sm(x).backward()
        assert sm.pool_stats().allocated_buffers == 2
    for n, p in net.named_parameters():
        assert torch.equal(p.grad, ref[n]), n


def _plan(kind: str) -> Schedule:
    """keep-all; blocks.1 recomputed (every kept layer runs bare); every block recomputed, in a segment of its own
    (no layer claims); blocks.1 offloaded (kept layers claim: no trace says who shares)."""
    sched = keep_all_schedule(BLOCKS)
    if kind == "recompute":
        sched.actions[1] = LayerAction(layer="blocks.1", action=Action.RECOMPUTE)
    elif kind == "recompute-all":
        sched.actions = [LayerAction(layer=b, action=Action.RECOMPUTE, recompute_group=i) for i, b in enumerate(BLOCKS)]
    elif kind == "offload":
        sched.actions[1] = LayerAction(
            layer="blocks.1",
            action=Action.OFFLOAD,
            offload=OffloadPlan(tensors=[0], bytes=0, done_by_layer=1, prefetch_at_layer=2),
        )
    return sched


@pytest.mark.parametrize("kind", ["keep-all", "recompute", "recompute-all", "offload"])
def test_two_forwards_before_one_backward_warn_once_and_a_dropped_forward_does_not(caplog, kind):
    # Each forward holds its own activations: the plan's budget is for one forward and its backward at a time.
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(5, 4)
    with apply_schedule(net, _plan(kind)) as sm, caplog.at_level("WARNING"):
        sm(x).backward()
        sm(x)  # a forward whose graph is dropped: nothing of it is alive when the next one begins
        (sm(x) + sm(2 * x)).backward()  # two forwards, one backward (a siamese loss)
        (sm(x) + sm(2 * x)).backward()
        sm(x).backward()
    overlaps = [r.getMessage() for r in caplog.records if "began a forward while" in r.getMessage()]
    assert len(overlaps) == 1, overlaps
    assert "'blocks.0'" in overlaps[0] and "above the budget" in overlaps[0]


@pytest.mark.parametrize("kind", ["keep-all", "recompute", "offload"])
def test_kept_layers_save_through_autograd_alone_unless_a_layer_offloads_or_a_ledger_counts(kind):
    # Entering saved-tensor hooks costs each saved tensor a Python pack and unpack (+10% on a small CPU ResNet-50
    # step with hooks that do nothing): a kept layer runs bare where nothing needs its claims.
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(5, 4)
    net(x).backward()
    ref = {n: p.grad.clone() for n, p in net.named_parameters()}
    hooked: dict[tuple[str, bool], bool] = {}  # (kept block, with a ledger) -> saved-tensor hooks active inside it
    counting = False

    def inside(name: str) -> None:
        def hook(_m: nn.Module, _args: object) -> None:
            if torch.is_grad_enabled():
                hooked[name, counting] = torch._C._autograd._top_saved_tensors_default_hooks(True) is not None

        net.get_submodule(name + ".up").register_forward_pre_hook(hook)

    for b in ("blocks.0", "blocks.2"):
        inside(b)
    for counting in (False, True):
        net.zero_grad()
        with apply_schedule(net, _plan(kind), ledger=SavedLedger() if counting else None) as sm:
            sm(x).backward()
        for n, p in net.named_parameters():
            assert torch.equal(p.grad, ref[n]), n
    claims = {"keep-all": (False, True), "recompute": (False, True), "offload": (True, True)}[kind]
    assert hooked == {(b, c): claims[c] for b in ("blocks.0", "blocks.2") for c in (False, True)}


def test_gradient_accumulation_does_not_warn(caplog):
    torch.manual_seed(0)
    net = Net()
    with apply_schedule(net, keep_all_schedule(BLOCKS)) as sm, caplog.at_level("WARNING"):
        for _ in range(3):
            sm(torch.randn(5, 4)).backward()
    assert not any("began a forward while" in r.getMessage() for r in caplog.records)


class _FakeEvent:
    """A CUDA-event stand-in: done once `done` is set; synchronize() completes it."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


def test_pool_holds_buffers_until_their_copy_is_done():
    pool = HostBufferPool(pin_memory=False)
    a = pool.acquire(64)
    ev = _FakeEvent()
    pool.release(a, ev)  # the copy is still in flight: not reusable yet, but not lent out either
    assert pool.stats().in_use_buffers == 0
    b = pool.acquire(32)  # another size: a new buffer, and `a` stays pending
    assert b is not a and not ev.done
    c = pool.acquire(64)  # same size: waits for a's copy rather than growing the pool
    assert c is a and ev.done
    assert pool.stats().allocated_buffers == 2


def test_dropping_the_graph_without_backward_returns_every_buffer():
    torch.manual_seed(0)
    net = Net()
    sched = keep_all_schedule([f"blocks.{i}" for i in range(3)])
    sched.actions[0] = LayerAction(
        layer="blocks.0",
        action=Action.OFFLOAD,
        offload=OffloadPlan(tensors=[0, 1, 2], bytes=0, done_by_layer=0, prefetch_at_layer=0),
    )
    with apply_schedule(net, sched) as sm:
        loss = sm(torch.randn(5, 4))
        assert sm.pool_stats().in_use_buffers == 3
        del loss  # e.g. an exception between forward and backward
        assert sm.pool_stats().in_use_buffers == 0


def test_schedule_for_fewer_blocks_than_the_model_is_rejected():
    with pytest.raises(ScheduleMismatchError, match=r"schedule has 2 layers but this Net has 3 repeated blocks"):
        apply_schedule(Net(), keep_all_schedule(["blocks.0", "blocks.1"]))


def _net_step(net: Net, x: torch.Tensor):
    def step() -> None:
        net.zero_grad(set_to_none=True)
        net(x).backward()

    return step


def test_trace_attributes_saved_tensors_to_the_innermost_layer():
    from memsched.runtime import trace

    torch.manual_seed(0)
    net, x = Net(), torch.randn(5, 4)
    flat = trace(net, _net_step(net, x), steps=1, warmup=0, measure_bandwidth=False)
    nested = trace(
        net, _net_step(net, x), layers=[r"blocks\.\d", r"blocks\.\d\.up"], steps=1, warmup=0, measure_bandwidth=False
    )
    assert nested.layer_names == ["blocks.0", "blocks.0.up", "blocks.1", "blocks.1.up", "blocks.2", "blocks.2.up"]
    by = {layer.name: layer for layer in nested.layers}
    for i in range(3):
        # The Linear `up` saves its input (the LayerNorm output): that storage is the inner layer's, once.
        assert by[f"blocks.{i}.up"].saved_tensor_bytes == [5 * 8 * 4]
        assert by[f"blocks.{i}"].saved_bytes + by[f"blocks.{i}.up"].saved_bytes == flat.layers[i].saved_bytes
    assert [layer.deps for layer in flat.layers] == [[], [0], [1]]
    assert flat.static.params == sum(p.numel() * 4 for p in net.parameters())


def test_measure_on_cpu_reports_the_whole_step_and_the_ledger():
    from memsched.runtime import measure

    torch.manual_seed(0)
    net, x = Net(), torch.randn(5, 4)
    m = measure(net, lambda model: model(x).backward(), None, steps=2, warmup=1)
    assert m.device == "cpu" and m.peak_source == "cpu-all-tensors" and len(m.step_times_s) == 2
    # The whole step holds the parameters, the gradients (allocated in the backward) and the saved tensors.
    params = sum(p.numel() * 4 for p in net.parameters())
    assert m.saved_peak_bytes and m.peak_bytes >= params + m.saved_peak_bytes
    assert m.predicted_peak_bytes is None and "measured" in m.summary()
    assert m.stage_saved_peak_bytes["F2"] == m.saved_peak_bytes  # all three blocks' tensors live at F2
    assert {"pre", "F0", "F2", "B0"} <= set(m.stage_peak_bytes)


def test_cuda_source_with_a_fake_allocator(monkeypatch):
    """The CUDA branch of the one measurement function, driven by a fake allocator: stage peaks reset the
    peak counter at each mark and the step's peak is their maximum."""
    from memsched.runtime.memory import CUDA_SOURCE, MemoryMeter

    alloc = {"now": 1000, "peak": 1000}

    def allocate(nbytes: int) -> None:
        alloc["now"] += nbytes
        alloc["peak"] = max(alloc["peak"], alloc["now"])

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *_a: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *_a: alloc.update(peak=alloc["now"]))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *_a: alloc["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *_a: alloc["peak"])
    meter = MemoryMeter(torch.device("cuda"))

    def step() -> None:
        allocate(100)
        meter.mark("F0")
        allocate(500)
        allocate(-300)
        meter.mark("B0")
        allocate(50)
        allocate(-350)

    m = meter.measure(step)
    assert m.source == CUDA_SOURCE and m.start_bytes == 1000 and m.end_bytes == 1000
    assert m.stage_peak_bytes == {"pre": 1100, "F0": 1600, "B0": 1350}
    assert m.peak_bytes == 1600 and m.stage_order == ["pre", "F0", "B0"]


def test_fit_workspace_places_outside_memory_where_it_is_live():
    """Stage peaks beyond the layer model become workspace: before F_0 and after B_0 (the optimizer) go to
    layer 0, the loss region (inside F_{n-1}'s stage) to the last layer; never negative."""
    from memsched.runtime.memory import StepMemory
    from memsched.runtime.tracer import _LayerStats, fit_workspace

    layers = [_LayerStats("a", "X", saved=[10], input_bytes=2, output_bytes=3) for _ in range(2)]
    static = 100
    peaks = {"pre": 150, "F0": 110, "F1": 140, "B1": 125, "B0": 100, "optimizer": 180}
    ws, fws = fit_workspace(layers, static, StepMemory("cpu-all-tensors", 180, 100, 100, stage_peak_bytes=peaks))
    # layer 0: F0 model 100+10+3 = 113 (pre needs 150: +37); B0 model 115 (optimizer needs 180: +65)
    # layer 1: F1 model 100+20+3 = 123 (the loss at 140: +17); B1 model 125 (+0)
    assert ws == [65, 17]
    assert fws == [37, 17]  # the forward stages' own need: layer 0's F0 holds 37, not the optimizer's 65


def test_the_runtime_never_imports_the_optimizer():
    import subprocess
    import sys

    code = "import sys, memsched.runtime; print(any(m.startswith('memsched.optimizer') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def _recompute_all(names: list[str]) -> Schedule:
    sched = keep_all_schedule(names)
    for i, name in enumerate(names):
        sched.actions[i] = LayerAction(layer=name, action=Action.RECOMPUTE, recompute_group=0 if i else None)
    return sched


def test_a_deep_copy_inside_the_schedule_is_a_plain_model_with_its_own_weights():
    torch.manual_seed(0)
    net, x = Net(), torch.randn(5, 4)
    loss = net(x).detach()
    with apply_schedule(net, _recompute_all(BLOCKS)) as sm:
        for clone in (copy.deepcopy(net), copy.deepcopy(sm)):  # the model, or the ScheduledModel around it
            assert type(clone) is Net
            assert not any(is_wrapped(m) for m in clone.modules())
            with torch.no_grad():
                for p in clone.blocks.parameters():
                    p.zero_()
            # Zeroed blocks are identities (x + down(relu(up(norm(x)))) = x): the copy runs its own weights.
            plain = clone.head(clone.embed(x)).sum()
            assert torch.equal(clone(x), plain) and not torch.equal(clone(x), loss)
        assert torch.equal(sm(x), loss)  # and the original is untouched


def test_a_scheduled_model_saves_pickles_and_keeps_its_state_dict(tmp_path):
    torch.manual_seed(0)
    net, x = Net(), torch.randn(5, 4)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with apply_schedule(net, _recompute_all(BLOCKS)) as sm:
        assert net.state_dict().keys() == before.keys()
        assert all(torch.equal(v, before[k]) for k, v in sm.state_dict().items())
        torch.save(net, tmp_path / "net.pt")
        torch.save(sm, tmp_path / "sm.pt")
        pickled = pickle.loads(pickle.dumps(net))
    for loaded in (
        torch.load(tmp_path / "net.pt", weights_only=False),
        torch.load(tmp_path / "sm.pt", weights_only=False),
        pickled,
    ):
        assert type(loaded) is Net and not any(is_wrapped(m) for m in loaded.modules())
        assert torch.equal(loaded(x), net(x))
        loaded(x).backward()  # trains as a plain model
        assert apply_schedule(loaded, _recompute_all(BLOCKS)).model is loaded  # and can be scheduled itself


class _Counter(nn.Module):
    """Reads a buffer, then updates it in place: a recomputation must read the value the forward read."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)
        self.mid = nn.Linear(8, 8)
        self.register_buffer("scale", torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.out(self.mid(torch.tanh(self.lin(x) + self.scale)))  # the add saves nothing: updating is legal
        self.scale.mul_(1.5)
        return y


class _CounterNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Counter() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().sum()


@pytest.mark.parametrize("steps", [1, 3])
def test_recompute_reads_the_buffers_the_forward_read_and_updates_them_once(steps):
    x = torch.randn(4, 8)
    results = []
    for sched in (None, _recompute_all(BLOCKS)):
        torch.manual_seed(0)
        net = _CounterNet()
        with apply_schedule(net, sched) if sched else contextlib.nullcontext(net) as m:
            for _ in range(steps):
                net.zero_grad()
                m(x).backward()
        results.append(({n: p.grad for n, p in net.named_parameters()}, dict(net.named_buffers())))
    (g0, b0), (g1, b1) = results
    assert all(torch.equal(b1[k], v) for k, v in b0.items()) and b1["blocks.0.scale"].item() == 1.5**steps
    assert all(torch.equal(g1[k], v) for k, v in g0.items())


class _TickClock:
    """A Clock whose marks are the times it is given, in order (no device, no noise)."""

    def __init__(self, times: list[float]) -> None:
        self.times = iter(times)

    def mark(self) -> float:
        return next(self.times)

    def finish(self) -> None:
        pass

    def seconds(self, a: float, b: float) -> float:
        return b - a


def test_a_rerun_is_priced_against_its_forward_of_the_same_step():
    from memsched.runtime.tracer import RERUN_BELOW, _LayerStats, _recompute_s

    # The timing steps ran at 1.0 s a forward; the re-run steps on a machine a third slower. Compared across
    # the two, the re-run (1.0 s) would look whole; against its own step's forward (1.333 s) it is 0.75x.
    st = _LayerStats(
        "h", "Block", forward_s=[1.0, 1.0, 1.0], rerun_s=[1.0, 0.98, 1.02], checkpointed_forward_s=[4 / 3] * 3
    )
    assert _recompute_s(st) == pytest.approx(0.75)
    # A re-run at RERUN_BELOW of its step's forward or above is the whole forward, within the noise.
    whole = _LayerStats("h", "Block", forward_s=[1.0], rerun_s=[0.8 * RERUN_BELOW], checkpointed_forward_s=[0.8])
    assert _recompute_s(whole) is None
    assert _recompute_s(_LayerStats("h", "Block", forward_s=[1.0])) is None
    assert _recompute_s(_LayerStats("h", "Block", forward_s=[1.0], rerun_s=[0.5], checkpointed_forward_s=[0.0])) is None


def test_the_rerun_probe_pairs_each_rerun_with_its_forward_step_by_step():
    from memsched.runtime import tracer

    stats = [tracer._LayerStats("h.0", "Block"), tracer._LayerStats("h.1", "Block")]
    # Step 1: layer 0 forward 0->2, layer 1 forward 2->5, then inside the backward layer 1's re-run 5->7,
    # layer 0's 7->8. Step 2: layer 1 runs no forward (and so its re-run, if any, has no pair): only layer 0.
    clock = _TickClock([0, 2, 2, 5, 5, 7, 7, 8, 10, 13, 20, 22, 30, 31])
    probe = tracer._RerunProbe(stats, clock)  # type: ignore[arg-type]
    backward = [False, False, True, True]
    for i, inside in zip([0, 1, 1, 0], backward, strict=True):
        token = _entered(probe, i, inside)
        probe.leave(i, token, None)
    probe.collect()
    for i, inside in zip([0, 0, 1], [False, True, True], strict=True):
        probe.leave(i, _entered(probe, i, inside), None)
    probe.collect()
    assert (stats[0].checkpointed_forward_s, stats[0].rerun_s) == ([2, 3], [1, 2])
    assert (stats[1].checkpointed_forward_s, stats[1].rerun_s) == ([3], [2])


def _entered(probe, i: int, inside_backward: bool):
    with mock_graph_task(inside_backward):
        return probe.enter(i, (), {})


@contextlib.contextmanager
def mock_graph_task(inside_backward: bool):
    """torch._C._current_graph_task_id as inside (or outside) a backward, which is how the probe tells a
    checkpoint's re-run from a forward."""
    real = torch._C._current_graph_task_id
    torch._C._current_graph_task_id = lambda: 7 if inside_backward else -1
    try:
        yield
    finally:
        torch._C._current_graph_task_id = real


def test_a_failed_host_allocation_is_out_of_memory_with_its_fix() -> None:
    """The CPU allocator's RuntimeError ("can't allocate memory") is out of memory as CUDA's is: the tracer's
    refusal names the batch and sequence to lower, not 'the model fails on its own'."""
    import torch

    from memsched.runtime.tracer import _step_failed, out_of_memory

    host = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
        "allocate 10000000000 bytes. Error code 12 (Cannot allocate memory)"
    )
    assert out_of_memory(host) and out_of_memory(MemoryError()) and out_of_memory(torch.OutOfMemoryError("x"))
    assert not out_of_memory(RuntimeError("shape mismatch")) and not out_of_memory(ValueError("no"))
    assert "ran out of device memory" in _step_failed(host) and "--seq-len" in _step_failed(host)
