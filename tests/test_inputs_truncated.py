"""Input files that can not be read to their end (a half-finished download or copy, a broken footer or row
group) fail the run naming the file and the byte offset, whichever part of the file meets the break: they
are never a few rejects under the reject limit while the rest of the file is lost unseen."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from omnipack.cli import main
from omnipack.dataset.meta import read_omnipack_meta
from omnipack.inputs import InputError, InputSpec, read_part, split_parts
from omnipack.manifest import read_manifest

from .inputs_helpers import SEQ_LENGTH, rejects


def _llava(i: int) -> dict:
    return {
        "id": f"llava-{i}",
        "conversations": [
            {"from": "human", "value": f"Question {i}: " + "what is shown here? " * 40},
            {"from": "gpt", "value": f"Answer {i}: " + "a picture of many things. " * 40},
        ],
    }


def _msg(i: int) -> dict:
    return {"id": f"m{i}", "messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}


def _cli(tmp_path, tokenizer, inputs, out: str, *extra: str) -> int:
    args = ["prepare", "--manifest", *map(str, inputs), "--media-root", str(tmp_path)]
    args += ["--tokenizer", str(tokenizer), "--no-progress", "--seq-length", str(SEQ_LENGTH), "-o", str(tmp_path / out)]
    return main([*args, *extra])


def _offset(err: str, path) -> tuple[int, int]:
    m = re.search(rf"input {re.escape(str(path))} can not be read to its end \(at byte (\d+) of (\d+):", err)
    assert m, err
    return int(m[1]), int(m[2])


def test_a_cut_short_json_array_fails_the_run_naming_file_and_offset(tmp_path, demo_tokenizer, capsys):
    body = json.dumps([_llava(i) for i in range(30)], indent=1).encode()
    assert len(body) > 30_000
    whole = tmp_path / "llava.json"
    whole.write_bytes(body)
    cut = tmp_path / "llava_cut.json"
    cut.write_bytes(body[:20_000])  # a half-downloaded file: its first records, then the cut
    assert _cli(tmp_path, demo_tokenizer, [cut], "a") == 2
    err = capsys.readouterr().err
    assert _offset(err, cut)[1] == 20_000 and "closing ']' (cut short?)" in err
    assert not (tmp_path / "a").exists()  # failed before the output folder was touched
    # the whole file packs every record
    assert _cli(tmp_path, demo_tokenizer, [whole], "b") == 0
    assert read_omnipack_meta(tmp_path / "b")["counts"]["packed"] == 30


@pytest.mark.parametrize("part_records", [1, 4, 7, 100])
def test_every_part_of_a_cut_json_array_fails_where_it_meets_the_cut(tmp_path, part_records):
    """Parts are cut from the whole file; when the file is cut short afterwards (a rerun that reuses its
    parts, a rank of a staged run), the part that meets the cut fails, not just the splitter."""
    body = json.dumps([_llava(i) for i in range(30)]).encode()
    p = tmp_path / "a.json"
    p.write_bytes(body)
    parts = split_parts([p], InputSpec(), part_records)
    size = len(body) * 2 // 3
    p.write_bytes(body[:size] + b"]")  # cut inside an element; the closing bracket fools a look at the end
    with pytest.raises(InputError, match=rf"a\.json can not be read to its end \(at byte \d+ of {size + 1}: "):
        for part in parts:
            list(read_part(part, InputSpec()))
    with pytest.raises(InputError):
        split_parts([p], InputSpec(), part_records)
    with pytest.raises(InputError):
        list(read_manifest([p]))


def test_a_broken_element_in_the_middle_is_an_input_error_too(tmp_path):
    body = json.dumps([_msg(i) for i in range(6)]).encode()
    p = tmp_path / "b.json"
    at = body.index(b'{"id": "m3"')
    p.write_bytes(body[:at] + b"{oops" + body[at + 1 :])
    with pytest.raises(InputError, match=rf"at byte {at} of {len(body) + 4}: element #3 is not valid JSON"):
        list(read_manifest([p]))


def test_a_cut_jsonl_last_line_fails_and_a_bad_middle_line_stays_a_reject(tmp_path, demo_tokenizer, capsys):
    lines = [json.dumps(_msg(i)) for i in range(40)]
    lines[10] = '{"id": "m10", "messages": [{"role": "user"'  # a bad line followed by more lines: a reject
    body = "\n".join(lines).encode()  # the last line has no newline, and is whole
    good = tmp_path / "good.jsonl"
    good.write_bytes(body)
    assert _cli(tmp_path, demo_tokenizer, [good], "a", "--max-reject-fraction", "0.1") == 0
    assert "invalid JSON" in rejects(tmp_path / "a")["good.jsonl:11"]["reason"]
    assert read_omnipack_meta(tmp_path / "a")["counts"]["packed"] == 39
    capsys.readouterr()

    parts = split_parts([good], InputSpec(), 7)
    size = len(body) - 9  # a cut inside the last line
    good.write_bytes(body[:size])
    last_line_at = body.rindex(b"\n") + 1
    # the part that holds the cut line fails; the parts before it read as before
    with pytest.raises(InputError, match=rf"at byte {last_line_at} of {size}: its last line, line 40, has no newline"):
        list(read_part(parts[-1], InputSpec()))
    assert [s.error is None for s in read_part(parts[0], InputSpec())] == [True] * 7
    with pytest.raises(InputError, match="line 40, has no newline and is not whole JSON"):
        split_parts([good], InputSpec(), 7)
    with pytest.raises(InputError):
        list(read_manifest([good]))
    assert _cli(tmp_path, demo_tokenizer, [good], "b", "--max-reject-fraction", "0.1") == 2
    err = capsys.readouterr().err
    assert _offset(err, good) == (last_line_at, size) and "the file is cut short?" in err
    assert not (tmp_path / "b").exists()


def _parquet(path, n: int = 40, row_group_size: int = 10):
    pq.write_table(pa.Table.from_pylist([_msg(i) for i in range(n)]), path, row_group_size=row_group_size)
    return path


def test_a_parquet_file_without_its_footer_fails_the_run(tmp_path, demo_tokenizer, capsys):
    p = _parquet(tmp_path / "train-00000-of-00001.parquet")
    data = p.read_bytes()
    p.write_bytes(data[: len(data) * 3 // 4])  # a cut-short download: no footer
    with pytest.raises(InputError, match=r"no readable Parquet footer"):
        list(read_manifest([p]))
    assert _cli(tmp_path, demo_tokenizer, [p], "a") == 2
    err = capsys.readouterr().err
    assert _offset(err, p) == (len(data) * 3 // 4 - 8, len(data) * 3 // 4)


def test_a_parquet_row_group_that_can_not_be_read_fails_the_part_that_reads_it(tmp_path):
    p = _parquet(tmp_path / "d.parquet")
    parts = split_parts([p], InputSpec(), 10)
    col = pq.ParquetFile(p).metadata.row_group(2).column(0)
    at = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    data = bytearray(p.read_bytes())
    data[at : at + 16] = b"\xff" * 16  # the row group's first page header is garbage
    p.write_bytes(bytes(data))
    assert len(list(read_part(parts[1], InputSpec()))) == 10  # row group 1 is intact
    with pytest.raises(InputError, match=rf"at byte {at} of {len(data)}: row group 2 \(records 20 to 29\) is unreadable"):
        list(read_part(parts[2], InputSpec()))
    with pytest.raises(InputError, match="row group 2"):
        list(read_manifest([p]))


def test_a_cut_arrow_file_fails_the_run(tmp_path, demo_tokenizer, capsys):
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.Dataset.from_list([_msg(i) for i in range(40)]).save_to_disk(str(saved))
    (arrow,) = saved.glob("*.arrow")
    data = arrow.read_bytes()
    assert data.endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")  # save_to_disk writes streams that end so
    arrow.write_bytes(data[: len(data) // 2])  # cut inside a record batch
    assert _cli(tmp_path, demo_tokenizer, [saved], "a") == 2
    err = capsys.readouterr().err
    assert _offset(err, arrow)[1] == len(data) // 2 and "unreadable IPC stream message" in err


def test_an_arrow_stream_cut_between_batches_is_not_read_as_a_shorter_one(tmp_path):
    table = pa.Table.from_pylist([_msg(i) for i in range(40)])
    whole = tmp_path / "whole.arrow"
    with pa.OSFile(str(whole), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        for batch in table.to_batches(max_chunksize=10):
            w.write_batch(batch)
    # where each batch ends: a stream cut there reads without error in pyarrow, as 10, 20 or 30 records
    with pa.OSFile(str(tmp_path / "x.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        ends = []
        for batch in table.to_batches(max_chunksize=10)[:3]:
            w.write_batch(batch)
            ends.append(f.tell())
    data = whole.read_bytes()
    assert len(list(read_manifest([whole]))) == 40
    for k, end in enumerate(ends):
        cut = tmp_path / f"cut{k}.arrow"
        cut.write_bytes(data[:end])
        assert sum(b.num_rows for b in pa.ipc.open_stream(pa.memory_map(str(cut)))) == 10 * (k + 1)
        with pytest.raises(InputError, match=rf"at byte {end} of {end}: the IPC stream ends without its end-of-stream"):
            list(read_manifest([cut]))


def test_an_arrow_ipc_file_without_its_footer_fails(tmp_path):
    table = pa.Table.from_pylist([_msg(i) for i in range(40)])
    p = tmp_path / "f.arrow"
    with pa.OSFile(str(p), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    assert len(list(read_manifest([p]))) == 40
    data = p.read_bytes()
    cut = tmp_path / "g.arrow"
    cut.write_bytes(data[:-20])
    with pytest.raises(InputError, match="g.arrow can not be read to its end .*no readable IPC file footer"):
        list(read_manifest([cut]))
