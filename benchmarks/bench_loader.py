"""Trainer-side throughput: omnipack shards through Energon vs. doing the same work online per batch.

omnipack: rows of a prepared dataset (Qwen2.5-VL profile, images stored at the target size) through
``get_val_dataset`` + ``OmnipackTaskEncoder.from_dataset`` (decode media, check placeholders, pixel patches).
online: a torch DataLoader over the raw manifest doing what a run-time pipeline does per batch: decode the
raw image files, ``Qwen2VLImageProcessorPil`` (resize + normalize + patchify), chat template + placeholder
expansion + tokenization, then in-batch first-fit packing into THD rows of the same width.

Both produce THD rows with pixel_values; rows/s and samples/s are reported for 0 and 2 workers.

    PYTHONPATH=. python benchmarks/bench_loader.py --quick    # < 1 min
    PYTHONPATH=. python benchmarks/bench_loader.py            # a few minutes
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

PROFILE = "qwen2_5_vl"


def build(root: Path, samples: int, seq_length: int, image_encoding: str) -> tuple[Path, Path, Path, Path]:
    from omnipack.demo.corpus import build_demo_corpus
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.pipeline import PrepareConfig, run_prepare

    tok = build_demo_tokenizer(root / "tok", profile=PROFILE)
    manifest, media = build_demo_corpus(root / "src", num_samples=samples)
    out = root / "ds"
    run_prepare(
        PrepareConfig(
            manifest=[str(manifest)],
            media_root=str(media),
            tokenizer=str(tok),
            output=str(out),
            profile=PROFILE,
            seq_length=seq_length,
            shard_max_rows=8,
            progress=False,
        )
    )
    return tok, manifest, media, out


def bench_omnipack(ds: Path, workers: int, passes: int) -> tuple[int, int, float]:
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    rows = samples = 0
    t = time.perf_counter()
    for _ in range(passes):
        loader = get_loader(
            get_val_dataset(
                str(ds),
                split_part="train",
                batch_size=1,
                worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
                task_encoder=OmnipackTaskEncoder.from_dataset(ds),
            )
        )
        for b in loader:
            assert b.pixel_values is None or b.pixel_values.dtype == torch.float32
            rows += 1
            samples += len(b.sample_ids[0])
    return rows, samples, time.perf_counter() - t


class OnlineSamples(torch.utils.data.Dataset):
    """Raw manifest samples -> (input_ids, labels, pixel_values, grids), as a run-time pipeline does."""

    def __init__(self, manifest: Path, media: Path, tokenizer: Path) -> None:
        from omnipack.profiles import get_profile

        self.samples = [json.loads(x) for x in manifest.read_text().splitlines()]
        self.samples = [s for s in self.samples if not s["id"].startswith("bad-")]
        self.media, self.tok_path = media, tokenizer
        p = get_profile(PROFILE)
        self.kw = dict(
            patch_size=p.image.patch_size,
            merge_size=p.image.merge_size,
            temporal_patch_size=p.image.temporal_patch_size,
            min_pixels=p.image.min_pixels,
            max_pixels=p.image.max_pixels,
        )
        self._tok = self._proc = None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict:
        from PIL import Image

        if self._tok is None:  # per worker process
            from transformers import AutoTokenizer
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

            self._tok = AutoTokenizer.from_pretrained(self.tok_path)
            self._proc = Qwen2VLImageProcessorPil(**self.kw)
        msgs = self.samples[i]["messages"]
        images = [
            np.asarray(Image.open(self.media / c["image"]).convert("RGB"))
            for m in msgs
            if not isinstance(m["content"], str)
            for c in m["content"]
            if c["type"] == "image"
        ]
        text = self._tok.apply_chat_template(msgs, tokenize=False)
        out = {"pixel_values": None, "grids": np.zeros((0, 3), np.int64)}
        if images:
            px = self._proc(images=images, return_tensors="np")
            out = {"pixel_values": px["pixel_values"], "grids": px["image_grid_thw"]}
            parts = text.split("<|image_pad|>")
            counts = [int(g.prod()) // 4 for g in px["image_grid_thw"]]
            text = parts[0] + "".join("<|image_pad|>" * n + p for n, p in zip(counts, parts[1:], strict=True))
        ids = np.asarray(self._tok(text, add_special_tokens=False)["input_ids"], np.int64)
        out["input_ids"] = ids
        out["labels"] = np.concatenate([ids[1:], [-100]])
        return out


def pack_collate(width: int):
    def collate(items: list[dict]) -> list[dict]:
        """First-fit in-batch packing into THD rows of ``width`` tokens (what a run-time packer does)."""
        bins: list[list[dict]] = []
        used: list[int] = []
        for it in sorted(items, key=lambda x: -len(x["input_ids"])):
            n = len(it["input_ids"])
            if n > width:
                continue
            j = next((k for k, u in enumerate(used) if u + n <= width), None)
            if j is None:
                bins.append([]), used.append(0)
                j = len(bins) - 1
            bins[j].append(it)
            used[j] += n
        rows = []
        for b in bins:
            ids = np.zeros(width, np.int64)
            labels = np.full(width, -100, np.int64)
            lens = [len(x["input_ids"]) for x in b]
            cu = np.concatenate([[0], np.cumsum(lens)])
            for x, a in zip(b, cu[:-1], strict=True):
                ids[a : a + len(x["input_ids"])] = x["input_ids"]
                labels[a : a + len(x["labels"])] = x["labels"]
            px = [x["pixel_values"] for x in b if x["pixel_values"] is not None]
            rows.append(
                {
                    "tokens": torch.from_numpy(ids)[None],
                    "labels": torch.from_numpy(labels)[None],
                    "cu_seqlens": torch.from_numpy(cu.astype(np.int32)),
                    "pixel_values": torch.from_numpy(np.concatenate(px)) if px else None,
                    "image_grid_thw": torch.from_numpy(np.concatenate([x["grids"] for x in b])),
                    "num_samples": len(b),
                }
            )
        return rows

    return collate


def bench_online(
    ds: OnlineSamples, width: int, workers: int, passes: int, batch: int
) -> tuple[int, int, float]:
    rows = samples = 0
    t = time.perf_counter()
    for _ in range(passes):
        loader = torch.utils.data.DataLoader(
            ds, batch_size=batch, num_workers=workers, collate_fn=pack_collate(width)
        )
        for packed in loader:
            rows += len(packed)
            samples += sum(r["num_samples"] for r in packed)
    return rows, samples, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small corpus, one pass (< 1 min)")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--seq-length", type=int, default=4096)
    ap.add_argument("--passes", type=int, default=None)
    ap.add_argument("--image-encoding", default="png", choices=("png", "npy"), help="how shards store images")
    ap.add_argument("--online-batch", type=int, default=16, help="raw samples per online batch")
    args = ap.parse_args()
    samples = args.samples or (48 if args.quick else 400)
    passes = args.passes or (1 if args.quick else 2)
    torch.set_num_threads(1)  # both sides single-threaded per process; workers give the parallelism
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        tok, manifest, media, ds = build(Path(tmp), samples, args.seq_length, args.image_encoding)
        print(
            f"images as {args.image_encoding}: prepared {samples} samples in {time.perf_counter() - t:.1f}s (offline, once); cpus={os.cpu_count()}"
        )
        online = OnlineSamples(manifest, media, tok)
        results = {}
        for w in (0, 2):
            results[("omnipack", w)] = bench_omnipack(ds, w, passes)
            results[("online", w)] = bench_online(online, args.seq_length, w, passes, args.online_batch)
    print(
        f"\n{'pipeline':<10} {'workers':>7} {'rows':>6} {'samples':>8} {'sec':>7} {'rows/s':>8} {'samples/s':>10}"
    )
    for (name, w), (r, s, sec) in results.items():
        print(f"{name:<10} {w:>7} {r:>6} {s:>8} {sec:>7.2f} {r / sec:>8.1f} {s / sec:>10.1f}")
    print()
    for w in (0, 2):
        (r1, s1, t1), (r2, s2, t2) = results[("omnipack", w)], results[("online", w)]
        print(
            f"workers={w}: omnipack/online  rows/s x{(r1 / t1) / (r2 / t2):.1f}   samples/s x{(s1 / t1) / (s2 / t2):.1f}"
        )


if __name__ == "__main__":
    main()
