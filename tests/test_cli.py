from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from omnipack.cli import build_parser, main


def _subcommands() -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sorted(sub.choices)


@pytest.mark.parametrize("command", [None, *_subcommands()])
def test_help_everywhere(command):
    args = [sys.executable, "-m", "omnipack"] + ([command] if command else []) + ["--help"]
    res = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "usage: omnipack" in res.stdout


def test_config_file_with_flag_overrides(tmp_path, demo_tokenizer, demo_corpus):
    manifest, media = demo_corpus
    cfg = tmp_path / "prepare.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "manifest": str(manifest),
                "media_root": str(media),
                "tokenizer": str(demo_tokenizer),
                "output": str(tmp_path / "ds"),
                "seq_length": 4096,
                "cp": 4,
                "progress": False,
                "max_reject_fraction": 0.2,  # the demo corpus holds 6 broken samples in 66
            }
        )
    )
    assert (
        main(["prepare", "-c", str(cfg), "--seq-length", "2048", "--cp", "2", "--max-pixels", "50176"]) == 0
    )
    meta = json.loads((tmp_path / "ds" / ".nv-meta" / "omnipack.json").read_text())
    assert meta["seq_length"] == 2048 and meta["align"] == 4
    assert meta["profile"]["settings"]["image"]["max_pixels"] == 50176


def test_usage_errors_exit_non_zero(tmp_path, demo_tokenizer, demo_corpus, capsys):
    manifest, media = demo_corpus
    assert main(["prepare", "--manifest", str(manifest)]) == 2
    assert "missing required setting(s): media_root, tokenizer, output" in capsys.readouterr().err
    bad_cfg = tmp_path / "list.yaml"
    bad_cfg.write_text("- a\n- b\n")
    assert main(["prepare", "-c", str(bad_cfg)]) == 2
    assert "must hold a mapping of settings, not a list" in capsys.readouterr().err
    base = [
        "prepare",
        "--manifest",
        str(manifest),
        "--media-root",
        str(media),
        "--tokenizer",
        str(demo_tokenizer),
        "--no-progress",
    ]
    assert main([*base, "-o", str(tmp_path / "a"), "--seq-length", "1002", "--cp", "4"]) == 2
    assert "not a multiple of the alignment 8" in capsys.readouterr().err
    assert main([*base, "-o", str(tmp_path / "b"), "--profile", "nope"]) == 2
    assert "unknown profile 'nope'" in capsys.readouterr().err
    assert main([*base, "-o", str(tmp_path / "b"), "--profile-option", "use_audio_in_video"]) == 2
    assert "expects KEY=VALUE" in capsys.readouterr().err
    # nothing packable: exit 1, with the rejects file written
    assert main([*base, "-o", str(tmp_path / "c"), "--seq-length", "16"]) == 1
    assert (tmp_path / "c" / "rejects.jsonl").exists()
    # refuses to overwrite a non-empty output without --overwrite
    assert main([*base, "-o", str(tmp_path / "c"), "--seq-length", "2048"]) == 2


def test_demo_command(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "omnipack", "demo", str(tmp_path / "demo"), "--samples", "24"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    meta = json.loads((tmp_path / "demo" / "dataset" / ".nv-meta" / "omnipack.json").read_text())
    assert (
        meta["counts"]["input"] == 30 and meta["counts"]["packed"] == 24 and meta["counts"]["rejected"] == 6
    )
    assert "packed samples" in res.stderr


def test_remote_media_flags_reach_the_run_settings(tmp_path, demo_tokenizer):
    """The remote-media flags (documented defaults; the private-address guard on unless allowed)."""
    from omnipack.cli import _prepare_config
    from omnipack.media.remote import RemoteSettings

    base = ["prepare", "--manifest", "m.jsonl", "--media-root", ".", "--tokenizer", str(demo_tokenizer), "-o", "ds"]
    assert _prepare_config(build_parser().parse_args(base)).remote == RemoteSettings(10.0, 30.0, 120.0, False, ())
    args = build_parser().parse_args(
        [
            *base,
            *("--http-connect-timeout", "2", "--http-read-timeout", "3.5", "--http-deadline", "40"),
            *("--allow-private-host", "media.internal:8080", "--allow-private-urls"),
        ]
    )
    remote = _prepare_config(args).remote
    assert remote == RemoteSettings(2.0, 3.5, 40.0, True, ("media.internal:8080",))
    with pytest.raises(ValueError, match="deadline_s must be > 0"):
        assert _prepare_config(build_parser().parse_args([*base, "--http-deadline", "0"])).remote
