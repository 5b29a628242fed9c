"""Loader workers reuse their shared-memory batch buffers only once the trainer has freed the batch."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest
import torch
from megatron.energon import WorkerConfig, get_loader, get_val_dataset

from omnipack.loader import buffer_pool
from omnipack.loader.buffer_pool import FREE, BufferLease, WorkerBufferPool, sweep_released
from omnipack.loader.task_encoder import OmnipackTaskEncoder
from omnipack.profiles.inputs import storage_view

PROFILE = "qwen3_omni"


class FakeBatch:
    """What a batch holds, as far as the lease is concerned: tensors in attributes, dicts and lists."""

    def __init__(self, **tensors: object) -> None:
        self.__dict__.update(tensors)


def _received(pool: WorkerBufferPool, sizes: list[int]) -> tuple[FakeBatch, BufferLease]:
    """A batch built in the pool's slots, leased, and its trainer-side copy watched as the trainer process
    does on unpickling (there the tensors map the same memory through storages of their own; here they are
    clones, so that their lifetime is the trainer's alone, as it is across processes)."""
    with pool.batch_scope() as scope:
        storages = [pool.take(n) for n in sizes]
        built = [storage_view(s, 0, (n,), torch.uint8) for s, n in zip(storages, sizes, strict=True)]
    lease = pool.lease(scope)
    assert lease is not None
    batch = FakeBatch(a=built[0].clone(), rest={"b": [t.clone() for t in built[1:]]})
    lease.watch(batch)  # in the worker itself: ignored
    assert not lease.watched and all(w[0] is not lease for w in buffer_pool._WATCHED)
    lease.worker_pid = -1  # as received from another process
    lease.watch(batch)
    return batch, lease


@pytest.fixture(autouse=True)
def _no_leftover_watches():
    buffer_pool._WATCHED.clear()
    yield
    buffer_pool._WATCHED.clear()


def test_a_slot_is_reused_only_after_every_tensor_of_its_batch_is_freed():
    pool = WorkerBufferPool(max_slots=8)
    batch, lease = _received(pool, [3 << 20, 1000])
    assert lease.slots == (0, 1) and pool.allocated == 2
    flags = pool._flags
    first = [pool.slots[k].data_ptr() for k in lease.slots]
    view = batch.a[10:20]  # a view the trainer keeps: the storage lives on
    del batch
    assert sweep_released() == 0 and flags[0] != FREE and flags[1] != FREE
    del view
    assert sweep_released() == 1 and flags[0] == FREE and flags[1] == FREE
    batch2, lease2 = _received(pool, [2 << 20, 500])
    assert sorted(lease2.slots) == [0, 1] and pool.allocated == 2  # the same buffers, nothing new
    assert {pool.slots[k].data_ptr() for k in lease2.slots} == set(first)
    assert pool.slots[lease2.slots[0]].data_ptr() == first[0]  # smallest fitting slot for the big buffer


def test_held_batches_get_new_slots_and_the_pool_falls_back_to_fresh_memory():
    pool = WorkerBufferPool(max_slots=3)
    held = [_received(pool, [1 << 20]) for _ in range(3)]
    assert len(pool.slots) == 3 and pool.allocated == 3
    with pool.batch_scope() as scope:  # every slot is in the trainer's hands: fresh memory, not leased
        extra = pool.take(1 << 20)
    assert pool.lease(scope) is None and pool.allocated == 4
    assert extra.data_ptr() not in {s.data_ptr() for s in pool.slots}
    assert sweep_released() == 0
    del held
    assert sweep_released() == 3 and not pool._flags.any()


def test_a_failed_batch_frees_its_slots_and_a_bigger_batch_replaces_a_free_slot():
    pool = WorkerBufferPool(max_slots=2)
    with pytest.raises(RuntimeError), pool.batch_scope():
        pool.take(1 << 20)
        raise RuntimeError("batch failed")
    assert pool._flags[0] == FREE and pool.scope is None
    batch, _ = _received(pool, [1 << 20])
    del batch
    assert sweep_released() == 1
    big, lease = _received(pool, [5 << 20])
    assert lease.slots == (0,) and pool.slots[0].nbytes() == 5 << 20 and len(pool.slots) == 1
    assert pool.take(10) is not None and pool.allocated == 3  # outside a scope: fresh, never a slot


def test_no_pool_outside_a_loader_worker():
    assert buffer_pool.worker_pool() is None


def test_a_batch_sent_on_or_copied_by_the_trainer_process_keeps_its_slots():
    """The trainer process may pickle a received batch to another process (or deep-copy it): the other copy
    maps the same memory, so the slots are never reused; a copy is not watched a second time."""
    import copy

    pool = WorkerBufferPool(max_slots=4)
    batch, lease = _received(pool, [1 << 20])
    twin = copy.deepcopy(batch)
    twin.lease = copy.deepcopy(lease)
    assert twin.lease.watched and not buffer_pool._WATCHED  # the original is no longer watched
    twin.lease.watch(twin)
    assert not buffer_pool._WATCHED
    del batch, twin
    assert sweep_released() == 0 and pool._flags[lease.slots[0]] != FREE


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    from omnipack.demo.corpus import build_demo_corpus
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.pipeline import PrepareConfig, run_prepare
    from omnipack.profiles import get_profile

    root = tmp_path_factory.mktemp("pool")
    tok = build_demo_tokenizer(root / "tok", profile=PROFILE)
    manifest, media = build_demo_corpus(root / "src", num_samples=40, kinds=get_profile(PROFILE).kinds)
    out = root / "ds"
    run_prepare(
        PrepareConfig(
            manifest=[str(manifest)],
            media_root=str(media),
            tokenizer=str(tok),
            output=str(out),
            profile=PROFILE,
            seq_length=512,
            shard_max_rows=4,
            progress=False,
        )
    )
    return out


def _batches(ds: Path, workers: int):
    te = OmnipackTaskEncoder.from_dataset(ds)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    return get_loader(get_val_dataset(str(ds), split_part="train", batch_size=1, worker_config=wc, task_encoder=te))


def _content(batch) -> dict[str, torch.Tensor]:
    out = {k: v.clone() for k, v in batch.as_dict().items() if isinstance(v, torch.Tensor)}
    return {**out, **{f"raw.{k}": v.clone() for k, v in (batch.encoder_inputs or {}).items()}}


def _inode(t: torch.Tensor) -> int:
    fd, _ = t.untyped_storage()._share_fd_cpu_()
    return os.fstat(fd).st_ino


@pytest.mark.parametrize("hold", [0, 3, None])
def test_worker_batches_equal_in_process_batches_while_buffers_are_reused(dataset, hold):
    """Two real Energon workers: every batch equals the in-process one when it is read, whether the
    trainer drops batches at once (buffers reused), holds the last ``hold`` batches, or holds all of them
    (``None``: no buffer may be reused while its batch is alive)."""
    expected = {b.__key__[0]: _content(b) for b in _batches(dataset, 0)}
    assert len(expected) >= 12
    held: collections.deque = collections.deque()
    inodes, keys = [], []

    def check(batch) -> None:
        for k, v in _content(batch).items():
            assert torch.equal(v, expected[batch.__key__[0]][k]), (batch.__key__, k)

    for batch in _batches(dataset, 2):
        keys.append(batch.__key__[0])
        inodes.append(_inode(batch.tokens))
        check(batch)
        held.append(batch)
        while hold is not None and len(held) > hold:
            check(held.popleft())  # still intact after later batches were built
        del batch
    for batch in held:
        check(batch)
    assert sorted(keys) == sorted(expected)
    if hold is None:
        assert len(set(inodes)) == len(inodes)  # all alive at once: no buffer shared
    else:
        assert len(set(inodes)) < len(inodes)  # buffers came back to the workers
