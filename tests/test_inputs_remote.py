"""Inputs on an object store: JSONL, a JSON array and a folder prefix of Parquet files with embedded images,
read from moto's S3 server (``--manifest s3://bucket/...``) give the very dataset the same files give when read
locally, and no ``--media-root`` is needed when every media reference is embedded or absolute."""

from __future__ import annotations

import base64
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("upath")
pytest.importorskip("moto.server")

from omnipack.cli import main  # noqa: E402
from omnipack.dataset.meta import read_omnipack_meta  # noqa: E402
from omnipack.inputs import InputSpec, data_files  # noqa: E402

from .inputs_helpers import S3Server, assert_images_match, jpeg_bytes, prepare, rejects  # noqa: E402
from .stage_outputs import dataset_bytes  # noqa: E402

BUCKET = "omnipack-inputs"


def _lf_record(i: int, images: list) -> dict:
    return {
        "id": f"r{i}",
        "messages": [
            {"role": "user", "content": "<image>" * len(images) + f"Describe picture {i}."},
            {"role": "assistant", "content": f"Noise {i}."},
        ],
        "images": images,
    }


def _b64(i: int) -> dict:
    return {"bytes": base64.b64encode(jpeg_bytes(i)).decode(), "path": None}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Local input files, the same files in the bucket (``s3://BUCKET/in/``), and images the records name by
    absolute URL (``s3://BUCKET/imgs/``)."""
    import fsspec

    local = tmp_path_factory.mktemp("inputs")
    # JSONL: base64 bytes and an absolute URL; one record with a relative path (needs a media root)
    lines = [_lf_record(0, [_b64(0)]), _lf_record(1, [f"s3://{BUCKET}/imgs/1.jpg"]), _lf_record(2, ["rel.jpg"])]
    (local / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    # a JSON array (LLaVA / LLaMA-Factory exports), indented as such files are
    array = [_lf_record(3, [_b64(3), f"s3://{BUCKET}/imgs/4.jpg"]), _lf_record(5, [_b64(5)])]
    (local / "chat.json").write_text(json.dumps(array, indent=2))
    # a Hub-style folder of Parquet files with embedded image bytes, row groups of 2, one broken image
    data = local / "data"
    data.mkdir()
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("images", pa.list_(image)),
        ]
    )
    first = [_lf_record(i, [{"bytes": jpeg_bytes(i), "path": f"p{i}.jpg"}]) for i in range(10, 13)]
    second = [_lf_record(13, [{"bytes": jpeg_bytes(13), "path": None}] * 2)]
    second.append(_lf_record(14, [{"bytes": b"not a jpeg", "path": None}]))
    pq.write_table(pa.Table.from_pylist(first, schema), data / "train-00000.parquet", row_group_size=2)
    pq.write_table(pa.Table.from_pylist(second, schema), data / "train-00001.parquet")
    with S3Server() as server:
        server.bucket(BUCKET)
        fs = fsspec.filesystem("s3")
        for f in sorted(p for p in local.rglob("*") if p.is_file()):
            fs.pipe(f"{BUCKET}/in/{f.relative_to(local).as_posix()}", f.read_bytes())
        for i in (1, 4):
            fs.pipe(f"{BUCKET}/imgs/{i}.jpg", jpeg_bytes(i))
        yield local, f"s3://{BUCKET}/in"


def test_jsonl_json_and_a_parquet_prefix_on_s3_give_the_local_dataset(inputs, tmp_path, demo_tokenizer):
    local, url = inputs
    names = ["chat.jsonl", "chat.json", "data"]
    here = prepare(tmp_path / "local", demo_tokenizer, [local / n for n in names], None)
    remote = [f"{url}/chat.jsonl", f"{url}/chat.json", f"{url}/data/"]  # two files and a folder prefix
    there = prepare(tmp_path / "remote", demo_tokenizer, remote, None)
    got, want = dataset_bytes(tmp_path / "remote"), dataset_bytes(tmp_path / "local")
    # omnipack.json names where each input was read (a path here, a URL there); all else is the same bytes
    meta = {k: json.loads(d.pop(".nv-meta/omnipack.json")) for k, d in (("got", got), ("want", want))}
    assert got == want  # shards, their indexes, the other metadata, rejects
    where = {k: [(i.pop("path"), i) for i in m.pop("inputs")] for k, m in meta.items()}
    assert [p for p, _ in where["got"]] == [u.rstrip("/") for u in remote] and [p for p, _ in where["want"]] == [str(local / n) for n in names]
    assert [i for _, i in where["got"]] == [i for _, i in where["want"]]  # the same split and files
    # the source record names the inputs too, and digests only local files
    sources = {k: m.pop("source") for k, m in meta.items()}
    assert [f["records"] for f in sources["got"]["files"]] == [f["records"] for f in sources["want"]["files"]]
    assert all(f["xxh3"] is None for f in sources["got"]["files"])
    assert all(f["xxh3"] for f in sources["want"]["files"])
    # the root covers omnipack.json, which records the input paths: every other file's leaf is the same
    leaves = {k: [f for f in m.pop("root")["leaves"] if f[0] != ".nv-meta/omnipack.json"] for k, m in meta.items()}
    assert leaves["got"] == leaves["want"]
    assert meta["got"] == meta["want"]
    assert here["counts"] == there["counts"]
    by_file = {f["file"]: (f["input"], f["packed"], f["rejected"]) for f in there["counts"]["by_input"]}
    assert by_file == {
        "chat.jsonl": (3, 2, 1),
        "chat.json": (2, 2, 0),
        "data/train-00000.parquet": (3, 3, 0),
        "data/train-00001.parquet": (2, 1, 1),
    }
    root = tmp_path / "remote"
    expected = {f"r{i}": [jpeg_bytes(i)] for i in (0, 1, 5, 10, 11, 12)}
    assert_images_match(root, {**expected, "r3": [jpeg_bytes(3), jpeg_bytes(4)], "r13": [jpeg_bytes(13)] * 2})
    reasons = rejects(root)
    assert "'rel.jpg' needs --media-root" in reasons["r2"]["reason"]
    assert "unreadable image" in reasons["r14"]["reason"]


def test_cli_takes_an_s3_prefix_without_media_root(inputs, tmp_path, demo_tokenizer, capsys):
    _, url = inputs
    out = tmp_path / "ds"
    args = ["prepare", "--manifest", f"{url}/data/", "--tokenizer", str(demo_tokenizer), "-o", str(out)]
    rc = main([*args, "--seq-length", "1024", "--no-progress", "--max-reject-fraction", "0.5"])
    assert rc == 0, capsys.readouterr().err
    assert read_omnipack_meta(out)["counts"]["packed"] == 4
    # a missing input names its URL as given
    args[2] = f"{url}/nothing/"
    assert main(args) == 2
    assert f"input {url}/nothing not found" in capsys.readouterr().err


def test_a_remote_parquet_file_is_read_in_ranges(inputs, monkeypatch):
    """Counting a remote Parquet file's records reads its footer, and reading one embedded image its row
    group's column: never the whole file."""
    import os

    import fsspec
    import s3fs

    from omnipack.inputs import parquet

    _, url = inputs
    blobs = [os.urandom(2 << 20) for _ in range(3)]  # incompressible: a 6 MiB file of three row groups
    table = pa.table({"id": ["a", "b", "c"], "blob": blobs})
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, row_group_size=1)
    fsspec.filesystem("s3").pipe(f"{BUCKET}/big/blobs.parquet", buf.getvalue().to_pybytes())
    fetched = []
    fetch = s3fs.core.S3File._fetch_range
    monkeypatch.setattr(
        s3fs.core.S3File, "_fetch_range", lambda f, a, b: fetched.append(b - a) or fetch(f, a, b)
    )
    ((reader, df),) = data_files([f"s3://{BUCKET}/big/blobs.parquet"], InputSpec())
    assert reader.name == "parquet" and str(df.path) == f"s3://{BUCKET}/big/blobs.parquet"
    assert reader.count(df.path) == 3
    assert 0 < sum(fetched) < 2 << 20
    fetched.clear()
    assert parquet.column_value(df.path, 2, "blob") == blobs[2]
    assert sum(fetched) < 2 * (2 << 20) + (1 << 20)  # row group 2's column (and read-ahead), not all three
