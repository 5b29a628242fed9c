"""``omnipack verify`` passes an intact dataset and catches each kind of damage, naming where it is."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from omnipack.cli import main
from omnipack.dataset.codec import decode_row, load_npy, npy_bytes
from omnipack.dataset.shards import file_sha256
from omnipack.tools.verify import CHECK_NAMES, run_verify
from tests.tools_dataset import (
    DUPLICATE_ID,
    TWIN_IDS,
    build_av_dataset,
    build_small_dataset,
    copy_dataset,
    edit_json,
    resign,
    rewrite_shard,
)

SHARD = "shards/shard-000001.tar"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Images with mRoPE ids, two same-size images in different samples, and one id on two lines."""
    return build_small_dataset(tmp_path_factory.mktemp("verify"), mrope=True, extras=True)


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
    assert set(fails) == {"checksums", "content"}
    assert any("bytes differ from what was written" in m and SHARD in m for m in fails["content"])
    # without payload checks, only the checksum can see it
    quiet = {
        r.name: r.failures for r in run_verify(ds, workers=1, progress=False, payloads=False) if r.failures
    }
    assert set(quiet) == {"checksums"}
    assert SHARD in fails["checksums"][0] and "xxh3_128" in fails["checksums"][0]
    # --sha256 needs a recorded sha256 (prepare --shard-sha256) and says so
    slow = {r.name: r.failures for r in run_verify(ds, payloads=False, sha256=True) if r.failures}
    assert set(slow) == {"checksums"} and "no sha256 recorded" in slow["checksums"][0]
    # with one recorded it recomputes the cryptographic digest, and sees the damage too
    meta_path = ds / ".nv-meta" / "omnipack.json"
    meta = json.loads(meta_path.read_text())
    before = {s["path"]: file_sha256(ds / s["path"]) for s in meta["shards"]}
    for s in meta["shards"]:
        s["sha256"] = "0" * 64 if s["path"] == SHARD else before[s["path"]]
    meta_path.write_text(json.dumps(meta))
    slow = {r.name: r.failures for r in run_verify(ds, payloads=False, sha256=True) if r.failures}
    assert set(slow) == {"checksums"} and f"{SHARD}: sha256" in slow["checksums"][0]
    # a shard recorded without an xxh3-128 (written before it existed) is checked by its sha256
    for s in meta["shards"]:
        s.pop("xxh3_128")
    meta_path.write_text(json.dumps(meta))
    old = {r.name: r.failures for r in run_verify(ds, payloads=False) if r.failures}
    assert set(old) == {"checksums"} and "sha256" in old["checksums"][0]
    # without the checksum, the payload's fingerprint still sees it
    fast = {r.name: r for r in run_verify(ds, checksums=False)}
    assert fast["checksums"].status == "skip" and fast["content"].status == "fail"
    assert {n for n, r in fast.items() if r.status == "fail"} == {"content"}


def test_no_checksums_passes_an_intact_dataset_unless_strict(
    small: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["verify", str(small), "-j", "1", "--no-checksums"]) == 0
    assert "SKIP checksums" in capsys.readouterr().out
    assert main(["verify", str(small), "-j", "1", "--no-checksums", "--strict"]) == 1


def test_corrupted_tokens_break_the_row_contract(ds: Path) -> None:
    corrupted = []

    def corrupt(rows):
        corrupted.append(len(rows) - 1)
        toks = load_npy(rows[-1].parts["tokens.npy"]).copy()
        toks[5] += 1  # a supervised neighbour's label no longer matches, or a role marker breaks
        toks[np.flatnonzero(load_npy(rows[-1].parts["labels.npy"]) != -100)[0] + 1] += 1
        rows[-1].parts["tokens.npy"] = npy_bytes(toks)
        return rows

    rewrite_shard(ds, SHARD, lambda rows: [resign(r) for r in corrupt(rows)])
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
    assert set(fails) == {"media", "content"}
    assert any("stored payload gives" in m and SHARD in m for m in fails["media"])
    assert any("bytes differ" in m for m in fails["content"])


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
    assert set(fails) == {"accounting", "splits"}  # the recorded rows by split no longer match either
    n = _meta(ds)["counts"]["rows_by_split"]["train"]
    said = f"split 'train': {n + 1} rows in its shards of split.yaml, omnipack.json's rows_by_split says {n}"
    assert fails["splits"] == [said]
    # the counts, and the row once (by the ledger, naming its samples; not again by id)
    counts, rows, (msg,) = fails["accounting"][:1], fails["accounting"][1:2], fails["accounting"][2:]
    assert "samples in the shards" in counts[0] and "rows in the shards" in rows[0]
    assert "key 999999999 is not a row of the accounting ledger" in msg and "samples demo-" in msg


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


# ---- deep checks: each damage keeps checksums, .tar.idx and counts consistent (rewrite_shard), and the
# ---- damaged row's content fingerprints recomputed (resign) unless the fingerprint is the check.


def _set_arrays(raw, **arrays) -> None:
    for name, arr in arrays.items():
        raw.parts[f"{name}.npy"] = npy_bytes(arr)


def _meta(ds: Path) -> dict:
    return json.loads((ds / ".nv-meta" / "omnipack.json").read_text())


def _all_rows(ds: Path) -> dict[str, list]:
    from omnipack.dataset.reader import ShardReader

    return {s["path"]: list(ShardReader(ds / s["path"])) for s in _meta(ds)["shards"]}


def _first_row_with_media(rows, kind: str = "image"):
    for r in rows:
        row, meta = decode_row(r.parts)
        for m in row.media:
            if m.kind == kind:
                return r, row, meta, m
    raise AssertionError(f"no {kind} in these rows")


@pytest.mark.parametrize("damage", ["labels", "loss", "target"])
def test_placeholders_are_never_supervised(ds: Path, damage: str) -> None:
    def edit(rows):
        r, row, _, m = _first_row_with_media(rows)
        t = m.token_start
        labels, loss = row.labels.copy(), row.loss_mask.copy()
        if damage == "labels":  # a label on a placeholder (its next token, so the label rule holds)
            labels[t], loss[t] = row.tokens[t + 1], 1
        elif damage == "loss":  # loss on a placeholder without a label
            loss[t] = 1
        else:  # the token before the block predicts a placeholder
            labels[t - 1], loss[t - 1] = row.tokens[t], 1
        _set_arrays(r, labels=labels, loss_mask=loss)
        resign(r)
        return rows

    rewrite_shard(ds, SHARD, edit)
    fails = failing(ds)
    assert set(fails) == {"row-contract", "roles"}  # a placeholder is in a user turn
    want = {
        "labels": "supervised on a placeholder token",
        "loss": "supervised on a placeholder token",
        "target": "a label whose target is a placeholder token",
    }
    hits = [m for m in fails["row-contract"] if want[damage] in m]
    assert hits and SHARD in hits[0] and "(samples ['demo-" in hits[0]


@pytest.mark.parametrize("damage", ["token", "label"])
def test_sample_altered_in_place(ds: Path, damage: str) -> None:
    """A user-text token changed, or a user-text token supervised: the row contract still holds."""
    where = {}

    def edit(rows):
        r = rows[0]
        row, _ = decode_row(r.parts)
        special = set(row.tokens[row.media[0].block_start : row.media[0].block_end]) if row.media else set()
        a = int(row.cu_seqlens_padded[0])
        n = int(row.cu_seqlens[1])
        # an unsupervised position whose predecessor is unsupervised too, in the sample's text
        i = next(
            i
            for i in range(a + 3, a + n - 2)
            if row.labels[i - 1] == -100 and row.labels[i] == -100 and row.tokens[i] not in special
        )
        if damage == "token":
            tokens = row.tokens.copy()
            tokens[i] = next(t for t in row.tokens[a : a + n] if t != tokens[i] and t not in special)
            _set_arrays(r, tokens=tokens)
        else:
            labels, loss = row.labels.copy(), row.loss_mask.copy()
            labels[i], loss[i] = row.tokens[i + 1], 1
            _set_arrays(r, labels=labels, loss_mask=loss)
        where["sid"] = row.sample_ids[0]
        return rows

    rewrite_shard(ds, SHARD, edit)
    fails = failing(ds)
    assert set(fails) == ({"content"} if damage == "token" else {"content", "roles"})
    assert f"sample {where['sid']}:" in fails["content"][0] and SHARD in fails["content"][0]


def _relayout(r, align: int, pad_id: int, order: list[int] | None = None, shift_last: int = 0) -> None:
    """Rebuild a row with sample slot i holding the content of old sample ``order[i]`` (sample ids stay
    in place) and the last sample moved right by ``shift_last``: arrays, positions, boundaries and media
    blocks all self-consistent, as the writer lays rows out."""
    row, meta = decode_row(r.parts)
    w, old_cup, old_len = row.seq_length, row.cu_seqlens_padded, row.seqlens
    order = list(range(len(row.sample_ids))) if order is None else order
    lens = np.array([old_len[j] for j in order])
    plens = -(-lens // align) * align
    plens[-1] += w - plens.sum()
    plens[-2] += shift_last
    plens[-1] -= shift_last
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    cup = np.concatenate([[0], np.cumsum(plens)]).astype(np.int32)
    tokens = np.full(w, pad_id, dtype=np.int32)
    labels = np.full(w, -100, dtype=np.int32)
    pad = np.ones(w, dtype=bool)
    pos = np.empty(w, dtype=np.int32)
    mrope = None if row.mrope_position_ids is None else np.empty((3, w), dtype=np.int32)
    moved = {}
    for i, j in enumerate(order):
        a, b, n, p = int(old_cup[j]), int(cup[i]), int(lens[i]), int(plens[i])
        tokens[b : b + n], labels[b : b + n], pad[b : b + n] = (
            row.tokens[a : a + n],
            row.labels[a : a + n],
            False,
        )
        pos[b : b + p] = np.arange(p)
        if mrope is not None:
            mrope[:, b : b + n] = row.mrope_position_ids[:, a : a + n]
            nxt = int(mrope[:, b : b + n].max()) + 1
            mrope[:, b + n : b + p] = np.arange(nxt, nxt + p - n)
        moved[j] = (i, b - a)
    for m in meta["media"]:
        i, d = moved[m["sample_index"]]
        m.update(
            sample_index=i, token_start=m["token_start"] + d, block=[m["block"][0] + d, m["block"][1] + d]
        )
    meta.update(max_seqlen=int(lens.max()), max_seqlen_padded=int(plens.max()))
    r.parts["meta.json"] = json.dumps(meta).encode()
    _set_arrays(
        r,
        tokens=tokens,
        labels=labels,
        loss_mask=(labels != -100).astype(np.int32),
        position_ids=pos,
        padding_mask=pad,
        cu_seqlens=cu,
        cu_seqlens_padded=cup,
        **({} if mrope is None else {"mrope_position_ids": mrope}),
    )


def _row_with_text_samples(ds: Path, count: int):
    """(shard, row index, decoded row, indices of ``count`` samples without media) of the first such row."""
    for shard, rows in _all_rows(ds).items():
        for i, r in enumerate(rows):
            row, _ = decode_row(r.parts)
            text = [k for k in range(len(row.sample_ids)) if all(m.sample_index != k for m in row.media)]
            if len(text) >= count:
                return shard, i, row, text[:count]
    raise AssertionError(f"no row with {count} text-only samples")


def test_content_swapped_between_samples_while_ids_stay(ds: Path) -> None:
    """Two samples of a row exchange tokens, labels and loss (boundaries follow the new lengths) while
    sample_ids stay: a valid row, every count consistent; only the fingerprints tie content to ids."""
    meta = _meta(ds)
    shard, i, row, (x, y) = _row_with_text_samples(ds, 2)
    order = list(range(len(row.sample_ids)))
    order[x], order[y] = y, x

    def swap(rs):
        _relayout(rs[i], meta["align"], meta["tokenizer"]["pad_token_id"], order=order)
        return rs

    rewrite_shard(ds, shard, swap)
    fails = failing(ds)
    assert set(fails) == {"content", "roles"}  # each sample's labels now lie on the other's turns
    for sid in (row.sample_ids[x], row.sample_ids[y]):
        assert any(f"sample {sid}:" in m and shard in m and f"row {i} " in m for m in fails["content"])


def test_padded_boundaries_shifted_consistently(ds: Path) -> None:
    """The last sample moves right by one alignment unit, arrays, positions and media blocks with it: a
    valid row, but not the one written (the fingerprint covers each sample's place in the row)."""
    meta = _meta(ds)
    align = meta["align"]
    shard, i, row = next(
        (shard, i, row)
        for shard, rows in _all_rows(ds).items()
        for i, row in enumerate(decode_row(r.parts)[0] for r in rows)
        if len(row.sample_ids) > 1 and row.seqlens_padded[-1] - row.seqlens[-1] >= align
    )

    def shift(rs):
        _relayout(rs[i], align, meta["tokenizer"]["pad_token_id"], shift_last=align)
        return rs

    rewrite_shard(ds, shard, shift)
    fails = failing(ds)
    assert set(fails) == {"content"}
    assert any(f"sample {row.sample_ids[-1]}:" in m and shard in m for m in fails["content"])


def test_relayout_without_damage_is_the_written_row(ds: Path) -> None:
    """The damage helper itself: the identity layout rebuilds each row byte for byte."""
    meta = _meta(ds)
    for rows in _all_rows(ds).values():
        for r in rows:
            before = dict(r.parts)
            _relayout(r, meta["align"], meta["tokenizer"]["pad_token_id"])
            for name in (
                "tokens",
                "labels",
                "loss_mask",
                "position_ids",
                "padding_mask",
                "cu_seqlens",
                "cu_seqlens_padded",
                "mrope_position_ids",
            ):
                assert r.parts[f"{name}.npy"] == before[f"{name}.npy"], name
            assert json.loads(r.parts["meta.json"]) == json.loads(before["meta.json"])


def test_media_payload_swapped_between_same_size_samples(ds: Path) -> None:
    rows = _all_rows(ds)
    located = {}
    for shard, rs in rows.items():
        for i, r in enumerate(rs):
            row, _ = decode_row(r.parts)
            for m in row.media:
                if row.sample_ids[m.sample_index] in TWIN_IDS:
                    located[row.sample_ids[m.sample_index]] = (shard, i, m.part)
    (sa, ia, pa), (sb, ib, pb) = located[TWIN_IDS[0]], located[TWIN_IDS[1]]
    data_a, data_b = rows[sa][ia].parts[pa], rows[sb][ib].parts[pb]
    assert data_a != data_b
    new = {(sa, ia, pa): data_b, (sb, ib, pb): data_a}
    for shard in {sa, sb}:

        def swap(rs, shard=shard):
            for (s, i, p), data in new.items():
                if s == shard:
                    rs[i].parts[p] = data
            return rs

        rewrite_shard(ds, shard, swap)
    fails = failing(ds)
    assert set(fails) == {"content"}  # same size: every shape, count and feature check still passes
    for sid in TWIN_IDS:
        assert any(f"of sample {sid}: bytes differ" in m for m in fails["content"])


def test_positions_not_restarting(ds: Path) -> None:
    def edit(rows):
        for r in rows:
            row, _ = decode_row(r.parts)
            if len(row.sample_ids) > 1:
                pos = np.arange(row.seq_length, dtype=np.int32)  # one long sequence, never reset
                _set_arrays(r, position_ids=pos)
                return rows
        raise AssertionError("no row with two samples")

    rewrite_shard(ds, SHARD, edit)
    fails = failing(ds)
    assert set(fails) == {"row-contract"} and "restart" in fails["row-contract"][0]


def test_mrope_ids_shifted(ds: Path) -> None:
    def edit(rows):
        r, row, _, m = _first_row_with_media(rows)
        mrope = row.mrope_position_ids.copy()
        a, b = int(row.cu_seqlens_padded[m.sample_index]), int(row.cu_seqlens_padded[m.sample_index + 1])
        mrope[:, a:b] += 1  # the whole sample, gap included: only the shape was checked before
        _set_arrays(r, mrope_position_ids=mrope)
        resign(r)
        return rows

    rewrite_shard(ds, SHARD, edit)
    fails = failing(ds)
    assert set(fails) == {"row-contract"}
    assert any("mrope_position_ids at row position" in m and SHARD in m for m in fails["row-contract"])


def test_dropped_row_with_every_count_fixed(ds: Path) -> None:
    dropped, dropped_key = [], []

    def drop(rows):
        dropped.extend(json.loads(rows[-1].parts["meta.json"])["sample_ids"])
        dropped_key.append(rows[-1].key)
        return rows[:-1]

    rewrite_shard(ds, SHARD, drop)
    k = len(dropped)

    def fix(d):
        c = d["counts"]
        c.update(input=c["input"] - k, packed=c["packed"] - k, rows=c["rows"] - 1)
        c["rows_by_split"]["train"] -= 1

    edit_json(ds / ".nv-meta" / "omnipack.json", fix)
    fails = failing(ds)
    assert set(fails) == {"accounting"}
    msgs = fails["accounting"]
    # the ledger still has every input sample: the dropped ones lie beyond the edited input count
    assert any("lie outside the input count" in m for m in msgs)
    lost = [m for m in msgs if "neither packed nor rejected" in m]
    assert len(lost) == k and all(f"key {dropped_key[0]}" in m for m in lost)
    assert any(f"({dropped[0]})" in m for m in lost)


def test_reject_line_removed_with_counts_fixed(ds: Path) -> None:
    lines = (ds / "rejects.jsonl").read_text().splitlines()
    gone = json.loads(lines[0])
    (ds / "rejects.jsonl").write_text("".join(x + "\n" for x in lines[1:]))

    def fix(d):
        c = d["counts"]
        c.update(rejected=c["rejected"] - 1, packed=c["packed"] + 1)  # as if it had been packed
        c["rejected_by_stage"][gone["stage"]] -= 1
        if not c["rejected_by_stage"][gone["stage"]]:
            del c["rejected_by_stage"][gone["stage"]]

    edit_json(ds / ".nv-meta" / "omnipack.json", fix)
    fails = failing(ds)
    assert "accounting" in fails
    assert any(f"sample index {gone['sample_index']} " in m and "neither" in m for m in fails["accounting"])


def test_duplicate_ids_in_the_manifest_are_not_a_failure(small: Path) -> None:
    """One id on two input lines: one packed, one rejected as a duplicate (an id-based check calls that
    'both packed and rejected'). Samples are told apart by input index."""
    packed = [
        sid for rows in _all_rows(small).values() for r in rows for sid in decode_row(r.parts)[0].sample_ids
    ]
    rejected = [json.loads(x)["sample_id"] for x in (small / "rejects.jsonl").read_text().splitlines()]
    assert packed.count(DUPLICATE_ID) == 1 and rejected.count(DUPLICATE_ID) == 1
    assert failing(small) == {}


def test_row_without_fingerprints(ds: Path) -> None:
    def strip(rows):
        meta = json.loads(rows[0].parts["meta.json"])
        del meta["digests"]
        rows[0].parts["meta.json"] = json.dumps(meta).encode()
        return rows

    rewrite_shard(ds, SHARD, strip)
    fails = failing(ds)
    assert set(fails) == {"content"} and "lacks the content fingerprints" in fails["content"][0]
    assert SHARD in fails["content"][0] and "samples demo-" in fails["content"][0]


# ---- audio and video payloads: exact stored lengths against the plan


@pytest.fixture(scope="module")
def av(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_av_dataset(tmp_path_factory.mktemp("verify_av"))


def test_av_dataset_passes(av: Path) -> None:
    results = run_verify(av)
    assert all(r.status == "pass" for r in results), [(r.name, r.failures, r.skipped) for r in results]
    kinds = {m.kind for rows in _all_rows(av).values() for r in rows for m in decode_row(r.parts)[0].media}
    assert kinds == {"image", "video", "audio"}


def _npz(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


@pytest.mark.parametrize("damage", ["video frame", "video audio", "audio"])
def test_payload_short_by_a_frame_or_160_samples(av: Path, tmp_path: Path, damage: str) -> None:
    ds = copy_dataset(av, tmp_path / "ds")
    kind = "audio" if damage == "audio" else "video"
    shard = next(
        s
        for s, rows in _all_rows(ds).items()
        if any(
            m.kind == kind and (damage != "video audio" or m.info.get("audio_num_tokens"))
            for r in rows
            for m in decode_row(r.parts)[0].media
        )
    )
    seen = {}

    def edit(rows):
        for r in rows:
            row, _ = decode_row(r.parts)
            for m in row.media:
                if m.kind != kind:
                    continue
                if damage == "audio":
                    wave = load_npy(r.parts[m.part])
                    r.parts[m.part] = npy_bytes(wave[:-160])
                else:
                    with np.load(io.BytesIO(r.parts[m.part])) as z:
                        arrays = {k: z[k] for k in z.files}
                    if damage == "video frame":
                        arrays["frames"] = arrays["frames"][:-1]
                    elif "audio" in arrays:
                        arrays["audio"] = arrays["audio"][:-160]
                    else:
                        continue
                    r.parts[m.part] = _npz(arrays)
                seen["sid"] = row.sample_ids[m.sample_index]
                resign(r)
                return rows
        raise AssertionError("nothing damaged")

    rewrite_shard(ds, shard, edit)
    fails = failing(ds)
    assert "media" in fails and set(fails) <= {"media"}
    what = "frames stored" if damage == "video frame" else "audio stored"
    assert any(what in m and f"sample {seen['sid']})" in m and shard in m for m in fails["media"])


# ---- the streaming shard reader and the header readers


def test_truncated_shard_is_a_finding_not_a_crash(ds: Path) -> None:
    from omnipack.dataset.reader import ShardReader
    from omnipack.dataset.shards import file_sha256

    path = ds / SHARD
    reader = ShardReader(path, checksum="sha256")
    count = next(s["count"] for s in _meta(ds)["shards"] if s["path"] == SHARD)
    assert len(list(reader)) == count and reader.error is None and reader.digest == file_sha256(path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    fails = failing(ds)
    assert "checksums" in fails and any("unreadable tar" in m and SHARD in m for m in fails["row-parts"])


def _encoded(fmt: str, pixels: np.ndarray, **kw) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("part", "make", "shape"),
    [
        ("x.png", lambda a: _encoded("PNG", a), (37, 53, 3)),
        ("x.png", lambda a: _encoded("PNG", a[..., 0]), (37, 53, 1)),
        ("x.png", lambda a: _encoded("PNG", np.dstack([a, a[..., :1]])), (37, 53, 4)),
        ("x.jpg", lambda a: _encoded("JPEG", a, quality=90), (37, 53, 3)),
        ("x.jpeg", lambda a: _encoded("JPEG", a, progressive=True), (37, 53, 3)),
        ("x.jpg", lambda a: _encoded("JPEG", a[..., 0]), (37, 53, 1)),
        ("x.npy", lambda a: npy_bytes(a), (37, 53, 3)),
    ],
)
def test_header_shapes_match_the_decoded_arrays(part: str, make, shape: tuple) -> None:
    from PIL import Image

    from omnipack.dataset.payload_header import payload_header

    pixels = np.random.default_rng(0).integers(0, 255, (37, 53, 3), dtype=np.uint8)
    data = make(pixels)
    ((got_shape, dtype),) = payload_header(part, data).values()
    assert got_shape == shape and dtype == np.uint8
    if not part.endswith(".npy"):
        with Image.open(io.BytesIO(data)) as img:
            assert (img.height, img.width, len(img.getbands())) == shape


def test_npz_header_reads_every_member_without_inflating_it() -> None:
    from omnipack.dataset.payload_header import payload_header

    frames = np.zeros((4, 64, 96, 3), dtype=np.uint8)
    audio = np.zeros(16000, dtype=np.int16)
    header = payload_header("media.0.npz", _npz({"frames": frames, "audio": audio}))
    assert header == {"frames": ((4, 64, 96, 3), np.dtype(np.uint8)), "audio": ((16000,), np.dtype(np.int16))}


@pytest.mark.parametrize("fmt", ["png", "jpg", "npy"])
def test_image_payload_checked_against_its_plan_in_any_format(fmt: str) -> None:
    from omnipack.dataset.contract import MediaItem
    from omnipack.profiles import get_profile
    from omnipack.tools.verify import _payload_errors

    profile = get_profile("qwen2_5_vl")
    item = MediaItem("image", f"media.0.{fmt}", 0, 1, 12, 0, 14, [1, 6, 8], {"target_hw": [84, 112]})
    good = np.zeros((84, 112, 3), dtype=np.uint8)
    encode = {"png": lambda a: _encoded("PNG", a), "jpg": lambda a: _encoded("JPEG", a), "npy": npy_bytes}[
        fmt
    ]
    assert _payload_errors(profile, item, item.part, encode(good)) == []
    errs = _payload_errors(profile, item, item.part, encode(np.zeros((84, 140, 3), dtype=np.uint8)))
    assert any("stored (84, 140, 3) uint8, the plan says (84, 112, 3)" in e for e in errs)
    assert any("gives 15 features, block has 12" in e for e in errs)
    with pytest.raises(ValueError):
        _payload_errors(profile, item, item.part, b"garbage")


def test_a_copy_without_the_run_folder_verifies_fully(ds: Path, tmp_path: Path) -> None:
    """verify reads only the dataset: a copy without ``stages/`` passes every check, the accounting ledger
    included (nothing noted as unchecked)."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(ds, copy, ignore=shutil.ignore_patterns("stages"))
    assert not (copy / "stages").exists() and (copy / ".nv-meta" / "accounting.parquet").is_file()
    results = {r.name: r for r in run_verify(copy)}
    assert all(r.status == "pass" for r in results.values()), {n: r.failures for n, r in results.items()}
    assert results["accounting"].notes == []


def _edit_ledger(root: Path, edit) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from omnipack.dataset.accounting import LEDGER_SCHEMA

    path = root / ".nv-meta" / "accounting.parquet"
    entries = pq.read_table(path).to_pylist()
    pq.write_table(pa.Table.from_pylist(edit(entries), schema=LEDGER_SCHEMA), path)


def _swap_rows(entries):
    a, b = (e for e in entries if e["row"] is not None and e["position"] == 0 and e["row"] in (0, 1))
    a["row"], b["row"] = b["row"], a["row"]
    return entries


def _reason_changed(entries):
    next(e for e in entries if e["stage"] is not None)["reason"] = "edited"
    return entries


def _entry_removed(entries):
    return [e for e in entries if e["row"] != 0 or e["position"] != 0]


def _both_placed_and_rejected(entries):
    e = next(e for e in entries if e["row"] is not None)
    e["stage"], e["reason"] = "write", "edited"
    return entries


@pytest.mark.parametrize(
    "damage, message",
    [
        (_swap_rows, "the accounting ledger puts sample indices"),
        (_reason_changed, "rejects.jsonl says"),
        (_entry_removed, "neither packed nor rejected"),
        (_both_placed_and_rejected, "not either placed (row, position) or rejected"),
        ("missing", "accounting.parquet: missing"),
        ("garbage", "accounting.parquet: unreadable"),
    ],
)
def test_a_damaged_ledger_fails_the_accounting_check(ds: Path, tmp_path: Path, damage, message: str) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(ds, copy, ignore=shutil.ignore_patterns("stages"))
    path = copy / ".nv-meta" / "accounting.parquet"
    if damage == "missing":
        path.unlink()
    elif damage == "garbage":
        path.write_bytes(path.read_bytes()[:100])
    else:
        _edit_ledger(copy, damage)
    fails = failing(copy)
    assert set(fails) == {"accounting"}
    assert any(message in m for m in fails["accounting"]), fails["accounting"]


def test_without_a_ledger_counts_still_checked_and_the_gap_is_said(ds: Path) -> None:
    """A dataset made before the ledger was published: counts and ids are checked, the gap is noted (the
    role spans, found by the ledger, are not checked)."""
    (ds / ".nv-meta" / "accounting.parquet").unlink()
    edit_json(ds / ".nv-meta" / "omnipack.json", lambda d: d.pop("accounting_file"))
    results = {r.name: r for r in run_verify(ds)}
    assert all(r.status == "pass" for n, r in results.items() if n != "roles")
    assert results["roles"].status == "skip" and "no usable accounting ledger" in results["roles"].skipped
    assert any("no accounting ledger" in n for n in results["accounting"].notes)
    edit_json(ds / ".nv-meta" / "omnipack.json", lambda d: d["counts"].__setitem__("packed", 1))
    assert "accounting" in failing(ds)


def test_worker_processes_report_what_one_process_reports(ds: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small datasets stay in one process (a worker costs a second to start); large ones use the pool,
    with the same findings."""
    path = ds / SHARD
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    one = {r.name: (r.status, r.failures) for r in run_verify(ds, workers=1)}
    import omnipack.tools.verify as verify_module

    monkeypatch.setattr(verify_module, "BYTES_PER_WORKER", 1)
    assert len(_meta(ds)["shards"]) >= 2  # so the pool really runs two processes
    pool = {r.name: (r.status, r.failures) for r in run_verify(ds, workers=2)}
    assert pool == one and one["checksums"][0] == "fail"


def test_prepare_shard_sha256_records_a_digest_that_verify_sha256_checks(tmp_path: Path) -> None:
    ds = build_small_dataset(tmp_path, num_samples=6, shard_sha256=True)
    shards = _meta(ds)["shards"]
    assert all(s["sha256"] == file_sha256(ds / s["path"]) and s["xxh3_128"] for s in shards)
    assert main(["verify", str(ds), "-j", "1", "--sha256"]) == 0
    path = ds / shards[0]["path"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    fails = {r.name: r.failures for r in run_verify(ds, sha256=True, payloads=False) if r.failures}
    assert set(fails) == {"checksums"} and f"{shards[0]['path']}: sha256" in fails["checksums"][0]


def test_ledger_bytes_do_not_depend_on_how_the_entries_come(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finalize writes the ledger part by part: the file must be the same for any split of the input."""
    import pyarrow as pa

    from omnipack.dataset import accounting

    monkeypatch.setattr(accounting, "ROW_GROUP", 7)
    entries = pa.table(
        {
            "sample_index": list(range(30)),
            "sample_id": [f"s{i}" for i in range(30)],
            "source": ["in.jsonl"] * 30,
            "row": [i // 4 for i in range(30)],
            "position": [i % 4 for i in range(30)],
        }
    )
    files = []
    for cuts in ([30], [3, 11, 16], [1] * 30, [7, 7, 16]):
        path = tmp_path / f"ledger-{len(files)}.parquet"
        writer = accounting.LedgerWriter(path)
        start = 0
        for n in cuts:
            writer.write(entries.slice(start, n))
            start += n
        writer.close()
        files.append(path.read_bytes())
        assert accounting.read_ledger(path).column("sample_index").to_pylist() == list(range(30))
    assert all(f == files[0] for f in files)
