"""Repack against a first prepare and against ``cp -r`` of the same shard bytes, on a photo corpus.

Corpus: distinct JPEG photos at camera sizes (``bench_loader``'s photo generator: smooth content plus
sensor-like noise, quality 90), one or two per sample with short texts, profile qwen2_5_vl, one worker.

1. first prepare at ``--seq-length`` (measure, pack, write: decode + HF-exact resize of every photo; the write
   stage keeps each payload in the run's sample store, ``stages/samples``);
2. ``--repeats`` repacks of the same output (``--from-stage pack``), to ``--repack-seq-length`` and half of it
   in turn: pack and write again, the payloads copied from the store; the media folder is moved away
   meanwhile, so no photo can be read;
3. after each repack, ``cp -r`` of its shard folder to a new folder (the same bytes, written once more);
4. with ``--check``: a fresh prepare at the last repack's seq length without a store, whose shards must equal
   the repack's byte for byte.

Timings are wall seconds of each whole command (``run_prepare`` in this process: tokenizer load, stages,
finalize); files are in the page cache for every step alike (nothing is dropped on a shared machine).

    PYTHONPATH=. python benchmarks/bench_repack.py --quick --check    # 64 samples, ~2 min
    PYTHONPATH=. python benchmarks/bench_repack.py --check            # 240 samples, ~5 min
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_loader import PHOTO_SIZES, WORDS, _smooth  # noqa: E402


def build_photos(root: Path, samples: int, seed: int = 0) -> tuple[Path, Path]:
    """One distinct photo per sample (every third sample a second one), and the manifest."""
    rng = np.random.default_rng(seed)
    media = root / "media"
    media.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(samples):
        names = []
        for j in range(1 + (i % 3 == 0)):
            h, w = PHOTO_SIZES[int(rng.integers(len(PHOTO_SIZES)))]
            name = f"photo{i:05d}-{j}.jpg"
            Image.fromarray(_smooth(rng, h, w, 6)).save(media / name, quality=90)
            names.append(name)
        words = " ".join(rng.choice(WORDS, size=int(rng.integers(10, 60))))
        answer = " ".join(rng.choice(WORDS, size=int(rng.integers(20, 150))))
        user = [{"type": "image", "image": n} for n in names] + [{"type": "text", "text": words}]
        msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        lines.append(json.dumps({"id": f"s{i:05d}", "messages": msgs}) + "\n")
    manifest = root / "manifest.jsonl"
    manifest.write_text("".join(lines))
    return manifest, media


def _prepare(out: Path, tok: Path, manifest: Path, media: Path, seq_length: int, **kw) -> float:
    from omnipack.pipeline import PrepareConfig, run_prepare

    cfg = PrepareConfig(
        manifest=[str(manifest)], media_root=str(media), tokenizer=str(tok), output=str(out),
        profile="qwen2_5_vl", seq_length=seq_length, progress=False, **kw,
    )  # fmt: skip
    t = time.perf_counter()
    run_prepare(cfg)
    return time.perf_counter() - t


def _shard_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted((root / "shards").rglob("*")) if p.is_file()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="64 samples")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--seq-length", type=int, default=16384)
    ap.add_argument("--repack-seq-length", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3, help="repacks (lengths in turn), each followed by a cp")
    ap.add_argument("--check", action="store_true", help="also a fresh prepare at the repack's length, compared")
    args = ap.parse_args()
    samples = args.samples or (64 if args.quick else 240)

    from omnipack.demo.tokenizer import build_demo_tokenizer

    with tempfile.TemporaryDirectory(prefix="omnipack-bench-repack-") as tmp:
        root = Path(tmp)
        tok = build_demo_tokenizer(root / "tok", profile="qwen2_5_vl")
        t = time.perf_counter()
        manifest, media = build_photos(root / "src", samples)
        print(f"corpus: {samples} samples, {len(list(media.iterdir()))} photos ({time.perf_counter() - t:.1f} s)")
        out = root / "ds"
        first = _prepare(out, tok, manifest, media, args.seq_length)
        lengths = [args.repack_seq_length, args.repack_seq_length // 2]  # each repack changes the length
        repacks, cps = [], []
        hidden = media.with_name("media-away")
        for k in range(args.repeats):
            media.rename(hidden)  # the repack must not read a photo
            try:
                repacks.append(_prepare(out, tok, manifest, media, lengths[k % 2], from_stage="pack"))
            finally:
                hidden.rename(media)
            shutil.rmtree(root / "copy", ignore_errors=True)
            t = time.perf_counter()
            subprocess.run(["cp", "-r", str(out / "shards"), str(root / "copy")], check=True)
            cps.append(time.perf_counter() - t)
        size = sum(p.stat().st_size for p in (out / "shards").rglob("*") if p.is_file())
        store = sum(p.stat().st_size for p in (out / "stages" / "samples").rglob("*") if p.is_file())
        repack, cp = statistics.median(repacks), statistics.median(cps)
        rows = [
            (f"first prepare (W={args.seq_length})", first),
            (f"repack (W={' / '.join(map(str, lengths))} in turn, --from-stage pack), median", repack),
            ("cp -r of the repacked shards, median", cp),
        ]
        if args.check:  # the last repack's length, fresh
            fresh = root / "fresh"
            w = lengths[(args.repeats - 1) % 2]
            rows.append((f"fresh prepare (W={w}, no store)", _prepare(fresh, tok, manifest, media, w, sample_store="off")))
            same = _shard_bytes(fresh) == _shard_bytes(out)
        print(f"\nshards: {size / 2**20:.1f} MiB; sample store: {store / 2**20:.1f} MiB")
        print(f"repacks: {', '.join(f'{s:.2f}' for s in repacks)} s; cp: {', '.join(f'{s:.2f}' for s in cps)} s\n")
        print("| step | wall s | first prepare / step | step / cp |")
        print("|---|---:|---:|---:|")
        for name, s in rows:
            print(f"| {name} | {s:.2f} | x{first / s:.1f} | x{s / cp:.2f} |")
        if args.check:
            print(f"\nrepacked shards byte-identical to the fresh prepare's: {same}")
        shutil.rmtree(root / "copy", ignore_errors=True)


if __name__ == "__main__":
    main()
