"""Options naming a folder or file of this machine refuse a store URL before any work: ``Path`` would take
``s3://bucket/x`` for the relative path ``s3:/bucket/x`` (it folds ``//``) and create it in the current
directory. Each test runs in an empty current directory and checks it stays empty."""

from __future__ import annotations

import pytest

from omnipack.cli import main
from omnipack.pipeline import PrepareConfig, run_prepare


@pytest.fixture
def empty_cwd(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_the_demo_refuses_an_object_store_output(empty_cwd, capsys):
    assert main(["demo", "s3://bucket/demo", "--samples", "4"]) == 2
    err = capsys.readouterr().err
    assert "the demo's output must be a local or mounted folder, got the URL s3://bucket/demo" in err
    assert list(empty_cwd.iterdir()) == []


def test_a_media_allow_root_url_is_refused_before_any_work(tmp_path, empty_cwd, demo_tokenizer, demo_corpus):
    manifest, media = demo_corpus
    cfg = PrepareConfig(
        manifest=[str(manifest)], media_root=str(media), tokenizer=str(demo_tokenizer),
        output=str(tmp_path / "out"), progress=False, media_allow_roots=["s3://bucket/media"],
    )  # fmt: skip
    with pytest.raises(ValueError, match="--media-allow-root must be a local or mounted folder"):
        run_prepare(cfg)
    assert not (tmp_path / "out").exists()
    assert list(empty_cwd.iterdir()) == []


def test_inspect_refuses_a_plot_url_before_scanning(empty_cwd, demo_reference, capsys):
    assert main(["inspect", str(demo_reference), "--plot", "s3://bucket/plots/rows.png"]) == 2
    err = capsys.readouterr().err
    assert "--plot must be a local or mounted file, got the URL s3://bucket/plots/rows.png" in err
    assert list(empty_cwd.iterdir()) == []
