"""LayerDrop off while tracing.

LayerDrop (Fan et al., 2019) skips whole layers at random in training: `transformers` models keep its
probability as `layerdrop`, `encoder_layerdrop` or `decoder_layerdrop`, on their config or on the module that
runs the layer loop (BART, Whisper, Marian and the speech encoders; Wav2Vec2 has 0.1 by default). A trace
describes one step whose every layer runs once, so the tracer runs its steps with those probabilities at 0 and
says so: the trace is then the step that runs every layer, the most a step holds, and the replay runs the
steps that skip some (runtime/README.md, 'Layers a step skips'). A model that skips layers another way is
refused by the tracer with the cause named (`tracer._not_every_step`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

LAYERDROP_ATTRIBUTES = ("layerdrop", "encoder_layerdrop", "decoder_layerdrop")
"""The names `transformers` gives a LayerDrop probability, on a config or on a module."""


@contextlib.contextmanager
def layerdrop_off(model: nn.Module) -> Iterator[list[str]]:
    """Within the block, every positive LayerDrop probability that the model's modules or their configs hold is
    0; yields them as `name=value` (empty where there are none). Put back on exit."""
    switched: list[tuple[object, str, float]] = []
    seen: set[int] = set()
    for module in model.modules():
        for owner in (module, getattr(module, "config", None)):
            if owner is None or id(owner) in seen:
                continue
            seen.add(id(owner))
            for attr in LAYERDROP_ATTRIBUTES:
                value = getattr(owner, attr, None)
                if isinstance(value, float | int) and not isinstance(value, bool) and value > 0:
                    switched.append((owner, attr, value))
                    setattr(owner, attr, 0.0)
    try:
        yield sorted({f"{attr}={value:g}" for _, attr, value in switched})
    finally:
        for owner, attr, value in reversed(switched):
            setattr(owner, attr, value)
