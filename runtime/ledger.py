"""The saved-tensor ledger: device bytes of live saved tensors, by the attribution rule (docs/architecture.md,
'Trace').

A storage is noted when a traced layer's forward saves it for backward (the innermost traced layer, the first
time in the step) and leaves the ledger when the storage is freed (a weakref finalizer on the storage, which
PyTorch keeps as one Python object per storage). So the ledger follows real lifetimes: an offloaded tensor
leaves at its done-by stage when the runtime drops it, a prefetched copy enters at issue, a recomputed tensor
enters during the recomputation. Host copies are not device bytes and are not counted.

The ledger is the per-layer, per-stage attribution of saved bytes, the part of memory a schedule moves. It is
not the step's peak: that is `memsched.runtime.memory` (every live tensor byte, on CUDA and on the CPU).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from memsched.runtime.storage import storage_nbytes


@dataclass
class LedgerStats:
    """What the ledger saw over one measured window."""

    peak_bytes: int
    """Maximum of the live saved bytes at any moment."""
    stage_peak_bytes: dict[str, int]
    """Maximum live saved bytes within each stage, keyed 'F{i}' / 'B{i}' (stage = layer index)."""
    live_bytes: int
    """Live saved bytes at the end of the window (0 after a complete step)."""
    per_layer_bytes: dict[int, int] = field(default_factory=dict)
    """Bytes noted per layer index in the window (each storage once, at its first note)."""


class SavedLedger:
    """Live saved-tensor bytes with stage marks. Thread-safe: autograd may run hooks on its own thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, tuple[int, int]] = {}  # id(storage) -> (bytes, layer)
        self._bytes = 0
        self._peak = 0
        self._stage = "setup"
        self._stage_peak: dict[str, int] = {}
        self._per_layer: dict[int, int] = {}
        self.on_mark: Callable[[str], None] | None = None
        """Called with each stage name after the ledger enters it (the whole-step meter's stage marks)."""

    def note(self, t: torch.Tensor, layer: int) -> None:
        """Count t's storage as a saved tensor of `layer`, unless it is already counted."""
        storage = t.untyped_storage()
        sid = id(storage)
        with self._lock:
            if sid in self._live:
                return
            nbytes = storage_nbytes(t)
            self._live[sid] = (nbytes, layer)
            self._bytes += nbytes
            self._per_layer[layer] = self._per_layer.get(layer, 0) + nbytes
            self._bump()
        weakref.finalize(storage, self._freed, sid)

    def forget(self, t: torch.Tensor) -> None:
        """Stop counting t's storage (it turned out to be static memory, not a saved tensor a schedule moves)."""
        with self._lock:
            entry = self._live.pop(id(t.untyped_storage()), None)
            if entry is not None:
                self._bytes -= entry[0]

    def _freed(self, sid: int) -> None:
        with self._lock:
            entry = self._live.pop(sid, None)
            if entry is not None:
                self._bytes -= entry[0]

    def _bump(self) -> None:
        self._peak = max(self._peak, self._bytes)
        self._stage_peak[self._stage] = max(self._stage_peak.get(self._stage, 0), self._bytes)

    def mark(self, stage: str) -> None:
        """Enter a stage ('F3', 'B3'): what is live now counts toward it."""
        with self._lock:
            self._stage = stage
            self._bump()
        if self.on_mark is not None:
            self.on_mark(stage)

    def reset(self) -> None:
        """Start a new window; storages still live stay counted (they are real memory)."""
        with self._lock:
            self._peak = self._bytes
            self._stage_peak = {}
            self._per_layer = {}

    @property
    def live_bytes(self) -> int:
        return self._bytes

    def stats(self) -> LedgerStats:
        with self._lock:
            return LedgerStats(self._peak, dict(self._stage_peak), self._bytes, dict(self._per_layer))
