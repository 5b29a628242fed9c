"""Write stage: planned rows -> media materialised at the model's target size -> tar shards.

Rows are built on a process pool (media decoding is the heavy part); the main process writes shards in
plan order, so output is deterministic regardless of the worker count. A sample whose media fails to
decode here is rejected with its reason and its row is rebuilt from the remaining samples.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..dataset.codec import encode_row
from ..dataset.contract import row_invariant_errors
from ..dataset.shards import SHARD_CHECKSUMS, ShardInfo, ShardWriter
from ..executor import map_ordered
from ..manifest import ManifestError
from ..measure import sample_arrays
from ..media.errors import MediaError
from ..media.sources import resolve_source
from ..plan import PackResult
from ..profiles.base import MediaPlan
from ..rows import SequenceInput, assemble_row


@dataclass(frozen=True)
class WriteConfig:
    media_root: str
    seq_length: int
    align: int
    pad_token_id: int
    image_encoding: str = "npy"
    compress_video: bool = False
    shard_max_bytes: int = 1 << 30
    shard_max_rows: int | None = None
    shard_checksums: tuple[str, ...] = SHARD_CHECKSUMS
    workers: int = 1
    val_rows: int = 0  # this many rows, drawn with ``val_seed``, go to separate "val" shards
    val_seed: int = 0
    media_allow_roots: tuple[str, ...] = ()  # folders outside the media root that symlinks may point into


@dataclass
class RowResult:
    key: str
    parts: dict[str, bytes] | None  # None when every sample of the row was rejected
    rejects: list[dict[str, Any]]
    num_samples: int
    real_tokens: int


def build_row(key: str, records: list[dict[str, Any]], cfg: WriteConfig) -> RowResult:
    """Materialise a row's media and assemble its arrays; pure function of its inputs."""
    from ..media.probe import materialize

    seqs: list[SequenceInput] = []
    payloads: dict[str, bytes] = {}
    rejects = []
    for rec in records:
        media, sample_payloads = [], {}
        try:
            for m in json.loads(rec["media_json"]):
                plan = MediaPlan.from_json(m["plan"])
                ext, data = materialize(
                    resolve_source(m["ref"], cfg.media_root, cfg.media_allow_roots),
                    plan,
                    image_encoding=cfg.image_encoding,
                    compress_video=cfg.compress_video,
                )
                part = f"media.{len(payloads) + len(sample_payloads)}.{ext}"
                sample_payloads[part] = data
                media.append((plan, tuple(m["span"]), part))
        except (MediaError, ManifestError) as e:
            rejects.append(
                {
                    "sample_index": rec["sample_index"],
                    "sample_id": rec["sample_id"],
                    "source": rec["source"],
                    "stage": "write",
                    "reason": str(e),
                }
            )
            continue
        ids, labels, mrope = sample_arrays(rec)
        seqs.append(SequenceInput(rec["sample_id"], ids, labels, media, mrope))
        payloads.update(sample_payloads)
    if not seqs:
        return RowResult(key, None, rejects, 0, 0)
    row = assemble_row(seqs, cfg.seq_length, cfg.align, cfg.pad_token_id)
    errors = row_invariant_errors(row, cfg.align)
    if errors:  # a bug, not bad input: refuse to write a wrong row
        raise AssertionError(f"row {key} breaks the contract: {errors}")
    return RowResult(key, encode_row(row, payloads), rejects, len(seqs), int(row.seqlens.sum()))


def _arrow_copy(samples_path: Path) -> Path:
    """The measure table as an Arrow IPC file next to the Parquet file (Parquet pages cannot be mapped;
    converted once, streaming, a record batch per row group)."""
    arrow_path = samples_path.with_suffix(".arrow")
    if not arrow_path.exists() or arrow_path.stat().st_mtime_ns < samples_path.stat().st_mtime_ns:
        parquet = pq.ParquetFile(samples_path)
        tmp = arrow_path.with_suffix(".arrow.partial")
        pool = pa.default_memory_pool()
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, parquet.schema_arrow) as out:
            # a row group at a time, one thread, freed pages handed back each time: memory stays flat
            # (batch iteration reads ahead on threads and the allocator keeps what it freed)
            for i in range(parquet.num_row_groups):
                out.write_table(parquet.read_row_group(i, use_threads=False))
                pool.release_unused()
        os.replace(tmp, arrow_path)
    return arrow_path


class MeasuredSamples:
    """Measured samples by position, read in place from the memory-mapped Arrow copy of the measure table.

    A sample costs O(its size): its record batch is found by bisection and its token lists are numpy views
    of the mapped file (a ``Table.take`` copies every record batch it spans: quadratic over a run). The
    mapped pages the rows touched are released every ``release_every`` samples (shuffled rows read a few
    arrays per sample all over the file, and each read maps the kernel's fault-around window, 64 KiB), so
    resident memory stays flat however large the table is.
    """

    def __init__(self, samples_path: Path, release_every: int = 64) -> None:
        import mmap

        with open(_arrow_copy(samples_path), "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        reader = pa.ipc.open_file(pa.py_buffer(self._map))
        self.schema = reader.schema
        self._batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        sizes = np.asarray([b.num_rows for b in self._batches], dtype=np.int64)
        self._batch_start = np.concatenate([[0], np.cumsum(sizes)])
        self.sample_index = (
            np.concatenate([b.column("sample_index").to_numpy() for b in self._batches])
            if self._batches
            else np.zeros(0, dtype=np.int64)
        )
        self._lists = {
            f.name for f in self.schema if pa.types.is_list(f.type) or pa.types.is_large_list(f.type)
        }
        self._list_views: dict[tuple[int, str], tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
        self._release_every, self._since_release = release_every, 0

    def __len__(self) -> int:
        return int(self._batch_start[-1])

    def positions(self, sample_index: np.ndarray) -> np.ndarray:
        """Table positions of input sample indices (the measure stage writes them in input order)."""
        indices = self.sample_index
        if len(indices) == 0:
            raise AssertionError("planned samples missing from the measure table")
        pos = np.minimum(np.searchsorted(indices, sample_index), len(indices) - 1)
        if not np.array_equal(indices[pos], sample_index):
            raise AssertionError("planned samples missing from the measure table")
        return pos

    def _list_view(self, b: int, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(offsets, values, validity or None when no list is null) of a list column of batch ``b``."""
        key = (b, name)
        view = self._list_views.get(key)
        if view is None:
            column = self._batches[b].column(name)
            valid = None if column.null_count == 0 else column.is_valid().to_numpy(zero_copy_only=False)
            view = (column.offsets.to_numpy(), column.values.to_numpy(), valid)
            self._list_views[key] = view
        return view

    def record(self, pos: int) -> dict[str, Any]:
        """The sample at table position ``pos``: scalars as Python values, token lists as numpy views."""
        b = int(np.searchsorted(self._batch_start, pos, side="right")) - 1
        i = int(pos - self._batch_start[b])
        batch = self._batches[b]
        rec: dict[str, Any] = {}
        for name in self.schema.names:
            if name in self._lists:
                offsets, values, valid = self._list_view(b, name)
                rec[name] = values[offsets[i] : offsets[i + 1]] if valid is None or valid[i] else None
            else:
                rec[name] = batch.column(name)[i].as_py()
        self._since_release += 1
        if self._since_release >= self._release_every:
            self.release()
        return rec

    def release(self) -> None:
        """Drop the mapped pages from this process's resident set (they stay in the page cache)."""
        import mmap

        self._since_release = 0
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)


def _row_jobs(samples_path: Path, plan: PackResult) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    samples = MeasuredSamples(samples_path)
    for r in range(plan.num_rows):
        pos = samples.positions(plan.row(r))
        yield f"{r:09d}", [samples.record(int(p)) for p in pos]


def _row_builder(cfg: WriteConfig) -> Callable[[tuple[str, list[dict[str, Any]]]], RowResult]:
    return lambda job: build_row(job[0], job[1], cfg)


def write_rows(
    samples_path: Path, plan: PackResult, out_root: Path, cfg: WriteConfig, *, progress: bool = True
) -> tuple[list[ShardInfo], list[dict[str, Any]], dict[str, Any]]:
    """Write every planned row; returns shard infos, write-time rejects and row statistics."""
    from tqdm import tqdm

    train = ShardWriter(
        out_root, max_bytes=cfg.shard_max_bytes, max_count=cfg.shard_max_rows, checksums=cfg.shard_checksums
    )
    val = ShardWriter(
        out_root, "shards/val", cfg.shard_max_bytes, cfg.shard_max_rows, "val", cfg.shard_checksums
    )
    # Drawn at random, not the plan's tail: unshuffled plans are ordered by length.
    val_picks = np.random.default_rng(cfg.val_seed).permutation(plan.num_rows)[: cfg.val_rows]
    is_val = np.zeros(plan.num_rows, dtype=bool)
    is_val[val_picks] = True
    rejects: list[dict[str, Any]] = []
    samples_per_row: list[int] = []
    real_tokens = 0
    try:
        # small windows: each job carries a whole row's samples
        results = map_ordered(
            _row_builder, cfg, _row_jobs(samples_path, plan), workers=cfg.workers, window=64, chunksize=2
        )
        for r, res in enumerate(
            tqdm(results, total=plan.num_rows, desc="write", unit="row", disable=not progress)
        ):
            rejects.extend(res.rejects)
            if res.parts is not None:
                (val if is_val[r] else train).write(res.key, res.parts)
                samples_per_row.append(res.num_samples)
                real_tokens += res.real_tokens
    except BaseException:
        train.abort()
        val.abort()
        raise
    shards = train.close() + val.close()
    stats = {
        "rows_written": len(samples_per_row),
        "samples_written": int(sum(samples_per_row)),
        "real_tokens": real_tokens,
    }
    return shards, rejects, stats
