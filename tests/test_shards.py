"""ShardWriter: shards roll over by size/count, and the checksums hashed while writing (on a helper thread)
are the file's."""

from __future__ import annotations

import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

from omnipack.dataset import shards
from omnipack.dataset.file_payload import FilePayload
from omnipack.dataset.shards import JOIN_MAX, HashThread, ShardWriter, file_digests, tar_members


def test_checksums_hashed_while_writing_equal_the_written_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    writer = ShardWriter(tmp_path, max_count=3, checksums=("xxh3_128", "sha256"))
    rows = {f"{i:05d}": {"a.bin": rng.bytes(int(rng.integers(0, 5000))), "b.json": b"{}"} for i in range(7)}
    for key, parts in rows.items():
        writer.write(key, parts)
    infos = writer.close()
    assert [s.count for s in infos] == [3, 3, 1]
    for info in infos:
        path = tmp_path / info.path
        assert file_digests(path, ("sha256", "xxh3_128")) == {
            "sha256": info.sha256,
            "xxh3_128": info.xxh3_128,
        }
        assert info.num_bytes == path.stat().st_size
        idx = np.fromfile(str(path) + ".idx", dtype="<u8")
        with tarfile.open(path) as tar:
            members = tar.getmembers()
        assert [m.offset for m in members[::2]] == idx[:-1].tolist()  # each row's first member
        for m in members:
            key, _, part = m.name.partition(".")
            assert m.size == len(rows[key][part])


def test_default_records_only_the_fast_checksum(tmp_path: Path) -> None:
    assert ShardWriter(tmp_path).close() == []  # nothing written, no shard
    writer = ShardWriter(tmp_path)
    writer.write("00000", {"a.bin": b"x"})
    (info,) = writer.close()
    assert info.sha256 is None
    assert info.xxh3_128 == file_digests(tmp_path / info.path, ("xxh3_128",))["xxh3_128"]


def test_abort_leaves_completed_shards_and_no_partial_file(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path, max_count=1)
    writer.write("00000", {"a.bin": b"x" * 10})
    writer.write("00001", {"a.bin": b"y" * 10})  # rolls shard 0 over, opens shard 1
    writer.abort()
    files = sorted(p.name for p in (tmp_path / "shards").iterdir())
    assert files == ["shard-000000.tar", "shard-000000.tar.idx"]


def test_shards_are_byte_for_byte_what_tarfile_writes(tmp_path: Path) -> None:
    """The writer emits members itself (headers from a template, one write or in-kernel copy per payload);
    the file equals tarfile's own archive of the same members with the same fixed ownership and mtime (sizes
    on and off the 512-byte blocks, names up to the header's 100 bytes and longer, not ASCII)."""
    import io

    rng = np.random.default_rng(1)
    sizes = [0, 1, 511, 512, 513, 10240, 70000, JOIN_MAX + 7]  # the last a chunk of its own
    rows = {f"{i:05d}": {"meta.json": b"{}", "media.0.npy": rng.bytes(n)} for i, n in enumerate(sizes)}
    rows["x" * 88] = {"media.0.npy": b"a" * 3}  # a 100-byte name
    rows["n"] = {"é" * 40: b"b"}  # 82 bytes of UTF-8
    # payloads that lie in a file (a sample store's segment): copied from it, or written from the bytes
    # held when the file can not give them (gone, shorter than recorded)
    segment = tmp_path / "segment.bin"
    stored = [rng.bytes(n) for n in (70000, 513, 4096)]
    segment.write_bytes(b"z" * 100 + b"".join(stored[:2]))
    rows["stored"] = {
        "media.0.npy": FilePayload(stored[0], str(segment), 100, 0),
        "media.1.npy": FilePayload(memoryview(stored[1]), str(segment), 70100, 0),
        "media.2.npy": FilePayload(stored[2], str(segment), 70613, 0),  # past the file's end
        "media.3.npy": FilePayload(stored[2], str(tmp_path / "gone.bin"), 0, 0),
    }
    writer = ShardWriter(tmp_path)
    for key, parts in rows.items():
        writer.write(key, parts)
    (info,) = writer.close()
    ref = io.BytesIO()
    with tarfile.open(fileobj=ref, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, parts in rows.items():
            for part, data in parts.items():
                data = bytes(data.data) if isinstance(data, FilePayload) else data
                m = tarfile.TarInfo(f"{key}.{part}")
                m.size = len(data)
                m.mode, m.mtime, m.uid, m.gid, m.uname, m.gname = 0o644, 0, 0, 0, "", ""
                tar.addfile(m, io.BytesIO(data))
    assert (tmp_path / info.path).read_bytes() == ref.getvalue()
    assert info.xxh3_128 == file_digests(tmp_path / info.path, ("xxh3_128",))["xxh3_128"]
    with pytest.raises(ValueError, match="too long"):  # tarfile's error for a name USTAR can not hold
        ShardWriter(tmp_path / "long").write("y" * 101, {"a": b""})


def test_file_digests_are_the_same_for_any_chunk_size(tmp_path: Path) -> None:
    """The read size only bounds the memory a digest holds (finalize reads inputs in small chunks)."""
    path = tmp_path / "f.bin"
    path.write_bytes(np.random.default_rng(1).bytes(100_003))
    whole = file_digests(path, ("sha256", "xxh3_128"))
    for chunk_size in (1, 4096, 1 << 18):
        assert file_digests(path, ("sha256", "xxh3_128"), chunk_size=chunk_size) == whole
    with pytest.raises(ValueError, match="chunk_size must be positive"):
        file_digests(path, chunk_size=0)


def test_tar_members_join_small_bytes_and_leave_payloads_whole(tmp_path: Path) -> None:
    """A row's headers and small arrays become one chunk (one write); a large in-memory payload and a stored
    payload stay the objects given (not copied again); the chunks are the member bytes tarfile writes."""
    rng = np.random.default_rng(2)
    big, stored = rng.bytes(JOIN_MAX), rng.bytes(1000)
    segment = tmp_path / "segment.bin"
    segment.write_bytes(stored)
    payload = FilePayload(stored, str(segment), 0, 0)
    parts = {"meta.json": b"{}", "tokens.npy": rng.bytes(10_000), "media.0.npy": big, "media.1.npy": payload}
    parts["labels.npy"] = rng.bytes(3)
    chunks = tar_members("00001", parts).chunks
    assert len(chunks) == 5 and chunks[1] is big and chunks[3] is payload
    assert all(isinstance(c, bytes) for c in chunks[::2])
    writer = ShardWriter(tmp_path)
    writer.write("00001", parts)
    (info,) = writer.close()
    written = b"".join(bytes(c.data) if isinstance(c, FilePayload) else c for c in chunks)
    assert (tmp_path / info.path).read_bytes()[: len(written)] == written
    with tarfile.open(tmp_path / info.path) as tar:
        assert [m.name for m in tar.getmembers()] == [f"00001.{p}" for p in parts]
        assert tar.extractfile("00001.media.0.npy").read() == big


class _GatedHasher:
    """A hasher that waits for ``gate`` before each update (a hash far slower than the writes)."""

    def __init__(self, gate: threading.Event, fail: bool = False) -> None:
        self.gate, self.fail, self.seen = gate, fail, b""
        self.entered = threading.Event()  # an update has started (and waits at the gate)

    def update(self, data: bytes) -> None:
        self.entered.set()
        self.gate.wait()
        if self.fail:
            raise OSError("hasher failed")
        self.seen += bytes(data)

    def hexdigest(self) -> str:
        return self.seen.hex()


def test_a_buffer_changed_after_its_write_is_hashed_as_written(monkeypatch, tmp_path: Path) -> None:
    """Hashing runs behind the writes: a mutable buffer the caller reuses at once (large, so not joined
    into a copy) must still be hashed as the bytes the file got (the hash is held back until it changed)."""
    gate = threading.Event()
    made: list[_GatedHasher] = []
    monkeypatch.setattr(shards, "new_hasher", lambda algorithm: made.append(_GatedHasher(gate)) or made[-1])
    buffer = bytearray(JOIN_MAX + 1)
    writer = ShardWriter(tmp_path, checksums=("gated",))
    writer.write("00000", {"a.bin": buffer})
    buffer[:] = b"x" * len(buffer)  # the caller's next row
    gate.set()
    (info,) = writer.close()
    assert made[0].seen == (tmp_path / info.path).read_bytes()


def test_the_hash_thread_holds_at_most_its_pending_bytes_and_keeps_their_order(monkeypatch) -> None:
    gate = threading.Event()
    monkeypatch.setattr(shards, "new_hasher", lambda algorithm: _GatedHasher(gate))
    hashes = HashThread(("gated",), max_pending=10)
    hashes.update(b"a" * 8)  # taken by the thread, which waits at the gate
    hashes.update(memoryview(b"b" * 8))  # 8 bytes pending: room for more
    third = threading.Thread(target=hashes.update, args=(b"c" * 8,))
    third.start()
    third.join(0.3)
    assert third.is_alive()  # 16 bytes pending: the writer waits for the hash
    gate.set()
    third.join(5)
    assert not third.is_alive()
    assert hashes.hexdigests() == {"gated": (b"a" * 8 + b"b" * 8 + b"c" * 8).hex()}
    with pytest.raises(RuntimeError, match="after the hash was closed"):  # not lost, nor a wait forever
        hashes.update(b"d")


def test_a_failed_hash_is_raised_to_the_writer_and_an_abort_drops_what_waits(monkeypatch, tmp_path: Path) -> None:
    gate = threading.Event()
    gate.set()
    monkeypatch.setattr(shards, "new_hasher", lambda algorithm: _GatedHasher(gate, fail=True))
    hashes = HashThread(("gated",))
    hashes.update(b"x")
    with pytest.raises(OSError, match="hasher failed"):
        hashes.hexdigests()
    hashes = HashThread(("gated",), max_pending=0)
    hashes.update(b"x")
    with pytest.raises(OSError, match="hasher failed"):  # the next write waits for it, and fails at once
        hashes.update(b"y")
    gate.clear()  # every hash now waits at the gate
    made: list[_GatedHasher] = []
    monkeypatch.setattr(shards, "new_hasher", lambda algorithm: made.append(_GatedHasher(gate)) or made[-1])
    writer = ShardWriter(tmp_path)
    row = {"a.bin": b"y" * JOIN_MAX, "b.bin": b"z" * JOIN_MAX}  # chunks: header, a, pad + header, b, pad
    writer.write("00000", row)
    assert made[0].entered.wait(5)  # the helper holds the first chunk (the rest wait in its queue)
    aborting = threading.Thread(target=writer.abort)
    aborting.start()
    aborting.join(0.3)
    gate.set()  # the hash in progress ends; the chunks still waiting are dropped, not hashed
    aborting.join(5)
    assert not aborting.is_alive()
    assert len(made[0].seen) == 512  # the first header only
    with pytest.raises(RuntimeError, match="covers part of the data"):
        writer_hashes = HashThread(("gated",))
        writer_hashes.close(discard=True)
        writer_hashes.hexdigests()
    assert not list((tmp_path / "shards").iterdir())
