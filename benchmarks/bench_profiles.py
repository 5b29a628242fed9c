"""Native profile vs processor-backed profile (``hf``) on the same corpus: what the native families buy.

The model: a Gemma 3 folder (the released preprocessor settings, 896 px views, Gemma's tokenizer layout,
``config.json`` model_type ``gemma3``; ``tests/test_profile_hf_native.py`` builds it and proves both
profiles give the same ids, labels and pixels). Gemma 3 is the native family whose processor transformers
builds without torchvision (the other families' processors hold a torchvision video processor).

Corpus: ``--samples`` conversations (default 96), each with one photo-like PNG of ``--sizes`` distinct sizes
(default 50, 200-1400 px a side) and a short exchange. Each profile runs measure -> pack -> write ->
finalize (1 local worker, W=8192) ``--repeats`` times (default 2; the best time per stage counts: the
machine is shared), each run in a fresh process (no profile, tokenizer or processor cache carried over),
stage by stage:

- measure samples/s: the chat template, tokenization and each image's plan (native: omnipack's resize
  rules; hf: the processor run once per distinct image size, then its cache);
- write samples/s: decode every image and store its payload (native: the uint8 views, normalized by the
  trainer half at load; hf: the processor's float32 ``pixel_values``, run on each image);
- shard bytes/sample: the finished dataset's shards over packed samples.

    PYTHONPATH=. python benchmarks/bench_profiles.py                   # ~5 min on 2 cores
    PYTHONPATH=. python benchmarks/bench_profiles.py --pan-and-scan    # crops too (more views per image)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["TOKENIZERS_PARALLELISM"] = "false"

CACHE = Path(tempfile.gettempdir()) / "omnipack_bench_profiles"


def model_dir() -> Path:
    """The Gemma 3 checkpoint folder at the released 896 px view, built once into the cache."""
    from tests.test_profile_hf_native import build_gemma3_checkpoint

    out = CACHE / "gemma3"
    if not (out / "config.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        build_gemma3_checkpoint(out, view=896)
    return out


def corpus(n: int, n_sizes: int) -> tuple[Path, Path]:
    """``n`` one-image conversations over ``n_sizes`` photo-like images of distinct sizes."""
    from PIL import Image

    root = CACHE / f"corpus_{n}_{n_sizes}"
    manifest, media = root / "manifest.jsonl", root / "media"
    if manifest.exists():
        return manifest, media
    rng = np.random.default_rng(0)
    media.mkdir(parents=True, exist_ok=True)
    sizes: set[tuple[int, int]] = set()
    while len(sizes) < n_sizes:
        sizes.add((int(rng.integers(200, 1400)), int(rng.integers(200, 1400))))
    for k, (h, w) in enumerate(sorted(sizes)):
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x // 7 + y // 5) % 256], -1)
        px = (base + rng.integers(0, 24, (h, w, 3))).clip(0, 255).astype(np.uint8)
        Image.fromarray(px).save(media / f"img{k}.png")
    lines = []
    for i in range(n):
        user = [{"type": "image", "image": f"img{int(rng.integers(n_sizes))}.png"}]
        user.append({"type": "text", "text": f"What does picture {i} show? Answer in one sentence."})
        msgs = [
            {"role": "user", "content": user},
            {"role": "assistant", "content": [{"type": "text", "text": "A colour gradient with fine noise."}]},
        ]
        lines.append(json.dumps({"id": f"s-{i:05d}", "messages": msgs}) + "\n")
    manifest.write_text("".join(lines))
    return manifest, media


def run_profile(name: str, options: dict, corpus_paths: tuple[Path, Path], out: Path, n: int) -> dict:
    """One whole run, stage by stage (measure and write timed, the executor already started)."""
    from bench_scale import timed_stages

    from omnipack.pipeline import PrepareConfig

    folder = model_dir()
    cfg = PrepareConfig(
        manifest=[str(corpus_paths[0])],
        media_root=str(corpus_paths[1]),
        tokenizer=str(folder),
        model=str(folder),
        profile=name,
        profile_options=options,
        output=str(out),
        seq_length=8192,
        workers=1,
        part_lines=max(1, -(-n // 4)),
        progress=False,
    )
    summary, seconds = timed_stages(cfg, "local", 1)
    meta = json.loads((out / ".nv-meta" / "omnipack.json").read_text())
    return {
        "measure_s": seconds["measure_s"],
        "write_s": seconds["write_s"],
        "packed": summary["counts"]["packed"],
        "shard_bytes": sum(s["num_bytes"] for s in summary["shards"]),
        "processor_cache": meta.get("processor_cache"),
    }


def run_fresh(name: str, options: dict, n: int, n_sizes: int) -> dict:
    """``run_profile`` in a fresh interpreter: its result (the last line it prints, JSON)."""
    cmd = [sys.executable, __file__, "--one", json.dumps([name, options]), "--samples", str(n), "--sizes", str(n_sizes)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{name} run failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--sizes", type=int, default=50, help="distinct image sizes in the corpus")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--pan-and-scan", action="store_true", help="Gemma 3's pan-and-scan crops, both profiles")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: one run, JSON [profile, options]
    args = ap.parse_args()

    paths = corpus(args.samples, args.sizes)
    if args.one:
        name, options = json.loads(args.one)
        print(json.dumps(run_profile(name, options, paths, CACHE / "out" / name, args.samples)))
        return
    model_dir()  # built once, before the runs
    pas = {"do_pan_and_scan": True} if args.pan_and_scan else {}
    configs = {"gemma3 (native)": ("gemma3", dict(pas)), "hf (Gemma3Processor)": ("hf", {"processor_kwargs": pas})}
    best: dict[str, dict] = {}
    for _ in range(args.repeats):
        for label, (name, options) in configs.items():
            r = run_fresh(name, options, args.samples, args.sizes)
            assert r["packed"] == args.samples, r
            prev = best.get(label)
            best[label] = r if prev is None else {
                **r, "measure_s": min(r["measure_s"], prev["measure_s"]), "write_s": min(r["write_s"], prev["write_s"])
            }
    n = args.samples
    print(f"\n{n} samples, one image each of {args.sizes} sizes (200-1400 px), 896 px views"
          f"{', pan-and-scan' if pas else ''}; best of {args.repeats}\n")
    print("| profile | measure samples/s | write samples/s | shard bytes/sample | processor calls (measure) |")
    print("|---|---:|---:|---:|---|")
    for label, r in best.items():
        cache = (r["processor_cache"] or {}).get("image")
        calls = f"{cache['processor_calls']} calls, {cache['cache_hits']} hits" if cache else "-"
        print(f"| {label} | {n / r['measure_s']:.1f} | {n / r['write_s']:.1f} | "
              f"{r['shard_bytes'] / n / 1e6:.2f} MB | {calls} |")


if __name__ == "__main__":
    main()
