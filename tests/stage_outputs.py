"""Helpers for the scale-out tests: one prepare config for the demo corpus, and a dataset's bytes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from omnipack.pipeline import PrepareConfig
from omnipack.stages.records import CRASH_ENV
from tests.prepare_child import run_omnipack


def demo_config(out: Path, tokenizer: Path, corpus: tuple[Path, Path], **kw) -> PrepareConfig:
    manifest, media = corpus
    settings = {"seq_length": 2048, "cp": 2, "shard_max_rows": 3, "part_lines": 16, "progress": False, **kw}
    return PrepareConfig(
        manifest=[str(manifest)], media_root=str(media), tokenizer=str(tokenizer), output=str(out), **settings
    )


def cli_args(cfg: PrepareConfig) -> list[str]:
    """The ``omnipack prepare`` flags of a demo config."""
    return [
        "prepare",
        "--manifest",
        *cfg.manifest,
        "--media-root",
        cfg.media_root,
        "--tokenizer",
        cfg.tokenizer,
        "--output",
        cfg.output,
        "--seq-length",
        str(cfg.seq_length),
        "--cp",
        str(cfg.cp),
        "--shard-max-rows",
        str(cfg.shard_max_rows),
        "--part-lines",
        str(cfg.part_lines),
        "--workers",
        str(cfg.workers),
        "--no-progress",
        "--max-reject-fraction",
        "0.2",  # the demo corpus holds 6 broken samples in 66
    ]


def dataset_bytes(root: Path) -> dict[str, bytes]:
    """Every file a reader of the dataset sees: shards, their indexes, metadata and rejects."""
    files = [*root.glob("shards/*"), *root.glob(".nv-meta/*"), root / "rejects.jsonl"]
    out = {str(p.relative_to(root)): p.read_bytes() for p in files}
    assert any(k.endswith(".tar") for k in out) and any(k.endswith(".tar.idx") for k in out)
    assert ".nv-meta/omnipack.json" in out
    return out


def prepare_in_subprocess(
    cfg: PrepareConfig, crash_at: str | None = None, *, args: tuple[str, ...] = (), env: dict | None = None
) -> subprocess.CompletedProcess:
    """``omnipack prepare`` for ``cfg`` (and more flags ``args``) in a child process (the environment carried,
    e.g. AWS_* settings, with ``env`` on top), killed with SIGKILL at ``crash_at`` (``OMNIPACK_CRASH_AT``).
    The child is forked from a process that imported the prepare stack once (``tests/prepare_child.py``)."""
    child_env = {k: v for k, v in os.environ.items() if k != CRASH_ENV} | (env or {})
    if crash_at:
        child_env[CRASH_ENV] = crash_at
    return run_omnipack([*cli_args(cfg), *args], child_env, timeout=300)
