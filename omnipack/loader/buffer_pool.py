"""Shared-memory batch buffers that a loader worker reuses once nothing can read them any more.

A worker hands a batch to the trainer process in shared memory (no copy). With fresh shared memory for
every batch the kernel allocates, zeroes and later frees each page of it: ~20 ms of system time for a
16 MB omni row on a 2-core machine, more than building the row. So each worker keeps its buffers
(``slots``) and writes one again only when no process can still read the batch it held:

- ``WorkerBufferPool.batch_scope`` (in ``OmnipackTaskEncoder.batch``) marks where a batch is built; ``take``
  (behind ``batch_storage``, the allocator the task encoder hands the family's ``collate_media``) cuts
  each buffer from the batch's slot, a free one sized for the largest batch so far (flagged busy in a
  small shared flags buffer), so a batch is usually one slot: one slot's file descriptor to hand over
  (plus the flags'). The batch carries a ``BufferLease`` naming its slots.
- Pickled in the worker (``BufferLease.pack``), the batch's tensors in slots travel as ``SlotView``
  references and each slot's storage once, through torch's own sharing.
- Unpickled in the trainer process (``BufferLease.unpack``), the views are rebuilt over a private
  (non-shared) torch storage that aliases the slot's memory. Sending such a tensor on to another process
  (spawn, forkserver, a torch.multiprocessing queue, ``share_memory_``) therefore moves its storage into
  fresh shared memory: torch copies a storage that is not shared yet. Tensors under 1/``PIN_RATIO`` of the
  memory they view (tokens, boundaries, grids; ``unpin_small``) are copied into memory of their own there,
  so a kept ``cu_seqlens`` never keeps a slot (nor, with ``reuse_buffers=False``, the batch's shared
  buffer). The lease keeps only weak references to the slots' shared storages; once they are gone
  (every tensor of the batch freed or moved), a later batch's arrival flags the slots free.
- Fork: a forked child inherits the trainer's mappings, so it can read a slot after the trainer let go of
  it. At every fork (``os.register_at_fork``) the trainer marks the batches it still maps; once freed,
  their slots are flagged RETIRED instead of free, and the worker drops them (the memory goes when the
  child does too) and makes new ones. The child never frees the parent's slots. A worker that forks, or
  that still holds a tensor of a batch it sent, never rewrites those slots either.
- A batch dropped in the worker without being sent (Energon skipping to a restored checkpoint) frees its
  slots when its lease is collected there.
- A worker never waits for a slot: with none free it takes fresh shared memory, as before.

Not covered: a fork made by C code that bypasses Python's fork hooks while the trainer still holds a
batch (``reuse_buffers=False`` for such trainers).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ..alignment import pad_to_multiple
from ..profiles.model_inputs import storage_view

MAX_SLOTS = 32  # per worker: batches in flight and held by the trainer, a few buffers each
SLOT_ROUNDING = 1 << 20  # slot sizes are whole MiB, so rows of similar size share slots
ALIGN = 64  # byte alignment of the buffers cut from a slot
# A received tensor under 1/PIN_RATIO of the memory it would keep alive is copied into memory of its own:
# holding one tensor of a batch never keeps more than PIN_RATIO times its bytes alive.
PIN_RATIO = 8
# Slot flags. RETIRED: freed by the trainer, but a process forked while it held the batch may still map
# the slot, so the worker drops it and never writes it again.
FREE, BUSY, RETIRED = 0, 1, 2


def _storage_use_count(storage: torch.UntypedStorage) -> int:
    """How many holders (the storage object, tensors viewing it) share ``storage``'s memory; 1 where torch
    does not tell."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return 1 if count is None else int(count(storage._cdata))


def _bytes_view(storage: torch.UntypedStorage) -> torch.Tensor:
    return storage_view(storage, 0, (storage.nbytes(),), torch.uint8)


@dataclass(frozen=True)
class SlotView:
    """A batch tensor as it travels: where it sits in slot ``slot`` (element offset, shape, strides)."""

    slot: int
    dtype: torch.dtype
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def over(self, slot_bytes: torch.Tensor) -> torch.Tensor:
        return slot_bytes.view(self.dtype).as_strided(self.shape, self.stride, self.offset)


def _map_tensors(value: Any, fn: Callable[[Any], Any]) -> Any:
    """``value`` with ``fn`` applied to every tensor / SlotView inside dicts, lists and tuples."""
    if isinstance(value, (torch.Tensor, SlotView)):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value


@dataclass
class BufferLease:
    """The pool slots a batch's tensors live in (see the module)."""

    flags: torch.UntypedStorage  # the worker's flags buffer (shared memory)
    slots: tuple[int, ...]
    storages: dict[int, torch.UntypedStorage] | None  # the slots' storages; None once unpacked
    worker_pid: int = field(default_factory=os.getpid)
    pool: WorkerBufferPool | None = field(default=None, repr=False)  # in the worker only
    serial: int = 0  # which of the pool's leases this is (the pool remembers each slot's last one)
    sent: bool = False  # pickled in the worker: from then on the receiving process frees the slots

    def __getstate__(self) -> dict[str, Any]:
        if os.getpid() == self.worker_pid:
            self.sent = True
        return {**self.__dict__, "pool": None}

    def __del__(self) -> None:
        # A batch dropped in the worker without being sent (e.g. skipped to reach a restored checkpoint):
        # nothing else will ever free its slots.
        if self.pool is not None and not self.sent and os.getpid() == self.worker_pid:
            self.pool.release(self)

    def pack(self, state: Any) -> Any:
        """In the worker: ``state`` (a pickled batch's) with every tensor in a slot as a ``SlotView``."""
        if os.getpid() != self.worker_pid or self.storages is None:
            return state
        if self.pool is not None and any(self.pool.owner.get(k) != self.serial for k in self.slots):
            raise RuntimeError(
                "a loader batch is being sent again after its shared buffers were reused for another batch; "
                "build a new batch (or pass reuse_buffers=False)"
            )
        by_ptr = {s.data_ptr(): k for k, s in self.storages.items()}

        def ref(t: Any) -> Any:
            k = by_ptr.get(t.untyped_storage().data_ptr()) if isinstance(t, torch.Tensor) else None
            if k is None:
                return t
            return SlotView(k, t.dtype, t.storage_offset(), tuple(t.shape), tuple(t.stride()))

        return _map_tensors(state, ref)

    def unpack(self, state: Any) -> Any:
        """Where the batch is unpickled: ``state`` with its ``SlotView``s as tensors. In another process
        than the worker they alias the slots through private storages, and the lease starts watching."""
        storages = self.storages
        if storages is None:
            return state
        if os.getpid() == self.worker_pid:
            # A copy inside the worker (copy.copy shares this lease with the original): plain views of its
            # own slots, and the lease keeps its storages, so the original still travels as slot references.
            return _map_tensors(state, lambda v: v.over(_bytes_view(storages[v.slot])) if isinstance(v, SlotView) else v)
        self.storages = None
        # torch.from_numpy gives a storage torch does not consider shared, holding the numpy array (and
        # through it the slot's shared storage) until that storage is freed or moved to new shared memory.
        # Small tensors are then copied out of the slot (``unpin_small``), so that they never keep it.
        private = {k: torch.from_numpy(_bytes_view(s).numpy()) for k, s in storages.items()}
        out = _map_tensors(state, lambda v: v.over(private[v.slot]) if isinstance(v, SlotView) else v)
        out = unpin_small(out)
        _watch(self, [StorageWeakRef(s) for s in storages.values()])
        return out


def unpin_small(state: Any) -> Any:
    """``state`` with every tensor under 1/``PIN_RATIO`` of the storage it views (a batch's slot, or the
    one shared buffer of its small tensors) copied into memory of its own: a tensor kept from a received
    batch keeps at most ``PIN_RATIO`` times its bytes alive, never the whole batch."""

    def own(t: Any) -> Any:
        small = isinstance(t, torch.Tensor) and t.nbytes * PIN_RATIO < t.untyped_storage().nbytes()
        return t.clone() if small else t

    return _map_tensors(state, own)


@dataclass
class _Watched:
    """A received batch's lease, in the trainer process."""

    lease: BufferLease
    refs: list[StorageWeakRef]  # to the slots' shared storages here
    flags: np.ndarray  # the worker's slot flags
    forked: bool = False  # this process forked while it mapped the slots: the child may map them too


# Received batches not yet freed; batches may be unpickled on the DataLoader's pin-memory thread, hence
# the lock.
_WATCHED: list[_Watched] = []
_LOCK = threading.Lock()


def _watch(lease: BufferLease, refs: list[StorageWeakRef]) -> None:
    with _LOCK:
        _WATCHED.append(_Watched(lease, refs, _bytes_view(lease.flags).numpy()))
    sweep_released()


def sweep_released() -> int:
    """Flag free the slots of received batches whose slot storages have all been freed here (retired
    instead where this process forked while it mapped them); how many leases ended."""
    with _LOCK:
        ended = [w for w in _WATCHED if all(r.expired() for r in w.refs)]
        for w in ended:
            w.flags[list(w.lease.slots)] = RETIRED if w.forked else FREE
        _WATCHED[:] = [w for w in _WATCHED if all(w is not e for e in ended)]
    return len(ended)


def _before_fork() -> None:
    # A forked child inherits every mapping of this process: a slot mapped now may be read there for as
    # long as the child lives, whatever this process does, so the worker must never write it again. The
    # lock is held through the fork so that no batch arrives unmarked in between.
    _LOCK.acquire()
    for w in _WATCHED:
        if not all(r.expired() for r in w.refs):
            w.forked = True
    if _POOL is not None and _POOL[0] == os.getpid():  # a loader worker forks (code of its own)
        _POOL[1].mark_forked()


def _after_fork_in_parent() -> None:
    _LOCK.release()


def _after_fork_in_child() -> None:
    # The child frees nothing of the parent's batches (the parent may still hold them).
    global _LOCK
    _WATCHED.clear()
    _LOCK = threading.Lock()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


@dataclass
class _Scope:
    taken: list[int] = field(default_factory=list)  # slots of this batch, in the order taken
    used: int = 0  # bytes given out of the last slot taken
    total: int = 0  # bytes given out in this scope


class WorkerBufferPool:
    """One worker process's reusable shared-memory slots and their busy flags.

    Inside a batch scope, buffers are cut one after the other from the scope's slot (``ALIGN``-byte
    aligned), and a slot is sized for the largest batch seen so far, so a batch usually lives in ONE slot:
    the hand-over passes one file descriptor per storage (a socket round trip each, ~0.75 ms here), and an
    omni batch has 6-8 buffers."""

    def __init__(self, max_slots: int = MAX_SLOTS) -> None:
        self.flags = torch.UntypedStorage._new_shared(max_slots)
        self._flags = _bytes_view(self.flags).numpy()
        self._flags[:] = FREE
        self.slots: list[torch.UntypedStorage] = []
        self.owner: dict[int, int] = {}  # the serial of the lease each slot was last given to
        self.leases = 0  # leases given out
        self.max_slots = max_slots
        self.scope: _Scope | None = None
        self.batch_bytes = 0  # the most bytes one batch has taken: a new slot is made this big
        self.allocated = 0  # shared buffers created (slots and fresh ones), for tests and benchmarks
        self.retired = 0  # slots dropped because another holder may still read them
        self.forked: set[int] = set()  # slots that held a batch when this worker forked

    def _viewed_here(self, k: int) -> bool:
        """Whether something in this worker besides the pool still holds slot ``k`` (a tensor of a batch
        already sent, kept by code in the worker)."""
        return _storage_use_count(self.slots[k]) > 1

    def mark_forked(self) -> None:
        """This worker forks: a slot holding a batch now may be read by the child, so it is never reused."""
        self.forked |= {k for k in range(len(self.slots)) if self._flags[k] != FREE or self._viewed_here(k)}

    def _drop_retired(self) -> None:
        """Let go of every slot that must not be written again: retired by the trainer (a process it
        forked may map it), or free but still viewed here or by a process this worker forked. The memory
        goes once the last process mapping it lets go; the index gets a new slot when one is next needed."""
        for k in range(len(self.slots)):
            flag = self._flags[k]
            if flag == RETIRED or (flag == FREE and (k in self.forked or self._viewed_here(k))):
                self.slots[k] = torch.UntypedStorage(0)  # free and too small: replaced by a new slot
                self._flags[k] = FREE
                self.forked.discard(k)
                self.retired += 1

    def release(self, lease: BufferLease) -> None:
        """Flag free the slots of a lease that was dropped in this worker without being sent."""
        for k in lease.slots:
            if self.owner.get(k) == lease.serial:
                self._flags[k] = FREE

    def _new(self, nbytes: int) -> torch.UntypedStorage:
        storage = torch.UntypedStorage._new_shared(nbytes)
        self.allocated += 1
        return storage

    def take(self, nbytes: int) -> tuple[torch.UntypedStorage, int]:
        """``(storage, byte offset)`` of ``nbytes`` of shared memory: inside a batch scope the next aligned
        bytes of the scope's slot, or of a new one (the smallest free slot that fits what a batch takes);
        outside a scope, or with every slot busy, fresh shared memory."""
        if self.scope is None:
            return self._new(max(nbytes, 1)), 0
        scope = self.scope
        size = pad_to_multiple(max(nbytes, 1), ALIGN)
        if scope.taken and scope.used + size <= self.slots[scope.taken[-1]].nbytes():
            offset = scope.used
            scope.used += size
            scope.total += size
            return self.slots[scope.taken[-1]], offset
        wanted = max(size, self.batch_bytes - scope.total)
        free = [k for k in range(len(self.slots)) if self._flags[k] == FREE]
        fitting = [k for k in free if self.slots[k].nbytes() >= wanted]
        if fitting:
            k = min(fitting, key=lambda k: self.slots[k].nbytes())
        else:
            rounded = pad_to_multiple(wanted, SLOT_ROUNDING)
            if free:  # a free slot too small for this batch: replace it (its memory goes back)
                k = max(free, key=lambda k: self.slots[k].nbytes())
                self.slots[k] = self._new(rounded)
            elif len(self.slots) < self.max_slots:
                self.slots.append(self._new(rounded))
                k = len(self.slots) - 1
            else:
                return self._new(size), 0
        self._flags[k] = BUSY
        scope.taken.append(k)
        scope.used = size
        scope.total += size
        return self.slots[k], 0

    @contextmanager
    def batch_scope(self) -> Iterator[_Scope]:
        """Slots taken inside belong to one batch; on an error they are free again."""
        if self.scope is not None:  # nested: the outer scope owns the slots
            yield self.scope
            return
        self._drop_retired()
        self.scope = scope = _Scope()
        try:
            yield scope
        except BaseException:
            self._flags[scope.taken] = FREE
            raise
        finally:
            self.scope = None
        self.batch_bytes = max(self.batch_bytes, scope.total)

    def lease(self, scope: _Scope) -> BufferLease | None:
        """The lease of a finished scope's slots (None if it took none)."""
        if not scope.taken:
            return None
        self.leases += 1
        storages = {k: self.slots[k] for k in scope.taken}
        lease = BufferLease(self.flags, tuple(scope.taken), storages, pool=self, serial=self.leases)
        for k in scope.taken:
            self.owner[k] = lease.serial
        return lease


_POOL: tuple[int, WorkerBufferPool] | None = None


def worker_pool() -> WorkerBufferPool | None:
    """This loader worker's pool (None outside a DataLoader worker: batches stay in private memory)."""
    global _POOL
    if torch.utils.data.get_worker_info() is None:
        return None
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), WorkerBufferPool())
    return _POOL[1]


def batch_storage(nbytes: int) -> tuple[torch.UntypedStorage, int]:
    """``(storage, byte offset)``: ``nbytes`` for batch tensors, the loader's ``MediaInputOptions.allocate``.
    In a DataLoader worker it is shared memory (as torch's own default collate does), so sending the batch
    to the main process copies no bytes; there the buffers of one batch are cut from one reused slot
    (``WorkerBufferPool.take``). Elsewhere an ordinary new storage. Every batch buffer of the loader is
    allocated here."""
    nbytes = max(int(nbytes), 1)
    pool = worker_pool()
    if pool is None:
        return torch.UntypedStorage(nbytes), 0
    return pool.take(nbytes)
