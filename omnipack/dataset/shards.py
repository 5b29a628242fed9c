"""Uncompressed tar shards with a ``.tar.idx`` each, written atomically.

Energon reads a shard through ``.info.json`` counts plus ``.tar.idx`` (uint64 byte offsets of each
sample's first header, then the end of the data). Members carry fixed ownership and mtime so the same
rows give byte-identical shards. A shard is written under a temporary name and renamed when complete,
so a crash never leaves a half shard that looks whole.
"""

from __future__ import annotations

import functools
import hashlib
import os
import queue
import re
import tarfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from .file_payload import FilePayload, copy_into

KEY_RE = re.compile(r"^[^./]+$")
TMP_SUFFIX = ".partial"  # omnipack.stages.storage.PARTIAL_SUFFIX: a rerun removes those a kill left


@dataclass(frozen=True)
class ShardInfo:
    path: str  # relative to the dataset root
    count: int
    num_bytes: int
    # sha256 of the shard, recorded when asked (``shard_sha256``: for tools that want a cryptographic digest;
    # it costs ~15x the xxh3 below, a sizeable part of writing raw media); None otherwise.
    sha256: str | None
    split: str = "train"
    # xxh3-128 of the same bytes: what ``verify`` recomputes (near memory speed, so checking a shard costs
    # little more than reading it). None only in datasets written before it existed.
    xxh3_128: str | None = None


SHARD_CHECKSUMS = ("xxh3_128",)  # recorded per shard in omnipack.json; "sha256" is added on request


def file_digests(
    path: Path, algorithms: tuple[str, ...] = ("sha256",), *, chunk_size: int = 1 << 22
) -> dict[str, str]:
    """Hex digests of a file's bytes (a local or object-store path), read once in ``chunk_size`` pieces
    (the memory the read holds), for each of ``algorithms`` (hashlib names or ``xxh3_128``)."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    hashers = {a: new_hasher(a) for a in algorithms}
    with (Path(path) if isinstance(path, str) else path).open("rb") as f:  # a path, or an object store's UPath
        for chunk in iter(lambda: f.read(chunk_size), b""):
            for h in hashers.values():
                h.update(chunk)
    return {a: h.hexdigest() for a, h in hashers.items()}


def new_hasher(algorithm: str) -> Any:
    """A streaming hasher with ``update``/``hexdigest``: ``xxh3_128`` or any hashlib algorithm."""
    if algorithm == "xxh3_128":
        return xxhash.xxh3_128()
    return hashlib.new(algorithm)


def file_sha256(path: Path) -> str:
    return file_digests(path)["sha256"]


class HashThread:
    """Digests of a byte stream computed on a helper thread, chunk by chunk in the order given (hashlib and
    xxhash release the GIL on large chunks), so hashing a shard overlaps writing or reading it instead of
    adding to it: in a repack the kernel's copy of one payload runs while the thread hashes the one before
    (benchmarks/README.md, Repack, fifth pass). A chunk must not change until hashed (``bytes``, or a view
    of a file that is never rewritten). ``update`` blocks while more than ``max_pending`` bytes wait (so at
    most that plus one chunk are held: a sha256 at ~0.5 GB/s must not hold a whole shard in memory while
    the writer runs ahead). One producer at a time: the stream's order is the order of ``update`` calls."""

    def __init__(self, algorithms: tuple[str, ...], max_pending: int = 64 << 20) -> None:
        self._hashers = {a: new_hasher(a) for a in algorithms}
        self._chunks: queue.SimpleQueue[tuple[bytes | memoryview, int] | None] = queue.SimpleQueue()
        # bytes given (written by the producer only) and hashed (by the helper only): a lock is taken only
        # when the producer must wait, not once per chunk
        self._given = self._hashed = 0
        self._max_pending = max_pending
        self._room = threading.Condition()
        self._waiting = False
        self._error: BaseException | None = None
        self._discard = self._closed = False
        self._thread = threading.Thread(target=self._run, name="omnipack-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._chunks.get()) is not None:
            chunk, size = item
            try:
                if not self._discard and self._error is None:
                    for h in self._hashers.values():
                        h.update(chunk)
            except BaseException as e:  # noqa: BLE001 - raised to the producer by update() and hexdigests()
                self._error = e
            finally:
                del chunk, item  # a view of a store segment must not outlive its hashing (its map goes later)
                self._hashed += size  # the producer's wait ends even after a failure: it then raises
                if self._waiting:
                    with self._room:
                        self._room.notify()

    def update(self, chunk: bytes | memoryview) -> None:
        if self._closed:
            raise RuntimeError("bytes given after the hash was closed")
        size = len(chunk)
        if not size:
            return
        if self._given - self._hashed > self._max_pending:
            with self._room:
                self._waiting = True
                while self._given - self._hashed > self._max_pending and self._thread.is_alive():
                    self._room.wait(0.1)
                self._waiting = False
        if self._error is not None:  # a failed hash fails the write now, not only at the end
            raise self._error
        if not self._thread.is_alive():
            raise RuntimeError("the hash thread has stopped")
        self._given += size
        self._chunks.put((chunk, size))

    def hexdigests(self) -> dict[str, str]:
        """Every chunk given hashed (waits for the thread); the digests by algorithm."""
        if self._discard:
            raise RuntimeError("the hash was closed with its pending bytes dropped: it covers part of the data")
        self.close()
        if self._error is not None:
            raise self._error
        return {a: h.hexdigest() for a, h in self._hashers.items()}

    def close(self, *, discard: bool = False) -> None:
        """The thread stopped, after hashing what waits (or dropping it with ``discard``)."""
        if not self._closed:
            self._closed = True
            self._discard = discard
            self._chunks.put(None)
            self._thread.join()


class _HashingFile:
    """A binary file that hashes what is written through it (on a ``HashThread``), so a shard's checksums
    cost no second read and no time of the writing thread."""

    def __init__(self, path: str, algorithms: tuple[str, ...]) -> None:
        self._f = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._hashes = HashThread(algorithms)
        self._sources: dict[str, int] = {}  # open files of FilePayloads, by path

    def write(self, data: bytes | FilePayload) -> None:
        if isinstance(data, FilePayload):
            # copied file to file in the kernel: a ``write`` of the same bytes from memory cost ~3x the
            # kernel time here (benchmarks/README.md, Repack)
            self._hashes.update(data.data)
            self._f.flush()  # the buffered bytes first: the copy appends at the file's position
            copy_into(data, self._f.fileno(), self._sources)
            if len(self._sources) > 64:  # a shard's payloads may come from thousands of files
                self._close_sources()
            return
        # hashed later: the caller may reuse a mutable buffer once this returns
        self._hashes.update(data if isinstance(data, bytes) else bytes(data))
        self._f.write(data)

    def _close_sources(self) -> None:
        for fd in self._sources.values():
            os.close(fd)
        self._sources.clear()

    def close(self, *, discard: bool = False) -> None:
        """The file closed; with ``discard`` its hashes are not finished (an aborted shard)."""
        try:
            self._close_sources()
            self._f.close()
        finally:  # the thread stops even when the last flush fails (a full disk)
            self._hashes.close(discard=discard)

    def hexdigests(self) -> dict[str, str]:
        return self._hashes.hexdigests()


def _tarfile_header(name: str, size: int) -> bytes:
    """The USTAR header tarfile writes for a shard member: fixed mode, owner and mtime."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = 0o644, 0, 0, 0, "", ""
    return info.tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape")


_NAME, _SIZE, _CHKSUM = slice(0, 100), slice(124, 136), slice(148, 156)  # a USTAR header's variable fields


@functools.cache
def _header_template() -> tuple[bytes, int]:
    """tarfile's header of this Python for a member, and the checksum of its fixed fields (the checksum
    field counted as spaces, as tarfile counts it)."""
    block = _tarfile_header("x", 0)
    fixed = sum(block) - sum(block[_NAME]) - sum(block[_SIZE]) - sum(block[_CHKSUM]) + 8 * ord(" ")
    return block, fixed


def member_header(name: str, size: int) -> bytes:
    """``_tarfile_header(name, size)``, byte for byte, from a template: only the name, the size and the
    checksum differ between members (tarfile builds each field anew: ~0.1 ms a member, 10x this)."""
    raw = name.encode(tarfile.ENCODING, "surrogateescape")
    if len(raw) > tarfile.LENGTH_NAME or not 0 <= size < 8**11:  # a prefix field, or an error: tarfile's way
        return _tarfile_header(name, size)
    block, fixed = _header_template()
    size_field = b"%011o\0" % size
    checksum = b"%06o\0 " % (fixed + sum(raw) + sum(size_field))
    return b"".join(
        (raw.ljust(100, tarfile.NUL), block[100:124], size_field, block[136:148], checksum, block[156:])
    )


JOIN_MAX = 256 << 10  # in-memory chunks below this are joined with their neighbours (``tar_members``)


@dataclass(frozen=True)
class TarMembers:
    """A sample's members as the bytes that go into the tar, in order: each member's USTAR header, data and
    NUL padding to a block (as tarfile's addfile writes them). Runs of small in-memory bytes are joined
    into one chunk: a row's headers and token arrays are then one write, not ~30, and the writing thread
    takes the GIL back once, not once per write (benchmarks/README.md, Repack, fifth pass). Payloads
    (a ``FilePayload``, or bytes of at least ``JOIN_MAX``) stay chunks of their own: not copied again."""

    chunks: tuple[bytes | FilePayload, ...]


def tar_members(key: str, parts: Mapping[str, bytes | FilePayload]) -> TarMembers:
    """``parts`` as the members ``{key}.{part}``, laid out for ``ShardWriter.write_members``."""
    if not KEY_RE.match(key):
        raise ValueError(f"sample key {key!r} must be non-empty and contain no '.' or '/'")
    chunks: list[bytes | FilePayload] = []
    run: list[bytes] = []  # small in-memory bytes not yet joined
    for part, data in parts.items():
        run.append(member_header(f"{key}.{part}", len(data)))
        if isinstance(data, FilePayload) or len(data) >= JOIN_MAX:
            chunks.append(b"".join(run))
            chunks.append(data)
            run = []
        else:
            run.append(data)
        if pad := -len(data) % tarfile.BLOCKSIZE:
            run.append(tarfile.NUL * pad)
    if run:
        chunks.append(b"".join(run))
    return TarMembers(tuple(chunks))


class ShardWriter:
    """Rolls samples into ``{prefix}-{n:06d}.tar`` shards of at most ``max_bytes`` / ``max_count``."""

    def __init__(
        self,
        root: Path,
        prefix: str = "shards/shard",
        max_bytes: int = 1 << 30,
        max_count: int | None = None,
        split: str = "train",
        checksums: tuple[str, ...] = SHARD_CHECKSUMS,
        first_number: int = 0,  # the number of the first shard (a write unit writes one numbered shard)
    ):
        self.root, self.prefix, self.split, self.checksums = root, prefix, split, checksums
        self.first_number = first_number
        self.max_bytes, self.max_count = max_bytes, max_count
        self.shards: list[ShardInfo] = []
        self._file: _HashingFile | None = None
        self._offset = 0  # bytes of the open shard so far (tar headers, payloads, block padding)
        self._offsets: list[int] = []
        self._rel: str = ""

    def _open(self) -> None:
        self._rel = f"{self.prefix}-{self.first_number + len(self.shards):06d}.tar"
        path = self.root / self._rel
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = _HashingFile(str(path) + TMP_SUFFIX, self.checksums)
        self._offset = 0
        self._offsets = []

    def write(self, key: str, parts: Mapping[str, bytes | FilePayload]) -> None:
        """One sample: every part becomes the member ``{key}.{part}``, contiguous in the tar."""
        self.write_members(tar_members(key, parts))

    def write_members(self, members: TarMembers) -> None:
        """One sample's members, laid out beforehand (``tar_members``: on another thread, say)."""
        if self._file is not None and (
            self._offset >= self.max_bytes or (self.max_count and len(self._offsets) >= self.max_count)
        ):
            self._finish()
        if self._file is None:
            self._open()
        assert self._file is not None
        self._offsets.append(self._offset)
        for chunk in members.chunks:
            self._write(chunk)

    def _write(self, data: bytes | FilePayload) -> None:
        assert self._file is not None
        self._file.write(data)
        self._offset += len(data)

    def _finish(self) -> None:
        assert self._file is not None
        offsets = np.asarray([*self._offsets, self._offset], dtype="<u8")
        # End of archive as tarfile writes it: two zero blocks, then zeros to a whole record.
        self._write(tarfile.NUL * (2 * tarfile.BLOCKSIZE))
        if pad := -self._offset % tarfile.RECORDSIZE:
            self._write(tarfile.NUL * pad)
        self._file.close()
        digests = self._file.hexdigests()
        path = self.root / self._rel
        tmp_tar = Path(str(path) + TMP_SUFFIX)
        idx_path = Path(str(path) + ".idx")
        tmp_idx = Path(str(idx_path) + TMP_SUFFIX)
        tmp_idx.write_bytes(offsets.tobytes())
        info = ShardInfo(
            self._rel,
            len(self._offsets),
            tmp_tar.stat().st_size,
            digests.get("sha256"),
            self.split,
            digests.get("xxh3_128"),
        )
        os.replace(tmp_idx, idx_path)
        os.replace(tmp_tar, path)  # the tar appears last: a present tar always has its index
        self.shards.append(info)
        self._file = None

    def close(self) -> list[ShardInfo]:
        if self._file is not None:
            self._finish()
        return self.shards

    def abort(self) -> None:
        """Drop the shard in progress (its temporary file), keeping completed shards."""
        if self._file is not None:
            self._file.close(discard=True)
            Path(str(self.root / self._rel) + TMP_SUFFIX).unlink(missing_ok=True)
            self._file = None
