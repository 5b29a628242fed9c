"""Sample store: the write stage's processed media payloads (the exact bytes of a shard's ``media.*`` members:
resized pixels, frames, audio, or a profile's own tensors), kept once so that a repack copies them instead
of decoding and resizing again.

A store is a local folder: by default ``stages/samples`` of the run, or ``--sample-store PATH`` shared by
many packings of one corpus. Inside it, one folder per *shape*, the settings that decide a payload's bytes
besides its source and plan (profile, its options and resolved settings, pixel encodings, this format)::

    <store>/<shape>/settings.json              the shape, readable
    <store>/<shape>/segments/<writer>.bin      append-only payload bytes of one write unit
    <store>/<shape>/segments/<writer>.parquet  its index (key, offset, length, ext, xxh3) and the .bin's
                                               stamp once written; written last
    <store>/<shape>/index.json                 names the merged index now current
    <store>/<shape>/index-<digest>.arrow       every segment's index merged, sorted by key (memory-mapped)

A media item's key is the digest (``records.digest``, as every completion key) of its measured reference,
the media root and its plan (target size, frames, samples): what the measure stage recorded for it. Files
scale with write units, not samples; a lookup is a binary search in the mapped index and a payload read is
a view of the memory-mapped segment; the shard writer copies it from the segment file to the shard in the
kernel. Each payload's xxh3 is computed from the bytes in memory as they are written, and the segment's stamp
(size, inode, mtime, ctime: ``records.output_stamp``) recorded after its last write: a segment whose stamp
is still that one holds the bytes hashed (any write since moves its ctime, which no process can set back),
so its payloads are copied unhashed (the shard's xxh3-128 is their one pass); a segment whose stamp moved
(changed, copied, or recorded before stamps) has each payload checked against its xxh3 on read (a damaged
one is decoded again, never copied). A change no stamp shows (bit rot under an unchanged inode) reaches the
shard with the row's recorded media digest, which ``verify`` recomputes.
Segments a stage writes become visible to the next run's index (``refresh_index``, before the write stage).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import mmap
import os
import sys
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from ..dataset.file_payload import FilePayload
from ..media.sources import local_path
from .records import digest, output_stamp, stat_stamp, write_json_atomic
from .storage import is_local, make_dirs

STORE_FORMAT = 1  # bump when the bytes a payload holds change for the same source, plan and settings
STORE_DIR = "samples"  # the default store under the run's stages/ folder
OFF = "off"  # ``--sample-store off``: no store (every write decodes)
MAX_OPEN_SEGMENTS = 64  # segment files a reader keeps mapped at once

SEGMENT_SCHEMA = pa.schema(
    [
        ("key0", pa.uint64()),  # the 128-bit key, high and low halves
        ("key1", pa.uint64()),
        ("offset", pa.int64()),
        ("length", pa.int64()),
        ("ext", pa.string()),
        ("xxh3", pa.uint64()),  # xxh3-64 of the payload (a row's media digest), checked on every read
    ]
)


MADV_POPULATE_READ = 22  # Linux >= 5.14: map a range's pages in one call (not one fault per few pages)


@functools.cache
def _libc_madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise`` through ctypes, which releases the GIL for the call; None off Linux. ``mmap.madvise``
    holds the GIL while the kernel maps the pages (~1.5 ms for a 3 MB payload), so the shard writer's thread,
    back from each write, waited that long for the build-ahead thread's populate (benchmarks/README.md,
    Repack, fifth pass)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def _address(mapped: mmap.mmap) -> int:
    """Where ``mapped`` lies in memory (a read-only map gives no ctypes buffer; numpy's view does)."""
    return int(np.frombuffer(mapped, dtype=np.uint8).ctypes.data) if len(mapped) else 0


def _populate(mapped: mmap.mmap, address: int, start: int, length: int) -> None:
    """Map a payload's pages before it is hashed: a fault per page cost about as much kernel time as
    copying the bytes (``benchmarks/README.md``, Repack). Where the call is missing, the faults do it.
    ``address``: ``_address(mapped)``."""
    if not length or not sys.platform.startswith("linux"):
        return
    first = start - start % mmap.PAGESIZE
    if (madvise := _libc_madvise()) is not None:
        madvise(address + first, start + length - first, MADV_POPULATE_READ)  # an old kernel's EINVAL: faults
        return
    with contextlib.suppress(OSError, ValueError):
        mapped.madvise(MADV_POPULATE_READ, first, start + length - first)


def shape_settings(spec: Any, own_media: bool) -> dict[str, Any]:
    """What shapes a payload beyond its source and plan: the profile (name, options, the settings it resolved
    from the model folder, e.g. a processor's normalisation) and how pixels are stored."""
    w, m = spec.write, spec.measure
    return {
        "format": STORE_FORMAT,
        "profile": m.profile,
        "options": m.profile_options,
        "settings": spec.facts.profile.get("settings"),
        "own_media": own_media,  # a profile's own tensors (npz) instead of the decoded media
        "image_encoding": "npy" if own_media else w.image_encoding,
        "compress_video": bool(w.compress_video and not own_media),
    }


def item_key(media_root: str | None, ref: str, plan: dict[str, Any]) -> tuple[int, int]:
    """A media item's key: its reference (as measured), the media root it is relative to, and its plan."""
    h = digest({"media_root": media_root, "ref": ref, "plan": plan})
    return int(h[:16], 16), int(h[16:32], 16)


def store_root(spec: Any) -> Path | None:
    """The run's store folder: ``--sample-store``, else ``stages/samples`` of a local output; None when off
    (``off``, or an object-store output without a store path)."""
    chosen = spec.write.sample_store
    if chosen == OFF:
        return None
    if chosen is not None:
        return Path(store_location(chosen))
    return spec.stages / STORE_DIR if is_local(spec.stages) else None


def store_location(chosen: str | None) -> str | None:
    """``--sample-store`` as the run records it: a folder as its absolute path (every worker, a Ray actor
    too, finds the same store), None and ``off`` as they are."""
    if chosen in (None, OFF):
        return chosen
    return str(_store_folder(chosen).resolve())


def check_store_location(chosen: str | None) -> None:
    """A store is a local (or mounted) folder: its payloads are read as views of memory-mapped
    indices and segment files, which an object store's whole-object PUTs do not give."""
    if chosen not in (None, OFF):
        _store_folder(chosen)


def _store_folder(chosen: str) -> Path:
    return local_path(chosen, "--sample-store", "folder (or 'off')")


@dataclass
class _Index:
    key0: np.ndarray
    key1: np.ndarray
    segment: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    ext: np.ndarray
    xxh3: np.ndarray
    segments: list[str]
    exts: list[str]
    stamps: list[list[int] | None]  # each segment's stamp as committed (None: recorded before stamps)


def _empty_index() -> _Index:
    z = np.zeros(0, dtype=np.uint64)
    return _Index(z, z, np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int8), z, [], [], [])


def _view(column: pa.ChunkedArray) -> np.ndarray:
    """A column of the mapped index as numpy, zero-copy (its one chunk is a view of the mapped file)."""
    return column.chunk(0).to_numpy() if column.num_chunks == 1 else column.to_numpy()


class SampleStore:
    """One shape's folder of a store: lookups in the merged index, and a writer for this unit's new payloads."""

    def __init__(self, folder: Path, shape: dict[str, Any]) -> None:
        self.folder = folder
        self.shape = shape
        self.segments = folder / "segments"
        self._index = _empty_index()
        self._index_name: str | None = None
        # segment number -> its mapped bytes and whether its stamp is the committed one (its payloads then
        # trusted unhashed), least recently used first (a repack reads from every segment of a corpus: one
        # per write unit, thousands for a large one, more than a process may hold open)
        self._files: OrderedDict[int, tuple[mmap.mmap, bool, int]] = OrderedDict()
        self._files_lock = threading.Lock()  # the write stage's row builders look payloads up from threads

    @classmethod
    def at(cls, root: Path, shape: dict[str, Any]) -> SampleStore:
        folder = root / digest(shape)[:20]
        make_dirs(folder / "segments")
        settings = folder / "settings.json"
        if not settings.exists():
            write_json_atomic(settings, shape)
        return cls(folder, shape)

    # ---- the merged index

    def refresh_index(self) -> str:
        """Merge every committed segment's index into one sorted, memory-mappable file (kept while the
        segments are the same) and name it current; returns its name."""
        names = sorted(p.stem for p in self.segments.glob("*.parquet"))
        name = f"index-{digest(names)[:16]}.arrow"
        path = self.folder / name
        if not path.exists():
            # (ParquetFile, not read_table: that imports pyarrow.dataset, which a repack needs nowhere else)
            tables = [pq.ParquetFile(self.segments / f"{n}.parquet").read() for n in names]
            stamps = [json.loads((t.schema.metadata or {}).get(b"stamp", b"null")) for t in tables]
            tables = [t.replace_schema_metadata(None) for t in tables]
            table = pa.concat_tables(tables) if tables else SEGMENT_SCHEMA.empty_table()
            seg = np.concatenate([np.full(len(t), i, np.int32) for i, t in enumerate(tables)] or [np.zeros(0, np.int32)])
            k0, k1 = table.column("key0").to_numpy(), table.column("key1").to_numpy()
            order = np.lexsort((k1, k0))
            k0, k1 = k0[order], k1[order]
            first = np.ones(len(order), dtype=bool)  # a key stored by two units: keep one
            first[1:] = (k0[1:] != k0[:-1]) | (k1[1:] != k1[:-1])
            order = order[first]
            ext = table.column("ext").combine_chunks().dictionary_encode()
            exts = ext.dictionary.to_pylist()
            merged = pa.table(
                {
                    "key0": k0[first],
                    "key1": k1[first],
                    "segment": seg[order],
                    "offset": table.column("offset").to_numpy()[order],
                    "length": table.column("length").to_numpy()[order],
                    "ext": ext.indices.to_numpy()[order].astype(np.int8),
                    "xxh3": table.column("xxh3").to_numpy()[order],
                }
            ).replace_schema_metadata(
                {"segments": json.dumps(names), "exts": json.dumps(exts), "stamps": json.dumps(stamps)}
            )
            tmp = path.with_name(f"{name}.{uuid.uuid4().hex}.partial")  # a run's start removes leftovers
            with pa.OSFile(str(tmp), "wb") as f, pa.ipc.new_file(f, merged.schema) as w:
                w.write_table(merged)
            os.replace(tmp, path)
        write_json_atomic(self.folder / "index.json", {"current": name})
        for old in self.folder.glob("index-*.arrow"):  # a reader that lost one re-reads index.json
            if old.name != name:
                old.unlink(missing_ok=True)
        return name

    def load_index(self) -> None:
        """Map the current merged index (none yet: an empty store)."""
        for _ in range(3):
            try:
                name = json.loads((self.folder / "index.json").read_text())["current"]
            except FileNotFoundError:
                self._index, self._index_name = _empty_index(), None
                return
            if name == self._index_name:
                return
            try:
                table = pa.ipc.open_file(pa.memory_map(str(self.folder / name))).read_all()
            except FileNotFoundError:  # replaced meanwhile by a newer merge
                continue
            meta = table.schema.metadata
            cols = {c: _view(table.column(c)) for c in table.column_names}
            segments = json.loads(meta[b"segments"])
            self._index = _Index(
                cols["key0"], cols["key1"], cols["segment"], cols["offset"], cols["length"], cols["ext"],
                cols["xxh3"], segments, json.loads(meta[b"exts"]),
                json.loads(meta.get(b"stamps", b"null")) or [None] * len(segments),
            )  # fmt: skip
            self._index_name = name
            self.close_files()
            return
        raise RuntimeError(f"the sample store's index under {self.folder} keeps changing")

    def get(self, key: tuple[int, int]) -> tuple[str, FilePayload] | None:
        """(ext, payload) stored under ``key``: its bytes (a view of the mapped segment), where they lie and
        their xxh3 (the shard writer copies them file to file, the row's media digest is that xxh3); None
        when absent or damaged (then decoded again). Checked against the xxh3 unless its segment's stamp is
        the committed one."""
        ix = self._index
        lo = int(np.searchsorted(ix.key0, np.uint64(key[0]), side="left"))
        hi = int(np.searchsorted(ix.key0, np.uint64(key[0]), side="right"))
        for i in range(lo, hi):
            if int(ix.key1[i]) == key[1]:
                seg, length, start, xxh3 = int(ix.segment[i]), int(ix.length[i]), int(ix.offset[i]), int(ix.xxh3[i])
                try:
                    mapped, trusted, address = self._segment(seg)
                except (OSError, ValueError):  # removed, or emptied: decoded again
                    return None
                data = memoryview(mapped)[start : start + length]
                if len(data) != length:
                    return None
                _populate(mapped, address, start, length)  # hashed next: here, or into the shard's checksum
                if not trusted and xxhash.xxh3_64_intdigest(data) != xxh3:
                    return None
                return ix.exts[int(ix.ext[i])], FilePayload(data, self._segment_path(seg), start, xxh3)
        return None

    def _segment(self, seg: int) -> tuple[mmap.mmap, bool, int]:
        """Segment ``seg`` mapped, whether the file mapped has the stamp its commit recorded, and the map's
        address (the last ``MAX_OPEN_SEGMENTS`` kept; one dropped is unmapped once no payload view of it is
        left)."""
        with self._files_lock:
            found = self._files.get(seg)
            if found is not None:
                self._files.move_to_end(seg)
                return found
            if len(self._files) >= MAX_OPEN_SEGMENTS:
                self._files.popitem(last=False)
            with open(self._segment_path(seg), "rb") as f:
                trusted = self._index.stamps[seg] == stat_stamp(os.fstat(f.fileno()))  # the file mapped
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                found = self._files[seg] = (mapped, trusted, _address(mapped))
            return found

    def _segment_path(self, seg: int) -> str:
        return str(self.segments / f"{self._index.segments[seg]}.bin")

    def close_files(self) -> None:
        """Drop the segment maps (each unmapped once no payload view of it is left)."""
        with self._files_lock:
            self._files.clear()

    def writer(self, unit: str) -> SegmentWriter:
        return SegmentWriter(self.segments, f"{unit}-{uuid.uuid4().hex[:12]}")


class RunSampleStore:
    """Where a run holds its sample store: opened on first use in each process that runs the run's write
    units, then kept for its units there. Each run's spec holds its own (``RunSpec.samples``), so a run
    opens the store anew (an overwrite before it may have removed the folder an earlier run mapped); a spec
    pickled to a worker carries it unopened (each worker maps its own)."""

    def __init__(self) -> None:
        self._opened = False
        self._store: SampleStore | None = None

    def get(self, open_store: Callable[[], SampleStore | None]) -> SampleStore | None:
        """The store ``open_store()`` opened at this process's first call (None: the run keeps none)."""
        if not self._opened:
            self._store, self._opened = open_store(), True
        return self._store

    def __getstate__(self) -> dict[str, Any]:
        return {}  # mapped files stay in the process that mapped them

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()


class SegmentWriter:
    """One write unit's new payloads: appended to its own ``.bin``, indexed in its ``.parquet`` on commit
    (a unit killed before that leaves only an unindexed ``.bin``, never read)."""

    def __init__(self, folder: Path, name: str) -> None:
        self.bin, self.index = folder / f"{name}.bin", folder / f"{name}.parquet"
        self._file: Any = None
        self._rows: dict[str, list[Any]] = {f.name: [] for f in SEGMENT_SCHEMA}
        self._keys: set[tuple[int, int]] = set()
        self._offset = 0

    def put(self, key: tuple[int, int], ext: str, data: bytes, digest: str) -> None:
        """Keep ``data`` under ``key``; ``digest``: its ``media_digest`` (the writer's, for the row)."""
        if key in self._keys:
            return
        if self._file is None:
            self._file = open(self.bin, "wb")  # noqa: SIM115 - held open across the unit's rows
        self._file.write(data)
        for name, value in zip(
            self._rows, (key[0], key[1], self._offset, len(data), ext, int(digest, 16)), strict=True
        ):
            self._rows[name].append(value)
        self._keys.add(key)
        self._offset += len(data)

    def commit(self) -> None:
        """The payloads written and synced, then their index and the segment's stamp (the segment's commit
        point). The fsync comes before the stamp: a repack copies a segment whose stamp is unchanged without
        checking its payloads' xxh3, and not every file system persists a file's data before its size and
        times (ext4 ``data=writeback``, some network and FUSE mounts), so a crash could otherwise leave a
        full-length segment of zeros behind a matching stamp."""
        if self._file is None:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        stamp = {"stamp": json.dumps(output_stamp(self.bin))}
        table = pa.table(self._rows, schema=SEGMENT_SCHEMA.with_metadata(stamp))
        tmp = self.index.with_name(f"{self.index.name}.{uuid.uuid4().hex}.partial")
        pq.write_table(table, tmp)
        os.replace(tmp, self.index)

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.bin.unlink(missing_ok=True)


class UnitPayloads:
    """A write unit's view of the store: payloads by media item (reference and plan), and its new ones."""

    def __init__(self, store: SampleStore, media_root: str | None, unit: str) -> None:
        self.store, self.media_root = store, media_root
        self.writer = store.writer(unit)

    def get(self, ref: str, plan: dict[str, Any]) -> tuple[str, FilePayload] | None:
        return self.store.get(item_key(self.media_root, ref, plan))

    def put(self, ref: str, plan: dict[str, Any], ext: str, data: bytes, digest: str) -> None:
        self.writer.put(item_key(self.media_root, ref, plan), ext, data, digest)
