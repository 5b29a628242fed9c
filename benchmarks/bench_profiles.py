"""Native profile vs processor-backed profile (``hf``) on the same corpus: what the native families buy.

The models: one checkpoint folder per native family (``--families``, default all five), each built by the
test that proves the pair equal, with ``config.json`` naming the family's model_type so the native run picks
its family from the checkpoint:

- ``gemma3``: the released preprocessor settings at 896 px views, Gemma's tokenizer layout
  (``tests/test_profile_hf_native.py``: same ids, labels, ``token_type_ids`` and normalized pixels);
- ``qwen2_5_vl``, ``qwen3_vl``: the family's demo tokenizer and processor class over the PIL image processor
  (``tests/test_profile_hf_native_vision.py``: same ids, labels, ``pixel_values`` and ``image_grid_thw``);
- ``qwen3_omni``: its processor class over the same PIL image processor and Whisper features (same file);
- ``nemotron_omni``: its processor class (same file): the hf profile refuses it at start, and the table
  prints the reason in place of the hf numbers (as for any family hf refuses).

The hf runs pin ``image_backend=pil`` (the backend the native families reproduce; Nemotron's RADIO image
processor has only the torchvision one). Every family but Gemma 3 holds a video processor, which
transformers builds only with torchvision: run them in an environment that has it (a family that cannot
build says so in its row).

Corpus: ``--samples`` conversations (default 96), each with one photo-like PNG of ``--sizes`` distinct sizes
(default 50, 200-1400 px a side) and a short exchange. Each profile runs measure -> pack -> write ->
finalize (1 local worker, W=8192) ``--repeats`` times (default 2; the best time per stage counts: the machine is shared), each run in a fresh
process (no profile, tokenizer or processor cache carried over), stage by stage:

- measure samples/s: the chat template, tokenization and each image's plan (native: omnipack's resize
  rules; hf: the processor run once per distinct image size, then its cache);
- write samples/s: decode every image and store its payload (native: the uint8 views, normalized by the
  trainer half at load; hf: the processor's float32 ``pixel_values``, run on each image);
- shard bytes/sample: the finished dataset's shards over packed samples.

    PYTHONPATH=. python benchmarks/bench_profiles.py --families gemma3     # ~5 min on 2 cores
    PYTHONPATH=. python benchmarks/bench_profiles.py --families gemma3 --pan-and-scan  # crops too
    PYTHONPATH=. python benchmarks/bench_profiles.py                       # all five (with torchvision)
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
# family -> the processor class its checkpoint folder holds (what the hf profile runs)
FAMILIES = {
    "gemma3": "Gemma3Processor",
    "qwen2_5_vl": "Qwen2_5_VLProcessor",
    "qwen3_vl": "Qwen3VLProcessor",
    "qwen3_omni": "Qwen3OmniMoeProcessor",
    "nemotron_omni": "NemotronH_Omni_Reasoning_V3Processor",
}


def build_checkpoint(family: str, out: Path) -> None:
    """``family``'s checkpoint folder, as the side-by-side tests build it."""
    if family == "gemma3":
        from tests.test_profile_hf_native import build_gemma3_checkpoint

        build_gemma3_checkpoint(out, view=896)
        return
    from transformers.utils import is_torchvision_available

    if not is_torchvision_available():  # the test module would skip; say why here
        raise ImportError("its processor holds a video processor, which transformers builds only with torchvision")
    import tests.test_profile_hf_native_vision as side_by_side

    side_by_side.BUILDERS[family](out)


def model_dir(family: str) -> Path:
    """The family's checkpoint folder, built once into the cache."""
    out = CACHE / family
    if not (out / "config.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        build_checkpoint(family, out)
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


def run_profile(family: str, name: str, options: dict, corpus_paths: tuple[Path, Path], out: Path, n: int) -> dict:
    """One whole run, stage by stage (measure and write timed, the executor already started); a profile
    refused at start: its reason."""
    from bench_scale import timed_stages

    from omnipack.pipeline import PrepareConfig

    folder = model_dir(family)
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
    try:
        summary, seconds = timed_stages(cfg, "local", 1)
    except (ValueError, ImportError) as e:  # the processor refused (or cannot be built): the reason is the result
        return {"refused": str(e)}
    meta = json.loads((out / ".nv-meta" / "omnipack.json").read_text())
    return {
        "measure_s": seconds["measure_s"],
        "write_s": seconds["write_s"],
        "packed": summary["counts"]["packed"],
        "shard_bytes": sum(s["num_bytes"] for s in summary["shards"]),
        "processor_cache": meta.get("processor_cache"),
    }


def run_fresh(family: str, name: str, options: dict, n: int, n_sizes: int) -> dict:
    """``run_profile`` in a fresh interpreter: its result (the last line it prints, JSON)."""
    one = json.dumps([family, name, options])
    cmd = [sys.executable, __file__, "--one", one, "--samples", str(n), "--sizes", str(n_sizes)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{family} {name} run failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def configs(family: str, pan_and_scan: bool) -> dict[str, tuple[str, dict]]:
    """{row label: (profile, options)}: the native family, and hf on the image backend it reproduces."""
    if family == "gemma3":  # pan-and-scan: the native option and the processor's call keyword
        pas = {"do_pan_and_scan": True} if pan_and_scan else {}
        hf = {"processor_kwargs": pas, "image_backend": "pil"}
        return {"gemma3 (native)": ("gemma3", dict(pas)), "hf (Gemma3Processor)": ("hf", hf)}
    backend = {} if family == "nemotron_omni" else {"image_backend": "pil"}  # RADIO's: torchvision only
    return {f"{family} (native)": (family, {}), f"hf ({FAMILIES[family]})": ("hf", backend)}


def best_runs(family: str, args: argparse.Namespace) -> dict[str, dict]:
    """{row label: the family's run with the best measure and write times of ``args.repeats``}."""
    best: dict[str, dict] = {}
    for _ in range(args.repeats):
        for label, (name, options) in configs(family, args.pan_and_scan).items():
            r = run_fresh(family, name, options, args.samples, args.sizes)
            assert "refused" in r or r["packed"] == args.samples, r
            prev = best.get(label)
            if prev is None or "refused" in r:
                best[label] = r
            else:
                best[label] = {**r, "measure_s": min(r["measure_s"], prev["measure_s"]), "write_s": min(r["write_s"], prev["write_s"])}
    return best


def table_row(family: str, label: str, r: dict, n: int) -> str:
    if "refused" in r:
        return f"| {family} | {label} | refused at start: {r['refused']} | | | |"
    cache = (r["processor_cache"] or {}).get("image")
    calls = f"{cache['processor_calls']} calls, {cache['cache_hits']} hits" if cache else "-"
    return (f"| {family} | {label} | {n / r['measure_s']:.1f} | {n / r['write_s']:.1f} | "
            f"{r['shard_bytes'] / n / 1e6:.2f} MB | {calls} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated native families")
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--sizes", type=int, default=50, help="distinct image sizes in the corpus")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--pan-and-scan", action="store_true", help="Gemma 3's pan-and-scan crops, both profiles")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: one run, JSON [family, profile, options]
    args = ap.parse_args()

    paths = corpus(args.samples, args.sizes)
    if args.one:
        family, name, options = json.loads(args.one)
        out = CACHE / "out" / f"{family}_{name}"
        print(json.dumps(run_profile(family, name, options, paths, out, args.samples)))
        return
    rows = []
    for family in args.families.split(","):
        try:
            model_dir(family)  # built once, before the runs
        except (ImportError, ValueError) as e:  # a processor transformers cannot build here
            rows.append(f"| {family} | - | cannot build its processor here: {str(e).strip().splitlines()[0]} | | | |")
            continue
        rows += [table_row(family, label, r, args.samples) for label, r in best_runs(family, args).items()]
    print(f"\n{args.samples} samples, one image each of {args.sizes} sizes (200-1400 px)"
          f"{', Gemma 3 pan-and-scan' if args.pan_and_scan else ''}; best of {args.repeats}\n")  # fmt: skip
    print("| family | profile | measure samples/s | write samples/s | shard bytes/sample | processor calls (measure) |")
    print("|---|---|---:|---:|---:|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
