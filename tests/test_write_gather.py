"""The write stage's sample gather: each sample's record read from its part's token file (mapped in place,
or fetched range by range), the same records as a take of the measured table."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq
import pytest

from omnipack.stages.measure import SAMPLES_PARQUET_SCHEMA, SAMPLES_SCHEMA, TableWriter, part_files
from omnipack.stages.token_file import LOCATION_COLUMNS, TokenFiles, coalesce


def _write_part(table: pa.Table, parquet, tokens, rows: int = 300) -> None:
    """``table`` as the measure stage writes a part: Parquet row groups of ``rows`` rows, its token file."""
    with TableWriter(parquet, SAMPLES_SCHEMA, tokens_path=tokens, parquet_schema=SAMPLES_PARQUET_SCHEMA) as w:
        for start in range(0, len(table), rows):
            w.write_table(table.slice(start, rows))


def _as_parts(table: pa.Table, measure_dir, split: int) -> tuple[TokenFiles, dict[int, tuple[int, int]]]:
    """The table as two measured parts (the second's record indices restart at 0): their token files by
    global index, and each global index's (offset, length) there, as the part's Parquet file says."""
    measure_dir.mkdir(exist_ok=True)
    first = int(table.column("sample_index")[split].as_py())
    where = {}
    for k, piece in enumerate((table.slice(0, split), table.slice(split))):
        if k:
            local = pa.compute.subtract(piece.column("sample_index"), pa.scalar(first, pa.int64()))
            piece = piece.set_column(0, "sample_index", local)
        files = part_files(measure_dir, k)
        _write_part(piece, files["samples"], files["tokens"])
        located = pq.read_table(files["samples"], columns=["sample_index", *LOCATION_COLUMNS])
        for i, o, n in zip(*(located.column(c).to_pylist() for c in located.column_names), strict=True):
            where[i + (first if k else 0)] = (o, n)
    total = int(table.column("sample_index")[-1].as_py()) + 1
    paths = [part_files(measure_dir, k)["tokens"] for k in range(2)]
    return TokenFiles(paths, np.asarray([0, first, total])), where


def _measure_table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, size=n)
    columns = {f.name: [0] * n for f in SAMPLES_SCHEMA}
    columns["sample_index"] = list(range(0, 2 * n, 2))  # input indices with gaps (rejects)
    columns["sample_id"] = [f"id{i}" for i in range(n)]
    columns["source"] = [f"m.jsonl:{i}" for i in range(n)]
    columns["num_tokens"] = lengths.tolist()
    columns["padded_length"] = lengths.tolist()
    columns["media_json"] = ["[]" if i % 5 else '[{"ref": "a.png"}]' for i in range(n)]
    columns["assistant_spans"] = [[0, int(k)] for k in lengths]
    columns["input_ids"] = [rng.integers(0, 1000, size=k).tolist() for k in lengths]
    columns["labels"] = [rng.integers(-100, 1000, size=k).tolist() for k in lengths]
    columns["mrope_position_ids"] = [None if i % 3 else list(range(3 * k)) for i, k in enumerate(lengths)]
    return pa.table(columns, schema=SAMPLES_SCHEMA)


WRITER_FIELDS = [  # what a token file's record holds
    "sample_index", "sample_id", "source", "media_json", "input_ids", "labels", "mrope_position_ids",
]  # fmt: skip


def test_gather_matches_a_take_in_any_order(tmp_path):
    n = 1200  # several row groups per part
    table = _measure_table(n)
    files, where = _as_parts(table, tmp_path / "measure", 700)
    order = np.random.default_rng(1).permutation(n)
    index = order * 2
    got = files.open(index, [where[i][0] for i in index], [where[i][1] for i in index])
    assert len(got) == n
    expected = table.take(order).select(WRITER_FIELDS).to_pylist()
    for k, want in enumerate(expected):
        rec = got.record(k)
        assert rec.keys() == want.keys()
        for name, v in want.items():
            if isinstance(v, list):
                assert isinstance(rec[name], np.ndarray) and rec[name].tolist() == v
            else:
                assert rec[name] == v
    got.release()
    assert got.record(5)["input_ids"].tolist() == expected[5]["input_ids"]


def test_planned_sample_missing_from_the_parts_is_a_bug(tmp_path):
    table = _measure_table(10)
    files, where = _as_parts(table, tmp_path / "measure", 5)
    with pytest.raises(AssertionError, match="planned samples missing"):
        files.open([25], [0], [8])  # past the input
    for odd in (3, 13):  # a reject's index in either part, given a neighbour's record
        records = files.open([odd], [where[odd - 1][0]], [where[odd - 1][1]])
        with pytest.raises(AssertionError, match="planned samples missing"):
            records.record(0)


def test_coalesced_reads_stay_within_half_again_the_wanted_bytes():
    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes = rng.integers(1, 5000, size=int(rng.integers(1, 60)))
        gaps = rng.integers(0, 20000, size=len(sizes)) * (rng.random(len(sizes)) < 0.7)
        starts = np.cumsum(gaps + np.concatenate([[0], sizes[:-1]]))
        ends = starts + sizes
        reads = coalesce(starts, ends, max_bytes=64 << 10)
        covered = [(s, e) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
        assert all(any(a <= s and e <= b for a, b in reads) for s, e in covered)  # every range read
        assert sum(b - a for a, b in reads) <= 1.5 * int(sizes.sum())
        assert all(b - a <= max(64 << 10, int(sizes.max())) for a, b in reads)
        assert len(reads) <= len(sizes)


def test_list_columns_of_a_sliced_table_are_read_from_the_slice():
    """A list column's child array is the whole one also for a slice: its values start at the slice's offset."""
    from omnipack.stages.token_file import _list_arrays

    column = pa.array([[1, 2], [3], [4, 5, 6], None, [7]], pa.list_(pa.int32()))
    for part in (column, column.slice(1, 3), column.slice(2), pa.chunked_array([column.slice(0, 2), column.slice(3)])):
        offsets, values, valid = _list_arrays(part)
        got = [None if valid is not None and not valid[i] else values[offsets[i] : offsets[i + 1]].tolist()
               for i in range(len(part))]  # fmt: skip
        want = part.to_pylist()
        assert got == want
