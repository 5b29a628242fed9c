"""Parquet files, or folders of them (a Hugging Face Hub dataset's ``data/*.parquet``), read a record batch
at a time. Binary values (an HF ``Image``/``Audio``/``Video`` feature's ``bytes``, a raw ``jpg`` column) stay in
the file: records reference them with ``embedded:`` pointers that the media resolver reads back by row group.
A file whose footer (its last bytes: a cut-short file has none) or a row group can not be read is an input
error naming the file and the byte offset: its records can not be counted, so they could not be rejected."""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from .base import (
    Reader,
    SourceRecord,
    cut_short,
    file_identity,
    file_stamp,
    input_path,
    is_local_input,
    open_input,
    raise_store_refusal,
    register_reader,
)

BATCH_ROWS = 64  # rows decoded to Python at once, at most
# Bytes decoded at once: a row group of large images (64 x 8 MB) is read a few rows at a time, never whole.
BATCH_BYTES = 16 << 20
PARQUET_MAGIC = b"PAR1"


def _file(path: str) -> Any:
    """The file's reader, kept per file version (a file replaced by a fresh download is opened again)."""
    size, stamp = file_stamp(input_path(path))
    return _file_of(path, size, stamp)


@lru_cache(maxsize=16)
def _file_of(path: str, size: int, stamp: int | str) -> Any:
    import pyarrow.parquet as pq

    file = input_path(path)
    source = path if is_local_input(file) else open_input(file)  # remote: ranged reads (footer, row groups)
    # buffered reads, no pre-buffering of whole column chunks: memory stays at about one row group
    return pq.ParquetFile(source, pre_buffer=False, buffer_size=1 << 20)


def _open(path: Path) -> Any:
    """The file's reader; :class:`InputError` when its footer can not be read."""
    try:
        return _file(str(path))
    except Exception as e:
        raise_store_refusal(e, path)
        raise cut_short(
            path,
            None,
            f"no readable Parquet footer, the file is cut short or not Parquet: {type(e).__name__}: {e}",
            from_end=8,
        ) from None


def _row_group_offset(pf: Any, rg: int) -> int:
    """The byte offset of row group ``rg``'s first page."""
    meta = pf.metadata.row_group(rg)
    offsets = []
    for c in range(meta.num_columns):
        col = meta.column(c)
        offsets.append(col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset)
    return min(offsets, default=0)


def rows_within(pf: Any, rg: int, budget: int, column: str | None = None, most: int = BATCH_ROWS) -> int:
    """Rows of row group ``rg`` whose decoded bytes (of ``column``, or of every column) come to about
    ``budget`` (from the row group's metadata: its uncompressed sizes), between 1 and ``most``."""
    md = pf.metadata.row_group(rg)
    chunks = [md.column(i) for i in range(md.num_columns)]
    if column is not None:
        chunks = [c for c in chunks if c.path_in_schema.split(".", 1)[0] == column]
    nbytes = sum(c.total_uncompressed_size for c in chunks)
    return max(1, min(most, budget * max(1, md.num_rows) // max(1, nbytes)))


def _row_group_starts(pf: Any) -> list[int]:
    starts = [0]
    for i in range(pf.metadata.num_row_groups):
        starts.append(starts[-1] + pf.metadata.row_group(i).num_rows)
    return starts


class ParquetReader(Reader):
    name = "parquet"
    binary_columns = True

    def detect(self, path: Path) -> bool:
        if path.is_dir():
            return any(path.rglob("*.parquet"))
        if path.suffix == ".parquet":
            return True
        with open_input(path) as f:
            return f.read(4) == PARQUET_MAGIC

    def data_files(self, path: Path) -> list[Path]:
        return sorted(path.rglob("*.parquet")) if path.is_dir() else [path]

    def check_end(self, file: Path) -> None:
        _open(file)

    def count(self, file: Path, max_record_bytes: int = 0) -> int:
        return _open(file).metadata.num_rows

    def split(self, file: Path, part_records: int, max_record_bytes: int = 0) -> list[dict[str, Any]]:
        """Parts of whole row groups (about ``part_records`` records each, so a part decodes only its own
        row groups); a row group of more than twice that many records is cut into ranges."""
        starts = _row_group_starts(_open(file))
        ident = file_identity(file)
        cuts = [0]
        for lo, hi in zip(starts, starts[1:], strict=False):
            if hi - lo > 2 * part_records:
                cuts += [*range(max(cuts[-1], lo) + part_records, hi, part_records)]
            if hi - cuts[-1] >= part_records:
                cuts.append(hi)
        if cuts[-1] < starts[-1]:
            cuts.append(starts[-1])
        return [
            {"start_byte": 0, "first_line": 0, "num_lines": 0, "xxh3": ident,
             "first_record": a, "num_records": b - a}
            for a, b in zip(cuts, cuts[1:], strict=False) if b > a
        ]  # fmt: skip

    def records(
        self, file: Path, label: str, start: int = 0, stop: int | None = None, max_record_bytes: int = 0
    ) -> Iterator[SourceRecord]:
        pf = _open(file)
        starts = _row_group_starts(pf)
        stop = starts[-1] if stop is None else min(stop, starts[-1])
        for rg in range(pf.metadata.num_row_groups):
            lo, hi = starts[rg], starts[rg + 1]
            if hi <= start or lo >= stop:
                continue
            index = lo
            try:
                rows = rows_within(pf, rg, BATCH_BYTES)
                for batch in pf.iter_batches(batch_size=rows, row_groups=[rg], use_threads=False):
                    n = batch.num_rows
                    if index >= stop:
                        break
                    if index + n > start:  # only the range's rows become Python objects
                        size = text_nbytes(batch) // max(1, n)  # of the whole batch: the same in any range
                        a, b = max(start - index, 0), min(stop - index, n)
                        for k, row in enumerate(batch.slice(a, b - a).to_pylist()):
                            i = index + a + k
                            yield SourceRecord(i, f"{label}#{i}", row, None, size)
                    index += n
            except Exception as e:  # a damaged row group: the file can not be read past it
                raise_store_refusal(e, file)
                raise cut_short(
                    file,
                    _row_group_offset(pf, rg),
                    f"row group {rg} (records {lo} to {hi - 1}) is unreadable: {type(e).__name__}: {e}",
                ) from None


def _holds_binary(t: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return True
    return any(_holds_binary(t.field(i).type) for i in range(t.num_fields))


def text_nbytes(batch: Any) -> int:
    """Bytes of a record batch without its binary columns (those stay in the file, referenced by pointers):
    what its records weigh in memory once read."""
    return sum(
        col.nbytes for col, f in zip(batch.columns, batch.schema, strict=True) if not _holds_binary(f.type)
    )


# Slices of row-group columns read back for embedded media (about SLICE_BYTES each: a large image column is
# never decoded whole), most recent last, within a byte budget per process: the measure stage reads records
# in order (a cursor per column runs along its row group), the write stage in packed-row order.
ROW_GROUP_CACHE_BYTES = 256 << 20
SLICE_BYTES = 16 << 20
_CURSORS = 4
_slices: OrderedDict[tuple[str, int, str, int], Any] = OrderedDict()  # (file, rg, column, first row) -> column
_cursors: OrderedDict[tuple[str, int, str], list[Any]] = OrderedDict()  # -> [next first row, batch iterator]
# one reader of the slices and cursors at a time: the write stage's row builders read media on several threads
_slices_lock = threading.Lock()


def _cache(key: tuple[str, int, str, int], column: Any) -> None:
    _slices[key] = column
    while len(_slices) > 1 and sum(c.nbytes for c in _slices.values()) > ROW_GROUP_CACHE_BYTES:
        _slices.popitem(last=False)


def _slice_holding(pf: Any, file: str, rg: int, column: str, row: int) -> tuple[int, Any]:
    """(first row, column values) of the cached or freshly read slice of row group ``rg`` holding ``row``."""
    for (f, g, c, first), values in _slices.items():
        if (f, g, c) == (file, rg, column) and first <= row < first + len(values):
            _slices.move_to_end((f, g, c, first))
            return first, values
    key = (file, rg, column)
    cursor = _cursors.get(key)
    if cursor is None or cursor[0] > row:  # behind the cursor (or none yet): read the row group again
        rows = rows_within(pf, rg, SLICE_BYTES, column, most=pf.metadata.row_group(rg).num_rows)
        batches = pf.iter_batches(batch_size=rows, row_groups=[rg], columns=[column], use_threads=False)
        cursor = _cursors[key] = [0, batches]
        while len(_cursors) > _CURSORS:
            _cursors.popitem(last=False)
    _cursors.move_to_end(key)
    while True:
        batch = next(cursor[1], None)
        if batch is None:
            raise IndexError(f"record {row} is past the end of row group {rg} of {file}")
        first, values = cursor[0], batch.column(0)
        cursor[0] += batch.num_rows
        if row < cursor[0]:
            _cache((file, rg, column, first), values)
            return first, values


def column_value(file: Path, index: int, column: str) -> Any:
    """The value of ``column`` in record ``index``; the slice of rows holding it is cached for the next
    lookups."""
    pf = _file(str(file))
    starts = _row_group_starts(pf)
    rg = bisect_right(starts, index) - 1
    if not 0 <= rg < len(starts) - 1:
        raise IndexError(f"record {index} is past the end of {file} ({starts[-1]} records)")
    with _slices_lock:
        first, values = _slice_holding(pf, str(file), rg, column, index - starts[rg])
    return values[index - starts[rg] - first].as_py()  # an Arrow array: immutable, read outside the lock


register_reader(ParquetReader())
