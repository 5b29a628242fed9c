from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from omnipack.cli import build_parser, main
from omnipack.stages.records import HOLD_ENV
from tests.prepare_child import run_omnipack


def _subcommands() -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sorted(sub.choices)


def _omnipack(*argv: str) -> subprocess.CompletedProcess:
    """``python -m omnipack ARGV`` in a child process forked from the test session's warm server (no
    interpreter start and imports for each; ``test_demo_command`` runs the real ``python -m omnipack``)."""
    return run_omnipack(list(argv), dict(os.environ), timeout=120)


@pytest.mark.parametrize("command", [None, *_subcommands()])
def test_help_everywhere(command):
    res = _omnipack(*([command] if command else []), "--help")
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
    assert "missing required setting(s): tokenizer, output" in capsys.readouterr().err  # no media root needed
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


def _prepare_args(manifest, media, tokenizer, out) -> list[str]:
    return [
        "prepare",
        "--manifest",
        str(manifest),
        "--media-root",
        str(media),
        "--tokenizer",
        str(tokenizer),
        "-o",
        str(out),
        "--max-reject-fraction",
        "0.2",
    ]


def test_help_shows_the_defaults():
    prepare = _omnipack("prepare", "--help").stdout
    flat = " ".join(prepare.split("options:", 1)[1].split())  # the option list, not the usage line
    for flag, default in [
        ("--seq-length SEQ_LENGTH", "4096"),
        ("--algorithm {bfd,ffd}", "bfd"),
        ("--workers WORKERS, -j WORKERS", "1"),
        ("--max-reject-fraction MAX_REJECT_FRACTION", "0.05"),
        ("--data-parallel DATA_PARALLEL [DATA_PARALLEL ...]", "8 64"),
    ]:
        section = flat[flat.index(flag) :]
        nxt = section.find(" --", len(flag))
        assert f"(default: {default})" in section[:nxt], (flag, section[:nxt])
    demo = _omnipack("demo", "--help").stdout
    assert "(default: 200)" in " ".join(demo.split())


def test_summary_prints_the_bound_the_packer_is_measured_against(
    tmp_path, demo_tokenizer, demo_corpus, capsys
):
    from omnipack.cli import _summary_rows

    manifest, media = demo_corpus
    assert main([*_prepare_args(manifest, media, demo_tokenizer, tmp_path / "ds"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    meta = json.loads((tmp_path / "ds" / ".nv-meta" / "omnipack.json").read_text())
    p = meta["packing"]
    rows = dict(_summary_rows(meta))
    assert rows["rows lower bound"].startswith(f"{max(p['l1'], p['l2'], p['dff'])} = max(L1")
    # the DFF bound can sit below L1: the bound shown is the max, the others its parts
    low = dict(_summary_rows({**meta, "packing": {**p, "l1": 1269, "l2": 1269, "dff": 1182}}))
    bound = low["rows lower bound"]
    assert bound.startswith("1269 = max(") and "DFF Fekete-Schepers 1182" in bound
    # the rejects file and the most common reasons, at the end of every run
    rejects = tmp_path / "ds" / "rejects.jsonl"
    n = len(rejects.read_text().splitlines())
    assert n > 0 and f"rejects: {n} in {rejects}" in err and "most common reasons:" in err
    assert "x missing image file: " in err


def test_ctrl_c_prints_one_line_and_the_rerun_resumes(tmp_path, demo_tokenizer, demo_corpus):
    import signal
    import time

    manifest, media = demo_corpus
    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "omnipack", *_prepare_args(manifest, media, demo_tokenizer, out)]
    cmd += ["-j", "2", "--part-lines", "8", "--shard-max-rows", "1", "--seq-length", "2048"]
    # the last write unit is held at its commit point: the signal lands while the run works, however loaded
    # the machine (a run of 7 small shards can otherwise end between two polls)
    env = {**os.environ, HOLD_ENV: "write:6"}
    proc = subprocess.Popen(
        cmd,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
        # SIGINT handled as in a terminal, also where this test runs in the background (a shell without job
        # control starts background commands with SIGINT ignored, and the child would inherit that)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first_shard = out / "stages" / "write" / "shard-000000.json"
    deadline = time.monotonic() + 300
    while not first_shard.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.startswith("omnipack prepare: reading 1 input file(s): ")  # said at once, before any work
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [line for line in err.splitlines() if "interrupted" in line]
    assert lines == ["omnipack prepare: interrupted; rerun the same command to resume"], err
    assert not (out / ".nv-meta" / "omnipack.json").exists()

    res = run_omnipack(cmd[3:], dict(os.environ), timeout=600)  # the same command, in a warm child
    assert res.returncode == 0, res.stderr
    parts = len(list((out / "stages" / "measure").glob("part-*.json")))
    assert f"resuming: {parts} of {parts} measure units done" in res.stderr
    shards = len(json.loads((out / ".nv-meta" / "omnipack.json").read_text())["shards"])
    done = re.search(rf"resuming: (\d+) of {shards} write units done \((\d+) of (\d+) rows\)", res.stderr)
    assert done and 1 <= int(done.group(1)) <= shards, res.stderr  # all: the signal came during finalize


def test_no_text_tells_users_to_install_the_package_index_name():
    """``omnipack`` on the package index is an unrelated project: the README, docstrings and messages say to
    install from the repository or its wheel (``pip install '.[ray]'``), never ``pip install omnipack``."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    index_name = re.compile(r"pip install\s+[\"']?omnipack\b")
    offenders = []
    texts = [root / "README.md", root / "benchmarks" / "README.md", *sorted((root / "omnipack").rglob("*.py"))]
    for path in texts:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if index_name.search(line) and "never" not in line:
                offenders.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


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
