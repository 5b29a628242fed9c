"""A small demo dataset for the tools tests, and helpers that damage copies of it."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from omnipack.demo.corpus import build_demo_corpus
from omnipack.demo.tokenizer import build_demo_tokenizer
from omnipack.pipeline import PrepareConfig, run_prepare
from omnipack.tools.dataset_reader import RawRow, ShardReader
from omnipack.writer.shards import file_sha256


def build_small_dataset(root: Path, num_samples: int = 24) -> Path:
    """24 good samples (+6 broken ones the demo adds), W=2048, cp=2 (align 4), 2 rows per shard."""
    src = root / "source"
    tok = build_demo_tokenizer(src / "tokenizer")
    manifest, media = build_demo_corpus(src, num_samples=num_samples)
    out = root / "dataset"
    cfg = PrepareConfig(
        manifest=[str(manifest)],
        media_root=str(media),
        tokenizer=str(tok),
        output=str(out),
        seq_length=2048,
        cp=2,
        shard_max_rows=2,
        progress=False,
    )
    run_prepare(cfg)
    return out


def copy_dataset(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def rewrite_shard(
    root: Path, shard: str, transform: Callable[[list[RawRow]], list[RawRow]], *, fix_metadata: bool = True
) -> None:
    """Rewrite ``shard`` with ``transform`` applied to its rows, with a correct ``.tar.idx``; with
    ``fix_metadata`` also the recorded count/size/sha256, so only the damage itself remains."""
    path = root / shard
    rows = transform(list(ShardReader(path)))
    buf = io.BytesIO()
    offsets = []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for r in rows:
            offsets.append(tar.offset)
            for part, data in r.parts.items():
                info = tarfile.TarInfo(f"{r.key}.{part}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        offsets.append(tar.offset)
    path.write_bytes(buf.getvalue())
    Path(str(path) + ".idx").write_bytes(np.asarray(offsets, dtype="<u8").tobytes())
    if fix_metadata:
        meta_path = root / ".nv-meta" / "omnipack.json"
        meta = json.loads(meta_path.read_text())
        for s in meta["shards"]:
            if s["path"] == shard:
                s.update(count=len(rows), num_bytes=path.stat().st_size, sha256=file_sha256(path))
        meta_path.write_text(json.dumps(meta))
        info_path = root / ".nv-meta" / ".info.json"
        info = json.loads(info_path.read_text())
        info["shard_counts"][shard] = len(rows)
        info_path.write_text(json.dumps(info))


def edit_json(path: Path, fn: Callable[[dict], None]) -> None:
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d))
