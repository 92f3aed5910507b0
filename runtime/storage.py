"""Storage identity: the unit of deduplication for saved tensors (views of one storage are one allocation)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    """(device, data pointer) of the tensor's storage; valid while the storage is alive."""
    return (str(t.device), t.untyped_storage().data_ptr())


def storage_nbytes(t: torch.Tensor) -> int:
    """Bytes of the whole storage: what the allocator holds while any view of it is alive."""
    return int(t.untyped_storage().nbytes())


def tensor_nbytes(t: torch.Tensor) -> int:
    return int(t.numel() * t.element_size())


def is_sparse_or_meta(t: torch.Tensor) -> bool:
    return t.is_sparse or t.device.type == "meta" or t.is_nested


@dataclass
class StorageRef:
    """A weak reference to a storage with the key it had; `alive(t)` tells whether t still uses it."""

    ref: weakref.ref[torch.UntypedStorage]
    """The storage, weakly (PyTorch preserves the Python object while the storage lives)."""

    def same(self, t: torch.Tensor) -> bool:
        return self.ref() is t.untyped_storage()


def param_storages(module: torch.nn.Module) -> set[tuple[str, int]]:
    """Keys of parameter and buffer storages: static memory, never counted as saved activations."""
    keys = {storage_key(p) for p in module.parameters()}
    keys |= {storage_key(b) for b in module.buffers()}
    return keys
