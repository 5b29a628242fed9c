"""The measure table's columns built in bulk are what pyarrow's row-by-row conversion builds."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from omnipack.stages.measure import REJECTS_SCHEMA, SAMPLES_SCHEMA, records_to_table


def _record(i: int, rng: np.random.Generator, mrope: bool) -> dict:
    n = int(rng.integers(0, 30))
    return {
        "sample_index": i,
        "sample_id": f"s{i}",
        "source": "m.jsonl:1",
        "num_tokens": n,
        "padded_length": n + (-n % 8),
        "num_images": 1,
        "num_videos": 0,
        "num_audios": 0,
        "num_media": 1,
        "image_tokens": 4,
        "video_tokens": 0,
        "audio_tokens": 0,
        "vision_patches": 16,
        "audio_frames": 0,
        "media_json": "[]",
        "input_ids": rng.integers(0, 2**31 - 1, n).astype(np.int32),
        "labels": rng.integers(-100, 1000, n).astype(np.int32),
        "mrope_position_ids": rng.integers(0, 99, 3 * n).astype(np.int32) if mrope else None,
    }


@pytest.mark.parametrize("mrope", ["none", "all", "some"])
def test_bulk_columns_equal_from_pylist(mrope):
    rng = np.random.default_rng(0)
    records = [_record(i, rng, {"none": False, "all": True, "some": i % 3 == 1}[mrope]) for i in range(40)]
    got = records_to_table(records, SAMPLES_SCHEMA)
    assert got.equals(pa.Table.from_pylist(records, schema=SAMPLES_SCHEMA))
    assert got.column("mrope_position_ids").null_count == sum(
        r["mrope_position_ids"] is None for r in records
    )


def test_other_values_take_pyarrow_conversion():
    rng = np.random.default_rng(1)
    records = [_record(i, rng, False) for i in range(5)]
    records[0]["input_ids"] = records[0]["input_ids"].tolist()  # a plain list
    records[1]["labels"] = records[1]["labels"].astype(np.int64)  # another dtype
    assert records_to_table(records, SAMPLES_SCHEMA).equals(
        pa.Table.from_pylist(records, schema=SAMPLES_SCHEMA)
    )
    records[2]["input_ids"] = np.asarray([2**40], dtype=np.int64)  # out of int32 range: an error, not a wrap
    with pytest.raises((pa.ArrowInvalid, OverflowError)):
        records_to_table(records, SAMPLES_SCHEMA)
    rejects = [{"sample_index": 3, "sample_id": "a", "source": "b", "stage": "read", "reason": "r"}]
    assert records_to_table(rejects, REJECTS_SCHEMA).equals(
        pa.Table.from_pylist(rejects, schema=REJECTS_SCHEMA)
    )
    assert records_to_table([], SAMPLES_SCHEMA).num_rows == 0
