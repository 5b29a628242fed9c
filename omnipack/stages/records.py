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
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

import xxhash

from ..dataset.shards import ShardInfo, file_digests
from ..errors import Reject
from ..inputs import InputPart
from .storage import is_local, write_bytes_atomic

CRASH_ENV = (
    "OMNIPACK_CRASH_AT"  # tests: "STAGE:UNIT" kills this process (SIGKILL) at that unit's commit point
)
HOLD_ENV = "OMNIPACK_HOLD_AT"  # tests: "STAGE:UNIT" holds that unit at its commit point until a signal


def digest(value: Any) -> str:
    """A stable digest of plain data (JSON with sorted keys; dataclasses by their repr)."""
    return xxhash.xxh3_128(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()


def file_xxh3(path: Path, chunk_size: int = 1 << 22) -> str:
    """xxh3-128 of a file's bytes (a local or object-store path), read in ``chunk_size`` pieces."""
    return file_digests(path, ("xxh3_128",), chunk_size=chunk_size)["xxh3_128"]


def output_stamp(path: Any) -> list[Any] | None:
    """What says a file is untouched since a record noted it, without reading it: in a folder its size,
    inode, mtime and ctime (any write moves the ctime, and no process can set it back, as a ``utime`` can
    the mtime); on an object store its size and ETag (any new PUT changes it). None when there is none."""
    try:
        if is_local(path):
            return stat_stamp(path.stat())
        info = path.fs.info(path.path)
    except FileNotFoundError:
        return None
    etag = info.get("ETag") or info.get("etag")
    return [int(info.get("size") or 0), str(etag)] if etag else None


def stat_stamp(st: os.stat_result) -> list[int]:
    """A local file's stamp (``output_stamp``) from its ``stat`` (or an open file's ``fstat``)."""
    return [st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


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
    if os.environ.get(HOLD_ENV) == f"{stage}:{unit}":  # an interrupt test's run does not end before its signal
        time.sleep(60)


# ---- the records' types: each unit's record as a dataclass, and its JSON object (keys in field order, as
# the records were written before they had types, so a resumed run reads the records of earlier versions)


@dataclass
class RecordedFile:
    """An output file as its unit recorded it: size, xxh3-128, and the stamp that vouches for it unread."""

    bytes: int
    xxh3: str | None
    stamp: list[Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "xxh3": self.xxh3, "stamp": self.stamp}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RecordedFile:
        return cls(d["bytes"], d["xxh3"], d.get("stamp"))

    def unchanged(self, path: Any) -> bool:
        return file_unchanged(path, self.bytes, self.xxh3, self.stamp)


class PartSpan(NamedTuple):
    """Where a measured part's samples are: its number and how many input records it holds."""

    number: int
    records: int


@dataclass
class PartRecord:
    """A measured part's record (``stages/measure/part-K.json``)."""

    key: str
    number: int
    part: InputPart
    records: int  # input records in the part: measured + rejected
    measured: int
    rejected: int
    files: dict[str, RecordedFile]  # by file name, relative to the measure folder
    # what the samples' cost columns were computed with (the pack stage checks it is its own model)
    cost_model: dict[str, Any] | None
    # this part's processor calls and cache hits per media kind (a processor-backed profile only)
    processor_cache: dict[str, dict[str, int]] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "key": self.key,
            "number": self.number,
            "part": asdict(self.part),
            "records": self.records,
            "measured": self.measured,
            "rejected": self.rejected,
            "files": {name: f.to_json() for name, f in self.files.items()},
            "cost_model": self.cost_model,
        }
        if self.processor_cache is not None:
            out["processor_cache"] = self.processor_cache
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PartRecord:
        files = {name: RecordedFile.from_json(f) for name, f in d.get("files", {}).items()}
        return cls(
            d["key"], d["number"], InputPart(**d["part"]), d["records"], d["measured"], d["rejected"], files,
            d.get("cost_model"), d.get("processor_cache"),
        )  # fmt: skip

    @property
    def kept_bytes(self) -> int:
        return sum(f.bytes for f in self.files.values())


@dataclass
class PlannedShard:
    """A shard of the pack stage's layout: a write unit, known before writing."""

    number: int
    path: str  # relative to the output root
    split: str
    prefix: str  # the split's shard name prefix ("shards/shard", "shards/val")
    index: int  # the shard's number within its split
    rows: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PlannedShard:
        return cls(**d)


@dataclass
class PlanRecord:
    """The pack stage's record (``stages/plan.json``): the plan's facts, its rejects and its shards."""

    key: str
    input: int  # input records of every part
    measured: int  # less the duplicates dropped: as if the input were read as one part
    dropped_duplicates: list[int]  # measured samples a duplicate-id reject replaces (by sample index)
    parts: list[int]  # the measured parts' numbers
    offsets: list[int]  # global sample index of each part's first record, plus the total
    rejects: list[Reject]  # the pack stage's, then the duplicate ids'
    superseded_rejects: list[int]  # measure rejects (by sample index) that the duplicate-id rejects replace
    stats: dict[str, Any]
    num_rows: int
    shards: list[PlannedShard]

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["rejects"] = [r.to_json() for r in self.rejects]
        out["shards"] = [s.to_json() for s in self.shards]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PlanRecord:
        # (plans of versions before the duplicate-id handling have neither list)
        lists = {"dropped_duplicates": [], "superseded_rejects": []}
        plain = {f.name: d.get(f.name, lists.get(f.name)) for f in fields(cls)}
        rejects = [Reject.from_json(r) for r in d["rejects"]]
        shards = [PlannedShard.from_json(s) for s in d["shards"]]
        return cls(**{**plain, "rejects": rejects, "shards": shards})

    @classmethod
    def read(cls, path: Path) -> PlanRecord | None:
        """The plan record at ``path``, whatever its key; None when there is none (yet)."""
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    @property
    def spans(self) -> list[PartSpan]:
        """The measured parts the plan used, with their record counts."""
        ends = zip(self.offsets, self.offsets[1:], strict=False)
        return [PartSpan(n, b - a) for n, (a, b) in zip(self.parts, ends, strict=False)]


@dataclass
class ShardRecord:
    """A written shard's record (``stages/write/shard-K.json``)."""

    key: str
    number: int
    shard: ShardInfo | None  # None when every sample of its rows was rejected
    # the index's checksum (the tar's is in the shard info): a resumed run checks both
    index_xxh3: str | None
    # what lets a resumed run trust the shard without reading it (see ``output_stamp``): "tar", "idx"
    stamps: dict[str, list[Any] | None] | None
    rejects: list[Reject]
    rows_written: int
    samples_written: int
    real_tokens: int

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["shard"] = None if self.shard is None else asdict(self.shard)
        out["rejects"] = [r.to_json() for r in self.rejects]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ShardRecord:
        plain = {f.name: d.get(f.name) for f in fields(cls) if f.name not in ("shard", "rejects")}
        shard = None if d["shard"] is None else ShardInfo(**d["shard"])
        return cls(**plain, shard=shard, rejects=[Reject.from_json(r) for r in d["rejects"]])

    @property
    def kept_bytes(self) -> int:
        return 0 if self.shard is None else self.shard.num_bytes
