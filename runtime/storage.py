"""Storage identity: the unit of deduplication for saved tensors (views of one storage are one allocation)."""

from __future__ import annotations

import weakref

import torch


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    """(device, data pointer) of the tensor's storage; valid while the storage is alive."""
    return (str(t.device), t.untyped_storage().data_ptr())


def storage_nbytes(t: torch.Tensor) -> int:
    """Bytes of the whole storage: what the allocator holds while any view of it is alive."""
    return int(t.untyped_storage().nbytes())


def tensor_nbytes(t: torch.Tensor) -> int:
    return int(t.numel() * t.element_size())


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding this rank's data: a DTensor's local shard (FSDP2 parameters), else t itself."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


class StaticStorages:
    """Storages of parameters and buffers: static memory, never counted or moved as activations.

    Membership is by storage identity (a weak reference per storage), not by address: a sharding wrapper
    (FSDP) frees gathered parameters between uses, and an activation allocated at a freed parameter's
    address must not pass for static."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}

    def add_module(self, module: torch.nn.Module) -> StaticStorages:
        for t in (*module.parameters(), *module.buffers()):
            s = local_tensor(t).untyped_storage()
            self._refs[id(s)] = weakref.ref(s)
        return self

    def add_tensor(self, t: torch.Tensor) -> None:
        """One more tensor's storage (a tensor without one, such as a functional wrapper, is left out)."""
        try:
            s = local_tensor(t).untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        self._refs[id(s)] = weakref.ref(s)

    def __contains__(self, t: object) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        s = t.untyped_storage()
        ref = self._refs.get(id(s))
        return ref is not None and ref() is s
