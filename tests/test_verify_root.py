"""The dataset's root digest (``omnipack.dataset.root``) and the split check of ``omnipack verify``.

A copy damaged and then re-checksummed (shard checksums, ``.tar.idx``, counts all rewritten to agree) passes
every self-consistency check; only the root its producer printed (``--expect-root``) catches it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import xxhash
import yaml

from omnipack.cli import main
from omnipack.dataset.codec import decode_row, load_npy, npy_bytes
from omnipack.dataset.root import stamp_root
from omnipack.pipeline import PrepareConfig, run_prepare
from omnipack.tools.verify import run_verify
from tests.tools_dataset import build_small_dataset, copy_dataset, resign, rewrite_shard

SHARD = "shards/shard-000001.tar"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_dataset(tmp_path_factory.mktemp("root"))


@pytest.fixture
def ds(small: Path, tmp_path: Path) -> Path:
    return copy_dataset(small, tmp_path / "ds")


def _meta(ds: Path) -> dict:
    return json.loads((ds / ".nv-meta" / "omnipack.json").read_text())


def failing(ds: Path, **kw) -> dict[str, list[str]]:
    return {r.name: r.failures for r in run_verify(ds, **kw) if r.status == "fail"}


def third_party_root(ds: Path) -> str:
    """The root recomputed from the rule as the README states it, with nothing of omnipack."""
    meta = _meta(ds)
    doc = json.dumps({k: v for k, v in meta.items() if k != "root"}, sort_keys=True, separators=(",", ":"))
    text = doc.encode()
    leaves = [(".nv-meta/omnipack.json", len(text), "sha256:" + hashlib.sha256(text).hexdigest())]

    def leaf(rel: str, fast: bool = False) -> tuple[str, int, str]:
        data = (ds / rel).read_bytes()
        if fast:
            return rel, len(data), "xxh3_128:" + xxhash.xxh3_128_hexdigest(data)
        return rel, len(data), "sha256:" + hashlib.sha256(data).hexdigest()

    for s in meta["shards"]:
        leaves += [leaf(s["path"], fast=not s.get("sha256")), leaf(s["path"] + ".idx")]
    leaves.append(leaf(meta["rejects_file"]))
    for p in (ds / ".nv-meta").rglob("*"):
        rel = p.relative_to(ds).as_posix()
        if p.is_file() and rel != ".nv-meta/omnipack.json":
            leaves.append(leaf(rel))
    return hashlib.sha256("".join(f"{p}\t{n}\t{d}\n" for p, n, d in sorted(leaves)).encode()).hexdigest()


def _repaint_an_image(ds: Path) -> str:
    """Invert one image payload's pixels (same shape and dtype) and rewrite the shard as a thorough forger
    would: content fingerprints, checksums, .tar.idx and counts all made to agree. Returns the sample id."""
    hit = []

    def edit(rows):
        for r in rows:
            row, _ = decode_row(r.parts)
            images = [m for m in row.media if m.kind == "image" and m.part.endswith(".npy")]
            if images and not hit:
                m = images[0]
                r.parts[m.part] = npy_bytes(255 - load_npy(r.parts[m.part]))
                resign(r)
                hit.append(row.sample_ids[m.sample_index])
        return rows

    rewrite_shard(ds, SHARD, edit)
    assert hit, "the shard holds no npy image to damage"
    return hit[0]


def test_prepare_records_a_root_anyone_can_recompute(small: Path, capsys: pytest.CaptureFixture) -> None:
    root = _meta(small)["root"]
    assert root["rule"] == "omnipack-root-v1" and root["sha256"] == third_party_root(small)
    named = {leaf[0] for leaf in root["leaves"]}
    assert named >= {SHARD, f"{SHARD}.idx", "rejects.jsonl", ".nv-meta/split.yaml", ".nv-meta/.info.json"}
    assert main(["verify", str(small), "--expect-root", root["sha256"]]) == 0
    assert f"root {root['sha256']}" in capsys.readouterr().out
    assert main(["verify", str(small), "--expect-root", "0" * 64]) == 1


def test_without_expect_root_the_record_is_checked_against_its_leaves(ds: Path) -> None:
    assert failing(ds) == {}
    path = ds / ".nv-meta" / "omnipack.json"
    meta = json.loads(path.read_text())
    meta["root"]["leaves"][0][1] += 1
    path.write_text(json.dumps(meta))
    assert set(failing(ds)) == {"root"}


def test_damaged_and_rechecksummed_copy_fails_only_the_root(ds: Path) -> None:
    expected = _meta(ds)["root"]["sha256"]
    sid = _repaint_an_image(ds)
    # every check but the root passes: the forger left the recorded root alone, so it names what differs
    assert failing(ds) == {}  # self-consistent: every check passes (the recorded root is unchanged)
    fails = failing(ds, expect_root=expected)
    assert set(fails) == {"root"}, fails
    msgs = fails["root"]
    assert msgs[0].startswith("the files give root") and expected in msgs[0]
    assert any(m.startswith(f"{SHARD}: ") for m in msgs)
    assert any(m.startswith(".nv-meta/omnipack.json: ") for m in msgs)  # its shard checksums were rewritten
    assert not any(m.startswith("shards/shard-000000.tar") for m in msgs)  # the untouched shard
    assert sid  # (the repainted sample: its row still passes the content check after resigning)


def test_a_forger_who_also_rewrites_the_recorded_root_is_caught_only_by_expect_root(
    ds: Path, tmp_path: Path
) -> None:
    expected = _meta(ds)["root"]["sha256"]
    _repaint_an_image(ds)
    # re-root the damaged copy: omnipack.json's root now agrees with its files
    staging = tmp_path / "staging"
    (staging / ".nv-meta").mkdir(parents=True)
    for p in (ds / ".nv-meta").iterdir():
        (staging / ".nv-meta" / p.name).write_bytes(p.read_bytes())
    forged = stamp_root(staging, ds)["sha256"]
    (ds / ".nv-meta" / "omnipack.json").write_bytes((staging / ".nv-meta" / "omnipack.json").read_bytes())
    assert forged != expected
    assert failing(ds) == {}  # self-consistent in every way
    fails = failing(ds, expect_root=expected)
    assert set(fails) == {"root"}
    assert f"the files give root {forged}, expected {expected}" == fails["root"][0]
    assert "cannot be named" in fails["root"][1]
    assert main(["verify", str(ds), "--expect-root", expected]) == 1


def test_root_does_not_depend_on_the_output_folder_or_the_workers(
    tmp_path: Path, demo_tokenizer: Path, demo_corpus: tuple[Path, Path]
) -> None:
    manifest, media = demo_corpus
    outs = []
    for name, workers in (("a", 1), ("elsewhere/b", 2)):
        out = tmp_path / name
        cfg = PrepareConfig(
            manifest=[str(manifest)],
            media_root=str(media),
            tokenizer=str(demo_tokenizer),
            output=str(out),
            seq_length=2048,
            shard_max_rows=4,
            workers=workers,
            progress=False,
        )
        run_prepare(cfg)
        outs.append(out)
    a, b = (_meta(o)["root"] for o in outs)
    for rel, _, _ in a["leaves"]:  # byte-identical runs ...
        if rel != ".nv-meta/omnipack.json":
            assert (outs[0] / rel).read_bytes() == (outs[1] / rel).read_bytes(), rel
    assert a == b  # ... give the same root
    assert a["sha256"] == third_party_root(outs[1])


def test_a_root_differing_in_any_file_is_named(ds: Path) -> None:
    expected = _meta(ds)["root"]["sha256"]
    with open(ds / "rejects.jsonl", "a") as f:
        f.write("\n")
    fails = failing(ds, expect_root=expected.upper())
    assert set(fails) == {"root"} and fails["root"][1].startswith("rejects.jsonl: ")
    (ds / ".nv-meta" / "extra.txt").write_text("x")
    fails = failing(ds, expect_root=expected)["root"]
    assert any(m.startswith(".nv-meta/extra.txt: a file the recorded leaves do not have") for m in fails)


# --- splits -----------------------------------------------------------------------------------------


def _edit_split(ds: Path, fn) -> None:
    path = ds / ".nv-meta" / "split.yaml"
    split = yaml.safe_load(path.read_text())
    fn(split["split_parts"])
    path.write_text(yaml.safe_dump(split, sort_keys=False))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p["train"].append(SHARD), f"{SHARD}: listed 2 times in split 'train'"),
        (lambda p: p["val"].append(SHARD), f"{SHARD}: in splits ['train', 'val'] of split.yaml"),
        (lambda p: p["train"].remove(SHARD), f"{SHARD}: in no split of split.yaml"),
        (
            lambda p: (p["train"].remove(SHARD), p["val"].append(SHARD)),
            f"{SHARD}: split.yaml puts it in 'val', omnipack.json in 'train'",
        ),
    ],
    ids=["twice", "two-splits", "missing", "moved"],
)
def test_damaged_split_file_names_the_shard(ds: Path, damage, message: str) -> None:
    assert SHARD in yaml.safe_load((ds / ".nv-meta" / "split.yaml").read_text())["split_parts"]["train"]
    _edit_split(ds, damage)
    fails = failing(ds)
    assert any(m.startswith(message) for m in fails.get("splits", [])), fails
    # the rows Energon would read per split no longer match the recorded ones
    assert any("rows in its shards of split.yaml" in m for m in fails["splits"])


def test_split_rows_checked_against_the_recorded_rows_by_split(ds: Path) -> None:
    path = ds / ".nv-meta" / "omnipack.json"
    meta = json.loads(path.read_text())
    meta["counts"]["rows_by_split"]["train"] += 1
    path.write_text(json.dumps(meta))
    fails = failing(ds)
    assert "splits" in fails and any(m.startswith("split 'train': ") for m in fails["splits"])


def test_a_split_file_that_excludes_rows_fails(ds: Path) -> None:
    path = ds / ".nv-meta" / "split.yaml"
    split = yaml.safe_load(path.read_text())
    split["exclude"] = [f"{SHARD}/000000001"]
    path.write_text(yaml.safe_dump(split, sort_keys=False))
    fails = failing(ds)
    assert set(fails) == {"splits"} and fails["splits"][0].startswith(f"split.yaml excludes ['{SHARD}/")
