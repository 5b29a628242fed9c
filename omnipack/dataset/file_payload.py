"""A member's payload that already lies in a file (a sample store's segment): its bytes, where they lie and
their xxh3-64, so that a shard writer copies them file to file in the kernel (``os.copy_file_range``) and
a row's media digest is the known xxh3 instead of one more pass over the bytes. The file must still hold
those bytes there when they are copied (a sample store's segments are append-only, never rewritten)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class FilePayload:
    data: bytes | memoryview  # the bytes, checked against ``xxh3`` (hashed into the shard's checksums)
    path: str  # the file holding them, from ``offset`` on
    offset: int
    xxh3: int  # xxh3-64 of ``data``

    def __len__(self) -> int:
        return len(self.data)

    @property
    def digest(self) -> str:
        """``xxh3_64(data).hexdigest()``."""
        return f"{self.xxh3:016x}"


def copy_into(payload: FilePayload, fd: int, sources: dict[str, int]) -> None:
    """``payload``'s bytes appended at ``fd``'s position, copied from its file in the kernel; the bytes held
    in memory where the kernel can not (another file system, a file shorter than recorded). ``sources``:
    the caller's open source files by path (it closes them)."""
    done = 0
    try:
        if not hasattr(os, "copy_file_range"):  # Linux only
            raise OSError("no copy_file_range")
        src = sources.get(payload.path)
        if src is None:
            src = sources[payload.path] = os.open(payload.path, os.O_RDONLY)
        while done < len(payload.data):
            n = os.copy_file_range(src, fd, len(payload.data) - done, payload.offset + done)
            if n == 0:
                break
            done += n
    except OSError:  # no in-kernel copy between these files (EXDEV, EINVAL, ...), or the source is gone
        pass
    rest = memoryview(payload.data)[done:]
    while rest:
        rest = rest[os.write(fd, rest) :]
