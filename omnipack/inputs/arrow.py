"""Arrow data: a Hugging Face ``datasets`` folder written by ``save_to_disk`` (a ``Dataset``: ``state.json``
naming its ``data-*.arrow`` files; a ``DatasetDict``: ``dataset_dict.json`` naming its split folders, read
split after split), or any folder of ``.arrow`` files (IPC stream or file format), memory-mapped and read a
record batch at a time. Read with pyarrow alone: ``datasets`` is not needed to read what it saved.
Binary values are referenced by ``embedded:`` pointers, as for Parquet."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from .base import Reader, SourceRecord, register_reader
from .parquet import BATCH_BYTES, text_nbytes

BATCH_ROWS = 64  # rows turned into Python objects at once, at most (fewer when rows are large: BATCH_BYTES)


def _hf_files(folder: Path) -> list[Path] | None:
    if (folder / "dataset_dict.json").is_file():
        splits = json.loads((folder / "dataset_dict.json").read_text()).get("splits", [])
        return [f for s in splits for f in (_hf_files(folder / s) or [])]
    if (folder / "state.json").is_file():
        state = json.loads((folder / "state.json").read_text())
        return [folder / d["filename"] for d in state.get("_data_files", [])]
    return None


@lru_cache(maxsize=16)
def _batches_index(path: str) -> tuple[Any, list[int]]:
    """(a function giving batch i, cumulative row starts) of an Arrow IPC file or stream, memory-mapped."""
    import pyarrow as pa

    source = pa.memory_map(path)
    try:
        reader = pa.ipc.open_file(source)
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    except pa.ArrowInvalid:
        source.seek(0)
        batches = list(pa.ipc.open_stream(source))  # zero-copy views of the mapped file
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

    def count(self, file: Path, max_record_bytes: int = 0) -> int:
        try:
            return _batches_index(str(file))[1][-1]
        except Exception:  # read as one reject naming the error (see records)
            return 1

    def records(
        self, file: Path, label: str, start: int = 0, stop: int | None = None, max_record_bytes: int = 0
    ) -> Iterator[SourceRecord]:
        try:
            batches, starts = _batches_index(str(file))
        except Exception as e:
            yield SourceRecord(0, f"{label}#0", None, f"unreadable Arrow file: {type(e).__name__}: {e}")
            return
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
