"""Parquet files, or folders of them (a Hugging Face Hub dataset's ``data/*.parquet``), read a record batch
at a time. Binary values (an HF ``Image``/``Audio``/``Video`` feature's ``bytes``, a raw ``jpg`` column) stay in
the file: records reference them with ``embedded:`` pointers that the media resolver reads back by row group.
A file whose footer (its last bytes: a cut-short file has none) or a row group can not be read is an input
error naming the file and the byte offset: its records can not be counted, so they could not be rejected."""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from .base import (
    InputError,
    Reader,
    SourceRecord,
    file_identity,
    file_stamp,
    input_path,
    is_local_input,
    open_input,
    register_reader,
)

BATCH_ROWS = 64  # rows decoded to Python at once (rows can hold megabytes of media bytes)
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
        size = file_stamp(path)[0]
        raise InputError(
            f"input {path} can not be read to its end (at byte {max(size - 8, 0)} of {size}: no readable "
            f"Parquet footer, the file is cut short or not Parquet: {type(e).__name__}: {e}); fix or "
            "re-download it"
        ) from None


def _row_group_offset(pf: Any, rg: int) -> int:
    """The byte offset of row group ``rg``'s first page."""
    meta = pf.metadata.row_group(rg)
    offsets = []
    for c in range(meta.num_columns):
        col = meta.column(c)
        offsets.append(col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset)
    return min(offsets, default=0)


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
                for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[rg], use_threads=False):
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
                size = file_stamp(file)[0]
                raise InputError(
                    f"input {file} can not be read to its end (at byte {_row_group_offset(pf, rg)} of {size}: "
                    f"row group {rg} (records {lo} to {hi - 1}) is unreadable: {type(e).__name__}: {e}); fix "
                    "or re-download it"
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


# Row-group columns read back for embedded media, most recent last, within a byte budget per process: the
# measure stage reads records in order (one row group at a time), the write stage in packed-row order.
ROW_GROUP_CACHE_BYTES = 256 << 20
_row_groups: OrderedDict[tuple[str, int, str], Any] = OrderedDict()


def column_value(file: Path, index: int, column: str) -> Any:
    """The value of ``column`` in record ``index``; the row group's column is cached for the next lookups."""
    pf = _file(str(file))
    starts = _row_group_starts(pf)
    rg = bisect_right(starts, index) - 1
    if not 0 <= rg < len(starts) - 1:
        raise IndexError(f"record {index} is past the end of {file} ({starts[-1]} records)")
    key = (str(file), rg, column)
    table = _row_groups.get(key)
    if table is None:
        table = pf.read_row_group(rg, columns=[column])
        _row_groups[key] = table
        while len(_row_groups) > 1 and sum(t.nbytes for t in _row_groups.values()) > ROW_GROUP_CACHE_BYTES:
            _row_groups.popitem(last=False)
    else:
        _row_groups.move_to_end(key)
    return table.column(0)[index - starts[rg]].as_py()


register_reader(ParquetReader())
