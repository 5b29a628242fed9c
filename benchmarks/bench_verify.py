"""``omnipack verify`` against the cost of reading the dataset's bytes, on image datasets.

Corpus: photo-like JPEGs at camera sizes (smooth content plus sensor noise, so PNG and JPEG cost what real
photos cost), one image per sample with a short chat, prepared with ``qwen2_5_vl`` once per stored image
encoding (``png``, ``npy``; others when ``--encodings`` names them and ``prepare`` knows them).

Measured per dataset, page cache warm (each timing is the best of ``--repeat`` runs), one process:

- **read floor**: read every byte of every file under the dataset (1 MiB reads): the least any check of
  the bytes costs;
- **read + sha256**: the floor plus hashing the shards, which verify must do to compare the sha256
  recorded at write time (the hash alone is far slower than a page-cache read);
- **verify --no-payloads** and **verify** (payloads: exact shapes from headers, fingerprints, features);
- **verify --no-checksums**: every check but the shards' sha256 (the fingerprints still cover content);
- **decode payloads**: reading the shards and fully decoding every media part (what payload checks cost
  when they decode pixels, as verify did before it read headers).
- **verify --source** against **prepare**: every sample re-derived from the corpus (measure and media
  materialised, no packing or writing) with prepare's worker count, once, against prepare's own time.

Ratios are against the read floor, and against read + sha256. ``-j`` runs verify with that many worker
processes as well (the floor stays single-process).

    PYTHONPATH=. python benchmarks/bench_verify.py --quick   # ~1 min: 60 photos
    PYTHONPATH=. python benchmarks/bench_verify.py           # 240 photos
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The loader benchmark's photo generator and words: the same camera-size, JPEG-noisy photos.
from bench_loader import PHOTO_SIZES, WORDS, _smooth  # noqa: E402


def build_corpus(root: Path, n: int, seed: int = 0) -> tuple[Path, Path]:
    """``n`` samples, one JPEG photo each; returns (manifest, media root)."""
    rng = np.random.default_rng(seed)
    media = root / "media"
    media.mkdir(parents=True, exist_ok=True)
    for i, (h, w) in enumerate(PHOTO_SIZES):
        Image.fromarray(_smooth(rng, h, w, 6.0)).save(media / f"photo{i}.jpg", quality=90)
    lines = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS, size=int(rng.integers(5, 40))))
        answer = " ".join(rng.choice(WORDS, size=int(rng.integers(5, 80))))
        user = [
            {"type": "image", "image": f"photo{i % len(PHOTO_SIZES)}.jpg"},
            {"type": "text", "text": text},
        ]
        lines.append(
            {
                "id": f"s{i}",
                "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
            }
        )
    manifest = root / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return manifest, media


PREPARE_WORKERS = 2


def prepare(root: Path, manifest: Path, media: Path, tokenizer: Path, encoding: str) -> Path:
    from omnipack.pipeline import PrepareConfig, run_prepare

    out = root / f"dataset-{encoding}"
    cfg = PrepareConfig(
        manifest=[str(manifest)],
        media_root=str(media),
        tokenizer=str(tokenizer),
        output=str(out),
        seq_length=8192,
        image_encoding=encoding,
        shard_size_mb=64,
        workers=PREPARE_WORKERS,
        mrope=False,  # the recorded numbers' workload (mRoPE ids are on by default now)
        progress=False,
    )
    run_prepare(cfg)
    return out


def _files(ds: Path) -> list[Path]:
    return sorted(p for p in ds.rglob("*") if p.is_file() and "stages" not in p.relative_to(ds).parts)


def read_floor(ds: Path) -> int:
    """Read every byte of the dataset (shards, indexes, metadata); returns the byte count."""
    total = 0
    buf = bytearray(1 << 20)
    for p in _files(ds):
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total


def read_hashed(ds: Path, algorithm: str) -> None:
    """The floor plus hashing every shard with ``algorithm`` (xxh3_128: the checksum verify compares)."""
    from omnipack.dataset.shards import new_hasher

    buf = bytearray(1 << 20)
    view = memoryview(buf)
    for p in _files(ds):
        h = new_hasher(algorithm) if p.suffix == ".tar" else None
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                if h is not None:
                    h.update(view[:n])


def decode_payloads(ds: Path) -> None:
    """Read the shards and fully decode every media part."""
    from omnipack.dataset.reader import ShardReader
    from omnipack.loader.media import decode_payload

    for p in sorted(ds.rglob("*.tar")):
        for raw in ShardReader(p):
            for part, data in raw.parts.items():
                if part.startswith("media."):
                    decode_payload(part, data)


def run_verify(ds: Path, payloads: bool, workers: int, checksums: bool = True, sha256: bool = False) -> None:
    from omnipack.tools.verify import run_verify as verify

    results = verify(
        ds, workers=workers, progress=False, payloads=payloads, checksums=checksums, sha256=sha256
    )
    bad = [(r.name, r.failures[:2]) for r in results if r.status == "fail"]
    if bad:
        raise SystemExit(f"verify failed on an intact dataset: {bad}")


def run_verify_source(ds: Path, workers: int) -> float:
    """Seconds of the source check alone (every sample re-derived and compared)."""
    from omnipack.tools.verify_source import run_source_check

    t = time.perf_counter()
    failures, notes = run_source_check(ds, fraction=1.0, workers=workers)
    if failures:
        raise SystemExit(f"verify --source failed on an intact dataset: {failures[:2]}")
    return time.perf_counter() - t


def best_of(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="60 photos instead of 240")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--encodings", default="png,npy", help="stored image encodings to prepare")
    ap.add_argument("--dataset", action="append", default=[], help="measure an existing dataset instead")
    ap.add_argument("-j", "--workers", type=int, default=2, help="verify worker processes (0: skip)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n = args.samples or (60 if args.quick else 240)

    tmp = tempfile.TemporaryDirectory(prefix="bench_verify_")
    root = Path(tmp.name)
    datasets = [(Path(d).name, Path(d)) for d in args.dataset]
    prepared: dict[str, float] = {}
    if not datasets:
        from omnipack.demo.tokenizer import build_demo_tokenizer

        tok = build_demo_tokenizer(root / "tokenizer")
        manifest, media = build_corpus(root / "corpus", n)
        for enc in args.encodings.split(","):
            t = time.perf_counter()
            datasets.append((enc, prepare(root, manifest, media, tok, enc)))
            prepared[enc] = time.perf_counter() - t
            print(f"prepared {enc}: {prepared[enc]:.1f} s", file=sys.stderr)

    rows = []
    source_s: dict[str, float] = {}
    for name, ds in datasets:
        size = read_floor(ds)  # also warms the page cache
        floor = best_of(lambda ds=ds: read_floor(ds), args.repeat)
        sha = best_of(lambda ds=ds: read_hashed(ds, "sha256"), args.repeat)
        fast = best_of(lambda ds=ds: read_hashed(ds, "xxh3_128"), args.repeat)
        timings = {
            "verify --no-payloads": best_of(lambda ds=ds: run_verify(ds, False, 1), args.repeat),
            "verify": best_of(lambda ds=ds: run_verify(ds, True, 1), args.repeat),
            "verify --no-checksums": best_of(lambda ds=ds: run_verify(ds, True, 1, False), args.repeat),
        }
        if args.workers > 1:
            timings[f"verify -j {args.workers}"] = best_of(
                lambda ds=ds: run_verify(ds, True, args.workers), args.repeat
            )
        timings["decode payloads (no checks)"] = best_of(lambda ds=ds: decode_payloads(ds), 1)
        rows.append((name, size, floor, fast, sha, timings))
        source_s[name] = run_verify_source(ds, PREPARE_WORKERS)

    print(f"\n{n} photo samples, one image each; best of {args.repeat}; page cache warm\n")
    print("| dataset | MB | read floor s | read+xxh3 s | read+sha256 s | what | s | × floor | × read+sha256 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, size, floor, fast, sha, timings in rows:
        for what, t in timings.items():
            print(
                f"| {name} | {size / 1e6:.0f} | {floor:.3f} | {fast:.3f} | {sha:.3f} | {what} | {t:.3f} | "
                f"{t / floor:.1f} | {t / sha:.2f} |"
            )
    print(f"\n| dataset | prepare s ({PREPARE_WORKERS} workers) | verify --source s | × prepare |")
    print("|---|---|---|---|")
    for name, t in source_s.items():
        p = prepared.get(name)
        print(f"| {name} | {'' if p is None else f'{p:.1f}'} | {t:.1f} | {'' if p is None else f'{t / p:.2f}'} |")
    tmp.cleanup()


if __name__ == "__main__":
    main()
