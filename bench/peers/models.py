"""The benchmarked models: transformers architectures at their published sizes, randomly initialised (no
download), dropout off so that every approach's gradients can be compared with keep-all's bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

MODELS = ("gpt2", "bert-base", "vit-base", "resnet50")


@dataclass
class ModelSpec:
    """A model, one fixed batch and where its repeated blocks live."""

    name: str
    model: nn.Module
    batch: dict[str, torch.Tensor]
    block_paths: list[str]
    """Module paths of the repeated blocks, in forward order."""
    shape: dict[str, int] = field(default_factory=dict)
    """batch_size / seq_len / image_size, for the report."""
    cache: dict[str, Any] = field(default_factory=dict)
    """Whatever approaches share across budgets (memsched's trace and schedules)."""

    def blocks(self) -> list[tuple[str, nn.Module]]:
        return [(p, self.model.get_submodule(p)) for p in self.block_paths]

    def loss(self) -> torch.Tensor:
        out: Any = self.model(**self.batch)
        return out.loss


def _gpt2(batch_size: int, seq_len: int, g: torch.Generator) -> ModelSpec:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch_size, seq_len), generator=g)
    paths = [f"transformer.h.{i}" for i in range(cfg.n_layer)]
    return ModelSpec(
        "gpt2", model, {"input_ids": ids, "labels": ids}, paths, {"batch_size": batch_size, "seq_len": seq_len}
    )


def _gpt2_tiny(batch_size: int, seq_len: int, g: torch.Generator) -> ModelSpec:
    """Two small GPT-2 blocks: for the harness's own smoke tests, not for results."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=64, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0
    )
    model = GPT2LMHeadModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch_size, seq_len), generator=g)
    return ModelSpec(
        "gpt2-tiny",
        model,
        {"input_ids": ids, "labels": ids},
        ["transformer.h.0", "transformer.h.1"],
        {"batch_size": batch_size, "seq_len": seq_len},
    )


def _bert(batch_size: int, seq_len: int, g: torch.Generator) -> ModelSpec:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForMaskedLM(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch_size, seq_len), generator=g)
    paths = [f"bert.encoder.layer.{i}" for i in range(cfg.num_hidden_layers)]
    return ModelSpec(
        "bert-base", model, {"input_ids": ids, "labels": ids}, paths, {"batch_size": batch_size, "seq_len": seq_len}
    )


def _vit(batch_size: int, image_size: int, g: torch.Generator) -> ModelSpec:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, image_size=image_size)
    cfg.num_labels = 1000  # a PretrainedConfig property (sets the label maps); the typed __init__ omits it
    model = ViTForImageClassification(cfg)
    x = torch.randn(batch_size, 3, image_size, image_size, generator=g)
    y = torch.randint(0, 1000, (batch_size,), generator=g)
    paths = [f"vit.layers.{i}" for i in range(cfg.num_hidden_layers)]  # transformers 5 layout
    return ModelSpec(
        "vit-base", model, {"pixel_values": x, "labels": y}, paths, {"batch_size": batch_size, "image_size": image_size}
    )


def _resnet50(batch_size: int, image_size: int, g: torch.Generator) -> ModelSpec:
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig()
    cfg.num_labels = 1000  # the defaults are ResNet-50: bottleneck, depths [3, 4, 6, 3]
    model = ResNetForImageClassification(cfg)
    x = torch.randn(batch_size, 3, image_size, image_size, generator=g)
    y = torch.randint(0, 1000, (batch_size,), generator=g)
    paths = [f"resnet.encoder.stages.{s}.layers.{i}" for s, d in enumerate(cfg.depths or ()) for i in range(d)]
    return ModelSpec(
        "resnet50", model, {"pixel_values": x, "labels": y}, paths, {"batch_size": batch_size, "image_size": image_size}
    )


_FACTORIES: dict[str, Callable[[int, int, torch.Generator], ModelSpec]] = {
    "gpt2": _gpt2,
    "bert-base": _bert,
    "vit-base": _vit,
    "resnet50": _resnet50,
    "gpt2-tiny": _gpt2_tiny,
}


def build(name: str, batch_size: int, size: int, device: torch.device, seed: int = 0) -> ModelSpec:
    """`size` is the sequence length for text models and the image side for vision models."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(_FACTORIES)}")
    torch.manual_seed(seed)
    spec = _FACTORIES[name](batch_size, size, torch.Generator().manual_seed(seed))
    spec.model.to(device).train()
    spec.batch = {k: v.to(device) for k, v in spec.batch.items()}
    return spec


def default_size(name: str) -> int:
    return 224 if name in ("vit-base", "resnet50") else 128
