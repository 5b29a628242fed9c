"""Loader workers reuse their shared-memory batch buffers only once the trainer has freed the batch."""

from __future__ import annotations

import collections
import copy
import multiprocessing
import os
from pathlib import Path

import pytest
import torch
from megatron.energon import WorkerConfig, get_loader, get_val_dataset

from omnipack.loader import buffer_pool
from omnipack.loader.buffer_pool import FREE, BufferLease, SlotView, WorkerBufferPool, sweep_released
from omnipack.loader.task_encoder import OmnipackTaskEncoder
from omnipack.profiles.model_inputs import storage_view
from tests.prepare_child import warm_context

PROFILE = "qwen3_omni"


def _received(pool: WorkerBufferPool, sizes: list[int]) -> tuple[dict, BufferLease]:
    """A batch built in the pool's slots, packed as the worker pickles it, and unpacked as the trainer
    process does. Across processes the trainer's storages map the worker's memory through objects of their
    own; here clones stand in for them, so that their lifetime is the trainer's alone."""
    with pool.batch_scope() as scope:
        taken = [pool.take(n) for n in sizes]
        assert all(offset % 64 == 0 for _, offset in taken)
        built = [storage_view(s, offset, (n,), torch.uint8) for (s, offset), n in zip(taken, sizes, strict=True)]
        for k, t in enumerate(built):
            t.fill_(k + 1)
    lease = pool.lease(scope)
    assert lease is not None
    packed = lease.pack({"a": built[0], "rest": {"b": built[1:]}, "n": 3})
    assert isinstance(packed["a"], SlotView) and all(isinstance(v, SlotView) for v in packed["rest"]["b"])
    sent = copy.copy(lease)
    assert sent.pool is None  # the worker's pool never travels
    sent.storages = {k: s.clone() for k, s in lease.storages.items()}
    sent.worker_pid = -1  # as received in another process
    batch = sent.unpack(packed)
    assert sent.storages is None and batch["n"] == 3
    for k, t in enumerate([batch["a"], *batch["rest"]["b"]]):
        assert t.shape == (sizes[k],) and bool((t == k + 1).all())
    return batch, lease


@pytest.fixture(autouse=True)
def _no_leftover_watches():
    buffer_pool._WATCHED.clear()
    yield
    buffer_pool._WATCHED.clear()


def test_a_slot_is_reused_only_after_every_tensor_of_its_batch_is_freed():
    pool = WorkerBufferPool(max_slots=8)
    batch, lease = _received(pool, [3 << 20, 1000])
    assert lease.slots == (0, 1) and pool.allocated == 2  # the second buffer did not fit the first slot
    flags = pool._flags
    view = batch["a"][10:20]  # a view the trainer keeps: the slot's memory lives on
    del batch
    assert sweep_released() == 0 and flags[0] != FREE and flags[1] != FREE
    del view
    assert sweep_released() == 1 and flags[0] == FREE and flags[1] == FREE


def test_a_batch_lives_in_one_slot_once_the_pool_knows_its_size():
    """The first batch's buffers get slots as they come; later batches get one slot sized for a whole
    batch (one file descriptor to hand over), and reuse it once it is free."""
    pool = WorkerBufferPool(max_slots=8)
    sizes = [1 << 20, 1000, 3000, 1 << 19]
    batch, lease = _received(pool, sizes)
    assert lease.slots == (0, 1) and pool.allocated == 2
    del batch
    assert sweep_released() == 1
    batch, lease = _received(pool, sizes)
    assert len(lease.slots) == 1 and pool.allocated == 3  # a free slot too small was replaced
    slot, ptr = lease.slots[0], pool.slots[lease.slots[0]].data_ptr()
    assert pool.slots[slot].nbytes() >= sum(sizes)
    del batch
    assert sweep_released() == 1
    for _ in range(3):
        batch, lease = _received(pool, sizes)
        assert lease.slots == (slot,) and pool.slots[slot].data_ptr() == ptr and pool.allocated == 3
        del batch
        assert sweep_released() == 1


def test_a_tensor_the_trainer_sends_on_moves_to_fresh_memory_and_frees_the_slot():
    """Shared on (to another process, or ``share_memory_``), a received tensor gets memory of its own: no
    other process ever maps a slot, and the slot comes back once the trainer's references are gone."""
    pool = WorkerBufferPool(max_slots=4)
    batch, lease = _received(pool, [1 << 20])
    kept = batch["a"]
    assert not kept.is_shared()
    del batch
    before = kept.untyped_storage().data_ptr()
    kept.share_memory_()  # what torch does to a tensor it sends to another process
    assert kept.is_shared() and kept.untyped_storage().data_ptr() != before and bool((kept == 1).all())
    assert sweep_released() == 1 and pool._flags[lease.slots[0]] == FREE
    _received(pool, [1 << 20])  # the slot is rewritten for the next batch; the sent tensor is not
    assert bool((kept == 1).all())


def test_held_batches_get_new_slots_and_the_pool_falls_back_to_fresh_memory():
    pool = WorkerBufferPool(max_slots=3)
    held = [_received(pool, [1 << 20]) for _ in range(3)]
    assert len(pool.slots) == 3 and pool.allocated == 3
    with pool.batch_scope() as scope:  # every slot is in the trainer's hands: fresh memory, not leased
        extra, offset = pool.take(1 << 20)
    assert pool.lease(scope) is None and pool.allocated == 4 and offset == 0
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


def test_a_batch_is_not_packed_again_once_its_slots_went_to_another_batch():
    pool = WorkerBufferPool(max_slots=1)
    with pool.batch_scope() as scope:
        t = storage_view(*pool.take(100), (100,), torch.uint8)
    lease = pool.lease(scope)
    pool._flags[0] = FREE  # as if the trainer had freed it
    with pool.batch_scope() as scope2:
        pool.take(100)
    pool.lease(scope2)
    with pytest.raises(RuntimeError, match="reused for another batch"):
        lease.pack({"t": t})


def _sent_and_freed(pool: WorkerBufferPool, nbytes: int) -> tuple[torch.Tensor, int]:
    """A worker batch's tensor (filled with 5) whose batch was sent and then freed by the trainer."""
    with pool.batch_scope() as scope:
        t = storage_view(*pool.take(nbytes), (nbytes,), torch.uint8).fill_(5)
    lease = pool.lease(scope)
    copy.copy(lease)  # pickled, as when the batch is sent
    pool._flags[list(lease.slots)] = FREE  # as the trainer does once it let go
    return t, lease.slots[0]


def _rewrite_a_slot(pool: WorkerBufferPool, nbytes: int) -> torch.UntypedStorage:
    with pool.batch_scope() as scope:
        storage, offset = pool.take(nbytes)
        storage_view(storage, offset, (nbytes,), torch.uint8).fill_(9)
    pool.lease(scope)
    return storage


def test_a_slot_still_viewed_in_the_worker_is_not_reused():
    """Code in the worker that keeps a tensor of a batch it sent keeps its values."""
    pool = WorkerBufferPool(max_slots=4)
    kept, _ = _sent_and_freed(pool, 1000)
    rewritten = _rewrite_a_slot(pool, 1000).data_ptr()
    assert rewritten != kept.untyped_storage().data_ptr() and bool((kept == 5).all())
    assert pool.retired == 1
    del kept
    free_again, slot = _sent_and_freed(pool, 1000)
    del free_again
    assert _rewrite_a_slot(pool, 1000).data_ptr() == pool.slots[slot].data_ptr()  # nothing views it: reused


def _hold_in_fork(t, go, outbox) -> None:
    go.wait(60)
    outbox.put(bool((t == 5).all()))


def test_a_slot_a_worker_forked_with_is_never_reused(monkeypatch):
    """A loader worker forks (code of its own) while a slot holds a batch: the child may read the slot
    as long as it lives, so the worker never writes it again."""
    pool = WorkerBufferPool(max_slots=4)
    monkeypatch.setattr(buffer_pool, "_POOL", (os.getpid(), pool))
    ctx = multiprocessing.get_context("fork")
    with pool.batch_scope() as scope:
        t = storage_view(*pool.take(1000), (1000,), torch.uint8).fill_(5)
    lease = pool.lease(scope)
    go, outbox = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_hold_in_fork, args=(t, go, outbox), daemon=True)
    child.start()
    del t
    copy.copy(lease)
    pool._flags[list(lease.slots)] = FREE
    _rewrite_a_slot(pool, 1000)
    go.set()
    assert outbox.get(timeout=60) is True
    child.join(timeout=30)
    assert pool.retired == 1


def test_no_pool_outside_a_loader_worker():
    assert buffer_pool.worker_pool() is None


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


def _batches(ds: Path, workers: int, **options):
    te = OmnipackTaskEncoder.from_dataset(ds, **options)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    return get_loader(get_val_dataset(str(ds), split_part="train", batch_size=1, worker_config=wc, task_encoder=te))


def _content(batch) -> dict[str, torch.Tensor]:
    out = {k: v.clone() for k, v in batch.as_dict().items() if isinstance(v, torch.Tensor)}
    return {**out, **{f"raw.{k}": v.clone() for k, v in (batch.encoder_inputs or {}).items()}}


def _views_more(t: torch.Tensor) -> bool:
    """Whether ``t`` views a larger buffer than itself (a batch's slot) rather than memory of its own."""
    return t.untyped_storage().nbytes() > t.nbytes


def _slots(batch) -> set[tuple[int, int]]:
    """(worker pid, slot) of every pool buffer ``batch`` lives in."""
    lease = batch.buffer_lease
    return set() if lease is None else {(lease.worker_pid, k) for k in lease.slots}


@pytest.fixture(scope="module")
def in_process_content(dataset) -> dict[str, dict[str, torch.Tensor]]:
    """Each batch's content (cloned) by key, read in the test process (no workers): read once for the module."""
    return {b.__key__[0]: _content(b) for b in _batches(dataset, 0)}


@pytest.mark.parametrize("hold", [0, 3, None])
def test_worker_batches_equal_in_process_batches_while_buffers_are_reused(dataset, in_process_content, hold):
    """Two real Energon workers: every batch equals the in-process one when it is read, whether the
    trainer drops batches at once (buffers reused), holds the last ``hold`` batches, or holds all of them
    (``None``: no buffer may be reused while a tensor of a live batch views it; a batch whose tensors
    were all small enough to be copied out of its buffer keeps none)."""
    expected = in_process_content
    assert len(expected) >= 12
    held: collections.deque = collections.deque()
    used: list[tuple[int, int]] = []
    viewed: set[tuple[int, int]] = set()  # buffers that a held batch's tensors view
    keys = []
    private = 0

    def check(batch) -> None:
        for k, v in _content(batch).items():
            assert torch.equal(v, expected[batch.__key__[0]][k]), (batch.__key__, k)

    for batch in _batches(dataset, 2):
        keys.append(batch.__key__[0])
        # In a slot, tokens alias it through a private storage (see buffer_pool); fresh memory is shared.
        private += not batch.tokens.is_shared()
        used += sorted(_slots(batch))
        if hold is None:
            assert not _slots(batch) & viewed  # all alive at once: no viewed buffer used twice
            viewed |= _slots(batch) if any(_views_more(v) for v in _raw(batch).values()) else set()
        check(batch)
        held.append(batch)
        while hold is not None and len(held) > hold:
            check(held.popleft())  # still intact after later batches were built
        del batch
    for batch in held:
        check(batch)
    assert sorted(keys) == sorted(expected)
    assert used and private
    if hold is None:
        assert viewed
    else:
        assert len(set(used)) < len(used)  # buffers came back to the workers


def _hold_and_compare(inbox, outbox) -> None:
    received = inbox.get()  # tensors of a loader batch, sent on by the trainer process
    expected = inbox.get()  # their content, sent after the loader has reused its buffers many times
    outbox.put([bool(torch.equal(a, b)) for a, b in zip(received, expected, strict=True)])


def test_tensors_sent_on_to_another_process_survive_buffer_reuse(dataset):
    """The trainer sends tensors of a worker batch to another process and drops its own: the workers reuse
    that batch's buffers for later batches, and the other process still reads the batch's values."""
    ctx = warm_context()  # a process of its own, forked from the tests' warm server (torch imported there)
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_hold_and_compare, args=(inbox, outbox), daemon=True)
    child.start()
    try:
        loader = iter(_batches(dataset, 2))
        first = next(loader)
        sent = [first.tokens, *[v for v in (first.encoder_inputs or {}).values()]]
        expected = [t.clone() for t in sent]
        first_slots = _slots(first)
        assert first_slots
        inbox.put(sent)
        del first, sent
        reused = set()
        for batch in loader:
            reused |= _slots(batch) & first_slots
            del batch
        assert reused, "the first batch's buffers were never reused: nothing was tested"
        inbox.put(expected)
        assert outbox.get(timeout=120) == [True] * len(expected)
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()


def test_reuse_buffers_off_gives_each_batch_fresh_memory(dataset):
    batches = list(_batches(dataset, 2, reuse_buffers=False))
    assert len(batches) >= 12 and all(b.buffer_lease is None for b in batches)
    # torch's own hand-over: fresh shared memory (the small tensors copied out of it, see unpin_small)
    assert all(any(v.is_shared() for v in _raw(b).values()) for b in batches)


def test_a_copy_inside_the_worker_leaves_the_batch_its_slot_references():
    """A batch copied inside the worker (copy.copy shares the lease) still travels as slot references."""
    pool = WorkerBufferPool(max_slots=2)
    with pool.batch_scope() as scope:
        t = storage_view(*pool.take(100), (100,), torch.uint8).fill_(7)
    lease = pool.lease(scope)
    twin = lease.unpack(lease.pack({"t": t}))  # in the worker: plain views, the lease keeps its storages
    assert bool((twin["t"] == 7).all()) and lease.storages is not None
    assert isinstance(lease.pack({"t": t})["t"], SlotView)


def _raw(batch) -> dict[str, torch.Tensor]:
    """Every tensor the trainer reads from ``batch``, as it lies in memory (no copy, no normalization)."""
    fields = {k: v for k, v in batch._token_fields().items() if isinstance(v, torch.Tensor)}
    return {**fields, **{f"raw.{k}": v for k, v in (batch.encoder_inputs or {}).items()}}


def _read_in_fork(batch, expected, go, outbox) -> None:
    """A forked helper holding a batch: what differs from ``expected`` on its first read, and once the
    trainer has gone on for many batches."""
    torch.set_num_threads(1)

    def changed() -> list[str]:
        return sorted(k for k, v in _raw(batch).items() if not torch.equal(v, expected[k]))

    first = changed()
    go.wait(300)
    outbox.put((first, changed()))


def test_a_fork_started_child_holding_a_batch_sees_it_unchanged(dataset):
    """The trainer starts fork children with a batch each, drops its own reference and goes on: the
    workers never write those batches' buffers again (the children map them), and still reuse the
    others'. Each child compares its batch with a copy taken before the fork, at once and at the end."""
    ctx = multiprocessing.get_context("fork")
    children, forked, later = [], set(), []
    for i, batch in enumerate(_batches(dataset, 2)):
        if i in (0, 3, 6, 9):
            expected = {k: v.clone() for k, v in _raw(batch).items()}
            go, outbox = ctx.Event(), ctx.Queue()
            child = ctx.Process(target=_read_in_fork, args=(batch, expected, go, outbox), daemon=True)
            child.start()
            children.append((child, go, outbox))
            forked |= _slots(batch)
        else:
            later += sorted(_slots(batch))
        del batch
    assert forked and len(set(later)) < len(later)  # buffers are still reused, just not the forked ones
    results = []
    for child, go, outbox in children:
        go.set()
        results.append(outbox.get(timeout=300))
        child.join(timeout=60)
    assert results == [([], [])] * len(children)


def _shm_mapped_bytes() -> int:
    """Bytes of torch shared memory (/dev/shm) this process maps."""
    total = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/dev/shm/torch_" in line:
                lo, hi = line.split()[0].split("-")
                total += int(hi, 16) - int(lo, 16)
    return total


@pytest.mark.parametrize("reuse", [True, False])
def test_holding_small_tensors_of_many_batches_pins_no_batch_memory(dataset, reuse):
    """Keeping only ``cu_seqlens_q`` of every batch must not keep the batches' shared memory alive."""
    import gc

    kept, batch_bytes = [], 0
    for batch in _batches(dataset, 2, reuse_buffers=reuse):
        batch_bytes += sum(v.nbytes for v in _raw(batch).values())
        kept.append(batch.cu_seqlens_q)
        del batch
    gc.collect()
    with_kept = _shm_mapped_bytes()
    kept_bytes = sum(t.nbytes for t in kept)
    held = max(t.untyped_storage().nbytes() / t.nbytes for t in kept)  # memory a kept tensor keeps alive
    del kept
    gc.collect()
    pinned = with_kept - _shm_mapped_bytes()  # the shared memory the kept tensors alone held mapped
    assert batch_bytes > 1000 * kept_bytes and pinned == 0, (pinned, kept_bytes, batch_bytes)
    assert held <= buffer_pool.PIN_RATIO


def test_a_batch_built_but_never_delivered_gives_its_slot_back(dataset):
    """Restored from a checkpoint, an Energon worker builds the batches before the restored position
    again and drops them: their slots are free again (flags read through a received batch's lease)."""
    from megatron.energon import get_savable_loader, get_train_dataset

    def loader():
        ds = get_train_dataset(
            str(dataset),
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2),
            batch_size=1,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            repeat=False,
            task_encoder=OmnipackTaskEncoder.from_dataset(dataset),
        )
        return get_savable_loader(ds)

    first = loader()
    it = iter(first)
    keys = [next(it).__key__[0] for _ in range(8)]
    state = first.save_state_rank()
    expected = [b.__key__[0] for b in it]
    del first, it
    restored = loader()
    restored.restore_state_rank(state)
    got, flags = [], {}
    for batch in restored:
        got.append(batch.__key__[0])
        if batch.buffer_lease is not None:
            flags[batch.buffer_lease.worker_pid] = batch.buffer_lease.flags
        del batch
    assert got == expected and len(keys) + len(got) >= 12
    sweep_released()  # the last batches were freed after the last arrival
    assert len(flags) == 2
    busy = {pid: int((storage_view(f, 0, (f.nbytes(),), torch.uint8) != FREE).sum()) for pid, f in flags.items()}
    assert busy == dict.fromkeys(flags, 0)


def test_the_task_encoder_hands_its_allocator_to_the_family(dataset):
    """The batch tensors a family's ``collate_media`` builds come from the loader's allocator (the worker
    pool's ``batch_storage``), handed in through ``MediaInputOptions``: the family never reaches into it."""
    import dataclasses

    te = OmnipackTaskEncoder.from_dataset(dataset)
    assert te.media_options.allocate is buffer_pool.batch_storage
    taken: list[int] = []

    def allocate(nbytes: int):
        storage, offset = buffer_pool.batch_storage(nbytes)
        taken.append(storage.data_ptr())
        return storage, offset

    te.media_options = dataclasses.replace(te.media_options, allocate=allocate)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_val_dataset(str(dataset), split_part="train", batch_size=1, worker_config=wc, task_encoder=te)
    loader = get_loader(ds)
    pixels = [v for b in loader for k, v in (b.encoder_inputs or {}).items() if k in b.pixel_keys]
    assert pixels and all(v.untyped_storage().data_ptr() in taken for v in pixels)
