"""Shared-memory batch buffers that a loader worker reuses once the trainer has let go of them.

A worker hands a batch to the trainer process in shared memory (no copy), and every batch used to get
fresh shared memory: the kernel allocates, zeroes and later frees each page of it, ~20 ms of system time for
a 16 MB omni row on a 2-core machine, more than building the row. So each worker keeps its buffers
(``slots``) and reuses one only after the trainer's copy of the batch that used it is gone:

- ``batch_scope`` (in ``OmnipackTaskEncoder.batch``) marks where a batch is built; ``take`` (behind
  ``profiles.inputs.batch_storage``) gives a free slot big enough, flags it busy in a small shared flags
  buffer and notes it in the batch's ``BufferLease``;
- the lease travels inside the batch; when the trainer process unpickles it, ``BufferLease.watch`` keeps
  weak references to the batch's storages there, and a later batch's arrival clears the flags of leases whose
  storages have all been freed (Python's and torch's references alike);
- a worker never waits for a slot: with none free it allocates fresh shared memory, as before. Slots
  taken outside a batch scope, or in one that fails, are never leased.

A lease that never reaches a trainer keeps its slots busy; the pool then allocates new ones, at most
``MAX_SLOTS`` per worker, and beyond that fresh memory per batch.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

MAX_SLOTS = 32  # per worker: batches in flight and held by the trainer, two buffers each
SLOT_ROUNDING = 1 << 20  # slot sizes are whole MiB, so rows of similar size share slots
FREE, BUSY = 0, 1


def _flags_view(storage: torch.UntypedStorage) -> np.ndarray:
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),)).numpy()


@dataclass
class BufferLease:
    """The pool slots one batch's tensors live in; ``watch`` (trainer side) frees them with the batch."""

    flags: torch.UntypedStorage  # the worker's flags buffer (shared memory)
    slots: tuple[int, ...]
    worker_pid: int = field(default_factory=os.getpid)
    watched: bool = False  # set in the process that watches it

    def watch(self, batch: Any) -> None:
        """In the process that received ``batch``: free its slots once every tensor storage it holds has
        been freed, checked whenever another batch arrives. Only the first process to receive the batch
        from its worker watches (not the worker itself, e.g. on a copy there, nor copies made later)."""
        if self.watched or os.getpid() == self.worker_pid:
            return
        self.watched = True
        refs = [StorageWeakRef(s) for s in _storages(batch)]
        if refs:  # a batch without tensors keeps its slots busy: nothing tells when they are free
            with _LOCK:
                _WATCHED.append((self, refs, _flags_view(self.flags)))
        sweep_released()

    def __getstate__(self) -> dict[str, Any]:
        # Sent on from the watching process (to another process, or deep-copied): the other copy maps
        # the same memory and nothing here would see it freed, so these slots are never given back.
        if self.watched:
            _unwatch(self)
        return dict(self.__dict__)


# (lease, storage weak refs, flags) of received batches not yet freed, in the receiving process; batches
# may be unpickled on the DataLoader's pin-memory thread, hence the lock.
_WATCHED: list[tuple[BufferLease, list[StorageWeakRef], np.ndarray]] = []
_LOCK = threading.Lock()


def sweep_released() -> int:
    """Clear the flags of received batches whose storages have all been freed; how many leases ended."""
    with _LOCK:
        ended = [w for w in _WATCHED if all(r.expired() for r in w[1])]
        for lease, _, flags in ended:
            flags[list(lease.slots)] = FREE
        _WATCHED[:] = [w for w in _WATCHED if all(w is not e for e in ended)]
    return len(ended)


def _unwatch(lease: BufferLease) -> None:
    with _LOCK:
        _WATCHED[:] = [w for w in _WATCHED if w[0] is not lease]


def _storages(value: Any) -> Iterator[torch.UntypedStorage]:
    """The tensor storages held by ``value`` (a batch dataclass, dicts, lists), each once."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            s = v.untyped_storage()
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                yield s
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):  # slotted ones have no __dict__
            stack.extend(getattr(v, f.name, None) for f in dataclasses.fields(v))
        elif hasattr(v, "__dict__") and not isinstance(v, type):
            stack.extend(vars(v).values())


@dataclass
class _Scope:
    taken: list[int] = field(default_factory=list)


class WorkerBufferPool:
    """One worker process's reusable shared-memory slots and their busy flags."""

    def __init__(self, max_slots: int = MAX_SLOTS) -> None:
        self.flags = torch.UntypedStorage._new_shared(max_slots)
        self._flags = _flags_view(self.flags)
        self._flags[:] = FREE
        self.slots: list[torch.UntypedStorage | None] = []
        self.max_slots = max_slots
        self.scope: _Scope | None = None
        self.allocated = 0  # shared buffers created (slots and unpooled), for tests and benchmarks

    def take(self, nbytes: int) -> torch.UntypedStorage:
        """A shared storage of at least ``nbytes``: a free slot (smallest fitting) inside a batch scope,
        else fresh shared memory."""
        if self.scope is None:
            self.allocated += 1
            return torch.UntypedStorage._new_shared(nbytes)
        free = [k for k in range(len(self.slots)) if self._flags[k] == FREE]
        fitting = [k for k in free if self.slots[k].nbytes() >= nbytes]  # type: ignore[union-attr]
        if fitting:
            k = min(fitting, key=lambda k: self.slots[k].nbytes())  # type: ignore[union-attr]
        else:
            if free:  # a free slot too small for this batch: replace it (its memory goes back)
                k = max(free, key=lambda k: self.slots[k].nbytes())  # type: ignore[union-attr]
            elif len(self.slots) < self.max_slots:
                k = len(self.slots)
                self.slots.append(None)
            else:
                self.allocated += 1
                return torch.UntypedStorage._new_shared(nbytes)
            self.slots[k] = None
            self.allocated += 1
            self.slots[k] = torch.UntypedStorage._new_shared(-(-nbytes // SLOT_ROUNDING) * SLOT_ROUNDING)
        self._flags[k] = BUSY
        self.scope.taken.append(k)
        return self.slots[k]  # type: ignore[return-value]

    @contextmanager
    def batch_scope(self) -> Iterator[_Scope]:
        """Slots taken inside belong to one batch; on an error they are free again."""
        if self.scope is not None:  # nested: the outer scope owns the slots
            yield self.scope
            return
        self.scope = scope = _Scope()
        try:
            yield scope
        except BaseException:
            self._flags[scope.taken] = FREE
            raise
        finally:
            self.scope = None

    def lease(self, scope: _Scope) -> BufferLease | None:
        return BufferLease(self.flags, tuple(scope.taken)) if scope.taken else None


_POOL: tuple[int, WorkerBufferPool] | None = None


def worker_pool() -> WorkerBufferPool | None:
    """This loader worker's pool (None outside a DataLoader worker: batches stay in private memory)."""
    global _POOL
    if torch.utils.data.get_worker_info() is None:
        return None
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), WorkerBufferPool())
    return _POOL[1]
