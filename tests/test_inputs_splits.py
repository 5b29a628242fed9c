"""Splits of folder inputs as the Hugging Face Hub names them: one split is read (``--split``, else ``train``,
else the only one), the run says which files it took, and omnipack.json records the split."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from omnipack.cli import main
from omnipack.dataset.meta import read_omnipack_meta
from omnipack.inputs import InputError, InputSpec, select_inputs
from omnipack.inputs.splits import find_splits
from omnipack.manifest import read_manifest

from .inputs_helpers import SEQ_LENGTH


def _rec(sid: str) -> dict:
    return {
        "id": sid,
        "messages": [
            {"role": "user", "content": f"What is {sid}?"},
            {"role": "assistant", "content": f"{sid} is a record."},
        ],
    }


def _hub_folder(root, counts: dict[str, int], shards: dict[str, int] | None = None):
    """A Hub dataset folder: ``data/{split}-NNNNN-of-NNNNN.parquet`` with ``counts[split]`` records."""
    (root / "data").mkdir(parents=True)
    for split, n in counts.items():
        k = (shards or {}).get(split, 1)
        recs = [_rec(f"{split}-{i}") for i in range(n)]
        for s in range(k):
            pq.write_table(pa.Table.from_pylist(recs[s::k]), root / "data" / f"{split}-{s:05d}-of-{k:05d}.parquet")
    (root / "README.md").write_text("---\nlicense: mit\n---\n")
    return root


def _ids(paths, split=None) -> list[str]:
    return [s.sample_id for s in read_manifest(paths, split=split)]


def _names(root, files) -> list[str]:
    return [f.relative_to(root).as_posix() for f in files]


def _touch(root, *names):
    out = []
    for n in names:
        (root / n).parent.mkdir(parents=True, exist_ok=True)
        (root / n).write_text("x")
        out.append(root / n)
    return out


@pytest.mark.parametrize(
    "names, expected",
    [
        # sharded Hub files: any split name, the Hub's order (train, validation, test, then by name)
        (["data/zz-00000-of-00001.parquet", "data/test-00000-of-00001.parquet", "data/train-00000-of-00002.parquet",
          "data/train-00001-of-00002.parquet", "other/validation.parquet"],
         {"train": ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"],
          "test": ["data/test-00000-of-00001.parquet"], "zz": ["data/zz-00000-of-00001.parquet"]}),
        # keywords in folder names before keywords in file names
        (["training/a.jsonl", "dev/b.jsonl", "test.jsonl"],
         {"train": ["training/a.jsonl"], "validation": ["dev/b.jsonl"]}),
        (["llava-train.jsonl", "x_eval_1.jsonl", "valid.jsonl", "extra.jsonl"],
         {"train": ["llava-train.jsonl"], "validation": ["valid.jsonl"], "test": ["x_eval_1.jsonl"]}),
        # a keyword inside a word names nothing; hidden and __special__ folders are skipped
        (["trainer.jsonl", "contest.jsonl", ".cache/train.jsonl", "__tmp__/test.jsonl"], {}),
    ],
)  # fmt: skip
def test_split_names_follow_the_hub(tmp_path, names, expected):
    files = _touch(tmp_path, *names)
    assert {s: _names(tmp_path, fs) for s, fs in find_splits(tmp_path, files).items()} == expected
    assert list(find_splits(tmp_path, files)) == list(expected)


def test_a_hub_data_folder_given_itself_has_the_same_splits(tmp_path):
    files = _touch(tmp_path, "data/train-00000-of-00001.parquet", "data/zz-00000-of-00001.parquet")
    splits = find_splits(tmp_path / "data", files)
    assert {s: _names(tmp_path / "data", fs) for s, fs in splits.items()} == {
        "train": ["train-00000-of-00001.parquet"], "zz": ["zz-00000-of-00001.parquet"]
    }


def test_a_hub_folder_reads_train_or_the_chosen_split(tmp_path):
    hub = _hub_folder(tmp_path / "hub", {"train": 30, "test": 5}, shards={"train": 2})
    train = _ids([hub])
    assert _ids([hub / "data"]) == train
    assert len(train) == 30 and all(i.startswith("train-") for i in train)  # not 35: the test split stays out
    assert sorted(_ids([hub], split="test")) == sorted(f"test-{i}" for i in range(5))
    with pytest.raises(InputError, match=r"no split 'validation'; its splits: train, test \(--split\)"):
        _ids([hub], split="validation")
    ((_, choice),) = select_inputs([hub], InputSpec())
    assert choice.describe() == (
        f"input {hub}: split 'train', 2 files: data/train-00000-of-00002.parquet, "
        "data/train-00001-of-00002.parquet; not read: split 'test' (1 file)"
    )


def test_several_splits_without_train_need_a_choice(tmp_path):
    hub = _hub_folder(tmp_path / "hub", {"validation": 3, "test": 2})
    with pytest.raises(InputError, match=r"holds the splits validation, test and none is 'train': choose one with --split"):
        _ids([hub])
    assert len(_ids([hub], split="validation")) == 3
    assert len(_ids([hub], split="dev")) == 3  # a keyword of the split names it too
    only = _hub_folder(tmp_path / "only", {"test": 2})
    assert _ids([only]) == ["test-0", "test-1"]  # the only split is read (and the run says which)


def test_a_folder_naming_no_split_is_read_whole(tmp_path):
    d = tmp_path / "parts"
    d.mkdir()
    for name in ("a", "b"):
        (d / f"{name}.jsonl").write_text(json.dumps(_rec(name)) + "\n")
    (d / ".partial").mkdir()
    (d / ".partial" / "c.jsonl").write_text('{"id": "c", "mess')  # a download in progress: not read
    assert _ids([d]) == _ids([d], split="train") == ["a", "b"]  # all of it is the Hub's train split
    with pytest.raises(InputError, match="no split 'test': its file names name no split"):
        _ids([d], split="test")
    ((_, choice),) = select_inputs([d], InputSpec())
    assert choice.split is None and "in no split (not read): .partial/c.jsonl" in choice.describe()
    # a file is read as given, whatever --split says
    assert _ids([d / "a.jsonl"], split="test") == ["a"]


def test_prepare_packs_one_split_of_a_dataset_dict_and_records_it(tmp_path, demo_tokenizer, capsys):
    datasets = pytest.importorskip("datasets")
    dd = tmp_path / "dd"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([_rec(f"train-{i}") for i in range(30)]),
            "test": datasets.Dataset.from_list([_rec(f"test-{i}") for i in range(5)]),
        }
    ).save_to_disk(str(dd))
    base = ["prepare", "--manifest", str(dd), "--media-root", str(tmp_path), "--tokenizer", str(demo_tokenizer)]
    base += ["--no-progress", "--seq-length", str(SEQ_LENGTH)]
    assert main([*base, "-o", str(tmp_path / "train")]) == 0
    err = capsys.readouterr().err
    assert f"input {dd}: split 'train', 1 file: train/data-00000-of-00001.arrow; not read: split 'test'" in err
    meta = read_omnipack_meta(tmp_path / "train")
    assert meta["counts"]["input"] == meta["counts"]["packed"] == 30  # not 35
    assert meta["inputs"] == [{"path": str(dd), "split": "train", "files": ["train/data-00000-of-00001.arrow"]}]
    assert [f["file"] for f in meta["counts"]["by_input"]] == ["dd/train/data-00000-of-00001.arrow"]

    assert main([*base, "-o", str(tmp_path / "test"), "--split", "test"]) == 0
    meta = read_omnipack_meta(tmp_path / "test")
    assert meta["counts"]["packed"] == 5 and meta["inputs"][0]["split"] == "test"
    capsys.readouterr()
    assert main([*base, "-o", str(tmp_path / "none"), "--split", "validation"]) == 2
    assert "no split 'validation'; its splits: train, test (--split)" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_prepare_packs_one_split_of_a_hub_parquet_folder(tmp_path, demo_tokenizer, capsys):
    hub = _hub_folder(tmp_path / "hub", {"train": 30, "test": 5}, shards={"train": 2})
    base = ["prepare", "--manifest", str(hub), "--media-root", str(tmp_path), "--tokenizer", str(demo_tokenizer)]
    base += ["--no-progress", "--seq-length", str(SEQ_LENGTH), "--part-lines", "7", "-j", "2"]
    assert main([*base, "-o", str(tmp_path / "train")]) == 0
    meta = read_omnipack_meta(tmp_path / "train")
    assert meta["counts"]["packed"] == 30 and meta["inputs"][0]["split"] == "train"
    assert [f["input"] for f in meta["counts"]["by_input"]] == [15, 15]
    assert main([*base, "-o", str(tmp_path / "test"), "--split", "test"]) == 0
    meta = read_omnipack_meta(tmp_path / "test")
    assert meta["counts"]["packed"] == 5
    assert meta["inputs"] == [{"path": str(hub), "split": "test", "files": ["data/test-00000-of-00001.parquet"]}]
    assert "split 'test', 1 file: data/test-00000-of-00001.parquet; not read: split 'train' (2 files)" in (
        capsys.readouterr().err
    )
