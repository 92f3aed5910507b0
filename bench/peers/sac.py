"""PyTorch's own module-level SAC MILP, run the way `auto_sac` runs it.

1. Under FakeTensorMode, one step of a fake copy of the model under MemTracker, RuntimeEstimator and
   SACEstimator ("operator-level-benchmark": the cost-model mode needs CUDA).
2. `aggregate_stats` -> `parse_module_info` -> `sac_milp(graph, budget_GiB, ac_units=<the blocks>)`: which blocks
   to checkpoint and what fraction of their activation memory to discard.
3. For every chosen block, `get_optimal_checkpointing_policy_per_module(stats, 1 - discard)`: which of its ops to
   save; applied with `checkpoint(..., context_fn=create_selective_checkpoint_contexts(policy))`.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from bench.peers.approaches import NotAvailable, Prepared, _patched_forwards, _plain_step
from bench.peers.models import ModelSpec

log = logging.getLogger(__name__)

_GIB = float(2**30)


def _ensure_pwlf(notes: list[str]) -> None:
    try:
        importlib.import_module("pwlf")
    except ImportError:
        from bench.peers import pwlf_shim

        sys.modules["pwlf"] = pwlf_shim
        notes.append(
            "pwlf is not installed (not on this machine's package index): its trade-off-curve fit was "
            "replaced by bench/peers/pwlf_shim.py (same continuous piecewise-linear model, numpy)"
        )


def _estimate(spec: ModelSpec) -> tuple[Any, Any, str]:
    """Run the three estimators on a fake copy; return (graph, sac_estimator, fqn prefix)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.ilp_utils import aggregate_stats, parse_module_info
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed._tools.runtime_estimator import RuntimeEstimator
    from torch.distributed._tools.sac_estimator import SACEstimator

    config = getattr(spec.model, "config", None)
    if config is None:
        raise NotAvailable("the SAC estimators need a fake copy of the model; this model has no config to rebuild it")
    device = next(spec.model.parameters()).device
    errors: list[str] = []
    # auto_sac's estimators come in two modes; try the measured one first, then the roofline model.
    for mode in ("operator-level-benchmark", "operator-level-cost-model"):
        fake_mode = FakeTensorMode()
        try:
            with fake_mode, device:
                fmodel: nn.Module = type(spec.model)(config).train()
                batch = {k: fake_mode.from_tensor(v) for k, v in spec.batch.items()}
                mem, rt, sac = MemTracker(), RuntimeEstimator(), SACEstimator()
                mem.track_external(fmodel)
                with rt(mode), sac(mode), mem:
                    out: Any = fmodel(**batch)
                    out.loss.backward()
        except (RuntimeError, AssertionError) as e:
            errors.append(f"{mode}: {type(e).__name__}: {str(e).strip().splitlines()[0]}")
            continue
        info = aggregate_stats(fmodel, mem, rt, sac, device)
        return parse_module_info(info), sac, type(fmodel).__name__
    joined = "; ".join(errors)
    if "CUDA" in joined or "Event" in joined:
        raise NotAvailable(
            f"the SAC estimators need CUDA here ({joined}): benchmark mode times ops with torch.cuda.Event and the "
            "cost model reads the GPU's capabilities"
        )
    raise NotAvailable(f"the SAC estimators failed under FakeTensorMode ({joined})")


_PROBED: dict[tuple[str, str], str | None] = {}


def _probe_in_child(spec: ModelSpec) -> None:
    """Run the estimators once in a child process first: on a machine without CUDA they can fail inside
    autograd's C++ engine and abort the whole process (seen on ResNet-50: "terminate called after throwing an
    instance of 'python_error'"), which would take the other approaches' results with it."""
    device = str(next(spec.model.parameters()).device)
    key = (spec.name, device)
    if key not in _PROBED:
        code = (
            "import sys, torch; from bench.peers.models import build; from bench.peers.sac import _estimate, "
            f"_ensure_pwlf; _ensure_pwlf([]); s = build({spec.name!r}, {spec.shape.get('batch_size', 1)}, "
            f"{spec.shape.get('seq_len') or spec.shape.get('image_size')}, torch.device({device!r})); _estimate(s)"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=False,
            cwd=str(Path(__file__).resolve().parents[2]),
        )
        if proc.returncode == 0:
            _PROBED[key] = None
        else:
            tail = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("USDT")]
            if proc.returncode < 0:
                said = " ".join(ln for ln in tail if "terminate" in ln or "what()" in ln) or "no message"
                _PROBED[key] = (
                    f"the SAC estimators aborted the process (signal {-proc.returncode}: {said}) on this CPU-only "
                    "machine; on GPT-2 and BERT the same estimators fail cleanly, naming CUDA "
                    "(torch.cuda.Event, GPU capabilities)"
                )
            else:
                last = next(
                    (ln for ln in reversed(tail) if "Error" in ln or "NotAvailable" in ln), tail[-1] if tail else ""
                )
                _PROBED[key] = f"{last.removeprefix('bench.peers.approaches.NotAvailable: ')}"
    if _PROBED[key] is not None:
        raise NotAvailable(str(_PROBED[key]))


def _policy_factory(save: list[int], counts: dict[str, int]) -> Callable[[], Any]:
    """A fresh op counter per checkpoint call: the i-th op of the block's forward gets decision save[i]."""

    def context_fn() -> Any:
        seen = {"fw": 0, "re": 0}

        def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            key = "re" if ctx.is_recompute else "fw"
            i = seen[key]
            seen[key] += 1
            counts["max_ops"] = max(counts.get("max_ops", 0), seen[key])
            if i < len(save) and save[i] == 1:
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context_fn


@contextlib.contextmanager
def prepare_sac(spec: ModelSpec, fraction: float) -> Iterator[Prepared]:
    from torch.distributed._tools.ilp_utils import get_peak_memory_runtime_baseline
    from torch.distributed._tools.sac_ilp import get_optimal_checkpointing_policy_per_module, sac_milp

    notes: list[str] = []
    _ensure_pwlf(notes)
    _probe_in_child(spec)
    graph, sac_est, prefix = _estimate(spec)
    fqn = {f"{prefix}.{p}": p for p in spec.block_paths}
    # sac_milp's budget is the whole estimated peak in GiB (params + grads + activations). Map our fraction
    # onto it the way docs/architecture.md ('Units and budgets') defines N%: what no checkpointing can move
    # + N% of the rest.
    peak, _ = get_peak_memory_runtime_baseline(graph)
    fixed = graph.nodes[0]["param_per_module"] + max(n["grad_total"] for n in graph.nodes)
    budget_gib = (fixed + fraction * max(0, peak - fixed)) / _GIB
    decisions, recompute_ms, est_peak = sac_milp(graph, memory_budget=budget_gib, ac_units=list(fqn))
    extra: dict[str, Any] = {
        "estimated_peak_bytes": int(peak),
        "milp_budget_bytes": int(budget_gib * _GIB),
        "milp_peak_bytes": int(est_peak),
        "milp_recompute_ms": recompute_ms,
        "decisions": {fqn.get(k, k): v for k, v in decisions.items()},
    }
    if est_peak == -1:
        raise NotAvailable(
            f"sac_milp found no solution at {budget_gib:.3f} GiB (its estimated keep-all peak is {peak / _GIB:.3f} GiB)"
        )
    counts: dict[str, int] = {}
    patches: dict[nn.Module, Callable[..., Any]] = {}
    for name, discard in decisions.items():
        path = fqn.get(name)
        if path is None:
            notes.append(f"sac_milp chose {name}, not a block: left as is")
            continue
        stats = sac_est.sac_mod_stats[name]
        save = get_optimal_checkpointing_policy_per_module(stats, memory_budget=max(0.0, min(1.0, 1 - discard)))
        block = spec.model.get_submodule(path)
        orig = block.forward
        ctx_fn = _policy_factory(save, counts)

        def fwd(*args: Any, _orig: Callable[..., Any] = orig, _ctx: Any = ctx_fn, **kwargs: Any) -> Any:
            return checkpoint(_orig, *args, use_reentrant=False, context_fn=_ctx, **kwargs)

        patches[block] = fwd
        extra.setdefault("ops_recorded", {})[path] = len(save)
    notes.append(
        f"MILP checkpoints {len(patches)} of {len(spec.block_paths)} blocks "
        f"(discard fractions {sorted({round(v, 2) for v in decisions.values()})})"
    )
    with _patched_forwards(patches):
        prepared = Prepared(_plain_step(spec), notes=notes, extra=extra)
        prepared.measure_fn = lambda: {"ops_seen_per_block_call": counts.get("max_ops", 0)}
        yield prepared
    torch._dynamo.reset()
