"""Blocks with a custom autograd Function that keeps a tensor on its ctx, or saves it for backward: the models of
the ctx-held tests (Layer.ctx_held_bytes; docs/cost-model.md, 'Tensors kept on a ctx')."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class KeepsOnCtx(torch.autograd.Function):
    """x * x, whose backward reads a copy of x kept as a ctx attribute, not through ctx.save_for_backward (as
    8-bit matmuls keep their quantisation state): no saved-tensor hook sees it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.x = x.detach() * 1.0
        return x * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return 2 * ctx.x * g


class SavesIt(torch.autograd.Function):
    """The same through ctx.save_for_backward: the hooks see it, so a schedule moves it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x.detach() * 1.0)
        return x * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * g


class CtxBlock(nn.Module):
    """norm -> Linear(d, 2d) -> `fn` -> tanh -> Linear(2d, d), plus the residual."""

    def __init__(self, fn: type[torch.autograd.Function], d: int = 32) -> None:
        super().__init__()
        self.fn = fn
        self.a, self.b, self.norm = nn.Linear(d, 2 * d), nn.Linear(2 * d, d), nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.tanh(self.fn.apply(self.a(self.norm(x)))))
