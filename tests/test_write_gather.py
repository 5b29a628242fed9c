"""The write stage's sample gather: in place from the mapped measured parts, the same records as a take."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute

from omnipack.stages.measure import SAMPLES_SCHEMA, TableWriter, part_files
from omnipack.stages.pack_planner import PackResult
from omnipack.stages.write import MeasuredParts, MeasuredSamples


def _write_part(table: pa.Table, parquet, arrow, rows: int = 1000) -> None:
    """``table`` as the measure stage writes a part: Parquet row groups and the Arrow copy's record batches
    of ``rows`` rows each."""
    with TableWriter(parquet, SAMPLES_SCHEMA, arrow_path=arrow) as writer:
        for start in range(0, len(table), rows):
            writer.write_table(table.slice(start, rows))


def _as_parts(table: pa.Table, measure_dir, split: int) -> MeasuredParts:
    """The table as two measured parts (the second's record indices restart at 0), read back by global
    index: the part offsets turn them into the table's indices again."""
    measure_dir.mkdir(exist_ok=True)
    first = int(table.column("sample_index")[split].as_py())
    for k, piece in enumerate((table.slice(0, split), table.slice(split))):
        if k:
            local = pa.compute.subtract(piece.column("sample_index"), pa.scalar(first, pa.int64()))
            piece = piece.set_column(0, "sample_index", local)
        files = part_files(measure_dir, k)
        _write_part(piece, files["samples"], files["arrow"])
    total = int(table.column("sample_index")[-1].as_py()) + 1
    return MeasuredParts(measure_dir, [0, 1], np.asarray([0, first, total]))


def _row_jobs(samples: MeasuredParts, plan: PackResult):
    for r in range(plan.num_rows):
        yield f"{r:09d}", samples.records(plan.row(r))


def _measure_table(path, n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, size=n)
    columns = {f.name: [0] * n for f in SAMPLES_SCHEMA}
    columns["sample_index"] = list(range(0, 2 * n, 2))  # input indices with gaps (rejects)
    columns["sample_id"] = [f"id{i}" for i in range(n)]
    columns["source"] = [f"m.jsonl:{i}" for i in range(n)]
    columns["num_tokens"] = lengths.tolist()
    columns["padded_length"] = lengths.tolist()
    columns["media_json"] = ["[]"] * n
    columns["assistant_spans"] = [[0, int(k)] for k in lengths]
    columns["input_ids"] = [rng.integers(0, 1000, size=k).tolist() for k in lengths]
    columns["labels"] = [rng.integers(-100, 1000, size=k).tolist() for k in lengths]
    columns["mrope_position_ids"] = [None if i % 3 else list(range(3 * k)) for i, k in enumerate(lengths)]
    table = pa.table(columns, schema=SAMPLES_SCHEMA)
    _write_part(table, path, path.with_suffix(".arrow"))
    return table


def test_gather_matches_a_take_per_row_across_record_batches(tmp_path):
    path = tmp_path / "samples.parquet"
    n = 9000  # nine record batches in the mapped copy (one per 1000-row row group)
    table = _measure_table(path, n)
    rng = np.random.default_rng(1)
    order = rng.permutation(n)
    cuts = np.sort(rng.choice(np.arange(1, n), size=1500, replace=False))
    row_ptr = np.concatenate([[0], cuts, [n]]).astype(np.int64)
    plan = PackResult(row_ptr, order.astype(np.int64) * 2, [], {})

    samples = MeasuredSamples(path.with_suffix(".arrow"), release_every=97)  # pages released many times along the way
    assert len(samples) == n and len(samples._batches) == 9
    jobs = list(_row_jobs(_as_parts(table, tmp_path / "measure", 4500), plan))
    assert len(jobs) == plan.num_rows
    for r, (key, records) in enumerate(jobs):
        assert key == f"{r:09d}"
        expected = table.take(order[row_ptr[r] : row_ptr[r + 1]]).to_pylist()
        assert len(records) == len(expected)
        for got, want in zip(records, expected, strict=True):
            assert got.keys() == want.keys()
            for k, v in want.items():
                if isinstance(v, list):
                    assert isinstance(got[k], np.ndarray) and got[k].tolist() == v
                else:
                    assert got[k] == v
    samples.release()
    assert samples.record(5)["input_ids"].tolist() == table.column("input_ids")[5].as_py()


def test_planned_sample_missing_from_the_table_is_a_bug(tmp_path):
    import pytest

    path = tmp_path / "samples.parquet"
    table = _measure_table(path, 10)
    parts = _as_parts(table, tmp_path / "measure", 5)
    for odd in (3, 13, 25):  # a reject's index in either part, and one past the input
        plan = PackResult(np.array([0, 2], dtype=np.int64), np.array([0, odd], dtype=np.int64), [], {})
        with pytest.raises(AssertionError, match="planned samples missing"):
            list(_row_jobs(parts, plan))
