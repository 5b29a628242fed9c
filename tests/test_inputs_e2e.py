"""End to end from real files: every input format and media source, prepared into a dataset whose stored
pixels are checked against the source images, with per-file accounting in the summary and omnipack.json."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from omnipack.cli import main
from omnipack.dataset.meta import read_omnipack_meta
from omnipack.media import sources

from .inputs_helpers import (
    FileServer,
    S3Server,
    assert_images_match,
    jpeg_bytes,
    omnipack_record,
    prepare,
    rejects,
    write_images,
    write_jsonl,
    write_tar,
)
from .stage_outputs import dataset_bytes


def _lf_record(i: int, images: list) -> dict:
    """A LLaMA-Factory / ms-swift record: markers in the text, media in a list."""
    return {
        "messages": [
            {"role": "user", "content": "<image>" * len(images) + f"Describe picture {i}."},
            {"role": "assistant", "content": f"Noise {i}."},
        ],
        "images": images,
    }


def _image_records_schema() -> pa.Schema:
    """LLaMA-Factory records with Hugging Face ``Image`` features (``{"bytes", "path"}``) in a list."""
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    return pa.schema(
        [
            ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("images", pa.list_(image_type)),
        ]
    )


def _check_accounting(root, summary, expected: dict[str, tuple[int, int, int]]) -> None:
    by_file = {f["file"]: (f["input"], f["packed"], f["rejected"]) for f in summary["counts"]["by_input"]}
    assert by_file == expected
    assert read_omnipack_meta(root)["counts"]["by_input"] == summary["counts"]["by_input"]
    c = summary["counts"]
    assert c["input"] == c["packed"] + c["rejected"] == sum(v[0] for v in expected.values())


def test_parquet_folder_with_embedded_jpeg_bytes(tmp_path, demo_tokenizer):
    data = tmp_path / "data"
    data.mkdir()
    schema = _image_records_schema()
    first = [_lf_record(i, [{"bytes": jpeg_bytes(i), "path": f"p{i}.jpg"}]) for i in range(3)]
    second = [_lf_record(i, [{"bytes": jpeg_bytes(i), "path": None}] * 2) for i in range(3, 5)]
    second.append(_lf_record(5, [{"bytes": b"not a jpeg", "path": None}]))
    pq.write_table(pa.Table.from_pylist(first, schema), data / "train-00000.parquet", row_group_size=2)
    pq.write_table(pa.Table.from_pylist(second, schema), data / "train-00001.parquet")
    root = tmp_path / "ds"
    summary = prepare(root, demo_tokenizer, [data], tmp_path)
    expected = {f"train-00000.parquet#{i}": [jpeg_bytes(i)] for i in range(3)}
    expected |= {f"train-00001.parquet#{k}": [jpeg_bytes(3 + k)] * 2 for k in range(2)}
    expected = {f"data/{k}": v for k, v in expected.items()}
    assert_images_match(root, expected)
    assert "unreadable image" in rejects(root)["data/train-00001.parquet#2"]["reason"]
    _check_accounting(
        root, summary, {"data/train-00000.parquet": (3, 3, 0), "data/train-00001.parquet": (3, 2, 1)}
    )
    # the same bytes with two worker processes reading the embedded media back
    prepare(tmp_path / "ds2", demo_tokenizer, [data], tmp_path, workers=2)
    shards = sorted(p.relative_to(root) for p in (root / "shards").rglob("*.tar"))
    assert shards and shards == sorted(
        p.relative_to(tmp_path / "ds2") for p in (tmp_path / "ds2" / "shards").rglob("*.tar")
    )
    assert all((root / s).read_bytes() == (tmp_path / "ds2" / s).read_bytes() for s in shards)


def test_embedded_parquet_media_read_by_several_row_builders_give_one_builders_bytes(
    tmp_path, demo_tokenizer, monkeypatch
):
    """The write stage's row builders read embedded media back on several threads: the row-group slices and
    cursors they share (``inputs.parquet``) are read one thread at a time, so a corpus larger than the slice
    cache (scaled down here) gives the bytes and rejects of one builder, with no sample lost to a race."""
    import omnipack.executors.local as local
    from omnipack.inputs import parquet as parquet_input

    data = tmp_path / "data"
    data.mkdir()
    schema = _image_records_schema()
    records = [_lf_record(i, [{"bytes": jpeg_bytes(i, 56, 84), "path": None}]) for i in range(160)]
    pq.write_table(pa.Table.from_pylist(records, schema), data / "train-00000.parquet", row_group_size=160)
    monkeypatch.setattr(parquet_input, "SLICE_BYTES", 16 << 10)  # many slices, evicted as rows go
    monkeypatch.setattr(parquet_input, "ROW_GROUP_CACHE_BYTES", 128 << 10)
    got = {}
    for cpus in (1, 4):
        monkeypatch.setattr(local, "available_cpus", lambda cpus=cpus: cpus)  # the inline worker's builders
        root = tmp_path / f"cpus{cpus}"
        summary = prepare(root, demo_tokenizer, [data], None, sample_store="off")
        assert summary["counts"]["packed"] == 160, summary["counts"]
        got[cpus] = dataset_bytes(root)
    assert got[4] == got[1]


def test_datasets_save_to_disk_with_image_features(tmp_path, demo_tokenizer):
    datasets = pytest.importorskip("datasets")
    records = [_lf_record(i, [{"bytes": jpeg_bytes(10 + i), "path": None}]) for i in range(4)]
    features = datasets.Features(
        {
            "messages": datasets.List(
                {"role": datasets.Value("string"), "content": datasets.Value("string")}
            ),
            "images": datasets.List(datasets.Image()),
            "id": datasets.Value("string"),
        }
    )
    rows = {
        "messages": [r["messages"] for r in records],
        "images": [r["images"] for r in records],
        "id": [f"hf-{i}" for i in range(4)],
    }
    saved = tmp_path / "saved"
    ds = datasets.Dataset.from_dict(rows, features=features)
    ds.save_to_disk(str(saved), num_shards=2)
    assert len(list(saved.glob("*.arrow"))) == 2  # several Arrow files, read in order
    root = tmp_path / "ds"
    summary = prepare(root, demo_tokenizer, [saved], tmp_path)
    assert_images_match(root, {f"hf-{i}": [jpeg_bytes(10 + i)] for i in range(4)})
    assert summary["counts"]["packed"] == 4 and len(summary["counts"]["by_input"]) == 2
    # measured a record per part: the same dataset, the same per-file counts
    again = prepare(tmp_path / "ds1", demo_tokenizer, [saved], tmp_path, part_lines=1)
    assert again["counts"]["by_input"] == summary["counts"]["by_input"]
    assert dataset_bytes(tmp_path / "ds1") == dataset_bytes(root)
    # a DatasetDict folder: its train split is read, not the test split after it
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(tmp_path / "dd"))
    from omnipack.manifest import read_manifest

    samples = list(read_manifest([tmp_path / "dd"]))
    assert [s.sample_id for s in samples] == ["hf-0", "hf-1", "hf-2", "hf-3"]
    assert all(s.error is None for s in samples)  # (the test split's hf-0 would be a duplicate id)


def test_llama_factory_json_with_system_prompt(tmp_path, demo_tokenizer):
    media = tmp_path / "media"
    write_images(media, 3)
    records = [{**_lf_record(i, [f"img{i}.jpg"]), "system": "You are terse."} for i in range(3)]
    records[2]["images"] = ["img2.jpg", "img1.jpg"]  # two images, one marker: rejected with the reason
    path = tmp_path / "lf.json"
    path.write_text(json.dumps(records, indent=2))
    root = tmp_path / "ds"
    summary = prepare(root, demo_tokenizer, [path], media)
    assert_images_match(root, {f"lf.json#{i}": [jpeg_bytes(i)] for i in range(2)})
    assert rejects(root)["lf.json#2"]["reason"] == "1 <image> markers but 2 image files"
    _check_accounting(root, summary, {"lf.json": (3, 2, 1)})
    from omnipack.manifest import read_manifest

    first = next(iter(read_manifest([path])))
    assert first.record["messages"][0] == {"role": "system", "content": "You are terse."}


def test_tar_shard_members(tmp_path, demo_tokenizer):
    write_tar(tmp_path / "shards" / "s0.tar", {f"{i:03d}.jpg": jpeg_bytes(20 + i) for i in range(3)})
    recs = [omnipack_record(f"t{i}", [f"shards/s0.tar#{i:03d}.jpg"]) for i in range(3)]
    recs.append(omnipack_record("t-missing", ["shards/s0.tar#999.jpg"]))
    root = tmp_path / "ds"
    summary = prepare(root, demo_tokenizer, [write_jsonl(tmp_path / "m.jsonl", recs)], tmp_path)
    assert_images_match(root, {f"t{i}": [jpeg_bytes(20 + i)] for i in range(3)})
    assert "no member '999.jpg'" in rejects(root)["t-missing"]["reason"]
    _check_accounting(root, summary, {"m.jsonl": (4, 3, 1)})


def test_files_served_over_http(tmp_path, demo_tokenizer, monkeypatch):
    monkeypatch.setattr(sources, "FETCH_BACKOFF_S", 0.01)
    served = tmp_path / "www"
    write_images(served, 3)
    with FileServer(served) as server:
        recs = [omnipack_record(f"h{i}", [f"{server.url}/img{i}.jpg"]) for i in range(3)]
        recs.append(omnipack_record("h-404", [f"{server.url}/gone.jpg"]))
        root = tmp_path / "ds"
        summary = prepare(
            root, demo_tokenizer, [write_jsonl(tmp_path / "m.jsonl", recs)], tmp_path, allow_private_urls=True
        )
    assert_images_match(root, {f"h{i}": [jpeg_bytes(i)] for i in range(3)})
    assert f"{server.url}/gone.jpg" in rejects(root)["h-404"]["reason"]
    _check_accounting(root, summary, {"m.jsonl": (4, 3, 1)})


def test_media_urls_at_private_addresses_are_rejected_by_default(tmp_path, demo_tokenizer):
    """The same served files without ``allow_private_urls``: each URL sample is rejected naming its URL
    (the setting reaches the measure workers); the local file is packed. Nothing was requested."""
    served = tmp_path / "www"
    write_images(served, 2)
    write_images(tmp_path, 1, prefix="local")
    with FileServer(served) as server:
        recs = [omnipack_record(f"h{i}", [f"{server.url}/img{i}.jpg"]) for i in range(2)]
        recs.append(omnipack_record("local", ["local0.jpg"]))
        root = tmp_path / "ds"
        summary = prepare(
            root, demo_tokenizer, [write_jsonl(tmp_path / "m.jsonl", recs)], tmp_path, max_reject_fraction=1.0
        )
        assert server.requests == {}
    assert_images_match(root, {"local": [jpeg_bytes(0)]})
    for i in range(2):
        reason = rejects(root)[f"h{i}"]["reason"]
        assert f"refused to fetch {server.url}/img{i}.jpg: a loopback address" in reason
    _check_accounting(root, summary, {"m.jsonl": (3, 1, 2)})


def test_s3_bucket_on_a_local_s3_server(tmp_path, demo_tokenizer):
    with S3Server():
        from omnipack.media.sources import filesystem_for

        fs, _ = filesystem_for("s3://train-media")
        fs.mkdir("train-media")
        for i in range(3):
            fs.pipe(f"train-media/imgs/{i}.jpg", jpeg_bytes(30 + i))
        recs = [omnipack_record(f"s{i}", [f"imgs/{i}.jpg"]) for i in range(2)]  # relative to an s3:// root
        recs.append(omnipack_record("s2", ["s3://train-media/imgs/2.jpg"]))  # a full URL
        root = tmp_path / "ds"
        summary = prepare(root, demo_tokenizer, [write_jsonl(tmp_path / "m.jsonl", recs)], "s3://train-media")
    assert_images_match(root, {f"s{i}": [jpeg_bytes(30 + i)] for i in range(3)})
    _check_accounting(root, summary, {"m.jsonl": (3, 3, 0)})


def test_non_utf8_line_is_rejected_and_the_good_lines_packed(tmp_path, demo_tokenizer):
    media = tmp_path / "media"
    write_images(media, 3)
    lines = [json.dumps(omnipack_record(f"u{i}", [f"img{i}.jpg"])).encode() for i in range(3)]
    lines.insert(1, b'{"id": "bad", "messages": [{"role": "user", "content": "caf\xe9"}]}')
    (tmp_path / "m.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    root = tmp_path / "ds"
    summary = prepare(root, demo_tokenizer, [tmp_path / "m.jsonl"], media)
    assert_images_match(root, {f"u{i}": [jpeg_bytes(i)] for i in range(3)})
    bad = rejects(root)["m.jsonl:2"]
    assert bad["source"] == "m.jsonl:2" and "invalid UTF-8" in bad["reason"] and bad["stage"] == "read"
    _check_accounting(root, summary, {"m.jsonl": (4, 3, 1)})


def test_cli_input_flags_and_the_reject_fraction_guard(tmp_path, demo_tokenizer, capsys):
    media = tmp_path / "media"
    write_images(media, 4)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.jpg").write_bytes(jpeg_bytes(40))
    (media / "link.jpg").symlink_to(tmp_path / "elsewhere" / "x.jpg")
    rows = [{"q": f"<image>What is {i}?", "a": f"noise {i}", "pic": f"img{i}.jpg"} for i in range(4)]
    rows.append({"q": "<image>and this?", "a": "noise", "pic": "link.jpg"})
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "vqa.parquet")
    base = ["prepare", "--manifest", str(tmp_path / "vqa.parquet"), "--media-root", str(media)]
    base += ["--tokenizer", str(demo_tokenizer), "--no-progress", "--seq-length", "1024"]
    base += ["--input-field", "prompt=q", "--input-field", "response=a", "--input-field", "image=pic"]
    # one reject in five is over the default 5%: exit 3, the data and the rejects file are written
    assert main([*base, "-o", str(tmp_path / "a")]) == 3
    err = capsys.readouterr().err
    assert "1 of 5 input records rejected (20.0%)" in err and "--max-reject-fraction" in err
    reason = rejects(tmp_path / "a")["vqa.parquet#4"]["reason"]
    assert "symlink" in reason and "--media-allow-root" in reason
    assert main([*base, "-o", str(tmp_path / "b"), "--max-reject-fraction", "0.25"]) == 0
    allowed = ["--media-allow-root", str(tmp_path / "elsewhere")]
    assert main([*base, "-o", str(tmp_path / "c"), *allowed]) == 0
    assert read_omnipack_meta(tmp_path / "c")["counts"]["by_input"] == [
        {"file": "vqa.parquet", "input": 5, "packed": 5, "rejected": 0}
    ]
    capsys.readouterr()
    assert main([*base, "-o", str(tmp_path / "d"), "--input-format", "csv"]) == 2
    assert "unknown input format 'csv'" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # a bad input setting leaves no output folder behind


def test_cli_model_settings_fail_in_one_line_naming_the_setting(tmp_path, demo_tokenizer, capsys):
    write_jsonl(tmp_path / "m.jsonl", [omnipack_record("a", [])])
    base = [
        "prepare",
        "--manifest",
        str(tmp_path / "m.jsonl"),
        "--media-root",
        str(tmp_path),
        "-o",
        str(tmp_path / "o"),
    ]
    cases = [
        (["--tokenizer", str(tmp_path / "no-tok")], "(--tokenizer)"),
        (["--tokenizer", str(demo_tokenizer), "--profile-option", "max_pixel=5"], "'max_pixel'"),
        (["--tokenizer", str(demo_tokenizer), "--preprocessor-config", str(tmp_path / "nope.json")], "(--preprocessor-config)"),
    ]  # fmt: skip
    for extra, needle in cases:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and "\n" not in err and "Traceback" not in err
