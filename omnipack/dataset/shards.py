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
import re
import tarfile
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


class _HashingFile:
    """A binary file that hashes what is written through it, so a shard's checksums cost no second read."""

    def __init__(self, path: str, algorithms: tuple[str, ...]) -> None:
        self._f = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.hashers = {a: new_hasher(a) for a in algorithms}
        self._sources: dict[str, int] = {}  # open files of FilePayloads, by path

    def write(self, data: bytes | FilePayload) -> None:
        if isinstance(data, FilePayload):
            # copied file to file in the kernel: a ``write`` of the same bytes from memory cost ~3x the
            # kernel time here (benchmarks/README.md, Repack)
            for h in self.hashers.values():
                h.update(data.data)
            self._f.flush()  # the buffered bytes first: the copy appends at the file's position
            copy_into(data, self._f.fileno(), self._sources)
            if len(self._sources) > 64:  # a shard's payloads may come from thousands of files
                self._close_sources()
            return
        for h in self.hashers.values():
            h.update(data)
        self._f.write(data)

    def _close_sources(self) -> None:
        for fd in self._sources.values():
            os.close(fd)
        self._sources.clear()

    def close(self) -> None:
        self._close_sources()
        self._f.close()

    def hexdigests(self) -> dict[str, str]:
        return {a: h.hexdigest() for a, h in self.hashers.items()}


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
        if not KEY_RE.match(key):
            raise ValueError(f"sample key {key!r} must be non-empty and contain no '.' or '/'")
        if self._file is not None and (
            self._offset >= self.max_bytes or (self.max_count and len(self._offsets) >= self.max_count)
        ):
            self._finish()
        if self._file is None:
            self._open()
        assert self._file is not None
        self._offsets.append(self._offset)
        for part, data in parts.items():
            # The member as tarfile's addfile writes it (USTAR header, data, NUL padding to a block), but
            # the payload goes to the file in one write: no 16 KiB copy loop over megabytes of pixels.
            self._write(member_header(f"{key}.{part}", len(data)))
            self._write(data)
            if pad := -len(data) % tarfile.BLOCKSIZE:
                self._write(tarfile.NUL * pad)

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
            self._file.close()
            Path(str(self.root / self._rel) + TMP_SUFFIX).unlink(missing_ok=True)
            self._file = None
