"""A measured part's token file (``part-K.tokens``): each measured sample's write-stage record back to back.

A record is what the write stage reads of a sample: its token ids, labels and mRoPE ids, its id, source
and media plans, and its index within the part. One sample's record is one contiguous byte range, whose
offset and length the part's Parquet file holds (``tokens_offset``, ``tokens_bytes``) and the pack stage
copies into the plan, so a write unit reads only its shard's samples: in place from the memory-mapped
file in a folder, and from an object store by ranged reads of just those ranges (near ones coalesced into
one request), never the whole part. Every shard draws samples from every part, so reading whole parts
would cost each write unit the whole corpus.

A record: ``<u32 header bytes, u32 tokens>``, the header (JSON: index, id, source, media, has mRoPE) padded
to 4 bytes, then int32 ``input_ids``, ``labels`` and, when present, ``mrope_position_ids`` ([3, L]).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from .storage import AnyPath, is_local, read_range, staging_dir

_HEAD = struct.Struct("<II")
LOCATION_COLUMNS = ("tokens_offset", "tokens_bytes")  # a sample's range in its part's token file
MISSING = "planned samples missing from the measure table"
# the gather file's entries: a placed sample's plan row, global index, and range in its part's token file
GATHER_DTYPE = np.dtype([("row", "<i8"), ("sample_index", "<i8"), ("offset", "<i8"), ("bytes", "<i8")])


def _list_arrays(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(offsets, values, validity or None when no list is null) of a list column."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    valid = None if array.null_count == 0 else array.is_valid().to_numpy(zero_copy_only=False)
    offsets = array.offsets.to_numpy()
    # ``values`` is the whole child array, also of a slice: its entries from the slice's first offset on
    values = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])).to_numpy()
    return offsets - offsets[0], values, valid


def write_records(table: pa.Table, out: BinaryIO, start: int) -> tuple[np.ndarray, np.ndarray]:
    """The samples of ``table`` (the measure stage's ``SAMPLES_SCHEMA``) appended to the token file ``out``,
    whose size is ``start``: each record's (offset, length)."""
    scalars = {n: table.column(n).to_pylist() for n in ("sample_index", "sample_id", "source", "media_json")}
    ids_off, ids, _ = _list_arrays(table.column("input_ids"))
    lab_off, labels, _ = _list_arrays(table.column("labels"))
    mr_off, mrope, mr_valid = _list_arrays(table.column("mrope_position_ids"))
    ids, labels, mrope = (np.asarray(a, dtype=np.int32) for a in (ids, labels, mrope))
    n = table.num_rows
    offsets, sizes = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    at = start
    for i in range(n):
        has_mrope = bool(mr_valid is None or mr_valid[i])
        head = json.dumps(
            [scalars["sample_index"][i], scalars["sample_id"][i], scalars["source"][i],
             scalars["media_json"][i], has_mrope],
            separators=(",", ":"),
        ).encode()  # fmt: skip
        length = int(ids_off[i + 1] - ids_off[i])
        if lab_off[i + 1] - lab_off[i] != length or (has_mrope and mr_off[i + 1] - mr_off[i] != 3 * length):
            raise AssertionError(f"sample {scalars['sample_id'][i]!r}: token columns of different lengths")
        pieces = [_HEAD.pack(len(head), length), head, b"\0" * (-len(head) % 4)]
        pieces += [ids[ids_off[i] : ids_off[i + 1]].tobytes(), labels[lab_off[i] : lab_off[i + 1]].tobytes()]
        if has_mrope:
            pieces.append(mrope[mr_off[i] : mr_off[i + 1]].tobytes())
        record = b"".join(pieces)
        out.write(record)
        offsets[i], sizes[i] = at, len(record)
        at += len(record)
    return offsets, sizes


def read_record(buf: Any, at: int) -> dict[str, Any]:
    """The record at byte ``at`` of ``buf``: scalars as Python values, token arrays as numpy views of it."""
    head_len, length = _HEAD.unpack_from(buf, at)
    head = at + _HEAD.size
    index, sample_id, source, media_json, has_mrope = json.loads(bytes(buf[head : head + head_len]))
    tokens = head + head_len + (-head_len % 4)
    mrope = np.frombuffer(buf, np.int32, 3 * length, tokens + 8 * length) if has_mrope else None
    return {
        "sample_index": index,
        "sample_id": sample_id,
        "source": source,
        "media_json": media_json,
        "input_ids": np.frombuffer(buf, np.int32, length, tokens),
        "labels": np.frombuffer(buf, np.int32, length, tokens + 4 * length),
        "mrope_position_ids": mrope,
    }


def coalesce(starts: np.ndarray, ends: np.ndarray, max_bytes: int = 8 << 20) -> list[tuple[int, int]]:
    """Sorted, disjoint byte ranges merged into fewer reads: a range joins the read before it when the gap
    between them keeps the read's unwanted bytes within half its wanted ones (so what is read stays within
    1.5x what is wanted) and the read within ``max_bytes``."""
    reads: list[tuple[int, int]] = []
    wanted = waste = 0
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        if reads:
            first, last = reads[-1]
            gap = s - last
            if gap >= 0 and 2 * (waste + gap) <= wanted + e - s and e - first <= max_bytes:
                reads[-1] = (first, e)
                wanted, waste = wanted + e - s, waste + gap
                continue
        reads.append((s, e))
        wanted, waste = e - s, 0
    return reads


class SampleRecords:
    """Measured samples of a write unit by position in its list, read from mapped token files.

    ``which``/``at``: each sample's buffer and offset in it; ``index``/``local_index``: its global sample
    index, and its index within its part (which its record must hold). The mapped pages of the files are
    released every ``release_every`` samples (rows read a few records each all over the files, and each
    read maps the kernel's fault-around window), so resident memory stays flat however large they are."""

    def __init__(
        self, buffers: Sequence[mmap.mmap | None], which: np.ndarray, at: np.ndarray, index: np.ndarray,
        local_index: np.ndarray, release_every: int = 64,
    ) -> None:  # fmt: skip
        self.buffers, self.which, self.at = buffers, which, at
        self.index, self.local_index = index, local_index
        self._release_every, self._since_release = release_every, 0

    def __len__(self) -> int:
        return len(self.at)

    def record(self, k: int) -> dict[str, Any]:
        """Sample ``k``'s record, ``sample_index`` global."""
        rec = read_record(self.buffers[int(self.which[k])], int(self.at[k]))
        if rec["sample_index"] != int(self.local_index[k]):
            raise AssertionError(MISSING)
        rec["sample_index"] = int(self.index[k])
        self._since_release += 1
        if self._since_release >= self._release_every:
            self.release()
        return rec

    def release(self) -> None:
        """Drop the mapped pages from this process's resident set (they stay in the page cache)."""
        self._since_release = 0
        if hasattr(mmap, "MADV_DONTNEED"):
            for buf in self.buffers:
                if hasattr(buf, "madvise"):
                    buf.madvise(mmap.MADV_DONTNEED)


def _mapped(path: Path) -> mmap.mmap:
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:  # a part with no measured sample: nothing to map
            return mmap.mmap(-1, 1)
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


class TokenFiles:
    """A run's measured parts' token files, by global sample index (parts' first indices ``offsets``)."""

    def __init__(self, paths: Sequence[AnyPath], offsets: np.ndarray) -> None:
        self.paths, self.offsets = list(paths), np.asarray(offsets, dtype=np.int64)
        self._maps: dict[int, mmap.mmap] = {}  # a folder's files, mapped once per process

    def parts(self, index: np.ndarray) -> np.ndarray:
        """The part of each global sample index."""
        part = np.searchsorted(self.offsets, index, side="right") - 1
        if len(part) and (part.min() < 0 or part.max() >= len(self.paths)):
            raise AssertionError(MISSING)
        return part

    def open(
        self, index: np.ndarray, offset: np.ndarray, size: np.ndarray, *, max_read: int = 64 << 20
    ) -> SampleRecords:
        """The samples with these global indices, at these offsets and sizes in their parts' token files.
        In a folder the files are mapped in place; on an object store just these ranges (coalesced) are
        read, at most ``max_read`` bytes a batch of concurrent requests, into one local file mapped in
        turn."""
        index, offset, size = (np.asarray(a, dtype=np.int64) for a in (index, offset, size))
        part = self.parts(index)
        local_index = index - self.offsets[part]
        if not len(self.paths) or is_local(self.paths[0]):
            for p in np.unique(part).tolist():
                if p not in self._maps:
                    self._maps[p] = _mapped(self.paths[p])
            buffers = [self._maps.get(p) for p in range(len(self.paths))]
            return SampleRecords(buffers, part, offset, index, local_index)
        buffer, at = self._fetched(part, offset, size, max_read)
        return SampleRecords([buffer], np.zeros_like(part), at, index, local_index)

    def _fetched(
        self, part: np.ndarray, offset: np.ndarray, size: np.ndarray, max_read: int
    ) -> tuple[mmap.mmap, np.ndarray]:
        """The ranges read from the store into a local file (deleted once mapped: the mapping keeps it), and
        each sample's offset in it."""
        order = np.lexsort((offset, part))
        reads = []  # (part, start, end)
        for p in np.unique(part).tolist():
            mine = order[part[order] == p]
            starts = offset[mine]
            first = np.concatenate([[True], starts[1:] != starts[:-1]])  # a sample twice in a plan: read once
            reads += [(p, s, e) for s, e in coalesce(starts[first], starts[first] + size[mine][first])]
        local = staging_dir() / f"gather-{os.getpid()}-{id(self)}.tokens"
        at_read: dict[tuple[int, int], int] = {}  # (part, read start) -> its offset in the local file
        try:
            with open(local, "wb") as out:
                for batch in _batches(reads, max_read):
                    paths, starts, ends = zip(*((self.paths[p].path, s, e) for p, s, e in batch), strict=True)
                    data = self.paths[0].fs.cat_ranges(list(paths), list(starts), list(ends))
                    for (p, s, e), blob in zip(batch, data, strict=True):
                        if isinstance(blob, Exception):
                            raise blob
                        if len(blob) != e - s:
                            raise OSError(f"{self.paths[p]}: read {len(blob)} bytes of its range {s}-{e}")
                        at_read[(p, s)] = out.tell()
                        out.write(blob)
            buffer = _mapped(local)
        finally:
            local.unlink(missing_ok=True)
        at = np.empty(len(offset), dtype=np.int64)
        for p in np.unique(part).tolist():
            begins = np.asarray(sorted(s for q, s in at_read if q == p), dtype=np.int64)
            base = np.asarray([at_read[(p, int(s))] for s in begins], dtype=np.int64)
            mine = np.flatnonzero(part == p)
            read = np.searchsorted(begins, offset[mine], side="right") - 1
            at[mine] = base[read] + offset[mine] - begins[read]
        return buffer, at


def _batches(reads: list[tuple[int, int, int]], max_bytes: int) -> list[list[tuple[int, int, int]]]:
    """Reads in batches of at most ``max_bytes`` (one read larger than that alone), each fetched at once."""
    batches: list[list[tuple[int, int, int]]] = [[]]
    total = 0
    for r in reads:
        if batches[-1] and total + r[2] - r[1] > max_bytes:
            batches.append([])
            total = 0
        batches[-1].append(r)
        total += r[2] - r[1]
    return [b for b in batches if b]


# ---- the gather file (``stages/gather.bin``): each shard's samples, for a write unit to read just its own.
# int64 ``first[S + 1]`` (shard K's entries are ``first[K]:first[K + 1]``), then the entries
# (``GATHER_DTYPE``) by shard, in row order within one. A unit reads two ranges of it, whatever the corpus's
# size (the plan and layout tables grow with it).


def write_gather(path: Path, shard_of: np.ndarray, num_shards: int, entries: np.ndarray) -> None:
    """``entries`` (``GATHER_DTYPE``, in plan order) grouped by their shards ``shard_of``: a gather file."""
    order = np.argsort(shard_of, kind="stable")
    first = np.searchsorted(shard_of[order], np.arange(num_shards + 1)).astype("<i8")
    with open(path, "wb") as f:
        f.write(first.tobytes())
        f.write(entries[order].tobytes())


def read_gather(path: AnyPath, num_shards: int, number: int) -> np.ndarray:
    """Shard ``number``'s entries of a gather file of ``num_shards`` shards (two ranged reads)."""
    a, b = np.frombuffer(read_range(path, 8 * number, 8 * (number + 2)), dtype="<i8").tolist()
    if not 0 <= a <= b:
        raise AssertionError(f"{path}: shard {number}'s entries {a}:{b}")
    if a == b:
        return np.zeros(0, dtype=GATHER_DTYPE)
    base, size = 8 * (num_shards + 1), GATHER_DTYPE.itemsize
    return np.frombuffer(read_range(path, base + size * a, base + size * b), dtype=GATHER_DTYPE)
