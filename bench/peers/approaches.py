"""One function per approach. Each is a context manager that prepares the model for a budget and yields a
`Prepared` step (forward + loss + backward on the spec's fixed batch); leaving it restores the model.

Budget-independent approaches (keep-all, checkpointing, save_on_cpu) ignore the fraction; the runner measures
them once and judges them against every budget.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from bench.peers.measure import Step, backward
from bench.peers.models import ModelSpec

log = logging.getLogger(__name__)


class NotAvailable(RuntimeError):  # a reason recorded as the row's status, not a bug
    """The approach cannot run here; the message is the recorded reason."""


@dataclass
class Prepared:
    """A ready step plus what the report should say about how it was obtained."""

    step: Step
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    """Approach-specific figures (solver record, predicted peak, the runtime's own ledger, ...)."""
    measure_fn: Callable[[], dict[str, Any]] | None = None
    """Called after the measured steps, inside the context, for figures the approach itself reports."""


Approach = Callable[[ModelSpec, float], contextlib.AbstractContextManager[Prepared]]


def _plain_step(spec: ModelSpec) -> Step:
    def step() -> None:
        backward(spec.loss())

    return step


@contextlib.contextmanager
def _patched_forwards(patches: dict[nn.Module, Callable[..., Any]]) -> Iterator[None]:
    """Replace module forwards by instance attributes; the class's forward comes back on exit."""
    try:
        for m, f in patches.items():
            m.forward = f
        yield
    finally:
        for m in patches:
            with contextlib.suppress(AttributeError):
                del m.forward


# ---------------------------------------------------------------------------------------------------------- #


@contextlib.contextmanager
def keep_all(spec: ModelSpec, fraction: float) -> Iterator[Prepared]:
    """Plain PyTorch: autograd keeps every saved tensor."""
    yield Prepared(_plain_step(spec))


@contextlib.contextmanager
def checkpoint_blocks(spec: ModelSpec, fraction: float) -> Iterator[Prepared]:
    """torch.utils.checkpoint(use_reentrant=False) around every block."""
    patches: dict[nn.Module, Callable[..., Any]] = {}
    for _, block in spec.blocks():
        orig = block.forward

        def fwd(*args: Any, _orig: Callable[..., Any] = orig, **kwargs: Any) -> Any:
            return checkpoint(_orig, *args, use_reentrant=False, **kwargs)

        patches[block] = fwd
    with _patched_forwards(patches):
        yield Prepared(_plain_step(spec), notes=[f"{len(patches)} blocks checkpointed"])


@contextlib.contextmanager
def checkpoint_sqrt(spec: ModelSpec, fraction: float) -> Iterator[Prepared]:
    """torch.utils.checkpoint.checkpoint_sequential over the blocks with round(sqrt(n)) segments.

    The models loop over their blocks themselves, so the first block runs the whole chain through
    checkpoint_sequential and the others pass their input through. The extra arguments the model gives each
    block (attention mask, ...) are the same for every block when training without a KV cache, so they are
    bound into each function; the gradient check proves the rewiring computes the same step.
    """
    blocks = [b for _, b in spec.blocks()]
    n = len(blocks)
    segments = max(1, round(math.sqrt(n)))
    origs = [b.forward for b in blocks]

    def first(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        fns = [(lambda h, _f=f: _f(h, *args, **kwargs)) for f in origs]
        return checkpoint_sequential(fns, segments, hidden, use_reentrant=False)

    def passthrough(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return hidden

    patches: dict[nn.Module, Callable[..., Any]] = {blocks[0]: first}
    patches.update({b: passthrough for b in blocks[1:]})
    size = n // segments
    with _patched_forwards(patches):
        yield Prepared(
            _plain_step(spec),
            notes=[f"{n} blocks, {segments} segments of {size}; the last segment is not checkpointed"],
        )


@contextlib.contextmanager
def save_on_cpu(spec: ModelSpec, fraction: float) -> Iterator[Prepared]:
    """torch.autograd.graph.save_on_cpu(pin_memory=True): every saved tensor goes to host memory."""
    notes: list[str] = []
    pin = True
    if not torch.cuda.is_available():
        # Pinning needs a CUDA context. Try what the user would type; if it raises, say so and use the
        # only setting that runs here.
        try:
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                spec.loss().backward()
            notes.append("pin_memory=True ran without CUDA")
        except Exception as e:  # noqa: BLE001 - any failure is the recorded fact
            pin = False
            notes.append(
                f"pin_memory=True failed without CUDA ({type(e).__name__}: {str(e).splitlines()[0]}); "
                "measured with pin_memory=False"
            )
        notes.append(
            "on a CPU-only machine host and 'device' memory are the same RAM: the copy to host cannot "
            "lower the measured peak, it only adds the copies' cost"
        )
        spec.model.zero_grad(set_to_none=False)

    def step() -> None:
        with torch.autograd.graph.save_on_cpu(pin_memory=pin):
            backward(spec.loss())

    yield Prepared(step, notes=notes, extra={"pin_memory": pin})


@contextlib.contextmanager
def compile_budget(spec: ModelSpec, fraction: float) -> Iterator[Prepared]:
    """torch.compile with torch._functorch.config.activation_memory_budget = fraction."""
    import torch._dynamo
    import torch._functorch.config as fconfig

    on_gpu = next(spec.model.parameters()).device.type == "cuda"
    backend = "inductor" if on_gpu else "aot_eager_decomp_partition"
    torch._dynamo.reset()  # a fresh cache: no graph compiled under another budget is reused
    compiled = torch.compile(spec.model, backend=backend)

    def step() -> None:
        out: Any = compiled(**spec.batch)
        backward(out.loss)

    try:
        # The budget is read when the joint graph is partitioned, i.e. at the first (warm-up) call: keep the
        # patch active for the whole run so a recompilation sees it too.
        with fconfig.patch(activation_memory_budget=fraction):
            yield Prepared(step, notes=[f"backend={backend}"], extra={"backend": backend})
    finally:
        torch._dynamo.reset()


@contextlib.contextmanager
def sac_milp(spec: ModelSpec, fraction: float) -> Iterator[Prepared]:
    """PyTorch's module-level SAC MILP (torch.distributed._tools.sac_ilp), applied with selective checkpointing."""
    from bench.peers.sac import prepare_sac

    with prepare_sac(spec, fraction) as prepared:
        yield prepared


@contextlib.contextmanager
def memsched(spec: ModelSpec, fraction: float) -> Iterator[Prepared]:
    """memsched: trace -> solve -> replay under apply_schedule."""
    from bench.peers.memsched_run import prepare_memsched

    with prepare_memsched(spec, fraction) as prepared:
        yield prepared


@contextlib.contextmanager
def memsched_recompute(spec: ModelSpec, fraction: float) -> Iterator[Prepared]:
    """memsched planning keep + recompute only (`--actions keep,recompute`): the recompute side of its trade on
    a GPU. On the CPU memsched's default is already this, so the row is not run twice."""
    from bench.peers.memsched_run import prepare_memsched

    with prepare_memsched(spec, fraction, no_offload=True) as prepared:
        prepared.notes.append("solved with actions keep,recompute")
        yield prepared


# Order of the report's tables and legends.
APPROACHES: dict[str, Approach] = {
    "keep-all": keep_all,
    "checkpoint-blocks": checkpoint_blocks,
    "checkpoint-sqrt": checkpoint_sqrt,
    "save_on_cpu": save_on_cpu,
    "torch.compile-budget": compile_budget,
    "sac-milp": sac_milp,
    "memsched": memsched,
    "memsched-recompute": memsched_recompute,
}
BUDGETED = frozenset({"torch.compile-budget", "sac-milp", "memsched", "memsched-recompute"})
"""Approaches that take the budget; the others are measured once and judged against every budget."""
LABELS = {
    "keep-all": "PyTorch keep-all",
    "checkpoint-blocks": "torch.utils.checkpoint per block",
    "checkpoint-sqrt": "checkpoint_sequential, sqrt(n) segments",
    "save_on_cpu": "save_on_cpu",
    "torch.compile-budget": "torch.compile activation_memory_budget",
    "sac-milp": "PyTorch SAC MILP (sac_ilp)",
    "memsched": "memsched",
    "memsched-recompute": "memsched, recompute only (actions keep,recompute)",
}
