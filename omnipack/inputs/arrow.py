"""Arrow data: a Hugging Face ``datasets`` folder written by ``save_to_disk`` (a ``Dataset``: ``state.json``
naming its ``data-*.arrow`` files; a ``DatasetDict``: ``dataset_dict.json`` naming its split folders, of which
one is read: see ``splits.py``), or any folder of ``.arrow`` files (IPC stream or file format), memory-mapped and read a
record batch at a time. Read with pyarrow alone: ``datasets`` is not needed to read what it saved.
Binary values are referenced by ``embedded:`` pointers, as for Parquet. A file that can not be read to its end
(an IPC file without its footer, a stream cut inside a batch or without its end-of-stream marker: a cut-short
copy) is an input error naming the file and the byte offset."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from .base import (
    InputError,
    Reader,
    SourceRecord,
    cut_short,
    file_stamp,
    input_path,
    is_local_input,
    open_input,
    raise_store_refusal,
    register_reader,
)
from .parquet import BATCH_BYTES, text_nbytes

BATCH_ROWS = 64  # rows turned into Python objects at once, at most (fewer when rows are large: BATCH_BYTES)


def _dict_splits(folder: Path) -> list[str] | None:
    """The split names a ``DatasetDict.save_to_disk`` folder lists, in its order (None: not such a folder)."""
    if not (folder / "dataset_dict.json").is_file():
        return None
    return list(json.loads((folder / "dataset_dict.json").read_text()).get("splits", []))


def _hf_files(folder: Path) -> list[Path] | None:
    splits = _dict_splits(folder)
    if splits is not None:
        return [f for s in splits for f in (_hf_files(folder / s) or [])]
    if (folder / "state.json").is_file():
        state = json.loads((folder / "state.json").read_text())
        return [folder / d["filename"] for d in state.get("_data_files", [])]
    return None


FILE_MAGIC = b"ARROW1"
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # a stream's end: continuation marker, zero length


def _batches_index(path: str) -> tuple[Any, list[int]]:
    """(the record batches, cumulative row starts) of an Arrow IPC file or stream, memory-mapped;
    :class:`InputError` when it can not be read to its end. Kept per file version (a file replaced by a
    fresh download is read again)."""
    size, stamp = file_stamp(input_path(path))
    return _batches_of(path, size, stamp)


@lru_cache(maxsize=16)
def _batches_of(path: str, size: int, stamp: int | str) -> tuple[Any, list[int]]:
    import pyarrow as pa

    file = input_path(path)
    try:
        if is_local_input(file):
            source = pa.memory_map(path)
        else:  # a stored object: read into memory
            with open_input(file) as f:
                source = pa.BufferReader(f.read())
    except OSError as e:
        raise_store_refusal(e, path)
        raise InputError(f"input {path} can not be read: {e}") from None
    if source.read(len(FILE_MAGIC)) == FILE_MAGIC:
        try:
            reader = pa.ipc.open_file(source)
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        except (pa.ArrowInvalid, OSError) as e:
            raise_store_refusal(e, path)
            raise cut_short(path, None, f"no readable IPC file footer: {e}", from_end=10) from None
    else:
        source.seek(0)
        try:
            batches = list(pa.ipc.open_stream(source))  # zero-copy views of the mapped file
        except (pa.ArrowInvalid, OSError) as e:
            raise_store_refusal(e, path)
            raise cut_short(path, source.tell(), f"unreadable IPC stream message: {e}") from None
        source.seek(max(source.size() - 8, 0))
        if source.read(8) != END_OF_STREAM:  # a stream cut between batches reads without error
            raise cut_short(path, source.size(), "the IPC stream ends without its end-of-stream marker")
    starts = [0]
    for b in batches:
        starts.append(starts[-1] + b.num_rows)
    return batches, starts


class ArrowReader(Reader):
    name = "arrow"
    binary_columns = True

    def detect(self, path: Path) -> bool:
        if path.is_dir():
            return _hf_files(path) is not None or any(path.rglob("*.arrow"))
        return path.suffix in (".arrow", ".feather", ".ipc")

    def data_files(self, path: Path) -> list[Path]:
        if path.is_dir():
            return _hf_files(path) or sorted(path.rglob("*.arrow"))
        return [path]

    def splits(self, path: Path) -> dict[str, list[Path]] | None:
        names = _dict_splits(path) if path.is_dir() else None
        if names is None:
            return super().splits(path)
        return {s: _hf_files(path / s) or [] for s in names}

    def check_end(self, file: Path) -> None:
        _batches_index(str(file))

    def count(self, file: Path, max_record_bytes: int = 0) -> int:
        return _batches_index(str(file))[1][-1]

    def records(
        self, file: Path, label: str, start: int = 0, stop: int | None = None, max_record_bytes: int = 0
    ) -> Iterator[SourceRecord]:
        batches, starts = _batches_index(str(file))
        stop = starts[-1] if stop is None else min(stop, starts[-1])
        for b, batch in enumerate(batches):
            lo, hi = starts[b], starts[b + 1]
            if hi <= start or lo >= stop:
                continue
            step = max(1, min(BATCH_ROWS, BATCH_BYTES * batch.num_rows // max(1, batch.nbytes)))
            for off in range(max(lo, start) - lo, min(hi, stop) - lo, step):
                part = batch.slice(off, min(step, min(hi, stop) - lo - off))
                size = text_nbytes(part) // max(1, part.num_rows)
                for k, row in enumerate(part.to_pylist()):
                    i = lo + off + k
                    yield SourceRecord(i, f"{label}#{i}", row, None, size)


def column_value(file: Path, index: int, column: str) -> Any:
    batches, starts = _batches_index(str(file))
    b = next(i for i in range(len(batches)) if starts[i] <= index < starts[i + 1])
    return batches[b].column(column)[index - starts[b]].as_py()


register_reader(ArrowReader(), "hf_disk", "datasets")
