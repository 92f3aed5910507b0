"""One offloaded storage: its host copy, the events of its two copies, and the handles autograd holds.

Autograd keeps a `_Handle` per saved tensor instead of the tensor. Several handles may share one record (views
of one storage, or a later layer saving a storage an earlier layer already offloaded): the storage moves once.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch

from memsched.runtime.copier import Copier
from memsched.runtime.ledger import SavedLedger
from memsched.runtime.pool import HostBufferPool

log = logging.getLogger(__name__)


class OffloadRecord:
    """A storage copied to a pooled host buffer, released from the device at its done-by stage and
    brought back by a prefetch (scheduled, or on demand if backward needs it first)."""

    def __init__(
        self,
        layer: int,
        storage: torch.UntypedStorage,
        copier: Copier,
        pool: HostBufferPool,
        ledger: SavedLedger | None,
    ) -> None:
        self.layer = layer
        self.nbytes = int(storage.nbytes())
        self._copier = copier
        self._pool = pool
        self._ledger = ledger
        self._lock = threading.Lock()
        self._host: torch.Tensor | None = pool.acquire(self.nbytes)
        # The device storage stays referenced until the done-by stage: the cost model counts it until then,
        # and on CUDA the D2H stream reads it until its event.
        self._device: torch.UntypedStorage | None = storage
        self._d2h = copier.offload(storage, self._host)
        self._prefetched: torch.Tensor | None = None
        self._h2d: Any = None
        self._handles = 0
        self.finished = False

    # -- forward side -------------------------------------------------------------------------------------

    def handle(self, t: torch.Tensor) -> _Handle:
        with self._lock:
            self._handles += 1
        return _Handle(self, t.dtype, int(t.storage_offset()), tuple(int(x) for x in t.size()), tuple(t.stride()))

    def release_device(self) -> None:
        """Done-by stage: the compute stream waits for the D2H copy, then the device storage is dropped."""
        with self._lock:
            if self._device is None:
                return
            self._copier.wait(self._d2h)
            self._device = None

    @property
    def released(self) -> bool:
        """Whether the done-by stage has let go of the device storage (the record no longer holds it)."""
        return self._device is None

    # -- backward side ------------------------------------------------------------------------------------

    def prefetch(self) -> None:
        """Issue the H2D copy (idempotent). Until the done-by stage the device storage is still there."""
        with self._lock:
            if self._prefetched is not None or self._device is not None:
                return
            if self._host is None:
                raise RuntimeError(
                    "memsched: an offloaded activation was used after its last backward (retain_graph=True "
                    "or a second backward over the same graph is not supported under an offload schedule)"
                )
            self._prefetched, self._h2d = self._copier.prefetch(self._host)
            if self._ledger is not None:
                self._ledger.note(self._prefetched, self.layer)

    def materialize(
        self, dtype: torch.dtype, offset: int, size: tuple[int, ...], stride: tuple[int, ...]
    ) -> torch.Tensor:
        """The saved tensor, on the device: waits for its own copy only."""
        self.prefetch()
        with self._lock:
            if self._device is not None:
                storage = self._device
            else:
                assert self._prefetched is not None
                self._copier.wait(self._h2d)
                storage = self._prefetched.untyped_storage()
        return torch.empty(0, dtype=dtype, device=self._copier.device).set_(storage, offset, size, stride)

    def _drop_handle(self) -> None:
        with self._lock:
            self._handles -= 1
            if self._handles > 0 or self.finished:
                return
            self.finished = True
            # Device memory a side stream may still touch (an offload never released, a prefetch never
            # unpacked: the graph was dropped) goes back to the allocator only after the compute stream waits.
            if self._device is not None:
                self._copier.wait(self._d2h)
            if self._prefetched is not None:
                self._copier.wait(self._h2d)
            host, self._host = self._host, None
            self._device = None
            self._prefetched = None
            # The last copy touching the host buffer: the prefetch if there was one, else the offload. The pool
            # reuses the buffer only after it (without blocking here, inside backward).
            last = self._h2d if self._h2d is not None else self._d2h
        if host is not None:
            self._pool.release(host, last)


class _Handle:
    """What autograd stores for an offloaded saved tensor: the record plus the view's geometry."""

    __slots__ = ("dtype", "offset", "record", "size", "stride")

    def __init__(
        self, record: OffloadRecord, dtype: torch.dtype, offset: int, size: tuple[int, ...], stride: tuple[int, ...]
    ) -> None:
        self.record = record
        self.dtype = dtype
        self.offset = offset
        self.size = size
        self.stride = stride

    def unpack(self) -> torch.Tensor:
        return self.record.materialize(self.dtype, self.offset, self.size, self.stride)

    def __del__(self) -> None:
        # Autograd frees the handle after the node that saved it ran (or when the graph is dropped):
        # the last handle of a record returns its host buffer to the pool.
        try:
            self.record._drop_handle()
        except Exception:  # never raise from __del__; a leaked buffer is logged instead
            log.exception("memsched: failed to release an offload record")
