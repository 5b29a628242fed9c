"""`--tokenizer ORG/NAME`: a Hub model id found in the local Hugging Face cache (a cache laid out as
huggingface_hub writes it, under a temporary HF_HOME), never downloaded; an uncached id says how to fetch it."""

from __future__ import annotations

import shutil

import pytest

from omnipack.cli import main
from omnipack.dataset.meta import read_omnipack_meta
from omnipack.profiles import get_profile
from omnipack.text.chat import ChatTokenizer
from omnipack.text.hub_cache import NotCached, resolve_model_dir

from .inputs_helpers import omnipack_record, write_images, write_jsonl

REV = "0123456789abcdef0123456789abcdef01234567"


def _fake_cache(hf_home, repo_id: str, tokenizer_dir, revision: str = REV, ref: str | None = "main"):
    """``repo_id``'s tokenizer files in huggingface_hub's cache layout: blobs, a snapshot of links to them,
    and refs/REF naming the snapshot."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for f in tokenizer_dir.iterdir():
        blob = repo / "blobs" / f"{f.name}-{revision[:8]}"
        shutil.copyfile(f, blob)
        (snapshot / f.name).symlink_to(blob)
    if ref is not None:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(revision)
    return snapshot


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # belt and braces: nothing here may reach a network
    return home


def test_hub_id_resolves_to_its_cached_snapshot(hf_home, demo_tokenizer):
    snapshot = _fake_cache(hf_home, "org/tiny-vl", demo_tokenizer)
    assert resolve_model_dir("org/tiny-vl") == snapshot
    assert resolve_model_dir(f"org/tiny-vl@{REV}") == snapshot  # a commit, without refs
    assert resolve_model_dir(str(demo_tokenizer)) == demo_tokenizer  # a folder stays a folder
    # the Python API takes the id too (ChatTokenizer resolves it: transformers never gets a Hub id to fetch)
    chat = ChatTokenizer("org/tiny-vl", get_profile("qwen2_5_vl"))
    assert chat.tokenizer_dir == snapshot
    with pytest.raises(ValueError, match="tokenizer 'org/absent' is not a local folder nor in the local"):
        ChatTokenizer("org/absent", get_profile("qwen2_5_vl"))
    with pytest.raises(NotCached, match="hf download org/tiny-vl --revision v2 "):
        resolve_model_dir("org/tiny-vl@v2")
    with pytest.raises(NotCached, match=r"hf download org/other .*huggingface-cli download"):
        resolve_model_dir("org/other")


def _corpus(tmp_path):
    write_images(tmp_path / "media", 2)
    return write_jsonl(tmp_path / "in.jsonl", [omnipack_record(f"s{i}", [f"img{i}.jpg"]) for i in range(2)])


def test_prepare_with_a_cached_hub_id(tmp_path, hf_home, demo_tokenizer):
    """End to end: `omnipack prepare --tokenizer ORG/NAME` reads the tokenizer from the cache snapshot."""
    snapshot = _fake_cache(hf_home, "org/tiny-vl", demo_tokenizer)
    manifest = _corpus(tmp_path)
    out = tmp_path / "ds"
    argv = ["prepare", "--manifest", str(manifest), "--media-root", str(tmp_path / "media"),
            "--tokenizer", "org/tiny-vl", "-o", str(out), "--seq-length", "1024", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    meta = read_omnipack_meta(out)
    assert meta["counts"]["packed"] == 2
    assert meta["tokenizer"]["path"] == str(snapshot)


def test_prepare_with_an_uncached_hub_id_says_how_to_fetch_it(tmp_path, hf_home, capsys):
    manifest = _corpus(tmp_path)
    argv = ["prepare", "--manifest", str(manifest), "--media-root", str(tmp_path / "media"),
            "--tokenizer", "Qwen/Qwen2.5-VL-7B-Instruct", "-o", str(tmp_path / "ds")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "tokenizer 'Qwen/Qwen2.5-VL-7B-Instruct' is not a local folder nor in the local Hugging Face cache" in err
    assert str(hf_home / "hub") in err and "`hf download Qwen/Qwen2.5-VL-7B-Instruct " in err
    assert not (tmp_path / "ds").exists()
