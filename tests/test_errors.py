"""Error semantics of a run: a data problem is a recorded reject with its reason; a bug (any other error in a
stage's work, a ``TypeError`` or a ``ValueError`` alike) fails the run with its traceback, naming the sample;
a usage error (a bad flag or setting) is one line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omnipack.cli import main
from omnipack.errors import SampleReject, StageError
from omnipack.manifest import ManifestError
from omnipack.media.access import StoreAccessError
from omnipack.media.errors import MediaError
from omnipack.profiles import MediaRejected
from omnipack.text.chat import SampleRejected

ODD_WIDTH = 47  # the one image the broken profile below fails on


def _corpus(root: Path, n: int = 100) -> tuple[Path, Path]:
    """``n`` samples with an image each; sample ``odd`` (the 38th) alone has an image ``ODD_WIDTH`` wide."""
    media = root / "media"
    media.mkdir(parents=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(media / "a.png")
    Image.fromarray(rng.integers(0, 255, (33, ODD_WIDTH, 3), dtype=np.uint8)).save(media / "odd.png")
    lines = []
    for i in range(n):
        sid, image = ("odd", "odd.png") if i == 37 else (f"s{i}", "a.png")
        user = [{"type": "image", "image": image}, {"type": "text", "text": f"what is {i}?"}]
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": f"it is {i}"}]
        lines.append(json.dumps({"id": sid, "messages": messages}))
    manifest = root / "m.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest, media


def _argv(manifest: Path, media: Path, tokenizer: Path, out: Path, *extra: str) -> list[str]:
    return ["prepare", "--manifest", str(manifest), "--media-root", str(media), "--tokenizer", str(tokenizer),
            "-o", str(out), "--seq-length", "1024", "--no-progress", *extra]  # fmt: skip


# The qwen2_5_vl profile with a bug that hits one image size only (under the 5% reject guard).
BROKEN_PLAN = f"""
from omnipack.profiles.qwen_vl import QwenVLProfile

_plan = QwenVLProfile.plan

def plan(self, meta):
    if meta.width == {ODD_WIDTH}:
        return None + 1  # TypeError
    return _plan(self, meta)

QwenVLProfile.plan = plan
"""


def test_data_errors_are_sample_rejects():
    for cls in (ManifestError, MediaError, StoreAccessError, MediaRejected, SampleRejected):
        assert issubclass(cls, SampleReject)
    e = MediaError("missing image file: x.png")
    assert e.reason == "missing image file: x.png" and e.stage is None
    assert SampleReject("r", stage="read").stage == "read"


def test_a_profile_bug_on_one_sample_fails_the_run_naming_it(tmp_path, demo_tokenizer, monkeypatch):
    """Before: the TypeError became a reject ("unexpected TypeError"), 1 of 100 is under the 5% guard, and
    the run exited 0 with the sample silently dropped from training."""
    manifest, media = _corpus(tmp_path / "in")
    from omnipack.profiles.qwen_vl import QwenVLProfile

    plan = QwenVLProfile.plan

    def broken(self, meta):
        if meta.width == ODD_WIDTH:
            return None + 1  # TypeError
        return plan(self, meta)

    monkeypatch.setattr(QwenVLProfile, "plan", broken)
    with pytest.raises(StageError, match=r"measure: sample 'odd' \(m.jsonl:38\) failed with TypeError") as info:
        main(_argv(manifest, media, demo_tokenizer, tmp_path / "out"))
    assert isinstance(info.value.__cause__, TypeError)  # the bug's own traceback is kept
    assert not (tmp_path / "out" / ".nv-meta").exists()  # no dataset that looks whole


def test_the_command_line_shows_the_bug_s_traceback_from_a_pool_worker(tmp_path, demo_tokenizer):
    """``omnipack prepare`` on two worker processes (each imports the broken profile: a ``sitecustomize``):
    exit 1 with the worker's traceback of the TypeError, then the StageError naming the sample."""
    import os

    manifest, media = _corpus(tmp_path / "in")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BROKEN_PLAN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    argv = _argv(manifest, media, demo_tokenizer, tmp_path / "out", "--workers", "2", "--part-lines", "20")
    res = subprocess.run(
        [sys.executable, "-m", "omnipack", *argv], capture_output=True, text=True, timeout=300, env=env
    )
    assert res.returncode == 1, res.stderr
    assert "Traceback" in res.stderr and 'sitecustomize.py", line' in res.stderr  # where the bug is
    assert "TypeError: unsupported operand" in res.stderr
    assert res.stderr.rstrip().splitlines()[-1].startswith(
        "omnipack.errors.StageError: measure: sample 'odd' (m.jsonl:38) failed with TypeError"
    )


def test_a_value_error_bug_in_a_stage_is_not_a_usage_error(tmp_path, demo_tokenizer, monkeypatch):
    """Before: the CLI turned any ValueError into "error: ..." and exit 2, as if a flag were wrong."""
    import omnipack.stages.pack as pack

    def broken_layout(*args, **kwargs):
        raise ValueError("cannot reshape array of size 3 into shape (2,)")

    monkeypatch.setattr(pack, "shard_layout", broken_layout)
    manifest, media = _corpus(tmp_path / "in", n=10)
    with pytest.raises(StageError, match="pack stage failed with ValueError: cannot reshape") as info:
        main(_argv(manifest, media, demo_tokenizer, tmp_path / "out"))
    assert isinstance(info.value.__cause__, ValueError)


def test_a_bug_in_the_write_stage_names_the_sample(tmp_path, demo_tokenizer, monkeypatch):
    import omnipack.stages.write as write

    materialize = write.materialize

    def broken(source, plan, **kw):
        if source.ref == "odd.png":
            raise KeyError("frames")
        return materialize(source, plan, **kw)

    monkeypatch.setattr(write, "materialize", broken)
    manifest, media = _corpus(tmp_path / "in", n=40)
    with pytest.raises(StageError, match=r"write: sample 'odd' \(m.jsonl:38\) failed with KeyError"):
        main(_argv(manifest, media, demo_tokenizer, tmp_path / "out"))


def test_a_bad_flag_value_is_still_one_line_and_exit_2(tmp_path, demo_tokenizer, capsys):
    manifest, media = _corpus(tmp_path / "in", n=4)
    assert main(_argv(manifest, media, demo_tokenizer, tmp_path / "out", "--cp", "4", "--seq-length", "1002")) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "not a multiple of the alignment 8" in err[0] and "Traceback" not in err[0]


def test_a_template_refusing_a_conversation_is_a_reject(tmp_path, demo_tokenizer):
    """A chat template's raise_exception() is about the sample (e.g. roles that do not alternate): a reject."""
    import shutil

    tok = tmp_path / "tok"
    shutil.copytree(demo_tokenizer, tok)
    config = json.loads((tok / "tokenizer_config.json").read_text())
    template = (tok / "chat_template.jinja").read_text() if (tok / "chat_template.jinja").exists() else None
    guard = "{% if messages[0]['content'] == 'refuse me' %}{{ raise_exception('no refusals here') }}{% endif %}"
    if template is not None:
        (tok / "chat_template.jinja").write_text(guard + template)
    else:
        config["chat_template"] = guard + config["chat_template"]
        (tok / "tokenizer_config.json").write_text(json.dumps(config))
    manifest = tmp_path / "m.jsonl"
    rows = [{"id": f"s{i}", "messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
            for i in range(30)]  # fmt: skip
    rows[3]["messages"][0]["content"] = "refuse me"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert main(["prepare", "--manifest", str(manifest), "--tokenizer", str(tok), "-o", str(out),
                 "--seq-length", "1024", "--no-progress"]) == 0  # fmt: skip
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert rejects == [
        {"sample_index": 3, "sample_id": "s3", "source": "m.jsonl:4", "stage": "measure",
         "reason": "the chat template refused the conversation: no refusals here"}
    ]  # fmt: skip


def test_a_reject_round_trips_through_its_rejects_jsonl_line():
    from omnipack.errors import Reject

    line = '{"sample_index": 205, "sample_id": "bad-long", "source": "manifest.jsonl:206", "stage": "pack", ' \
        '"reason": "over-length: 20027 tokens"}'
    r = Reject.from_json(json.loads(line))
    assert r == Reject(205, "bad-long", "manifest.jsonl:206", "pack", "over-length: 20027 tokens")
    assert json.dumps(r.to_json()) == line  # the same bytes: keys in the file's order
    assert Reject.of(3, "s3", "m.jsonl:4", "write", MediaError("unreadable image")).stage == "write"
    assert Reject.of(3, "s3", "m.jsonl:4", "write", SampleReject("dup", stage="read")).stage == "read"
