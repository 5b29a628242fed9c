"""``omnipack verify`` passes an intact dataset and catches each kind of damage, naming where it is."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from omnipack.cli import main
from omnipack.codec import load_npy, npy_bytes
from omnipack.tools.verify import CHECK_NAMES, run_verify
from tests.tools_dataset import build_small_dataset, copy_dataset, edit_json, rewrite_shard

SHARD = "shards/shard-000001.tar"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_dataset(tmp_path_factory.mktemp("verify"))


@pytest.fixture
def ds(small: Path, tmp_path: Path) -> Path:
    return copy_dataset(small, tmp_path / "ds")


def failing(root: Path) -> dict[str, list[str]]:
    return {r.name: r.failures for r in run_verify(root) if r.status == "fail"}


def test_intact_dataset_passes(small: Path, capsys: pytest.CaptureFixture) -> None:
    results = run_verify(small)
    assert [r.name for r in results] == CHECK_NAMES
    assert all(r.status == "pass" for r in results), [(r.name, r.failures, r.skipped) for r in results]
    # The CLI with a process pool, machine-readable.
    assert main(["verify", str(small), "--workers", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and len(report["checks"]) == len(CHECK_NAMES)


def test_flipped_byte_in_a_shard(ds: Path) -> None:
    path = ds / SHARD
    with tarfile.open(path) as tar:
        img = next(m for m in tar if ".media." in m.name)
    data = bytearray(path.read_bytes())
    data[img.offset_data + img.size // 2] ^= 0xFF  # inside a media payload's pixels
    path.write_bytes(bytes(data))
    fails = failing(ds)
    assert "checksums" in fails and set(fails) <= {"checksums", "media"}
    # without payload decoding, only the checksum can see it
    quiet = {
        r.name: r.failures for r in run_verify(ds, workers=1, progress=False, payloads=False) if r.failures
    }
    assert set(quiet) == {"checksums"}
    assert SHARD in fails["checksums"][0] and "sha256" in fails["checksums"][0]


def test_corrupted_tokens_break_the_row_contract(ds: Path) -> None:
    corrupted = []

    def corrupt(rows):
        corrupted.append(len(rows) - 1)
        toks = load_npy(rows[-1].parts["tokens.npy"]).copy()
        toks[5] += 1  # a supervised neighbour's label no longer matches, or a role marker breaks
        toks[np.flatnonzero(load_npy(rows[-1].parts["labels.npy"]) != -100)[0] + 1] += 1
        rows[-1].parts["tokens.npy"] = npy_bytes(toks)
        return rows

    rewrite_shard(ds, SHARD, corrupt)
    fails = failing(ds)
    assert set(fails) == {"row-contract"}
    msg = fails["row-contract"][0]
    assert SHARD in msg and f"row {corrupted[0]} " in msg and "samples" in msg and "label" in msg


def test_edited_media_count_in_row_meta(ds: Path) -> None:
    def edit(rows):
        for r in rows:
            meta = json.loads(r.parts["meta.json"])
            if meta["media"]:
                meta["media"][0]["num_tokens"] -= 1
                r.parts["meta.json"] = json.dumps(meta).encode()
                return rows
        raise AssertionError("no media in shard")

    rewrite_shard(ds, SHARD, edit)
    fails = failing(ds)
    assert set(fails) == {"media"}
    assert any("placeholder" in m and SHARD in m and "sample demo-" in m for m in fails["media"])
    assert any("grid_thw" in m for m in fails["media"])


def test_swapped_media_payload_no_longer_matches_its_block(ds: Path) -> None:
    """The stored image is replaced by one of another size (meta, counts and checksums kept consistent):
    only decoding the payload and counting its features can tell."""
    from PIL import Image

    def swap(rows):
        for r in rows:
            meta = json.loads(r.parts["meta.json"])
            for m in meta["media"]:
                if m["kind"] == "image":
                    buf = io.BytesIO()
                    h, w = m["info"]["target_hw"]
                    if m["part"].endswith(".npy"):  # the default raw storage
                        np.save(buf, np.zeros((h, w + 56, 3), np.uint8))
                    else:
                        Image.new("RGB", (w + 56, h)).save(buf, format="PNG")
                    m["info"]["target_hw"] = [h, w + 56]  # header check agrees; features do not
                    r.parts[m["part"]] = buf.getvalue()
                    r.parts["meta.json"] = json.dumps(meta).encode()
                    return rows
        raise AssertionError("no image in shard")

    rewrite_shard(ds, SHARD, swap)
    fails = failing(ds)
    assert set(fails) == {"media"}
    assert any("stored payload gives" in m and SHARD in m for m in fails["media"])


def test_edited_count_in_info_json(ds: Path) -> None:
    real = json.loads((ds / ".nv-meta" / ".info.json").read_text())["shard_counts"][SHARD]
    edit_json(ds / ".nv-meta" / ".info.json", lambda d: d["shard_counts"].__setitem__(SHARD, real + 1))
    fails = failing(ds)
    assert set(fails) == {"shard-counts"}
    assert f".info.json says {real + 1}" in fails["shard-counts"][0] and SHARD in fails["shard-counts"][0]


def test_edited_real_token_count_in_row_meta(ds: Path) -> None:
    def edit(rows):
        meta = json.loads(rows[0].parts["meta.json"])
        meta["num_real_tokens"] += 7
        rows[0].parts["meta.json"] = json.dumps(meta).encode()
        return rows

    rewrite_shard(ds, SHARD, edit)
    assert set(failing(ds)) == {"row-meta"}


def test_duplicated_sample(ds: Path) -> None:
    def dup(rows):
        rows.append(type(rows[0])("999999999", 0, dict(rows[0].parts)))
        return rows

    rewrite_shard(ds, SHARD, dup)
    fails = failing(ds)
    assert set(fails) == {"accounting"}
    assert any("packed twice" in m and "key 999999999" in m for m in fails["accounting"])


def test_removed_shard(ds: Path) -> None:
    (ds / SHARD).unlink()
    Path(str(ds / SHARD) + ".idx").unlink()
    fails = failing(ds)
    assert "shard-files" in fails and any(SHARD in m and "missing" in m for m in fails["shard-files"])
    assert "accounting" in fails  # its samples are gone


def test_unrecorded_stray_shard(ds: Path) -> None:
    (ds / "shards" / "extra.tar").write_bytes((ds / SHARD).read_bytes())
    assert set(failing(ds)) == {"shard-files"}


def test_wrong_tar_index(ds: Path) -> None:
    idx_path = Path(str(ds / SHARD) + ".idx")
    idx = np.fromfile(idx_path, dtype="<u8")
    idx[1] += 512
    idx.tofile(idx_path)
    fails = failing(ds)
    assert set(fails) == {"tar-index"} and "entry 1" in fails["tar-index"][0]


@pytest.mark.parametrize(("align", "check"), [(8, "row-contract"), (2, "metadata")])
def test_wrong_alignment(ds: Path, align: int, check: str) -> None:
    # 8: the rows' padded lengths are not multiples; 2: below what cp=2 needs.
    edit_json(ds / ".nv-meta" / "omnipack.json", lambda d: d.__setitem__("align", align))
    fails = failing(ds)
    assert check in fails
    if check == "row-contract":
        assert any(f"align={align}" in m for m in fails[check])


def test_cli_exit_status_and_report(ds: Path, capsys: pytest.CaptureFixture) -> None:
    edit_json(
        ds / ".nv-meta" / ".info.json",
        lambda d: d["shard_counts"].__setitem__(SHARD, d["shard_counts"][SHARD] + 1),
    )
    assert main(["verify", str(ds), "-j", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL shard-counts" in out and "PASS checksums" in out and "FAILED" in out
