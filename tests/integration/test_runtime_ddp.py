"""DDP (gloo, 2 processes) training under a schedule gives the same gradients as without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_runtime_support import free_port, init_gloo, schedule_of, tiny

from memsched.io import load_schedule, save_model
from memsched.optimizer.decisions import KEEP, offload_all, recompute
from memsched.runtime import apply_schedule, trace

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")


def _worker(rank: int, world: int, port: int, folder: str) -> None:
    init_gloo(rank, world, port)
    try:
        w = tiny("gpt2", layers=4)  # same seed on every rank: same initial weights
        gen = torch.Generator().manual_seed(100 + rank)  # but each rank its own data
        ids = torch.randint(0, 1024, w.batch["input_ids"].shape, generator=gen)
        w.batch = {"input_ids": ids, "labels": ids}
        ddp = torch.nn.parallel.DistributedDataParallel(w.model)
        out = {}
        for label in ("plain", "offload", "mixed"):
            ddp.zero_grad(set_to_none=True)
            torch.manual_seed(7)  # dropout masks equal across the runs
            if label == "plain":
                ddp(**w.batch).loss.backward()
            else:
                schedule = load_schedule(Path(folder) / f"{label}.json")
                with apply_schedule(ddp, schedule) as sm:  # names resolve through DDP's 'module.' prefix
                    sm(**w.batch).loss.backward()
            out[label] = {n: p.grad.detach().clone() for n, p in w.model.named_parameters()}
        result = {}
        for label in ("offload", "mixed"):
            diffs = [(out["plain"][n] - g).abs().max().item() for n, g in out[label].items()]
            bitwise = all(torch.equal(out["plain"][n], g) for n, g in out[label].items())
            # Gradients are all-reduced: every rank holds the same ones; a checksum compares the ranks.
            checksum = sum(float(g.double().sum()) for g in out[label].values())
            result[label] = {"max_diff": max(diffs), "bitwise": bitwise, "sum": checksum}
        (Path(folder) / f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()  # every rank done with gloo before anyone tears it down
    finally:
        dist.destroy_process_group()


def test_ddp_gloo_two_processes_same_gradients(tmp_path):
    w = tiny("gpt2", layers=4)
    tr = trace(w.model, w.step, steps=1, warmup=0, batch_size=2, seq_len=32, measure_bandwidth=False)
    offload = [offload_all(tr, 0, 1, 1), KEEP, offload_all(tr, 2, 3, 3), offload_all(tr, 3, 3, 3)]
    save_model(schedule_of(tr, offload), tmp_path / "offload.json")
    mixed = [offload_all(tr, 0, 1, 1), recompute(), recompute(group=1), KEEP]
    save_model(schedule_of(tr, mixed), tmp_path / "mixed.json")
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        assert r["offload"]["bitwise"], r  # keep + offload: bitwise, as on one process
        assert r["mixed"]["max_diff"] <= 1e-6, r  # recompute with dropout in the schedule: fp tolerance
    for label in ("offload", "mixed"):
        assert results[0][label]["sum"] == results[1][label]["sum"]  # the same all-reduced gradients
