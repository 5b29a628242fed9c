"""Measure parts of every input format: each reader cuts its files into record ranges that read back exactly
as the whole file does, a prepared dataset is the same bytes for any part size, worker count or staged run,
per-file accounting is exact across parts, and a part's resume key follows its file and the import settings."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from omnipack.cli import main
from omnipack.inputs import InputError, InputSpec, read_part, split_parts
from omnipack.manifest import read_manifest
from omnipack.pipeline import PrepareConfig, run_prepare

from .inputs_helpers import SEQ_LENGTH, jpeg_bytes, omnipack_record, write_images
from .stage_outputs import dataset_bytes

QA = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def _rec(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}


def _view(samples) -> list[tuple]:
    return [(s.sample_id, s.source, s.error, s.record and s.record["messages"]) for s in samples]


def _inputs(tmp_path) -> dict[str, object]:
    """One input per format, each with records that are rejects of its own kind."""
    jsonl = tmp_path / "a.jsonl"
    lines = [json.dumps(_rec(i)).encode() for i in range(9)]
    lines[3] = b'{"messages": "caf\xe9"}'  # not UTF-8
    lines.insert(5, b"")  # a blank line: no record
    lines[7] = b"[1, 2]"  # not an object
    jsonl.write_bytes(b"\n".join(lines))  # the last line has no newline
    arr = tmp_path / "b.json"
    body = json.dumps([_rec(i) for i in range(8)], indent=1).encode()
    arr.write_bytes(body.replace(b'"q2"', b'"q\xff2"'))  # one element with bytes that are not UTF-8
    broken = tmp_path / "c.json"
    broken.write_bytes(body[: len(body) * 2 // 3])  # a truncated array
    no_comma = tmp_path / "c2.json"
    no_comma.write_text(json.dumps([_rec(i) for i in range(4)]).replace("}]}, {", "}]} {", 1))
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([_rec(i) for i in range(11)]), parquet, row_group_size=4)
    arrow = tmp_path / "e"
    arrow.mkdir()
    table = pa.Table.from_pylist([_rec(i) for i in range(7)])
    with (
        pa.OSFile(str(arrow / "data-00000-of-00001.arrow"), "wb") as f,
        pa.ipc.new_stream(f, table.schema) as w,
    ):
        for batch in table.to_batches(max_chunksize=3):
            w.write_batch(batch)
    (arrow / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    return {
        "jsonl": jsonl,
        "json": arr,
        "parquet": parquet,
        "arrow": arrow,
        # files that can not be read to their end: input errors, whichever part meets the break
        "json-broken": broken,
        "json-no-comma": no_comma,
    }


@pytest.mark.parametrize("part_records", [1, 2, 3, 4, 5, 100])
def test_parts_of_every_format_read_back_as_the_whole_input(tmp_path, part_records):
    inputs = _inputs(tmp_path)
    spec = InputSpec()
    for name, path in inputs.items():
        if name.endswith(("-broken", "-no-comma")):
            continue
        whole = _view(read_manifest([path]))
        parts = split_parts([path], spec, part_records)
        got = [s for part in parts for s in read_part(part, spec)]
        assert _view(got) == whole, (name, part_records)
        assert [s.index for s in read_part(parts[-1], spec)][:1] == [0]  # indices start at 0 in a part
        assert len({p.number for p in parts}) == len(parts)
    jsonl = split_parts([inputs["jsonl"]], spec, part_records)
    assert sum(p.num_lines for p in jsonl) == 10  # every line once, the blank one included
    parquet = split_parts([inputs["parquet"]], spec, part_records)
    # whole row groups (4 rows each) per part, as many as make part_records; larger ones cut in ranges
    expected = {1: list(range(11)), 4: [0, 4, 8], 5: [0, 8], 100: [0]}
    if part_records in expected:
        assert [p.first_record for p in parquet] == expected[part_records]
    with pytest.raises(InputError, match="c.json can not be read to its end .*the file ends inside element #5"):
        split_parts([inputs["json-broken"]], spec, part_records)
    with pytest.raises(InputError, match="c2.json can not be read to its end .*expected ',' or ']' after element #0"):
        split_parts([inputs["json-no-comma"]], spec, part_records)


def test_json_array_parts_start_at_their_first_element_byte(tmp_path, monkeypatch):
    from omnipack.inputs import json_array

    inputs = _inputs(tmp_path)
    (part,) = [p for p in split_parts([inputs["json"]], InputSpec(), 3) if p.first_record == 3]
    data = inputs["json"].read_bytes()
    assert json.JSONDecoder().raw_decode(data[part.start_byte :].decode())[0] == _rec(3)
    calls = []
    real = json.JSONDecoder.raw_decode
    monkeypatch.setattr(json_array.json.JSONDecoder, "raw_decode", lambda *a: calls.append(1) or real(*a))
    assert [s.sample_id for s in read_part(part, InputSpec())] == [f"b.json#{i}" for i in (3, 4, 5)]
    assert len(calls) == 3  # the elements before the part are not parsed


@pytest.mark.parametrize("chunk", [7, 64, 100])
def test_json_array_parts_are_right_when_elements_straddle_the_read_buffer(tmp_path, monkeypatch, chunk):
    """An element cut at the read buffer's end is decoded again after the next read: its offset must be
    noted once, or every later part starts one part early and records repeat while others vanish."""
    from omnipack.inputs import json_array

    path = tmp_path / "a.json"
    records = [
        {
            "id": f"r{i}",
            "messages": [
                {"role": "user", "content": "x" * (i % 7 * 9 + 1)},
                {"role": "assistant", "content": "ok"},
            ],
        }
        for i in range(30)
    ]
    path.write_text(json.dumps(records))
    whole = [s.sample_id for s in read_manifest([path])]
    monkeypatch.setattr(json_array, "_CHUNK", chunk)
    parts = split_parts([path], InputSpec(), 4)
    assert [p.first_record for p in parts] == list(range(0, 30, 4))
    got = [s.sample_id for part in parts for s in read_part(part, InputSpec())]
    assert got == whole == [f"r{i}" for i in range(30)]


def _mixed_inputs(tmp_path):
    """A Parquet file with embedded JPEG bytes, a LLaMA-Factory JSON array and an omnipack JSONL manifest."""
    media = tmp_path / "media"
    write_images(media, 4)
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema(
        [
            ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("images", pa.list_(image_type)),
        ]
    )
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"<image>What is {i}?"},
                {"role": "assistant", "content": f"noise {i}"},
            ],
            "images": [{"bytes": jpeg_bytes(50 + i) if i != 4 else b"not a jpeg", "path": None}],
        }
        for i in range(7)
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema), tmp_path / "emb.parquet", row_group_size=3)
    lf = [
        {
            "messages": [
                {"role": "user", "content": f"<image>Picture {i}?"},
                {"role": "assistant", "content": f"noise {i}"},
            ],
            "images": [f"img{i}.jpg"],
            "system": "Be brief.",
        }
        for i in range(4)
    ]
    lf[2]["images"].append("img0.jpg")  # two files, one marker: a reject
    (tmp_path / "lf.json").write_text(json.dumps(lf, indent=1))
    jsonl = [omnipack_record(f"j{i}", [f"img{i % 4}.jpg"]) for i in range(5)]
    jsonl[1]["id"] = "j0"  # a duplicate id
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in jsonl))
    return [tmp_path / "emb.parquet", tmp_path / "lf.json", tmp_path / "m.jsonl"], media


def _config(out, tokenizer, inputs, media, **kw) -> PrepareConfig:
    settings = {"seq_length": SEQ_LENGTH, "shard_max_rows": 2, "progress": False, **kw}
    return PrepareConfig(
        manifest=[str(p) for p in inputs],
        media_root=str(media),
        tokenizer=str(tokenizer),
        output=str(out),
        **settings,
    )


def test_every_part_size_worker_count_and_staged_run_gives_the_same_bytes(tmp_path, demo_tokenizer):
    inputs, media = _mixed_inputs(tmp_path)
    expected_by_input = [
        {"file": "emb.parquet", "input": 7, "packed": 6, "rejected": 1},
        {"file": "lf.json", "input": 4, "packed": 3, "rejected": 1},
        {"file": "m.jsonl", "input": 5, "packed": 4, "rejected": 1},
    ]
    ref = tmp_path / "ref"
    summary = run_prepare(_config(ref, demo_tokenizer, inputs, media))  # one part per file
    assert summary["counts"]["by_input"] == expected_by_input
    reference = dataset_bytes(ref)
    parts = json.loads((ref / "stages" / "parts.json").read_text())["parts"]
    assert [p["format"] for p in parts] == ["parquet", "json", "jsonl"]
    for name, kw in [("p2", {"part_lines": 2}), ("p2w2", {"part_lines": 2, "workers": 2})]:
        out = tmp_path / name
        summary = run_prepare(_config(out, demo_tokenizer, inputs, media, **kw))
        assert summary["counts"]["by_input"] == expected_by_input
        assert dataset_bytes(out) == reference, name
    parts = json.loads((tmp_path / "p2" / "stages" / "parts.json").read_text())["parts"]
    assert [(p["format"], p["first_record"]) for p in parts if p["format"] != "jsonl"] == [
        ("parquet", 0), ("parquet", 3), ("parquet", 6), ("json", 0), ("json", 2)
    ]  # fmt: skip
    # the staged CLI: measure ranks, pack, write ranks, finalize
    out = tmp_path / "staged"
    args = ["prepare", "--manifest", *map(str, inputs), "--media-root", str(media)]
    args += ["--tokenizer", str(demo_tokenizer), "-o", str(out), "--seq-length", str(SEQ_LENGTH)]
    args += ["--shard-max-rows", "2", "--part-lines", "2", "--no-progress", "--max-reject-fraction", "0.3"]
    for rank in range(3):
        assert main([*args, "--stage", "measure", "--rank", str(rank), "--world-size", "3"]) == 0
    assert main([*args, "--stage", "pack"]) == 0
    for rank in range(2):
        assert main([*args, "--stage", "write", "--rank", str(rank), "--world-size", "2"]) == 0
    assert main([*args, "--stage", "finalize"]) == 0
    assert dataset_bytes(out) == reference


def _part_keys(out) -> dict[tuple[str, int], str]:
    keys = {}
    for path in (out / "stages" / "measure").glob("part-*.json"):
        rec = json.loads(path.read_text())
        part = rec["part"]
        keys[(os.path.basename(part["path"]), part["first_record"], part["first_line"])] = rec["key"]
    return keys


def test_part_keys_follow_the_input_file_and_the_import_settings(tmp_path, demo_tokenizer):
    inputs, media = _mixed_inputs(tmp_path)
    out = tmp_path / "ds"
    cfg = _config(out, demo_tokenizer, inputs, media, part_lines=3)
    run_prepare(cfg, stage="measure")
    before = _part_keys(out)
    assert len(before) == 3 + 2 + 2
    # a Parquet file touched (same size, new modification time): its parts are measured again, only them
    st = inputs[0].stat()
    os.utime(inputs[0], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    run_prepare(cfg, stage="measure")
    after = _part_keys(out)
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {k for k in before if k[0] == "emb.parquet"}
    # another field mapping measures every part again
    remapped = _config(
        out, demo_tokenizer, inputs, media, part_lines=3, input_fields={"meta": "extra"}, overwrite=True
    )
    run_prepare(remapped)  # an unfinished run goes on with other settings: it redoes what they touch
    again = _part_keys(out)
    assert all(again[k] != after[k] for k in after)


def test_per_file_counts_merge_parts_and_catch_every_accounting_error():
    from omnipack.inputs.accounting import per_file_counts

    ledger = [  # two parts of a.jsonl, one of b.parquet, in input order
        {"file": "a.jsonl", "first_index": 0, "records": 3},
        {"file": "a.jsonl", "first_index": 3, "records": 2},
        {"file": "b.parquet", "first_index": 5, "records": 2},
    ]
    assert per_file_counts(ledger, [1, 6], [0, 2, 3, 4, 5]) == [
        {"file": "a.jsonl", "input": 5, "packed": 4, "rejected": 1},
        {"file": "b.parquet", "input": 2, "packed": 1, "rejected": 1},
    ]
    with pytest.raises(AssertionError, match="a.jsonl: 5 input != 4 packed"):
        per_file_counts(ledger, [6], [0, 2, 3, 4, 5])  # index 1 neither packed nor rejected
    with pytest.raises(AssertionError, match="b.parquet: 2 input != 2 packed \\+ 1 rejected"):
        per_file_counts(ledger, [1, 6], [0, 2, 3, 4, 5, 6])  # index 6 both
    with pytest.raises(AssertionError, match="sample index 7 belongs to no input file"):
        per_file_counts(ledger, [1, 6, 7], [0, 2, 3, 4, 5])
