"""Trainer-side throughput: omnipack shards through Energon vs. doing the same work online per batch.

Corpus (built once, like real SFT data): photos as JPEG at camera sizes (800x600 .. 1920x1080, smooth
content + sensor-like noise so decoding costs what real photos cost), libx264 mp4 clips of 3-6 s at
25/30 fps (640x360), and speech-length audio (5-20 s; wav / mp3 / m4a at 16-48 kHz). Two profiles:
``qwen3_omni`` (images, video and audio samples) and ``qwen2_5_vl`` (image-only samples).

omnipack: ``omnipack prepare`` once (offline), then ``get_val_dataset`` + ``OmnipackTaskEncoder.from_dataset``
(decode the stored media, check placeholders, build encoder inputs), pixels as float32 (HF layout) or uint8
(``pixel_dtype="uint8"``, normalized later on the GPU).

online: a torch DataLoader over the raw manifest doing per batch what a run-time pipeline must: decode the
raw files (PIL for JPEG, decord for video, PyAV for audio), ``Qwen2VLImageProcessorPil`` for images, frame
sampling + resize + patchify for video, resampling to 16 kHz + ``WhisperFeatureExtractor`` for audio, chat
template + placeholder expansion + tokenization, then first-fit packing into THD rows of the same width.
HF's video processors need torchvision (not installed here), so the online video path uses omnipack's own
probe / frame loader / patchify: an optimistic stand-in (it is at least as fast as the HF processor).

Both sides run single-threaded per process (workers give the parallelism). Timing starts after the first
batch of each loader (worker start-up and imports excluded on both sides). samples/s is the fair measure:
the omnipack rows are packed over the whole dataset, the online rows only within a batch (more, emptier rows).

    PYTHONPATH=. python benchmarks/bench_loader.py --quick    # < 1 min (npy-image datasets only)
    PYTHONPATH=. python benchmarks/bench_loader.py            # a few minutes (png and npy datasets)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

PHOTO_SIZES = [(960, 1280), (1080, 1920), (600, 800), (1280, 960), (768, 1024), (720, 1280)]  # (h, w)
VIDEOS = [(4.0, 25), (3.0, 30), (6.0, 25)]  # (seconds, fps), 640x360
AUDIOS = [(5.0, 16000, "wav"), (12.0, 44100, "mp3"), (20.0, 48000, "m4a"), (8.0, 22050, "wav")]
WORDS = [
    "the",
    "a",
    "photo",
    "shows",
    "person",
    "street",
    "car",
    "tree",
    "sky",
    "left",
    "right",
    "small",
    "large",
    "bright",
    "dark",
    "speaker",
    "says",
]


# ---------------------------------------------------------------- corpus


def _smooth(rng: np.random.Generator, h: int, w: int, noise: float) -> np.ndarray:
    """Photo-like uint8 [h, w, 3]: bicubic-upsampled random field plus Gaussian noise (JPEG can't erase it)."""
    small = rng.integers(0, 256, (max(h // 48, 2), max(w // 48, 2), 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC), dtype=np.float32)
    return np.clip(base + rng.normal(0, noise, base.shape), 0, 255).astype(np.uint8)


def _write_video(
    path: Path, rng: np.random.Generator, secs: float, fps: int, w: int = 640, h: int = 360
) -> None:
    import av

    base = _smooth(rng, h, w + 4 * int(secs * fps), 0)
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.options = {"preset": "veryfast", "crf": "23"}
        for i in range(int(secs * fps)):  # a panning camera with sensor noise
            f = np.clip(base[:, 4 * i : 4 * i + w] + rng.normal(0, 3, (h, w, 3)), 0, 255).astype(np.uint8)
            for pk in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(pk)
        for pk in s.encode():
            c.mux(pk)


def _speech(rng: np.random.Generator, secs: float, rate: int) -> np.ndarray:
    """Speech-like float32 wave: a wandering pitch with harmonics, syllable envelope, breath noise."""
    t = np.arange(int(secs * rate)) / rate
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2
    return (0.2 * voice * env + 0.01 * rng.normal(size=t.size)).astype(np.float32)


def build_corpus(root: Path, samples: int, kinds: tuple[str, ...], seed: int = 0) -> tuple[Path, Path]:
    """Media files + manifest; kinds ("image",) or ("image", "video", "audio")."""
    from omnipack.demo.media import write_audio

    rng = np.random.default_rng(seed)
    media = root / "media"
    media.mkdir(parents=True, exist_ok=True)
    photos, videos, audios = [], [], []
    for i, (h, w) in enumerate(PHOTO_SIZES):
        Image.fromarray(_smooth(rng, h, w, 6)).save(media / f"photo{i}.jpg", quality=90)
        photos.append(f"photo{i}.jpg")
    if "video" in kinds:
        for i, (secs, fps) in enumerate(VIDEOS):
            _write_video(media / f"clip{i}.mp4", rng, secs, fps)
            videos.append(f"clip{i}.mp4")
    if "audio" in kinds:
        for i, (secs, rate, ext) in enumerate(AUDIOS):
            write_audio(media / f"speech{i}.{ext}", _speech(rng, secs, rate), rate)
            audios.append(f"speech{i}.{ext}")

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi)))).capitalize() + "."

    lines = []
    for i in range(samples):
        user: list[dict] = []
        slot = i % 4 if "video" in kinds else 0
        if slot == 0:  # one photo, sometimes two
            user += [{"type": "image", "image": str(rng.choice(photos))} for _ in range(1 + (i % 3 == 0))]
        elif slot == 1:
            user.append({"type": "video", "video": str(rng.choice(videos))})
        elif slot == 2:
            user.append({"type": "audio", "audio": str(rng.choice(audios))})
        else:  # a photo with a spoken question
            user += [
                {"type": "image", "image": str(rng.choice(photos))},
                {"type": "audio", "audio": str(rng.choice(audios))},
            ]
        user.append({"type": "text", "text": text(10, 60)})
        msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": text(20, 150)}]
        lines.append({"id": f"s{i:05d}", "messages": msgs})
    manifest = root / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return manifest, media


def prepare(
    root: Path, profile: str, samples: int, seq_length: int, encodings: list[str]
) -> tuple[Path, Path, Path, dict[str, Path]]:
    """The raw corpus and one omnipack dataset per storage choice (png: compact, images as PNG and video
    deflated; npy: raw npy images and uncompressed video frames, nothing to inflate at load)."""
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.pipeline import PrepareConfig, run_prepare
    from omnipack.profiles import get_profile

    tok = build_demo_tokenizer(root / "tok", profile=profile)
    # qwen2_5_vl: the image-only case; qwen3_omni: every kind it takes.
    kinds = ("image",) if profile == "qwen2_5_vl" else get_profile(profile).kinds
    manifest, media = build_corpus(root / "src", samples, kinds)
    out = {}
    for enc in encodings:
        out[enc] = root / f"ds-{enc}"
        run_prepare(
            PrepareConfig(
                manifest=[str(manifest)],
                media_root=str(media),
                tokenizer=str(tok),
                output=str(out[enc]),
                profile=profile,
                seq_length=seq_length,
                shard_max_rows=8,
                image_encoding=enc,
                compress_video=enc != "npy",  # "npy": raw storage throughout, nothing to inflate at load
                progress=False,
            )
        )
    return tok, manifest, media, out


# ---------------------------------------------------------------- timing


def timed(batches: Iterable[Any], count: Callable[[Any], tuple[int, int]]) -> tuple[int, int, float]:
    """(rows, samples, seconds) after the first batch (start-up excluded)."""
    rows = samples = 0
    t = None
    for b in batches:
        if t is None:
            t = time.perf_counter()
            continue
        r, s = count(b)
        rows, samples = rows + r, samples + s
    return rows, samples, time.perf_counter() - (t or time.perf_counter())


def bench_omnipack(ds: Path, workers: int, passes: int, pixel_dtype: str) -> tuple[int, int, float]:
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    def batches() -> Iterable[Any]:
        for _ in range(passes):
            yield from get_loader(
                get_val_dataset(
                    str(ds),
                    split_part="train",
                    batch_size=1,
                    worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
                    task_encoder=OmnipackTaskEncoder.from_dataset(ds, pixel_dtype=pixel_dtype),
                )
            )

    return timed(batches(), lambda b: (1, len(b.sample_ids[0])))


# ---------------------------------------------------------------- online


PADS = re.compile(r"(<\|image_pad\|>|<\|video_pad\|>|<\|audio_pad\|>)")


class OnlineSamples(torch.utils.data.Dataset):
    """Raw manifest sample -> token ids + encoder inputs, as a run-time pipeline does it per step."""

    def __init__(self, manifest: Path, media: Path, tokenizer: Path, profile: str) -> None:
        self.samples = [json.loads(x) for x in manifest.read_text().splitlines()]
        self.media, self.tok_path, self.profile_name = media, tokenizer, profile
        self._tok = self._proc = self._profile = None

    def __len__(self) -> int:
        return len(self.samples)

    def _setup(self) -> None:  # per worker process
        from transformers import AutoTokenizer
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        from omnipack.profiles import get_profile

        p = self._profile = get_profile(self.profile_name)
        self._tok = AutoTokenizer.from_pretrained(self.tok_path)
        self._proc = Qwen2VLImageProcessorPil(
            patch_size=p.image.patch_size,
            merge_size=p.image.merge_size,
            temporal_patch_size=p.image.temporal_patch_size,
            min_pixels=p.image.min_pixels,
            max_pixels=p.image.max_pixels,
            image_mean=list(p.image_mean),
            image_std=list(p.image_std),
        )

    def _image(self, path: Path) -> tuple[dict, int]:
        with Image.open(path) as img:
            rgb = np.asarray(img.convert("RGB"))
        px = self._proc(images=[rgb], return_tensors="np")
        grid = px["image_grid_thw"]
        return {"pixel_values": px["pixel_values"], "image_grid_thw": grid}, int(grid.prod()) // 4

    def _video(self, path: Path) -> tuple[dict, int]:
        # Stand-in for Qwen2VLVideoProcessor (needs torchvision): decord probe + sampled frame decode,
        # PIL bicubic resize, then omnipack's patchify.
        from omnipack.media.video import load_frames, probe_video

        plan = self._profile.plan_video(probe_video(path))
        frames = load_frames(path, plan.frame_indices, plan.target_hw)
        inputs = self._profile.vision_inputs("video", {"kind": "video", "info": {"info": plan.info}}, frames)
        return inputs, int(inputs["video_grid_thw"].prod()) // 4

    def _audio(self, path: Path) -> tuple[dict, int]:
        from omnipack.media.audio import decode_audio
        from omnipack.profiles.qwen3_omni import audio_output_length, mel_frames, whisper_features

        wave = decode_audio(path, 16000)  # the reference loader: decode, channel mean, soxr HQ to 16 kHz
        return {"input_features": whisper_features(wave)}, audio_output_length(mel_frames(len(wave)))

    def __getitem__(self, i: int) -> dict:
        if self._tok is None:
            self._setup()
        msgs = self.samples[i]["messages"]
        media: list[dict] = []
        counts: list[int] = []
        for m in msgs:
            for c in [] if isinstance(m["content"], str) else m["content"]:
                if c["type"] in ("image", "video", "audio"):
                    inputs, n = getattr(self, f"_{c['type']}")(self.media / c[c["type"]])
                    media.append(inputs)
                    counts.append(n)
        text = self._tok.apply_chat_template(msgs, tokenize=False)
        parts = PADS.split(text)  # text, pad, text, pad, ...: one pad per media item, in order
        pads = parts[1::2]
        assert len(pads) == len(counts), (len(pads), len(counts))
        text = parts[0] + "".join(p * n + t for p, n, t in zip(pads, counts, parts[2::2], strict=True))
        ids = np.asarray(self._tok(text, add_special_tokens=False)["input_ids"], np.int64)
        return {"input_ids": ids, "labels": np.concatenate([ids[1:], [-100]]), "media": media}


def pack_collate(width: int) -> Callable[[list[dict]], list[dict]]:
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
                bins.append([])
                used.append(0)
                j = len(bins) - 1
            bins[j].append(it)
            used[j] += n
        rows = []
        for b in bins:
            ids = np.zeros(width, np.int64)
            labels = np.full(width, -100, np.int64)
            cu = np.concatenate([[0], np.cumsum([len(x["input_ids"]) for x in b])])
            for x, a in zip(b, cu[:-1], strict=True):
                ids[a : a + len(x["input_ids"])] = x["input_ids"]
                labels[a : a + len(x["labels"])] = x["labels"]
            row: dict[str, Any] = {
                "tokens": torch.from_numpy(ids)[None],
                "labels": torch.from_numpy(labels)[None],
                "cu_seqlens": torch.from_numpy(cu.astype(np.int32)),
                "num_samples": len(b),
            }
            per_item = [d for x in b for d in x["media"]]
            vision = [{k: v for k, v in d.items() if k != "input_features"} for d in per_item]
            for k in {k for d in vision for k in d}:
                row[k] = torch.from_numpy(np.concatenate([d[k] for d in vision if k in d]))
            feats = [d["input_features"] for d in per_item if "input_features" in d]
            if feats:  # padded to the longest clip with a mask, as the HF processor batches them
                lens = [f.shape[1] for f in feats]
                x = np.zeros((len(feats), feats[0].shape[0], max(lens)), np.float32)
                mask = np.zeros((len(feats), max(lens)), np.int64)
                for i, f in enumerate(feats):
                    x[i, :, : f.shape[1]], mask[i, : f.shape[1]] = f, 1
                row["input_features"] = torch.from_numpy(x)
                row["feature_attention_mask"] = torch.from_numpy(mask)
            rows.append(row)
        return rows

    return collate


def bench_online(
    ds: OnlineSamples, width: int, workers: int, passes: int, batch: int
) -> tuple[int, int, float]:
    def batches() -> Iterable[Any]:
        for _ in range(passes):
            yield from torch.utils.data.DataLoader(
                ds, batch_size=batch, num_workers=workers, collate_fn=pack_collate(width)
            )

    return timed(batches(), lambda packed: (len(packed), sum(r["num_samples"] for r in packed)))


# ---------------------------------------------------------------- main


def run_profile(
    profile: str, samples: int, seq_length: int, passes: int, online_batch: int, encodings: list[str]
) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        tok, manifest, media, dss = prepare(Path(tmp), profile, samples, seq_length, encodings)
        prep = (time.perf_counter() - t) / len(encodings)
        online = OnlineSamples(manifest, media, tok, profile)
        res: dict[tuple[str, int], tuple[int, int, float]] = {}
        for w in (0, 2):
            for enc, ds in dss.items():
                for dtype, short in (("float32", "f32"), ("uint8", "u8")):
                    res[(f"omnipack {enc} {short}", w)] = bench_omnipack(ds, w, passes, dtype)
            res[("online", w)] = bench_online(online, seq_length, w, passes, online_batch)
    kinds = (
        "images only" if profile == "qwen2_5_vl" else "1/4 photo(s), 1/4 video, 1/4 audio, 1/4 photo+audio"
    )
    out = [
        f"### {profile} ({kinds}; {samples} samples, W={seq_length}, {passes} pass(es); "
        f"prepare ~{prep:.0f} s per dataset, offline, once)",
        "",
        "omnipack `png`: images as PNG, video deflated; `npy`: `--image-encoding npy --no-compress-video` (raw, nothing to inflate); `f32`/`u8`: `pixel_dtype`.",
        "",
        "| pipeline | workers | rows | samples | sec | rows/s | samples/s | samples/s vs online |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (name, w), (r, s, sec) in res.items():
        ro, so, to = res[("online", w)]
        ratio = (s / sec) / (so / to) if so and to and sec else float("nan")
        out.append(f"| {name} | {w} | {r} | {s} | {sec:.2f} | {r / sec:.1f} | {s / sec:.1f} | x{ratio:.1f} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small corpus, one pass (< 1 min)")
    ap.add_argument("--profiles", default="qwen3_omni,qwen2_5_vl")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--seq-length", type=int, default=8192)
    ap.add_argument("--passes", type=int, default=None)
    ap.add_argument("--online-batch", type=int, default=None, help="raw samples per online batch")
    ap.add_argument("--image-encodings", default=None, help="omnipack datasets to build (png,npy)")
    args = ap.parse_args()
    samples = args.samples or (24 if args.quick else 96)
    passes = args.passes or 1
    online_batch = args.online_batch or (8 if args.quick else 16)
    encodings = (args.image_encodings or ("npy" if args.quick else "png,npy")).split(",")
    torch.set_num_threads(1)  # both sides single-threaded per process; workers give the parallelism
    print(f"cpus={os.cpu_count()}; timing starts after each loader's first batch\n")
    for profile in args.profiles.split(","):
        lines = run_profile(profile, samples, args.seq_length, passes, online_batch, encodings)
        print("\n".join(lines) + "\n", flush=True)


if __name__ == "__main__":
    main()
