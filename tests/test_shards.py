"""ShardWriter: shards roll over by size/count, and the checksums hashed while writing are the file's."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest

from omnipack.dataset.file_payload import FilePayload
from omnipack.dataset.shards import ShardWriter, file_digests


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
    sizes = [0, 1, 511, 512, 513, 10240, 70000]
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
