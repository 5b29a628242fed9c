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
from .storage import write_bytes_atomic

CRASH_ENV = (
    "OMNIPACK_CRASH_AT"  # tests: "STAGE:UNIT" kills this process (SIGKILL) at that unit's commit point
)


def digest(value: Any) -> str:
    """A stable digest of plain data (JSON with sorted keys; dataclasses by their repr)."""
    return xxhash.xxh3_128(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()


def file_xxh3(path: Path) -> str:
    """xxh3-128 of a file's bytes (a local or object-store path)."""
    return file_digests(path, ("xxh3_128",))["xxh3_128"]


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
