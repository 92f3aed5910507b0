"""FSDP2 (fully_shard, gloo, 2 processes, CPU) under a schedule: same gradients, exactly the scheduled bytes
offloaded. Sharded parameters are gathered and freed around each block, so a freed parameter's address is
reused by activations: static memory must be recognised by storage identity, not by address."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_runtime_support import free_port, init_gloo, schedule_of, tiny

from memsched.io import load_schedule, save_model
from memsched.optimizer.decisions import offload_all, recompute
from memsched.runtime import apply_schedule, trace

fsdp = pytest.importorskip("torch.distributed.fsdp")
pytestmark = pytest.mark.skipif(
    not dist.is_available() or not hasattr(fsdp, "fully_shard"), reason="needs torch.distributed FSDP2"
)


def _worker(rank: int, world: int, port: int, folder: str) -> None:
    init_gloo(rank, world, port)
    try:
        from torch.distributed.fsdp import fully_shard

        w = tiny("gpt2", layers=4)
        for block in w.model.transformer.h:
            fully_shard(block)
        fully_shard(w.model)
        schedule = load_schedule(Path(folder) / "schedule.json")
        grads = {}
        for label in ("plain", "scheduled"):
            w.model.zero_grad(set_to_none=True)
            torch.manual_seed(7)
            if label == "plain":
                w.model(**w.batch).loss.backward()
            else:
                with apply_schedule(w.model, schedule) as sm:
                    sm(**w.batch).loss.backward()
                    offloaded = sm.pool_stats().allocated_bytes
            grads[label] = {n: p.grad.full_tensor() for n, p in w.model.named_parameters()}
        bitwise = all(torch.equal(grads["plain"][n], g) for n, g in grads["scheduled"].items())
        diff = max((grads["plain"][n] - g).abs().max().item() for n, g in grads["scheduled"].items())
        (Path(folder) / f"rank{rank}.json").write_text(
            json.dumps({"bitwise": bitwise, "max_diff": diff, "offloaded": offloaded})
        )
        dist.barrier()  # every rank done with gloo before anyone tears it down
    finally:
        dist.destroy_process_group()


def test_fsdp2_two_processes_under_a_schedule(tmp_path):
    w = tiny("gpt2", layers=4)
    tr = trace(w.model, w.step, steps=1, warmup=0, batch_size=2, seq_len=32, measure_bandwidth=False)
    decisions = [offload_all(tr, 0, 1, 1), recompute(), recompute(group=1), offload_all(tr, 3, 3, 3)]
    sched = schedule_of(tr, decisions)
    save_model(sched, tmp_path / "schedule.json")
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    for r in range(2):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert res["max_diff"] <= 1e-6, res
        assert res["offloaded"] == sum(a.offload.bytes for a in sched.actions if a.offload), res
