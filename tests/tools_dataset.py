"""A small demo dataset for the tools tests, helpers that damage copies of it, and one that stops the loader
workers a failed load leaves behind."""

from __future__ import annotations

import gc
import io
import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from omnipack.dataset.codec import decode_row
from omnipack.dataset.contract import DIGESTS_KEY, META_PART, content_digests
from omnipack.dataset.reader import RawRow, ShardReader
from omnipack.dataset.shards import file_digests
from omnipack.demo.corpus import build_demo_corpus
from omnipack.demo.tokenizer import build_demo_tokenizer
from omnipack.pipeline import PrepareConfig, run_prepare
from omnipack.profiles import get_profile

TWIN_IDS = ("twin-a", "twin-b")  # two samples whose images differ but share one size
DUPLICATE_ID = "dup-id"  # two input lines share this id: one is packed, the other rejected as a duplicate


def _add_twins_and_duplicate_ids(manifest: Path, media: Path) -> None:
    """Extra manifest lines: two same-size images in different samples, and one id on two lines (the
    reader packs the first and rejects the second: the id is not a sample's identity, its input index is)."""
    for name, value in (("twin_a.png", 40), ("twin_b.png", 200)):
        pixels = np.full((56, 84, 3), value, dtype=np.uint8)
        pixels[::7] = 255 - value  # stripes, so resizing keeps the two apart
        Image.fromarray(pixels).save(media / name)

    def line(sid: str, image: str | None, text: str) -> dict:
        user = ([{"type": "image", "image": image}] if image else []) + [{"type": "text", "text": text}]
        return {
            "id": sid,
            "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": text}],
        }

    extra = [
        line(TWIN_IDS[0], "twin_a.png", "The left picture."),
        line(TWIN_IDS[1], "twin_b.png", "The right picture."),
        line(DUPLICATE_ID, None, "Red square in the corner."),
        line(DUPLICATE_ID, None, "Blue circle, large and bright."),
    ]
    with open(manifest, "a") as f:
        for x in extra:
            f.write(json.dumps(x) + "\n")


def build_small_dataset(
    root: Path, num_samples: int = 24, *, mrope: bool = False, extras: bool = False, **settings: Any
) -> Path:
    """24 good samples (+6 broken ones the demo adds), W=2048, cp=2 (align 4), 2 rows per shard.

    ``extras`` adds twin-size images and a duplicated id (``_add_twins_and_duplicate_ids``)."""
    src = root / "source"
    tok = build_demo_tokenizer(src / "tokenizer")
    manifest, media = build_demo_corpus(src, num_samples=num_samples)
    if extras:
        _add_twins_and_duplicate_ids(manifest, media)
    out = root / "dataset"
    cfg = PrepareConfig(
        manifest=[str(manifest)],
        media_root=str(media),
        tokenizer=str(tok),
        output=str(out),
        seq_length=2048,
        cp=2,
        mrope=mrope,
        shard_max_rows=2,
        progress=False,
        **settings,
    )
    run_prepare(cfg)
    return out


def build_av_dataset(root: Path, num_samples: int = 12) -> Path:
    """qwen3_omni with audio-in-video and mRoPE: images, videos (npz frames + audio) and audio clips."""
    profile, options = "qwen3_omni", {"use_audio_in_video": True}
    src = root / "source"
    tok = build_demo_tokenizer(src / "tokenizer", profile=profile)
    manifest, media = build_demo_corpus(
        src, num_samples=num_samples, kinds=get_profile(profile, **options).kinds
    )
    out = root / "dataset"
    cfg = PrepareConfig(
        manifest=[str(manifest)],
        media_root=str(media),
        tokenizer=str(tok),
        output=str(out),
        profile=profile,
        profile_options=options,
        mrope=True,
        seq_length=4096,
        cp=2,
        shard_max_rows=2,
        progress=False,
    )
    run_prepare(cfg)
    return out


def resign(row: RawRow) -> RawRow:
    """Recompute a damaged row's content fingerprints, as a thorough forger would: then only the deep
    check aimed at the damage can see it."""
    arrays, _ = decode_row(row.parts)
    meta = json.loads(row.parts[META_PART])
    meta[DIGESTS_KEY] = content_digests(arrays, row.parts)
    row.parts[META_PART] = json.dumps(meta).encode()
    return row


def copy_dataset(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def rewrite_shard(
    root: Path, shard: str, transform: Callable[[list[RawRow]], list[RawRow]], *, fix_metadata: bool = True
) -> None:
    """Rewrite ``shard`` with ``transform`` applied to its rows, with a correct ``.tar.idx``; with
    ``fix_metadata`` also the recorded count/size/checksums, so only the damage itself remains."""
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
                digests = file_digests(path, ("sha256", "xxh3_128"))
                s.update(count=len(rows), num_bytes=path.stat().st_size, **digests)
        meta_path.write_text(json.dumps(meta))
        info_path = root / ".nv-meta" / ".info.json"
        info = json.loads(info_path.read_text())
        info["shard_counts"][shard] = len(rows)
        info_path.write_text(json.dumps(info))


def edit_json(path: Path, fn: Callable[[dict], None]) -> None:
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d))


def stop_loader_workers() -> None:
    """Stop the workers of every PyTorch loader iterator left in this process. A load that failed leaves its
    loader in reference cycles (the error's frames, Energon's own). A garbage collection would then stop each
    worker only at PyTorch's 5 s join timeout, during the next test."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    for obj in gc.get_objects():
        # type(), not isinstance(): the heap holds dead weak proxies (Energon's), which isinstance() dereferences
        if issubclass(type(obj), _MultiProcessingDataLoaderIter):
            obj._shutdown_workers()
