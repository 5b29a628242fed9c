"""Input importers: format detection, streaming readers, record ranges, layouts, field mapping, default ids."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from omnipack.inputs import InputError, InputSpec, count_records, json_array, read_samples
from omnipack.inputs.read import reader_for, to_sample_record
from omnipack.manifest import ManifestError, read_manifest

USER_ASSISTANT = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def _records(n: int, start: int = 0) -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
        for i in range(start, start + n)
    ]


def _write_all_formats(tmp_path, recs):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    arr = tmp_path / "b.json"
    arr.write_text(json.dumps(recs, indent=1))
    pq_path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(recs), pq_path, row_group_size=3)
    arrow_dir = tmp_path / "d"
    arrow_dir.mkdir()
    table = pa.Table.from_pylist(recs)
    with (
        pa.OSFile(str(arrow_dir / "data-00000-of-00001.arrow"), "wb") as f,
        pa.ipc.new_stream(f, table.schema) as w,
    ):
        for batch in table.to_batches(max_chunksize=4):
            w.write_batch(batch)
    (arrow_dir / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    return {"jsonl": jsonl, "json": arr, "parquet": pq_path, "arrow": arrow_dir}


def test_formats_are_detected_and_read_the_same_records(tmp_path):
    recs = _records(10)
    paths = _write_all_formats(tmp_path, recs)
    for name, path in paths.items():
        assert reader_for(path, InputSpec()).name == name
        samples = list(read_manifest([path]))
        assert [s.error for s in samples] == [None] * 10, name
        assert [s.record["messages"] for s in samples] == [r["messages"] for r in recs], name
        assert [s.record_index for s in samples] == list(range(10))
        assert count_records([path]) == 10


def test_missing_ids_are_stable_source_positions(tmp_path):
    paths = _write_all_formats(tmp_path, _records(4))
    assert [s.sample_id for s in read_manifest([paths["jsonl"]])] == [f"a.jsonl:{i}" for i in range(1, 5)]
    assert [s.sample_id for s in read_manifest([paths["parquet"]])] == [f"c.parquet#{i}" for i in range(4)]
    assert [s.sample_id for s in read_manifest([paths["arrow"]])] == [
        f"d/data-00000-of-00001.arrow#{i}" for i in range(4)
    ]
    # the same file read twice gives the same ids (and a second file of the same name stays distinct)
    other = tmp_path / "x"
    other.mkdir()
    (other / "c.parquet").write_bytes(paths["parquet"].read_bytes())
    ids = [s.sample_id for s in read_manifest([paths["parquet"], other / "c.parquet"])]
    assert len(set(ids)) == 8 and all(
        s.error is None for s in read_manifest([paths["parquet"], other / "c.parquet"])
    )


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "arrow"])
def test_record_ranges_split_the_input_exactly(tmp_path, fmt):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = _write_all_formats(tmp_path / "one", _records(7))
    second = _write_all_formats(tmp_path / "two", _records(5, 7))
    paths = [first[fmt], second[fmt]]
    whole = [(s.index, s.sample_id, s.record["messages"][0]["content"]) for s in read_manifest(paths)]
    assert [w[2] for w in whole] == [f"q{i}" for i in range(12)]
    for cuts in ([0, 12], [0, 3, 7, 12], [0, 5, 6, 9, 12], [0, 7, 12]):
        parts = []
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            ledger = []
            got = list(read_manifest(paths, start=lo, stop=hi, ledger=ledger))
            assert sum(e["records"] for e in ledger) == hi - lo
            parts += [(s.index, s.sample_id, s.record["messages"][0]["content"]) for s in got]
        assert parts == whole, cuts


def test_format_override_and_unknown_names(tmp_path):
    p = tmp_path / "data.txt"
    p.write_text(json.dumps({"id": 1, "messages": USER_ASSISTANT}) + "\n")
    assert [s.error for s in read_manifest([p], input_format="jsonl")] == [None]
    with pytest.raises(InputError, match="unknown input format 'csv'"):
        InputSpec(format="csv")
    with pytest.raises(InputError, match="unknown input layout"):
        InputSpec(layout="nope")
    with pytest.raises(InputError, match="unknown input field"):
        InputSpec(fields={"pictures": "x"})
    with pytest.raises(FileNotFoundError, match="not found"):
        list(read_samples([tmp_path / "missing.jsonl"]))


def test_llama_factory_messages_with_media_lists_and_top_level_system():
    rec = {
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "<image>Compare with <image>"},
            {"role": "assistant", "content": "Same."},
        ],
        "images": ["a.jpg", "b.jpg"],
    }
    out = to_sample_record(rec, InputSpec())
    assert out["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [
            {"type": "image", "image": "a.jpg"}, {"type": "text", "text": "Compare with "},
            {"type": "image", "image": "b.jpg"}]},
        {"role": "assistant", "content": "Same."},
    ]  # fmt: skip
    assert "images" not in out and "system" not in out
    with pytest.raises(ManifestError, match="1 <video> markers but 0 video files"):
        to_sample_record({"messages": [{"role": "user", "content": "<video>"}, {"role": "assistant", "content": "x"}], "images": ["a"]}, InputSpec())  # fmt: skip
    with pytest.raises(ManifestError, match="both a top-level 'system' and a system message"):
        to_sample_record({"system": "s", "messages": [{"role": "system", "content": "t"}, *USER_ASSISTANT]}, InputSpec())  # fmt: skip


def test_a_top_level_system_is_kept_for_every_layout():
    conv = {"system": "S", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}
    assert to_sample_record(conv, InputSpec())["messages"][0] == {"role": "system", "content": "S"}
    plain = {"system": "S", "messages": USER_ASSISTANT}
    assert to_sample_record(plain, InputSpec())["messages"][0] == {"role": "system", "content": "S"}


def test_sharegpt_conversations_and_swift_audio():
    rec = {"conversations": [{"from": "human", "value": "<audio>hear"}, {"from": "gpt", "value": "a bird"}], "audios": ["x.wav"]}  # fmt: skip
    out = to_sample_record(rec, InputSpec())
    assert out["messages"][0]["content"] == [
        {"type": "audio", "audio": "x.wav"},
        {"type": "text", "text": "hear"},
    ]


def test_field_mapping_and_prompt_response_columns():
    rec = {"uid": 7, "question": "<image>what?", "answer": "cat", "pic": "c.jpg"}
    spec = InputSpec(fields={"id": "uid", "prompt": "question", "response": "answer", "image": "pic"})
    out = to_sample_record(rec, spec)
    assert out["id"] == 7
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "image", "image": "c.jpg"}, {"type": "text", "text": "what?"}]},
        {"role": "assistant", "content": "cat"},
    ]
    turns = {"dialog": [{"speaker": "user", "text": "q"}, {"speaker": "assistant", "text": "a"}]}
    spec = InputSpec(fields={"messages": "dialog", "role": "speaker", "content": "text"})
    assert to_sample_record(turns, spec)["messages"] == USER_ASSISTANT
    with pytest.raises(ManifestError, match="no conversation: expected 'messages'.*--input-field"):
        to_sample_record({"dialog": []}, InputSpec())


def test_bad_records_become_rejects_with_file_and_position(tmp_path):
    p = tmp_path / "m.jsonl"
    good = json.dumps({"messages": USER_ASSISTANT})
    p.write_bytes(
        (good + "\n").encode()
        + b'{"messages": "\x98\x99"}\n'
        + b"[1, 2]\n"
        + b'{"messages": [{"role": "assistant", "content": "only me"}]}\n'
        + b'{"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "a"}]}\n'
        + (good + "\n").encode()
    )
    samples = list(read_manifest([p]))
    assert [s.source for s in samples] == [f"m.jsonl:{i}" for i in range(1, 7)]
    assert samples[0].error is None and samples[5].error is None
    assert "invalid UTF-8" in samples[1].error
    assert "record is a list, not an object" in samples[2].error
    assert "assistant-only conversation" in samples[3].error
    assert "schema" in samples[4].error


def test_json_array_streams_large_records_and_isolates_bad_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(json_array, "_CHUNK", 64)  # records span many reads of the sliding buffer
    recs = _records(5)
    recs[2]["messages"][0]["content"] = "x" * 1000 + " ünïcode"
    body = json.dumps(recs, ensure_ascii=False).encode()
    bad = body.replace(b'"q3"', b'"q\xff3"')
    p = tmp_path / "a.json"
    p.write_bytes(bad)
    samples = list(read_manifest([p]))
    assert [s.error is None for s in samples] == [True, True, True, False, True]
    assert "invalid UTF-8" in samples[3].error and samples[3].source == "a.json#3"
    assert samples[2].record["messages"][0]["content"].endswith("ünïcode")
    cut = len(body) // 2
    p.write_bytes(body[:cut])  # a truncated array: an input error, not its first records and one reject
    for read in (lambda: list(read_manifest([p])), lambda: count_records([p])):
        with pytest.raises(InputError, match=rf"a\.json can not be read to its end \(at byte \d+ of {cut}: "
                           r"the file ends inside element #\d"):  # fmt: skip
            read()


def test_parquet_reads_row_groups_lazily(tmp_path, monkeypatch):
    p = tmp_path / "big.parquet"
    pq.write_table(pa.Table.from_pylist(_records(40)), p, row_group_size=8)
    import pyarrow.parquet as pqm

    seen = []
    real = pqm.ParquetFile.iter_batches

    def spy(self, *a, **k):
        seen.append(tuple(k.get("row_groups") or ()))
        return real(self, *a, **k)

    monkeypatch.setattr(pqm.ParquetFile, "iter_batches", spy)
    got = list(read_manifest([p], start=17, stop=20))
    assert [s.index for s in got] == [17, 18, 19]
    assert seen == [(2,)]  # only the row group holding the range was decoded


def test_an_unreadable_parquet_file_is_an_input_error(tmp_path):
    p = tmp_path / "x.parquet"
    p.write_bytes(b"PAR1 this is not parquet")  # its records can not even be counted, so not rejected
    for read in (lambda: list(read_manifest([p])), lambda: count_records([p])):
        with pytest.raises(InputError, match=r"x\.parquet can not be read to its end \(at byte 16 of 24: no "
                           "readable Parquet footer"):  # fmt: skip
            read()


def test_embedded_audio_bytes_are_read_back_from_the_parquet_file(tmp_path):
    import io

    import numpy as np
    import soundfile as sf

    from omnipack.media.probe import probe
    from omnipack.media.sources import resolve_source

    buf = io.BytesIO()
    sf.write(buf, np.zeros(8000, dtype=np.float32), 16000, format="WAV")
    rec = {
        "conversations": [
            {"from": "human", "value": "<audio>What do you hear?"},
            {"from": "gpt", "value": "silence"},
        ],
        "audios": [{"bytes": buf.getvalue(), "path": "clip.wav"}],
    }
    pq.write_table(pa.Table.from_pylist([rec, rec]), tmp_path / "a.parquet")
    samples = list(read_manifest([tmp_path / "a.parquet"]))
    ref = samples[1].record["messages"][0]["content"][0]["audio"]
    assert ref.startswith("embedded:") and ref.endswith("#1/audios/0/bytes")
    src = resolve_source(ref, tmp_path)
    assert src.read_bytes() == buf.getvalue()
    assert probe(src, "audio").num_samples == 8000


def test_a_folder_of_jsonl_files_is_read_in_name_order(tmp_path):
    d = tmp_path / "parts"
    (d / "sub").mkdir(parents=True)
    (d / "b.jsonl").write_text(json.dumps({"messages": USER_ASSISTANT}) + "\n")
    (d / "sub" / "a.jsonl").write_text(json.dumps({"messages": USER_ASSISTANT}) + "\n")
    (d / "a.jsonl").write_text(json.dumps({"messages": USER_ASSISTANT}) + "\n")
    ledger = []
    samples = list(read_manifest([d], ledger=ledger))
    assert [s.source for s in samples] == ["parts/a.jsonl:1", "parts/b.jsonl:1", "parts/sub/a.jsonl:1"]
    assert [(e["file"], e["first_index"], e["records"]) for e in ledger] == [
        ("parts/a.jsonl", 0, 1),
        ("parts/b.jsonl", 1, 1),
        ("parts/sub/a.jsonl", 2, 1),
    ]


_READ_ALL_MEDIA = """
import sys
from omnipack.manifest import read_manifest
from omnipack.media.sources import resolve_source

def read_all(path):  # as the measure stage reads a batch of records, then probes each one's image
    refs = [s.record["messages"][0]["content"][0]["image"] for s in read_manifest([path])]
    return sum(len(resolve_source(ref, ".").read_bytes()) for ref in refs)

def status_mb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024

read_all(sys.argv[2])  # a tiny file first: what the first read imports is not what is measured
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak resident size (VmHWM) to the current one
before = status_mb("VmRSS:")
n = read_all(sys.argv[1])
print(n, status_mb("VmHWM:") - before)
"""


def _peak_reading_media(path):
    """(media bytes read, peak RSS growth in MB) of reading every record of ``path`` and its image bytes, in
    a fresh process."""
    import subprocess
    import sys

    tiny = path.with_name("tiny.parquet")
    talk = [{"from": "human", "value": "<image>What is it?"}, {"from": "gpt", "value": "noise"}]
    pq.write_table(pa.Table.from_pylist([{"conversations": talk, "images": [{"bytes": b"x", "path": None}]}]), tiny)
    out = subprocess.run(
        [sys.executable, "-c", _READ_ALL_MEDIA, str(path), str(tiny)],
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout.split()  # fmt: skip
    return int(out[0]), float(out[1])


def test_large_binary_columns_are_read_in_bounded_slices(tmp_path):
    """A row group of 24 x 4 MB images: records are decoded, and embedded bytes read back, about 16 MB of rows
    at a time. What remains over one-row groups is one data page: writers (pyarrow, HF datasets) put a row
    group's column of under 1024 values in one page, and pyarrow reads a page whole. Measured here: 456 MB
    of peak growth before (3.7x one-row groups' 124 MB), 260 MB after (1.9x)."""
    import os

    rows, size = 24, 4 << 20
    talk = [{"from": "human", "value": "<image>What is it?"}, {"from": "gpt", "value": "noise"}]
    recs = [{"id": f"s{i}", "conversations": talk, "images": [{"bytes": os.urandom(size), "path": None}]}
            for i in range(rows)]  # fmt: skip
    table = pa.Table.from_pylist(recs)
    del recs
    one_group, one_row_groups = tmp_path / "group.parquet", tmp_path / "rows.parquet"
    pq.write_table(table, one_group, row_group_size=rows, compression="none")
    pq.write_table(table, one_row_groups, row_group_size=1, compression="none")
    del table
    grouped_bytes, grouped = _peak_reading_media(one_group)
    single_bytes, single = _peak_reading_media(one_row_groups)
    assert grouped_bytes == single_bytes == rows * size
    row_group_mb = rows * size / 2**20
    assert grouped < single + 1.6 * row_group_mb, (grouped, single, row_group_mb)
