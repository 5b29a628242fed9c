"""``omnipack verify --source``: self-consistent damage (every checksum, fingerprint, index and count kept
consistent, as a thorough forger would) of each kind of field is caught by re-deriving the samples from the
run's inputs, naming shard, row, sample and the first differing field; the intact dataset passes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from omnipack.cli import main
from omnipack.dataset.codec import decode_row, load_npy, npy_bytes
from omnipack.tools.verify import SourceOptions, run_verify
from tests.test_verify import _all_rows, _meta, _relayout, _set_arrays
from tests.tools_dataset import (
    build_av_dataset,
    build_small_dataset,
    copy_dataset,
    edit_json,
    resign,
    rewrite_shard,
)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_dataset(tmp_path_factory.mktemp("vsrc"), mrope=True, extras=True)


@pytest.fixture(scope="module")
def av(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_av_dataset(tmp_path_factory.mktemp("vsrc_av"))


def source_result(root: Path, **options):
    results = run_verify(root, source=SourceOptions(**options))
    assert results[-1].name == "source"
    return results[-1]


def _damage_row(ds: Path, edit) -> dict:
    """``edit(raw, row, meta, where)`` applied to the first row it accepts (it returns True), re-signed."""
    where: dict = {}
    for shard, rows in _all_rows(ds).items():
        for i, r in enumerate(rows):
            row, meta = decode_row(r.parts)
            if edit(r, row, meta, where):
                resign(r)
                rewrite_shard(ds, shard, lambda rs, i=i, r=r: [r if k == i else x for k, x in enumerate(rs)])
                where.update(shard=shard, row=i)
                return where
    raise AssertionError("no row to damage")


def assert_caught(ds: Path, where: dict, field: str, **options) -> None:
    res = source_result(ds, **options)
    assert res.status == "fail", res.notes
    hits = [m for m in res.failures if f"sample {where['sid']} " in m and f"{field}" in m]
    assert hits, res.failures
    assert where["shard"] in hits[0] and "source manifest.jsonl:" in hits[0]


def test_intact_datasets_pass(small: Path, av: Path, capsys: pytest.CaptureFixture) -> None:
    for root in (small, av):
        res = source_result(root)
        assert res.status == "pass", res.failures
        assert "0 differ" in res.notes[-1]
    assert main(["verify", str(small), "--source", "--source-fraction", "0.5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["checks"][-1]["name"] == "source" and report["checks"][-1]["status"] == "pass"


def _text_position(row, k: int) -> int:
    """An unsupervised text position of sample ``k`` (not in a media block) whose predecessor is too."""
    a, n = int(row.cu_seqlens_padded[k]), int(row.seqlens[k])
    blocks = [(m.block_start, m.block_end) for m in row.media if m.sample_index == k]
    return next(
        i for i in range(a + 3, a + n - 2)
        if row.labels[i - 1] == -100 and row.labels[i] == -100 and not any(s <= i < e for s, e in blocks)
    )  # fmt: skip


def _damage_text_token(r, row, meta, where) -> bool:
    """A ``_damage_row`` edit: another token of the first sample's own text (only ``--source`` sees it)."""
    tokens, i = row.tokens.copy(), _text_position(row, 0)
    tokens[i] = next(t for t in row.tokens[i + 1 :] if t != tokens[i] and t > 100)
    _set_arrays(r, tokens=tokens)
    where["sid"] = row.sample_ids[0]
    return True


@pytest.mark.parametrize("field", ["tokens", "labels", "loss_mask", "position_ids", "mrope_position_ids"])
def test_token_fields(small: Path, tmp_path: Path, field: str) -> None:
    ds = copy_dataset(small, tmp_path / "ds")

    def edit(r, row, meta, where) -> bool:
        if field == "tokens":
            return _damage_text_token(r, row, meta, where)
        i = _text_position(row, 0)
        where["sid"] = row.sample_ids[0]
        if field == "labels":  # a prompt token supervised (the label rule: its next token)
            labels, loss = row.labels.copy(), row.loss_mask.copy()
            labels[i], loss[i] = row.tokens[i + 1], 1
            _set_arrays(r, labels=labels, loss_mask=loss)
        elif field == "loss_mask":
            loss = row.loss_mask.copy()
            loss[i] = 1
            _set_arrays(r, loss_mask=loss)
        elif field == "position_ids":
            pos = row.position_ids.copy()
            pos[i], pos[i + 1] = pos[i + 1], pos[i]
            _set_arrays(r, position_ids=pos)
        else:
            mrope = row.mrope_position_ids.copy()
            mrope[:, : int(row.cu_seqlens_padded[1])] += 1
            _set_arrays(r, mrope_position_ids=mrope)
        return True

    where = _damage_row(ds, edit)
    assert_caught(ds, where, f"{field} differs")


def test_boundaries_shifted(small: Path, tmp_path: Path) -> None:
    """The last sample moved right by one alignment unit, with everything that follows it consistent."""
    ds = copy_dataset(small, tmp_path / "ds")
    align, pad = _meta(ds)["align"], _meta(ds)["tokenizer"]["pad_token_id"]

    def edit(r, row, meta, where) -> bool:
        if len(row.sample_ids) < 2 or row.seqlens_padded[-1] - row.seqlens[-1] < align:
            return False
        _relayout(r, align, pad, shift_last=align)
        where["sid"] = row.sample_ids[-1]
        return True

    assert_caught(ds, _damage_row(ds, edit), "cu_seqlens_padded differs")


def test_contents_swapped_between_samples(small: Path, tmp_path: Path) -> None:
    ds = copy_dataset(small, tmp_path / "ds")
    align, pad = _meta(ds)["align"], _meta(ds)["tokenizer"]["pad_token_id"]

    def edit(r, row, meta, where) -> bool:
        text = [k for k in range(len(row.sample_ids)) if all(m.sample_index != k for m in row.media)]
        if len(text) < 2 or row.seqlens[text[0]] == row.seqlens[text[1]]:
            return False
        order = list(range(len(row.sample_ids)))
        order[text[0]], order[text[1]] = text[1], text[0]
        _relayout(r, align, pad, order=order)
        where["sid"] = row.sample_ids[text[0]]
        return True

    assert_caught(ds, _damage_row(ds, edit), "cu_seqlens differs")


def _media_edit(kind: str, change):
    """An edit that applies ``change(raw, item, meta_item)`` to the first media item of ``kind``."""

    def edit(r, row, meta, where) -> bool:
        for k, m in enumerate(row.media):
            if m.kind == kind and change(r, m, meta["media"][k]) is not False:
                r.parts["meta.json"] = json.dumps(meta).encode()
                where["sid"] = row.sample_ids[m.sample_index]
                return True
        return False

    return edit


def _npz_edit(r, m, fn) -> None:
    with np.load(io.BytesIO(r.parts[m.part])) as z:
        arrays = {k: z[k].copy() for k in z.files}
    fn(arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    r.parts[m.part] = buf.getvalue()


def test_pixels_changed_same_shape(small: Path, tmp_path: Path) -> None:
    ds = copy_dataset(small, tmp_path / "ds")

    def change(r, m, _):
        pixels = load_npy(r.parts[m.part]).copy()
        pixels[0, 0, 0] ^= 1
        r.parts[m.part] = npy_bytes(pixels)

    assert_caught(ds, _damage_row(ds, _media_edit("image", change)), "media[0] (image).payload differs")


def test_frames_audio_and_timing(av: Path, tmp_path: Path) -> None:
    """Video frames, the video's audio track, an audio clip and a timing field of a video's plan, each
    damaged in its own copy of the dataset."""

    def frames(r, m, _):
        _npz_edit(r, m, lambda a: a["frames"].__setitem__((0, 0, 0, 0), a["frames"][0, 0, 0, 0] ^ 1))

    def video_audio(r, m, _):
        if "audio" not in np.load(io.BytesIO(r.parts[m.part])).files:
            return False
        _npz_edit(r, m, lambda a: a["audio"].__setitem__(5, a["audio"][5] + 1))

    def audio(r, m, _):
        wave = load_npy(r.parts[m.part]).copy()
        wave[7] += 1
        r.parts[m.part] = npy_bytes(wave)

    def timing(r, m, item):
        item["info"]["info"]["second_per_grid"] *= 2

    cases = [
        ("video", frames, "payload['frames'] differs"),
        ("video", video_audio, "payload['audio'] differs"),
        ("audio", audio, "payload differs"),
        ("video", timing, "info.info.second_per_grid differs"),
    ]
    for n, (kind, change, field) in enumerate(cases):
        ds = copy_dataset(av, tmp_path / f"ds{n}")
        assert_caught(ds, _damage_row(ds, _media_edit(kind, change)), field)


def test_a_fraction_catches_damage_to_a_tenth_of_the_samples(small: Path, tmp_path: Path) -> None:
    """Every sample of one shard (over 10% of the samples) gets a supervised prompt token: a 10% seeded
    subset (at least one sample per shard) finds it, whatever the seed."""
    ds = copy_dataset(small, tmp_path / "ds")
    shard = sorted(_all_rows(ds))[0]

    def supervise(rows):
        for r in rows:
            row, _ = decode_row(r.parts)
            labels, loss = row.labels.copy(), row.loss_mask.copy()
            for k in range(len(row.sample_ids)):
                i = _text_position(row, k)
                labels[i], loss[i] = row.tokens[i + 1], 1
            _set_arrays(r, labels=labels, loss_mask=loss)
            resign(r)
        return rows

    rewrite_shard(ds, shard, supervise)
    packed = _meta(ds)["counts"]["packed"]
    damaged = sum(len(decode_row(r.parts)[0].sample_ids) for r in _all_rows(ds)[shard])
    assert damaged >= 0.1 * packed
    for seed in (0, 1, 2):
        res = source_result(ds, fraction=0.1, seed=seed)
        assert res.status == "fail" and all("labels differs" in m and shard in m for m in res.failures)
        assert res.notes[-1].split(" of ")[0] != str(packed)  # a subset, not all of them


def test_changed_input_is_refused_unless_allowed(small: Path, tmp_path: Path) -> None:
    ds = copy_dataset(small, tmp_path / "ds")
    manifest = Path(_meta(ds)["source"]["files"][0]["path"])
    moved = tmp_path / "manifest.jsonl"
    lines = manifest.read_text().splitlines()
    first = json.loads(lines[0])
    first["messages"][-1]["content"] = "A different answer altogether."
    moved.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")

    def point_to_copy(d):
        d["source"]["settings"]["manifest"] = [str(moved)]
        d["source"]["files"][0]["path"] = str(moved)

    edit_json(ds / ".nv-meta" / "omnipack.json", point_to_copy)
    res = source_result(ds)
    assert res.status == "fail" and f"input {moved}: xxh3-128" in res.failures[0]
    assert "--allow-changed-source" in res.failures[-1]
    res = source_result(ds, allow_changed=True)
    assert any("changed since prepare" in n for n in res.notes)
    assert res.failures and all(f"sample {first['id']} " in m for m in res.failures)
    assert "1 differ" in res.notes[-1]


def test_changed_tokenizer_is_refused(small: Path, tmp_path: Path) -> None:
    ds = copy_dataset(small, tmp_path / "ds")
    edit_json(ds / ".nv-meta" / "omnipack.json", lambda d: d["tokenizer"].update(fingerprint="0" * 16))
    res = source_result(ds)
    assert res.status == "fail" and "tokenizer fingerprint" in res.failures[0]
    assert main(["verify", str(ds), "--source"]) == 1


def test_a_dataset_without_source_settings_says_so(small: Path, tmp_path: Path) -> None:
    ds = copy_dataset(small, tmp_path / "ds")
    edit_json(ds / ".nv-meta" / "omnipack.json", lambda d: d.pop("source"))
    res = source_result(ds)
    assert res.status == "fail" and "records no source settings" in res.failures[0]


def test_worker_processes_report_what_one_process_reports(
    small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Input parts of 8 records on two spawned workers of the local executor: the same findings."""
    import omnipack.tools.verify_source as vs

    ds = copy_dataset(small, tmp_path / "ds")

    def edit(r, row, meta, where) -> bool:
        labels, loss = row.labels.copy(), row.loss_mask.copy()
        i = _text_position(row, 0)
        labels[i], loss[i] = row.tokens[i + 1], 1
        _set_arrays(r, labels=labels, loss_mask=loss)
        where["sid"] = row.sample_ids[0]
        return True

    where = _damage_row(ds, edit)
    monkeypatch.setattr(vs, "PART_LINES", 8)
    one = vs.run_source_check(ds, workers=1)
    two = vs.run_source_check(ds, workers=2)
    assert sorted(one[0]) == sorted(two[0]) and len(one[0]) == 1 and f"sample {where['sid']} " in one[0][0]
    assert one[1] == two[1]


def test_staged_ranks_split_the_check_by_input_part(
    small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``--rank R --world-size 2`` (prepare's staged flags): each rank re-derives the picked samples of its input
    parts (number % 2 == R), so the ranks' counts add up to the unranked check's; a self-consistent damage is
    reported by exactly the rank that owns its part, which exits non-zero while the other passes."""
    import re

    import omnipack.tools.verify_source as vs

    ds = copy_dataset(small, tmp_path / "ds")

    where = _damage_row(ds, _damage_text_token)
    monkeypatch.setattr(vs, "PART_LINES", 8)  # several input parts for the ranks to share
    whole_failures, whole_notes = vs.run_source_check(ds)
    checked = int(re.search(r"(\d+) of \d+ input samples re-derived", whole_notes[-1]).group(1))
    assert len(whole_failures) == 1 and f"sample {where['sid']} " in whole_failures[0]
    line = int(re.search(r"source manifest\.jsonl:(\d+)", whole_failures[0]).group(1))
    parts = vs.split_input(_meta(ds)["source"]["settings"]["manifest"], 8)
    owner = next(p.number for p in parts if p.first_line <= line < p.first_line + p.num_lines) % 2

    ranks = {}
    for rank in (0, 1):
        rc = main(["verify", str(ds), "--source", "--rank", str(rank), "--world-size", "2", "--json", "-j", "1"])
        ranks[rank] = (rc, json.loads(capsys.readouterr().out)["checks"][-1])
    counts = [int(re.search(r"(\d+) of \d+ input samples", c["notes"][-1]).group(1)) for _, c in ranks.values()]
    assert sum(counts) == checked and all(counts), counts
    picked = [re.search(r"rank (\d) of 2: (\d+) of (\d+) picked samples", c["notes"][-2]) for _, c in ranks.values()]
    assert [int(m.group(1)) for m in picked] == [0, 1] and [int(m.group(2)) for m in picked] == counts
    assert {int(m.group(3)) for m in picked} == {checked}
    assert ranks[owner][0] == 1 and ranks[owner][1]["failures"] == whole_failures
    assert ranks[1 - owner][1]["status"] == "pass" and ranks[1 - owner][0] == 0


@pytest.mark.parametrize(("rank", "size"), [(2, 2), (-1, 2), (0, 0)])
def test_an_invalid_rank_is_a_clear_error(small: Path, capsys: pytest.CaptureFixture, rank: int, size: int) -> None:
    assert main(["verify", str(small), "--source", "--rank", str(rank), "--world-size", str(size)]) == 2
    assert f"rank must be in [0, world_size), got rank {rank} of {size}" in capsys.readouterr().err
    assert main(["verify", str(small), "--rank", "1", "--world-size", "2"]) == 2
    assert "give --source" in capsys.readouterr().err
