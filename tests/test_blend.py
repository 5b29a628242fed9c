"""Energon metadatasets blending omnipack datasets through get_train_loader / get_val_loader, with the
per-leaf checks (profile, tokenizer, seq_length, alignment) that one task encoder needs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from omnipack.dataset.codec import decode_row
from omnipack.dataset.contract import row_contract_errors
from omnipack.dataset.meta import read_omnipack_meta
from omnipack.loader.blend import BlendMismatchError, LeafAlignmentError, dataset_leaves
from omnipack.loader.compat import DatasetAlignmentError
from omnipack.loader.loaders import get_train_loader, get_val_loader
from tests.test_pipeline import read_rows_from_tars

W = 1024


def _prepare(root: Path, tokenizer: Path, *, seed: int, profile: str = "qwen2_5_vl", **settings) -> Path:
    from omnipack.demo.corpus import build_demo_corpus
    from omnipack.pipeline import PrepareConfig, run_prepare

    manifest, media = build_demo_corpus(root / "src", num_samples=10, seed=seed)
    out = root / "ds"
    cfg = dict(seq_length=W, cp=2, shard_max_rows=2)
    cfg.update(settings)
    run_prepare(
        PrepareConfig(
            manifest=[str(manifest)],
            media_root=str(media),
            tokenizer=str(tokenizer),
            output=str(out),
            profile=profile,
            progress=False,
            **cfg,
        )
    )
    return out


@pytest.fixture(scope="module")
def leaves(tmp_path_factory) -> dict[str, Path]:
    """a, b: blendable (b packed for cp=4, align 8, which also serves cp=2); the rest differ from a in one
    field each."""
    from omnipack.demo.tokenizer import build_demo_tokenizer

    root = tmp_path_factory.mktemp("blend")
    tok = build_demo_tokenizer(root / "tok")
    # the same chat template and special tokens over a vocabulary learnt from other text
    other_tok = build_demo_tokenizer(
        root / "tok2", training_text=["Zebras quietly juggle vexed owls. " * 8] * 40
    )
    return {
        "a": _prepare(root / "a", tok, seed=0),
        "b": _prepare(root / "b", tok, seed=1, cp=4),
        "profile": _prepare(
            root / "p", build_demo_tokenizer(root / "tok3", profile="qwen3_vl"), seed=2, profile="qwen3_vl"
        ),
        "tokenizer fingerprint": _prepare(root / "t", other_tok, seed=3),
        "seq_length": _prepare(root / "w", tok, seed=4, seq_length=2 * W),
        "align": _prepare(root / "c", tok, seed=5, cp=1),  # align 1: cannot serve cp=2
    }


def _metadataset(path: Path, train: list[dict], val: list[dict] | None = None, mode: str = "blend") -> Path:
    splits = {"train": {mode: train}}
    if val is not None:
        splits["val"] = {"blend": val}
    path.write_text(
        yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": splits})
    )
    return path


def _rows_of(batch, tars: dict[str, dict[str, dict[str, bytes]]]) -> list[tuple[str, dict[str, bytes]]]:
    """(leaf name, raw row parts) of each row of the batch, found through the subflavors the blend set."""
    return [
        (sf["leaf"], tars[sf["leaf"]][k]) for sf, k in zip(batch.__subflavors__, batch.__key__, strict=True)
    ]


def test_a_weighted_blend_trains_in_about_the_weight_ratio_with_every_row_sound(leaves, tmp_path):
    mds = _metadataset(
        tmp_path / "blend.yaml",
        [
            {"path": str(leaves["a"]), "weight": 3.0, "subflavors": {"leaf": "a"}},
            {"path": str(leaves["b"]), "weight": 1.0, "subflavors": {"leaf": "b"}},
        ],
    )
    found = dataset_leaves(mds)
    assert [p.path for p in found] == [leaves["a"], leaves["b"]]
    assert [p.subflavors for p in found] == [{"leaf": "a"}, {"leaf": "b"}]

    tars = {k: read_rows_from_tars(leaves[k]) for k in ("a", "b")}
    placeholder_ids = read_omnipack_meta(leaves["a"])["tokenizer"]["placeholder_token_ids"]
    assert placeholder_ids == read_omnipack_meta(leaves["b"])["tokenizer"]["placeholder_token_ids"]
    loader = get_train_loader(
        mds, batch_size=2, num_workers=0, cp=2, cp_rank=0, shuffle_buffer_size=4, max_samples_per_sequence=2
    )
    it = iter(loader)
    per_leaf: Counter[str] = Counter()
    for _ in range(60):
        batch = next(it)
        rows = _rows_of(batch, tars)
        per_leaf.update(name for name, _ in rows)
        full = []
        for name, parts in rows:
            row, meta = decode_row(parts)
            align = 4 if name == "a" else 8
            assert row_contract_errors(row, align, placeholder_ids) == [], (name, meta["sample_ids"])
            full.append(torch.from_numpy(row.tokens.astype(np.int64)))
        stream = torch.cat(full)
        assert stream.numel() == 2 * W and batch.tokens.shape == (1, W)  # cp=2: this rank's half
        assert torch.equal(batch.tokens[0].long(), stream[batch.cp_token_indices])
        assert batch.sample_ids == [decode_row(p)[0].sample_ids for _, p in rows]
    share = per_leaf["a"] / sum(per_leaf.values())
    assert set(per_leaf) == {"a", "b"} and 0.62 < share < 0.88, per_leaf  # weights 3:1 -> 0.75


def test_val_loader_reads_every_row_of_a_metadataset_split_once(leaves, tmp_path):
    mds = _metadataset(
        tmp_path / "val.yaml",
        [{"path": str(leaves["a"])}],
        val=[
            {"path": str(leaves["a"]), "split_part": "train", "subflavors": {"leaf": "a"}},
            {"path": str(leaves["b"]), "split_part": "train", "subflavors": {"leaf": "b"}},
        ],
    )
    seen = Counter()
    for batch in get_val_loader(mds, batch_size=1, num_workers=0, decode_media=False):
        seen.update((sf["leaf"], k) for sf, k in zip(batch.__subflavors__, batch.__key__, strict=True))
    expect = {(n, k) for n in ("a", "b") for k in read_rows_from_tars(leaves[n])}
    assert set(seen) == expect and set(seen.values()) == {1}


def test_blend_epochized_and_nested_metadatasets_are_checked_leaf_by_leaf(leaves, tmp_path):
    inner = _metadataset(tmp_path / "inner.yaml", [{"path": str(leaves["seq_length"]), "weight": 1.0}])
    outer = _metadataset(
        tmp_path / "outer.yaml",
        [{"path": str(leaves["a"]), "repetitions": 2}, {"path": str(inner), "repetitions": 1}],
        mode="blend_epochized",
    )
    with pytest.raises(BlendMismatchError, match="seq_length") as e:
        get_train_loader(outer, num_workers=0)
    assert e.value.leaf == str(leaves["seq_length"])
    good = _metadataset(
        tmp_path / "good.yaml",
        [
            {"path": str(leaves["a"]), "repetitions": 2, "subflavors": {"leaf": "a"}},
            {"path": str(leaves["b"]), "repetitions": 1, "subflavors": {"leaf": "b"}},
        ],
        mode="blend_epochized",
    )
    tars = {k: read_rows_from_tars(leaves[k]) for k in ("a", "b")}
    it = iter(get_train_loader(good, num_workers=0, decode_media=False))
    epoch = Counter(
        name for _ in range(2 * len(tars["a"]) + len(tars["b"])) for name, _ in _rows_of(next(it), tars)
    )
    assert epoch == {"a": 2 * len(tars["a"]), "b": len(tars["b"])}  # one epoch: a twice, b once


@pytest.mark.parametrize("field", ["profile", "tokenizer fingerprint", "seq_length", "align"])
def test_a_leaf_that_differs_is_refused_naming_the_leaf_and_the_field(leaves, tmp_path, field):
    mds = _metadataset(
        tmp_path / "bad.yaml",
        [{"path": str(leaves["a"]), "weight": 1.0}, {"path": str(leaves[field]), "weight": 1.0}],
    )
    with pytest.raises(BlendMismatchError) as e:
        get_train_loader(mds, num_workers=0, cp=2)
    assert e.value.field == field and e.value.leaf == str(leaves[field])
    a_meta, other = read_omnipack_meta(leaves["a"]), read_omnipack_meta(leaves[field])
    if field == "tokenizer fingerprint":
        assert other["profile"] == a_meta["profile"] and other["seq_length"] == a_meta["seq_length"]
    assert str(leaves[field]) in str(e.value) and field in str(e.value)
    if field == "align":  # the layout message of the single-dataset check, for this leaf
        assert isinstance(e.value, (LeafAlignmentError, DatasetAlignmentError))
        assert "need a multiple of 4" in str(e.value)
    # the same leaves in the other order: the first leaf is the reference, the other one is named
    swapped = _metadataset(
        tmp_path / "swapped.yaml", [{"path": str(leaves[field])}, {"path": str(leaves["a"])}]
    )
    with pytest.raises(BlendMismatchError) as e2:
        get_val_loader(swapped, split_part="train", num_workers=0, cp=2)
    named = leaves[field] if field == "align" else leaves["a"]
    assert e2.value.field == field and e2.value.leaf == str(named)


def test_the_alignment_leaf_alone_serves_its_own_layout(leaves):
    # the cp=1 leaf is fine for cp=1 and refused for cp=2 also when loaded on its own
    assert get_val_loader(leaves["align"], split_part="train", num_workers=0, decode_media=False) is not None
    with pytest.raises(DatasetAlignmentError):
        get_val_loader(leaves["align"], split_part="train", num_workers=0, cp=2)


def test_a_leaf_that_is_not_an_omnipack_dataset_is_named(leaves, tmp_path):
    import shutil

    plain = tmp_path / "plain"
    shutil.copytree(leaves["a"], plain)
    (plain / ".nv-meta" / "omnipack.json").unlink()
    mds = _metadataset(tmp_path / "m.yaml", [{"path": str(leaves["a"])}, {"path": str(plain)}])
    with pytest.raises(BlendMismatchError, match="omnipack.json") as e:
        get_train_loader(mds, num_workers=0)
    assert e.value.leaf == str(plain)


def test_dataset_locations_as_energon_opens_them(tmp_path):
    """Store URLs become multi-storage-client's implicit profiles (Energon opens msc:// only); local paths and
    file:// URLs stay paths; a scheme Energon can not open is refused by name."""
    from omnipack.dataset.location import energon_location

    assert energon_location("s3://bkt/runs/ds/") == "msc://_s3-bkt/runs/ds"
    assert energon_location("gs://bkt/ds") == "msc://_gs-bkt/ds"
    assert energon_location("msc://my-profile/ds") == "msc://my-profile/ds"
    assert energon_location(f"file://{tmp_path}") == tmp_path == energon_location(str(tmp_path))
    with pytest.raises(ValueError, match="Energon opens local paths and msc://"):
        energon_location("https://host/ds")
