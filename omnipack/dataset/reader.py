"""Reading an omnipack dataset for the tools: metadata files, shards as rows, one row by index.

A shard is read once, sequentially: tar members are grouped into rows by key (the name up to the first
dot, as webdataset does), optionally hashing the bytes on the way so checksum and row checks share one
pass. Light readers ask only for a few parts (``meta.json``, boundaries) and seek over the rest.
"""

from __future__ import annotations

import io
import json
import multiprocessing as mp
import os
import sys
import tarfile
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import yaml

from .codec import decode_row, load_npy
from .contract import META_PART, PackedRowArrays, part_name
from .meta import NV_META, OMNIPACK_META
from .shards import HashThread

INFO_JSON = ".info.json"
SPLIT_YAML = "split.yaml"
LIGHT_PARTS = (META_PART, part_name("cu_seqlens"), part_name("cu_seqlens_padded"))

T = TypeVar("T")


@dataclass
class Dataset:
    """An omnipack dataset's metadata: omnipack.json, Energon's .info.json and split.yaml."""

    root: Path
    meta: dict[str, Any]
    info: dict[str, Any] | None
    split: dict[str, Any] | None
    problems: list[str] = field(default_factory=list)  # metadata that is missing or unreadable

    @property
    def seq_length(self) -> int:
        return int(self.meta.get("seq_length", 0))

    @property
    def align(self) -> int:
        return int(self.meta.get("align", 1))

    @property
    def recorded_shards(self) -> dict[str, dict[str, Any]]:
        """Shard records written by prepare (path -> count, num_bytes, sha256)."""
        return {s["path"]: s for s in self.meta.get("shards", [])}

    @property
    def shard_counts(self) -> dict[str, int]:
        """Rows per shard as Energon will read them (``.info.json``), else as omnipack recorded them."""
        if self.info and "shard_counts" in self.info:
            return {k: int(v) for k, v in self.info["shard_counts"].items()}
        return {p: int(s["count"]) for p, s in self.recorded_shards.items()}

    @property
    def shards(self) -> list[str]:
        """Every shard named by any metadata file, in write order."""
        out = list(self.recorded_shards)
        out += [p for p in self.shard_counts if p not in out]
        return out

    @property
    def tokenizer_path(self) -> str | None:
        return (self.meta.get("tokenizer") or {}).get("path")

    def rejects(self) -> list[dict[str, Any]]:
        path = self.root / self.meta.get("rejects_file", "rejects.jsonl")
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def locate(self, row: int) -> tuple[str, int]:
        """(shard, index within the shard) of global row ``row``, in shard order."""
        counts = self.shard_counts
        for shard in self.shards:
            n = counts.get(shard, 0)
            if row < n:
                return shard, row
            row -= n
        raise IndexError(f"row out of range: the dataset has {sum(counts.values())} rows")


def open_dataset(root: str | Path) -> Dataset:
    """The dataset's metadata; a missing omnipack.json is an error, other gaps are listed in problems."""
    if "://" in str(root):
        raise ValueError(
            f"{root}: verify and inspect read a local copy of the dataset (they scan every shard); download "
            "it first, e.g. `aws s3 sync s3://BUCKET/PREFIX DIR`, then give DIR"
        )
    root = Path(root)
    meta_path = root / NV_META / OMNIPACK_META
    if not meta_path.exists():
        raise FileNotFoundError(f"{root} is not an omnipack dataset (no {NV_META}/{OMNIPACK_META})")
    problems: list[str] = []
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError as e:
        raise ValueError(f"{meta_path} is not valid JSON: {e}") from None
    info = split = None
    try:
        info = json.loads((root / NV_META / INFO_JSON).read_text())
    except (OSError, ValueError) as e:
        problems.append(f"{NV_META}/{INFO_JSON}: {e}")
    try:
        split = yaml.safe_load((root / NV_META / SPLIT_YAML).read_text())
    except (OSError, yaml.YAMLError) as e:
        problems.append(f"{NV_META}/{SPLIT_YAML}: {e}")
    return Dataset(root, meta, info, split, problems)


@dataclass
class RawRow:
    """One Energon sample: its key, the byte offset of its first tar header, and its parts."""

    key: str
    offset: int
    parts: dict[str, bytes]

    def decode(self) -> tuple[PackedRowArrays, dict[str, Any]]:
        return decode_row(self.parts)


TAR_BLOCK = 512


def _stream_members(f: Any, sink: Callable[[bytes], None]) -> Iterator[tuple[tarfile.TarInfo, bytes]]:
    """Each member of a ustar stream and its data, one read per header and per payload (``sink`` sees every
    byte read, in order). Ends at the end-of-archive block or the end of the file."""
    offset = 0

    def read(n: int) -> bytes:
        data = f.read(n)
        sink(data)
        if len(data) < n:
            raise EOFError(f"file ends at offset {offset + len(data)}, inside a member")
        return data

    while True:
        header = f.read(TAR_BLOCK)
        sink(header)
        if not header or header.count(0) == TAR_BLOCK:
            return
        if len(header) < TAR_BLOCK:
            raise EOFError(f"file ends at offset {offset + len(header)}, inside a header")
        info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        if info.type in (
            tarfile.GNUTYPE_LONGNAME,
            tarfile.GNUTYPE_LONGLINK,
            tarfile.XHDTYPE,
            tarfile.XGLTYPE,
        ):
            raise tarfile.HeaderError(f"member type {info.type!r} at offset {offset}: shards are plain ustar")
        info.offset, info.offset_data = offset, offset + TAR_BLOCK
        data = read(info.size) if info.size else b""
        pad = -info.size % TAR_BLOCK
        if pad:
            read(pad)
        offset += TAR_BLOCK + info.size + pad
        yield info, data


class ShardReader:
    """Iterates a shard's rows. After iteration: ``data_end`` (end of the last member's data),
    ``digest`` (the hex digest of the whole file with algorithm ``checksum``, when given), ``error`` (a tar that could not be read to its end) and
    ``duplicate_keys`` (keys whose members are not contiguous).

    ``parts`` limits which parts are loaded (the others are seeked over); None loads all. With
    ``checksum`` (``xxh3_128`` or a hashlib name) every byte is read once, in order, and hashed on a
    helper thread.
    """

    def __init__(self, path: Path, parts: Collection[str] | None = None, checksum: str | None = None) -> None:
        self.path, self.parts, self.checksum = Path(path), parts, checksum
        self.digest: str | None = None
        self.data_end = 0
        self.error: str | None = None
        self.duplicate_keys: list[str] = []

    def _members(self, f: Any, hasher: HashThread | None) -> Iterator[tuple[tarfile.TarInfo, Any]]:
        if hasher is not None or self.parts is None:  # every byte is wanted: one sequential pass
            yield from _stream_members(f, hasher.update if hasher is not None else lambda _: None)
            return
        with tarfile.open(fileobj=f, mode="r:") as tar:  # random access: seek over unwanted payloads
            for member in tar:
                yield member, tar

    def __iter__(self) -> Iterator[RawRow]:
        hasher = HashThread((self.checksum,)) if self.checksum else None
        with open(self.path, "rb", buffering=1 << 20) as f:
            seen: set[str] = set()
            cur: RawRow | None = None
            try:
                for member, data in self._members(f, hasher):
                    key, _, part = member.name.partition(".")
                    if cur is None or key != cur.key:
                        if cur is not None:
                            yield cur
                        if key in seen:
                            self.duplicate_keys.append(key)
                        seen.add(key)
                        cur = RawRow(key, member.offset, {})
                    self.data_end = member.offset_data + -(-member.size // TAR_BLOCK) * TAR_BLOCK
                    if member.isfile() and (self.parts is None or part in self.parts):
                        if isinstance(data, tarfile.TarFile):
                            fobj = data.extractfile(member)
                            data = fobj.read() if fobj is not None else b""
                        cur.parts[part] = data
            except (tarfile.TarError, OSError, EOFError) as e:
                self.error = f"unreadable tar after offset {self.data_end}: {type(e).__name__}: {e}"
            finally:
                if hasher is not None:
                    while chunk := f.read(1 << 22):  # the tail after the last member (end blocks, padding)
                        hasher.update(chunk)
                    self.digest = hasher.hexdigests()[self.checksum]
            if cur is not None:
                yield cur


def read_index(path: Path) -> np.ndarray:
    """A ``.tar.idx``: uint64 offsets of each sample's first header, then the end of the data."""
    return np.fromfile(path, dtype="<u8")


def read_row(ds: Dataset, row: int, parts: Collection[str] | None = None) -> RawRow:
    """Global row ``row``, read by seeking with the shard's ``.tar.idx`` (scanning if it is missing)."""
    shard, local = ds.locate(row)
    path = ds.root / shard
    idx_path = Path(str(path) + ".idx")
    if idx_path.exists():
        idx = read_index(idx_path)
        if local + 1 < len(idx):
            with open(path, "rb") as f:
                f.seek(int(idx[local]))
                blob = f.read(int(idx[local + 1] - idx[local]))
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:
                out = RawRow("", int(idx[local]), {})
                for m in tar:
                    key, _, part = m.name.partition(".")
                    out.key = out.key or key
                    if m.isfile() and (parts is None or part in parts):
                        data = tar.extractfile(m)
                        out.parts[part] = data.read() if data is not None else b""
                return out
    for i, raw in enumerate(ShardReader(path, parts)):
        if i == local:
            return raw
    raise IndexError(f"row {row} not found in {shard}")


@dataclass
class RowSummary:
    """What the summary and the plots need of a row: boundaries, sample ids and media blocks."""

    shard: str
    key: str
    sample_ids: list[str]
    cu_seqlens: list[int]
    cu_seqlens_padded: list[int]
    media: list[dict[str, Any]]  # kind, sample_index, token_start, num_tokens, block

    @property
    def width(self) -> int:
        return self.cu_seqlens_padded[-1] if self.cu_seqlens_padded else 0

    @property
    def seqlens(self) -> list[int]:
        return np.diff(self.cu_seqlens).tolist()

    @property
    def real_tokens(self) -> int:
        return self.cu_seqlens[-1] if self.cu_seqlens else 0


def summarize_raw(shard: str, raw: RawRow) -> RowSummary:
    meta = json.loads(raw.parts[META_PART])
    return RowSummary(
        shard=shard,
        key=raw.key,
        sample_ids=list(meta.get("sample_ids", [])),
        cu_seqlens=load_npy(raw.parts[part_name("cu_seqlens")]).astype(int).tolist(),
        cu_seqlens_padded=load_npy(raw.parts[part_name("cu_seqlens_padded")]).astype(int).tolist(),
        media=[
            {k: m[k] for k in ("kind", "sample_index", "token_start", "num_tokens", "block")}
            for m in meta.get("media", [])
        ],
    )


def summarize_shard(args: tuple[str, str]) -> list[RowSummary]:
    """Light summaries of every row of a shard (``args``: dataset root, shard path)."""
    root, shard = args
    return [summarize_raw(shard, raw) for raw in ShardReader(Path(root) / shard, LIGHT_PARTS)]


def map_shards(
    fn: Callable[[Any], T],
    jobs: Sequence[Any],
    *,
    workers: int = 1,
    progress: bool | None = None,
    label: str = "shards",
) -> list[T]:
    """``fn`` over ``jobs`` (one per shard), in a process pool when ``workers > 1``; results in job order.

    A rich progress bar on stderr shows when asked, or by default when stderr is a terminal and there is
    more than one job.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    if progress is None:
        progress = sys.stderr.isatty() and len(jobs) > 1
    results: list[Any] = [None] * len(jobs)
    bar = Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not progress,
    )
    workers = max(1, min(workers, len(jobs)))
    with bar:
        task = bar.add_task(label, total=len(jobs))
        if workers == 1:
            for i, job in enumerate(jobs):
                results[i] = fn(job)
                bar.advance(task)
        else:
            # spawn: the parent may hold threads (the progress bar), which fork does not copy safely.
            with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
                futures = {pool.submit(fn, job): i for i, job in enumerate(jobs)}
                for fut in as_completed(futures):
                    results[futures[fut]] = fut.result()
                    bar.advance(task)
    return results


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))
