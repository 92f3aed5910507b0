"""Helpers of the runtime integration tests (no tests here): tiny real transformers models and schedules
built by the optimizer's own constructors, so the runtime is checked against the cost model's decisions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from memsched.optimizer.decisions import Decision
from memsched.optimizer.simulate import make_schedule, simulate
from memsched.runtime import Workload, builtin_workload
from memsched.schema import Schedule, SolverRecord, SolverStatus, Trace

torch.set_num_threads(1)  # two shared cores: intra-op threads only oversubscribe them


def tiny(name: str = "gpt2", layers: int = 4, batch: int = 2, seq: int = 32, dropout: float | None = None) -> Workload:
    """A small-config model (hidden 64), no optimizer (gradients are what the tests compare)."""
    return builtin_workload(
        name, small=True, num_layers=layers, batch_size=batch, seq_len=seq, optimizer="none", dropout=dropout
    )


def tiny_llama(layers: int = 4, batch: int = 2, seq: int = 16, attention_dropout: float = 0.0) -> Workload:
    """A transformers Llama of hidden size 64 (grouped-query attention, rotary embeddings), cache off, seeded:
    blocks that take keyword tensors (rotary cos/sin, masks)."""
    import transformers as tf

    from memsched.runtime import Workload

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        attention_dropout=attention_dropout,
        use_cache=False,
    )
    model = tf.LlamaForCausalLM(cfg).train()
    ids = torch.randint(0, 256, (batch, seq))
    return Workload(model, "llama-tiny", {"input_ids": ids, "labels": ids}, batch, seq)


def schedule_of(trace: Trace, decisions: list[Decision], policy: str = "test", budget: int = 10**12) -> Schedule:
    sim = simulate(trace, decisions)
    record = SolverRecord(backend=policy, status=SolverStatus.HEURISTIC)
    return make_schedule(trace, sim.decisions, budget, policy, record)


def grads(
    w: Workload, model: Callable[..., Any] | None = None, seed: int = 0
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and parameter gradients of one forward+backward, with the RNG seeded (dropout masks match)."""
    w.model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = w.backward(model)
    return loss, {n: p.grad.detach().clone() for n, p in w.model.named_parameters() if p.grad is not None}


def assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    bad = [k for k in a if not torch.equal(a[k], b[k])]
    assert not bad, f"gradients differ bitwise in {bad[:5]}"


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k, v in a.items():
        torch.testing.assert_close(v, b[k], rtol=1e-5, atol=1e-7)


def free_port() -> int:
    """A free TCP port on loopback for a process group's rendezvous."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_gloo(rank: int, world: int, port: int) -> None:
    """Join a CPU (gloo) process group of `world` ranks on loopback, one torch thread per rank."""
    import os

    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
