"""The tokenizer travels with the run: nodes that share nothing but the object store (moto's S3 server) run
one staged run, the tokenizer folder existing only on the node that starts it; the dataset is the bytes of
the same run on one node. A node with neither the folder nor a shipped copy gets a clear error, a damaged
copy is refused, and a changed tokenizer is a new copy that is never mixed with the old one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("upath")
pytest.importorskip("moto.server")

from omnipack.cli import main  # noqa: E402
from omnipack.pipeline import run_prepare  # noqa: E402
from omnipack.stages.measure import local_measure_config  # noqa: E402
from omnipack.stages.model_files import (  # noqa: E402
    MODEL_DIR,
    MODEL_RECORD,
    materialise,
    read_shipped,
    ship,
)
from tests.s3_server import S3Server  # noqa: E402
from tests.stage_outputs import cli_args, demo_config  # noqa: E402

BUCKET = "omnipack-ship"
REPO = Path(__file__).resolve().parents[1]


def _fs():
    import fsspec

    return fsspec.filesystem("s3")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The store, holding a demo corpus's manifest and media: the only thing the nodes share. 30 samples (and
    the broken ones, under the reject limit): two measure parts, three rows, in runs that read every file over HTTP."""
    from omnipack.demo.corpus import build_demo_corpus

    manifest, media = build_demo_corpus(tmp_path_factory.mktemp("store"), num_samples=30)
    with S3Server() as server:
        server.bucket(BUCKET)
        fs = _fs()
        fs.put_file(str(manifest), f"{BUCKET}/in/manifest.jsonl")
        for f in sorted(media.iterdir()):
            fs.put_file(str(f), f"{BUCKET}/in/media/{f.name}")
        yield server


def _store_bytes(url: str) -> dict[str, bytes]:
    fs, root = _fs(), url.removeprefix("s3://")
    keys = [*fs.glob(f"{root}/shards/*"), *fs.glob(f"{root}/.nv-meta/*"), f"{root}/rejects.jsonl"]
    return {k.removeprefix(root + "/"): fs.cat_file(k) for k in keys}


def _config(url: str, tokenizer: Path, **kw):
    corpus = (f"s3://{BUCKET}/in/manifest.jsonl", f"s3://{BUCKET}/in/media")
    kw = {"shard_max_rows": 1, **kw}  # a shard per row (the store's corpus packs into 3): both write ranks write
    return demo_config(url, tokenizer, corpus, **kw)  # type: ignore[arg-type]


def _node_b(home: Path, runs: list[list[str]]) -> tuple[list[int], str]:
    """``omnipack`` CLI runs in a child process standing for another machine: its own working folder, home
    and cache, the store's settings (AWS_*) from the environment; the exit codes and stderr."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "XDG_", "OMNIPACK_"))}
    env |= {"HOME": str(home), "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])}
    script = (
        "import json, sys\nfrom omnipack.cli import main\n"
        "print(json.dumps([main(a) for a in json.loads(sys.argv[1])]))"
    )
    res = subprocess.run(
        [sys.executable, "-c", script, json.dumps(runs)],
        cwd=home, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1]), res.stderr


def test_nodes_sharing_only_the_store_give_the_bytes_of_one_node(s3, tmp_path, demo_tokenizer):
    tok = tmp_path / "node-a" / "models" / "tok"  # the folder exists on node A only
    shutil.copytree(demo_tokenizer, tok)
    (tok / "model.safetensors").write_bytes(b"\0" * 4096)  # weights: never shipped
    whole = f"s3://{BUCKET}/runs/whole"
    reference = run_prepare(_config(whole, tok))
    assert reference["counts"]["packed"] > 0

    url = f"s3://{BUCKET}/runs/two-nodes"
    args = cli_args(_config(url, tok))
    # node A: the measure stage's rank 0, where the tokenizer folder is
    assert main([*args, "--stage", "measure", "--rank", "0", "--world-size", "2"]) == 0
    tok.rename(tok.with_name("tok.elsewhere"))  # from here on, no node has the folder
    home = tmp_path / "node-b"
    codes, log = _node_b(
        home,
        [
            [*args, "--stage", "measure", "--rank", "1", "--world-size", "2"],
            [*args, "--stage", "pack"],
            [*args, "--stage", "write", "--rank", "0", "--world-size", "2"],
            [*args, "--stage", "write", "--rank", "1", "--world-size", "2"],
            [*args, "--stage", "finalize"],
        ],
    )
    assert codes == [0] * 5, log[-3000:]
    assert f"tokenizer {tok}: not on this machine, read from the run's copy" in log
    assert _store_bytes(url) == _store_bytes(whole)
    meta = json.loads(_store_bytes(url)[".nv-meta/omnipack.json"])
    assert meta["tokenizer"]["path"] == str(tok)  # the run names the folder it was started with

    # what went into the store: the tokenizer's small files, no weights; node B's copy is keyed by their digest
    shipped = read_shipped(_upath(url) / "stages")
    names = {n for n, _, _ in shipped.files}
    assert "tokenizer.json" in names and "model.safetensors" not in names
    assert sorted(_fs().ls(shipped.location.removeprefix("s3://"), detail=False)) == sorted(
        f"{shipped.location.removeprefix('s3://')}/{n}" for n in names
    )
    copy = home / ".cache" / "omnipack" / "model" / shipped.digest
    assert sorted(p.name for p in copy.iterdir()) == sorted(names)
    assert all((copy / n).read_bytes() == (tok.with_name("tok.elsewhere") / n).read_bytes() for n in names)


def _upath(url: str):
    from upath import UPath

    return UPath(url)


def test_no_folder_and_no_shipped_copy_is_a_clear_error(s3, tmp_path, demo_tokenizer):
    absent = tmp_path / "not-on-this-node" / "tok"
    url = f"s3://{BUCKET}/runs/no-copy"
    with pytest.raises(ValueError, match=r"is not a folder on this machine, and the run's output holds no shipped"):
        run_prepare(_config(url, absent), stage="measure", rank=1, world_size=2)
    # a copy of another tokenizer is not taken for this one
    elsewhere = tmp_path / "tok"
    shutil.copytree(demo_tokenizer, elsewhere)
    ship(elsewhere, str(elsewhere), _upath(url) / "stages")
    with pytest.raises(ValueError, match=rf"holds no shipped copy of it .*\(it holds '{elsewhere}'\)"):
        run_prepare(_config(url, absent), stage="measure", rank=1, world_size=2)
    assert main([*cli_args(_config(url, absent)), "--stage", "measure", "--rank", "1", "--world-size", "2"]) == 2


def test_a_damaged_copy_is_refused(s3, tmp_path, demo_tokenizer, monkeypatch):
    stages = _upath(f"s3://{BUCKET}/runs/damaged") / "stages"
    shipped = ship(demo_tokenizer, str(demo_tokenizer), stages)
    _fs().pipe(f"{shipped.location.removeprefix('s3://')}/tokenizer_config.json", b"{}")
    monkeypatch.setenv("OMNIPACK_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="does not match its record"):
        materialise(shipped)
    assert not (tmp_path / "cache" / "model" / shipped.digest).exists()


def test_a_changed_tokenizer_is_a_new_copy_and_workers_read_the_runs_own(tmp_path, demo_tokenizer, monkeypatch):
    """A folder edited between stages: the measured parts of the old tokenizer are not packed with the new one
    (its fingerprint is in their key); the run's record moves to the new copy, the old one stays whole for
    specs that name it, and a worker reads the copy its spec names, not the folder at the same path."""
    from tests.stage_outputs import demo_config as local_config

    monkeypatch.setenv("OMNIPACK_CACHE_DIR", str(tmp_path / "cache"))
    tok = tmp_path / "tok"
    shutil.copytree(demo_tokenizer, tok)
    out = tmp_path / "out"
    corpus_dir = tmp_path / "corpus"
    from omnipack.demo.corpus import build_demo_corpus

    cfg = local_config(out, tok, build_demo_corpus(corpus_dir, num_samples=8))
    run_prepare(cfg, stage="measure")
    old = read_shipped(out / "stages")
    assert (out / "stages" / MODEL_DIR / MODEL_RECORD).exists() and old.name == str(tok)
    template = tok / "chat_template.jinja"
    if template.exists():
        template.write_text(template.read_text() + "{#- edited -#}")
    else:
        config = json.loads((tok / "tokenizer_config.json").read_text())
        config["chat_template"] += "{#- edited -#}"
        (tok / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match="not measured with these settings"):
        run_prepare(cfg, stage="pack")
    new = read_shipped(out / "stages")
    assert new.digest != old.digest and (out / "stages" / MODEL_DIR / old.digest).is_dir()
    # a worker given the old spec reads the old tokenizer, though the folder at its path was edited
    from omnipack.stages.spec import MeasureConfig

    measure = MeasureConfig("qwen2_5_vl", str(tok), None)
    folder = Path(local_measure_config(measure, old).tokenizer)
    assert folder == tmp_path / "cache" / "model" / old.digest
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == {
        p.name: p.read_bytes() for p in demo_tokenizer.iterdir() if p.is_file()
    }
    edited = local_measure_config(measure, new)
    assert edited == replace(measure, tokenizer=str(tmp_path / "cache" / "model" / new.digest))
    assert {p.name: p.read_bytes() for p in Path(edited.tokenizer).iterdir()} == {
        p.name: p.read_bytes() for p in tok.iterdir()
    }


def test_a_hub_id_names_the_snapshot_it_was_resolved_to():
    from omnipack.stages.model_files import ShippedModel, names_match

    shipped = ShippedModel("/cache/hub/models--org--tiny-vl/snapshots/abc123", "s3://b/stages/model/d", "d", ())
    assert names_match("org/tiny-vl", shipped) and names_match("org/tiny-vl@abc123", shipped)
    assert names_match("/cache/hub/models--org--tiny-vl/snapshots/abc123", shipped)
    assert not names_match("org/other", shipped) and not names_match("tiny-vl", shipped)
    assert not names_match("org/tiny-vl", replace(shipped, name="/models/org/tiny-vl"))


def test_a_preprocessor_config_travels_with_the_run(tmp_path, demo_tokenizer, demo_corpus, monkeypatch):
    """A ``preprocessor_config`` profile option (here one that halves the pixel budget, so it changes the
    dataset) on the first node only: the ranks without it read the run's copy and the dataset is the one
    node's; without a copy, a clear error instead of the profile's defaults."""
    from tests.stage_outputs import dataset_bytes

    monkeypatch.setenv("OMNIPACK_CACHE_DIR", str(tmp_path / "cache"))
    config = tmp_path / "node-a" / "preprocessor_config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"min_pixels": 3136, "max_pixels": 64 * 28 * 28}))
    options = {"profile_options": {"preprocessor_config": str(config)}}
    whole = tmp_path / "whole"
    run_prepare(demo_config(whole, demo_tokenizer, demo_corpus, **options))
    plain = tmp_path / "plain"
    run_prepare(demo_config(plain, demo_tokenizer, demo_corpus))
    assert dataset_bytes(whole) != dataset_bytes(plain)  # the option matters

    out = tmp_path / "two"
    cfg = demo_config(out, demo_tokenizer, demo_corpus, **options)
    run_prepare(cfg, stage="measure", rank=0, world_size=2)
    config.rename(config.with_name("moved.json"))
    run_prepare(cfg, stage="measure", rank=1, world_size=2)
    for stage in ("pack", "write", "finalize"):
        run_prepare(cfg, stage=stage)
    assert dataset_bytes(out) == dataset_bytes(whole)
    with pytest.raises(FileNotFoundError, match="profile option preprocessor_config .* holds no shipped copy"):
        run_prepare(demo_config(tmp_path / "none", demo_tokenizer, demo_corpus, **options), stage="measure")
