"""Completion records: how a stage says a unit of work (a part, the plan, a shard) is done.

A unit writes its outputs under temporary names, renames them into place, and writes its record last
(atomically): a record that exists and carries the unit's current key means the unit needs no redoing.
The key is a digest of everything the unit's output depends on (its inputs' checksums and the settings),
so a rerun after a crash, or with changed inputs or settings, redoes exactly the units that need it.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import xxhash

from ..dataset.shards import file_digests
from .storage import is_local, write_bytes_atomic

CRASH_ENV = (
    "OMNIPACK_CRASH_AT"  # tests: "STAGE:UNIT" kills this process (SIGKILL) at that unit's commit point
)


def digest(value: Any) -> str:
    """A stable digest of plain data (JSON with sorted keys; dataclasses by their repr)."""
    return xxhash.xxh3_128(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()


def file_xxh3(path: Path) -> str:
    """xxh3-128 of a file's bytes (a local or object-store path)."""
    return file_digests(path, ("xxh3_128",))["xxh3_128"]


def output_stamp(path: Any) -> list[Any] | None:
    """What says a file is untouched since a record noted it, without reading it: in a folder its size,
    inode, mtime and ctime (any write moves the ctime, and no process can set it back, as a ``utime`` can
    the mtime); on an object store its size and ETag (any new PUT changes it). None when there is none."""
    try:
        if is_local(path):
            st = path.stat()
            return [st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]
        info = path.fs.info(path.path)
    except FileNotFoundError:
        return None
    etag = info.get("ETag") or info.get("etag")
    return [int(info.get("size") or 0), str(etag)] if etag else None


def file_unchanged(path: Any, size: int, xxh3: str | None, stamp: list[Any] | None) -> bool:
    """A recorded file is still what it was: its stamp as recorded (no read), or else its size and xxh3-128
    (a read of the whole file: a file copied elsewhere, or whose metadata alone changed, costs that read)."""
    if stamp is not None and output_stamp(path) == stamp:
        return True
    return path.is_file() and path.stat().st_size == size and xxh3 is not None and file_xxh3(path) == xxh3


def write_json_atomic(path: Path, value: Any) -> None:
    """Write JSON that readers see all or nothing of (a renamed temporary file, or one PUT)."""
    write_bytes_atomic(path, (json.dumps(value, indent=1) + "\n").encode())


def read_record(path: Path, key: str) -> dict[str, Any] | None:
    """The record at ``path`` when it exists and was made with ``key``; None when the unit must be redone."""
    try:
        record = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return record if record.get("key") == key else None


def crash_point(stage: str, unit: int | str) -> None:
    """Test hook: die as a ``kill -9`` would, between a unit's outputs and its record (the worst moment)."""
    if os.environ.get(CRASH_ENV) == f"{stage}:{unit}":
        os.kill(os.getpid(), signal.SIGKILL)
