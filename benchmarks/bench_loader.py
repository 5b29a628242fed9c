"""Trainer-side throughput: omnipack shards through Energon vs. doing the same work online per batch.

Corpus (built once, like real SFT data): photos as JPEG at camera sizes (800x600 .. 1920x1080, smooth
content + sensor-like noise so decoding costs what real photos cost), libx264 mp4 clips of 3-6 s at
25/30 fps (640x360), and speech-length audio (5-20 s; wav / mp3 / m4a at 16-48 kHz). Two profiles:
``qwen3_omni`` (images, video and audio samples) and ``qwen2_5_vl`` (image-only samples).

omnipack: ``omnipack prepare`` once (offline), then ``get_val_dataset`` + ``OmnipackTaskEncoder.from_dataset``
(decode the stored media, check every row's contract and placeholders, build encoder inputs) at DEFAULT
settings: raw storage (npy images, stored npz video) and uint8 pixels (normalized on the trainer's GPU,
bit-identical to the HF processor). The old defaults (PNG images, deflated video) and float32 pixels are
measured for reference, and so are the per-row contract check (``check_rows``) and the workers' reuse of
their shared-memory batch buffers (``reuse_buffers=False``: fresh shared memory per batch, as before).

Storage: every candidate way to store a resized photo is measured on the corpus photos (bytes, write cost,
load cost up to the uint8 patches, exactness of the loader's pixels against ``Qwen2VLImageProcessorPil`` run
on the source JPEG), and png vs npy also as whole prepares (write stage timed, shard bytes summed).

online: a torch DataLoader over the raw manifest doing per batch what a run-time pipeline must: decode the
raw files (PIL for JPEG, decord for video, PyAV for audio), ``Qwen2VLImageProcessorPil`` for images, frame
sampling + resize + patchify for video, resampling to 16 kHz + ``WhisperFeatureExtractor`` for audio, chat
template + placeholder expansion + tokenization, then first-fit packing into THD rows of the same width.
HF's video processors need torchvision (not installed here), so the online video path uses omnipack's own
probe / frame loader / patchify: an optimistic stand-in (it is at least as fast as the HF processor).

Both sides run single-threaded per process (workers give the parallelism). Timing starts after the first
batch of each worker (worker start-up and imports excluded on both sides). samples/s is the fair measure:
the omnipack rows are packed over the whole dataset, the online rows only within a batch (more, emptier rows).

    PYTHONPATH=. python benchmarks/bench_loader.py --quick    # ~1-2 min (24 samples per profile)
    PYTHONPATH=. python benchmarks/bench_loader.py            # a few minutes (96 samples per profile)
    PYTHONPATH=. python benchmarks/bench_loader.py --profiles qwen2_5_vl --repeats 3 --no-reference
        # targets 3-4 on a shared box: every prepare and loader run 3 times in turn, median and min-max
    PYTHONPATH=. python benchmarks/bench_loader.py --profiles qwen2_5_vl --reuse-ab 8
        # only the worker hand-over (buffers reused or not), 8 alternating rounds, paired ratios
    PYTHONPATH=. python benchmarks/bench_loader.py --floor 5
        # only the loader against its physical floor (tar members read into tensors), 0 and 2 workers
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import statistics
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


# name -> (image_encoding, compress_video): the default raw storage and the previous default.
STORAGES = {"npy": ("npy", False), "png": ("png", True)}


def prepare(
    root: Path, profile: str, samples: int, seq_length: int, storages: list[str], repeats: int = 1
) -> tuple[Path, Path, Path, dict[str, Path], dict[str, dict[str, Any]]]:
    """The raw corpus and one omnipack dataset per storage choice, with each prepare's wall time, write-stage
    time (the ``write_shard`` units timed in place) and shard bytes; ``repeats`` prepares per storage, the
    storages taking turns (load drift falls on all alike). The png baseline is the previous write path:
    png images, rows built one after the other (no build-ahead thread)."""
    import omnipack.pipeline as pipeline
    import omnipack.stages.write as write_stage
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.pipeline import PrepareConfig, run_prepare
    from omnipack.profiles import get_profile

    tok = build_demo_tokenizer(root / "tok", profile=profile)
    # qwen2_5_vl: the image-only case; qwen3_omni: every kind it takes.
    kinds = ("image",) if profile == "qwen2_5_vl" else get_profile(profile).kinds
    manifest, media = build_corpus(root / "src", samples, kinds)
    # The write stage is one unit per shard (in this process with one worker): sum the units' times.
    write_stage_units, write_s = pipeline.WRITE, [0.0]
    write_shard = write_stage_units.run
    built_ahead = write_stage._built_ahead

    def timed_write_shard(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return write_shard(*a, **kw)
        finally:
            write_s[0] += time.perf_counter() - t

    def in_turn(build: Callable[[int], Any], rows: list[int], ahead: int = 0) -> Iterable[Any]:
        return map(build, rows)

    out: dict[str, Path] = {}
    stats: dict[str, dict[str, Any]] = {name: {"prepare_s": [], "write_s": []} for name in storages}
    pipeline.WRITE = dataclasses.replace(write_stage_units, run=timed_write_shard)
    try:
        for _ in range(repeats):
            for name in storages:
                enc, compress = STORAGES[name]
                out[name] = root / f"ds-{name}"
                shutil.rmtree(out[name], ignore_errors=True)
                write_stage._built_ahead = in_turn if name == "png" else built_ahead
                t, write_s[0] = time.perf_counter(), 0.0
                run_prepare(
                    PrepareConfig(
                        manifest=[str(manifest)],
                        media_root=str(media),
                        tokenizer=str(tok),
                        output=str(out[name]),
                        profile=profile,
                        seq_length=seq_length,
                        shard_max_rows=8,
                        image_encoding=enc,
                        compress_video=compress,
                        progress=False,
                        mrope=False,  # the recorded numbers' workload (mRoPE ids are on by default now)
                    )
                )
                stats[name]["prepare_s"].append(time.perf_counter() - t)
                stats[name]["write_s"].append(write_s[0])
                stats[name]["bytes"] = sum(f.stat().st_size for f in out[name].glob("**/*.tar"))
    finally:
        pipeline.WRITE = write_stage_units
        write_stage._built_ahead = built_ahead
    return tok, manifest, media, out, stats


# ---------------------------------------------------------------- storage candidates


def _best_ms(fn: Callable[[], Any], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def storage_candidates(media: Path, profile_name: str) -> list[str]:
    """Per corpus photo, every storage candidate: bytes, write ms, load ms (stored bytes -> uint8 patches in
    the batch layout) and whether the loader's pixels equal Qwen2VLImageProcessorPil on the source JPEG."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from omnipack.dataset.contract import MediaItem
    from omnipack.loader.media import decode_payload, expand_temporal, normalize_pixels
    from omnipack.media.image import encode_image, load_image
    from omnipack.media.probe import probe
    from omnipack.profiles import get_profile
    from omnipack.profiles.model_inputs import MediaInputOptions
    from omnipack.profiles.qwen_vl import _spatial_patches

    try:
        import zstandard
    except ImportError:
        zstandard = None
    p = get_profile(profile_name)
    s = p.image
    hf = Qwen2VLImageProcessorPil(
        patch_size=s.patch_size,
        merge_size=s.merge_size,
        temporal_patch_size=s.temporal_patch_size,
        min_pixels=s.min_pixels,
        max_pixels=s.max_pixels,
        image_mean=list(p.image_mean),
        image_std=list(p.image_std),
    )
    item = MediaItem("image", "media.0.npy", 0, 0, 0, 0, 0)

    def patches(frames: np.ndarray) -> np.ndarray:
        # What the loader builds by default: uint8, each image's identical temporal slots once.
        options = MediaInputOptions(pixel_dtype="uint8", compact=True)
        return p.inputs().media_inputs(item, frames, options)["pixel_values"]

    def patch_layout_bytes(px: np.ndarray) -> bytes:
        # The loader's own layout stored: [gh*gw, C, ps*ps] spatial patches, one per temporal slot later.
        return _spatial_patches(px[None], s.patch_size, s.merge_size).tobytes()

    def from_patch_layout(data: bytes, shape: tuple[int, ...]) -> np.ndarray:
        # Already the loader's compact layout: a view, one temporal slot per image.
        return np.frombuffer(data, np.uint8).reshape(shape[0], -1)

    totals: dict[str, list[float]] = {}
    exact: dict[str, bool] = {}

    def measure_photo(f: Path) -> None:
        meta = probe(f, "image")
        plan = p.plan(meta)
        px = load_image(f, plan.target_hw)
        decode_resize = _best_ms(lambda: load_image(f, plan.target_hw), 2)
        with Image.open(f) as img:
            ref = hf(images=[np.asarray(img.convert("RGB"))], return_tensors="np")["pixel_values"]
        norm = p.inputs().pixel_normalization()

        def check(name: str, u8: np.ndarray) -> None:
            got = normalize_pixels(torch.from_numpy(u8), *norm)
            if got.shape[1] != ref.shape[1]:  # compact: repeated on the device, as batch.as_dict does
                got = expand_temporal(got, 3, ref.shape[1] // got.shape[1])
            got = got.numpy()
            exact[name] = exact.get(name, True) and got.shape == ref.shape and bool(np.array_equal(got, ref))

        cands: dict[str, tuple[Callable[[], bytes], Callable[[bytes], np.ndarray]]] = {
            "npy (raw uint8) [default]": (
                lambda: encode_image(px, "npy")[1],
                lambda b: patches(decode_payload("x.npy", b)),
            ),
            "png": (lambda: encode_image(px, "png")[1], lambda b: patches(decode_payload("x.png", b))),
            "patch layout (raw uint8)": (
                lambda: patch_layout_bytes(px),
                lambda b: from_patch_layout(
                    b, _spatial_patches(px[None], s.patch_size, s.merge_size).shape[1:]
                ),
            ),
        }
        if zstandard is not None:
            zc, zd = zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor()
            cands["npy + zstd level 1"] = (
                lambda: zc.compress(encode_image(px, "npy")[1]),
                lambda b: patches(decode_payload("x.npy", zd.decompress(b))),
            )
        # Keeping the source JPEG is possible only when it needs no resize (none of these photos): its load
        # cost is a JPEG decode; measured here on the source with the patches of the resized pixels.
        no_resize = tuple(plan.target_hw) == (meta.height, meta.width)
        cands["source JPEG kept (only if no resize)"] = (
            f.read_bytes,
            lambda b: (load_image(f), patches(px))[1] if not no_resize else patches(load_image(f)),
        )
        for name, (enc, dec) in cands.items():
            data = enc()
            write_ms = decode_resize + _best_ms(enc, 2)
            load_ms = _best_ms(lambda: dec(data), 3)  # noqa: B023 (called at once)
            if name.startswith("source JPEG") and not no_resize:
                exact[name] = False
            else:
                check(name, dec(data))
            t = totals.setdefault(name, [0.0, 0.0, 0.0, 0])
            t[0] += len(data)
            t[1] += write_ms
            t[2] += load_ms
            t[3] += 1

    photos = sorted(media.glob("photo*.jpg"))
    for f in photos:
        measure_photo(f)
    jpeg_bytes = sum(f.stat().st_size for f in photos)
    png_write = totals["png"][1]
    lines = [
        f"Storage candidates per resized photo ({len(photos)} corpus JPEGs, {jpeg_bytes / 1e6:.2f} MB as JPEG; "
        f"profile {profile_name}; write = JPEG decode + resize + encode; load = stored bytes -> uint8 patches "
        "in the batch layout; exact = loader pixels after GPU normalization == Qwen2VLImageProcessorPil on the "
        "source JPEG, bit for bit):",
        "",
        "| storage | MB / photo | x JPEG bytes | write ms / photo | write speed vs png | load ms / photo | exact vs HF |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, (nbytes, write_ms, load_ms, n) in totals.items():
        lines.append(
            f"| {name} | {nbytes / n / 1e6:.2f} | x{nbytes / jpeg_bytes * len(photos) / n:.1f} | "
            f"{write_ms / n:.1f} | x{png_write / write_ms:.1f} | {load_ms / n:.2f} | {exact[name]} |"
        )
    if zstandard is None:
        lines.append("| npy + zstd | (zstandard not installed: skipped) | | | | | |")
    lines.append(
        "(source JPEG kept: exact only for photos already at the target size; every corpus photo needs a resize, "
        "so it is False here and its write cost is just reading the file.)"
    )
    return lines


# ---------------------------------------------------------------- timing


def timed(
    batches: Iterable[Any], count: Callable[[Any], tuple[int, int]], skip: int
) -> tuple[int, int, float]:
    """(rows, samples, seconds) after the first ``skip`` batches (one per worker: start-up excluded)."""
    rows = samples = 0
    t = None
    for i, b in enumerate(batches):
        if i < skip:
            continue
        if t is None:
            t = time.perf_counter()
            continue
        r, s = count(b)
        rows, samples = rows + r, samples + s
    return rows, samples, time.perf_counter() - (t or time.perf_counter())


def bench_omnipack(
    ds: Path,
    workers: int,
    passes: int,
    patches_in_worker: bool = False,
    **encoder_options: Any,
) -> tuple[int, int, float]:
    """The loader at default settings plus ``encoder_options``; ``patches_in_worker``: uint8 pixels cut into
    patches in the worker (not left to the consumer as the stored frames)."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    def encoder() -> OmnipackTaskEncoder:
        te = OmnipackTaskEncoder.from_dataset(ds, **encoder_options)
        if patches_in_worker:
            te.unpatched_pixels = {}
            te.media_options = dataclasses.replace(te.media_options, unpatched=False)
        return te

    def batches() -> Iterable[Any]:
        for _ in range(passes):
            yield from get_loader(
                get_val_dataset(
                    str(ds),
                    split_part="train",
                    batch_size=1,
                    worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
                    task_encoder=encoder(),
                )
            )

    return timed(batches(), lambda b: (1, len(b.sample_ids[0])), max(workers, 1) - 1)


# ---------------------------------------------------------------- floor


def tar_rows(ds: Path) -> list[tuple[str, int, int]]:
    """``(shard, start, end)`` byte range of every row, in dataset order: Energon's ``.tar.idx`` holds each
    row's offset in its shard and then the end of the last row."""
    info = json.loads((ds / ".nv-meta" / ".info.json").read_text())
    rows = []
    for shard in info["shard_counts"]:
        offsets = np.fromfile(ds / f"{shard}.idx", dtype=np.uint64).tolist()
        rows += [(str(ds / shard), a, b) for a, b in zip(offsets, offsets[1:], strict=False)]
    return rows


def read_row(path: str, start: int, end: int, shared: bool) -> tuple[torch.Tensor, list[tuple[str, int, int]]]:
    """A row's tar bytes in one read into one uint8 tensor (shared memory in a loader worker, so the hand-over
    copies nothing) and its members ``(name, data offset, size)``: tar headers walked, nothing decoded."""
    n = end - start
    buf = torch.UntypedStorage._new_shared(n) if shared else torch.UntypedStorage(n)
    arr = torch.empty(0, dtype=torch.uint8).set_(buf, 0, (n,)).numpy()
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        got = f.readinto(arr)
    assert got == n, (path, start, got, n)
    members, pos = [], 0
    while pos + 512 <= n:
        header = arr[pos : pos + 512].tobytes()
        size = int(header[124:136].rstrip(b"\0 ") or b"0", 8)
        if header[156:157] in (b"0", b"\0"):
            members.append((header[:100].rstrip(b"\0").decode(), pos + 512, size))
        pos += 512 + -(-size // 512) * 512
    return torch.empty(0, dtype=torch.uint8).set_(buf, 0, (n,)), members


def member_tensors(row: torch.Tensor, members: list[tuple[str, int, int]]) -> tuple[dict[str, torch.Tensor], int]:
    """The row's members as uint8 tensors over its bytes (``np.frombuffer``'s work, no copy) and its sample
    count (the entries of its ``cu_seqlens.npy`` less one; an npy v1 header is 10 bytes + its length)."""
    out = {name.split(".", 1)[1]: row[a : a + size] for name, a, size in members}
    cu = out["cu_seqlens.npy"]
    header = 10 + int(cu[8]) + 256 * int(cu[9])
    return out, (cu.numel() - header) // 4 - 1


class FloorRows(torch.utils.data.Dataset):
    """Every row of an omnipack dataset as its raw member bytes: the physical floor of the loader."""

    def __init__(self, ds: Path) -> None:
        self.rows = tar_rows(ds)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, list[tuple[str, int, int]]]:
        return read_row(*self.rows[i], shared=torch.utils.data.get_worker_info() is not None)


def bench_floor(ds: Path, workers: int, passes: int) -> tuple[int, int, float]:
    """The loader's physical floor: each row's tar members read (one read per row, at the ``.tar.idx``
    offset) into tensors with no decoding (``member_tensors``), in the trainer process; with workers through
    a torch DataLoader (rows in order, one row per batch, the bytes read straight into shared memory)."""

    def batches() -> Iterable[Any]:
        for _ in range(passes):
            for row, members in torch.utils.data.DataLoader(
                FloorRows(ds), batch_size=None, num_workers=workers, collate_fn=None
            ):
                yield member_tensors(row, members)

    return timed(batches(), lambda b: (1, b[1]), max(workers, 1) - 1)


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
        inputs = self._profile.inputs().vision_inputs("video", {"kind": "video", "info": {"info": plan.info}}, frames)
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

    return timed(
        batches(), lambda packed: (len(packed), sum(r["num_samples"] for r in packed)), max(workers, 1) - 1
    )


# ---------------------------------------------------------------- main


def contract_check_cost(ds: Path) -> tuple[float, float, int]:
    """(check seconds, loader seconds, rows) over one in-process pass: the per-row contract check timed
    directly on every row (a difference of two noisy loader runs could not resolve a few percent)."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    te = OmnipackTaskEncoder.from_dataset(ds)
    check_s, rows = 0.0, 0
    original = te.row_errors

    def timed_row_errors(sample: Any) -> list[str]:
        nonlocal check_s, rows
        t = time.perf_counter()
        try:
            return original(sample)
        finally:
            check_s += time.perf_counter() - t
            rows += 1

    te.row_errors = timed_row_errors
    loader = get_loader(
        get_val_dataset(
            str(ds),
            split_part="train",
            batch_size=1,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            task_encoder=te,
        )
    )
    t = time.perf_counter()
    for _ in loader:
        pass
    return check_s, time.perf_counter() - t, rows


def _ratio_cells(values: list[float]) -> str:
    """``median (min-max)`` of per-repeat values."""
    if len(values) == 1:
        return f"x{values[0]:.1f}"
    return f"x{statistics.median(values):.1f} (x{min(values):.1f}-x{max(values):.1f})"


def run_profile(
    profile: str,
    samples: int,
    seq_length: int,
    passes: int,
    online_batch: int,
    repeats: int = 1,
    reference: bool = True,
) -> list[str]:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tok, manifest, media, dss, prep = prepare(
            Path(tmp), profile, samples, seq_length, list(STORAGES), repeats
        )
        storage = storage_candidates(media, profile)
        online = OnlineSamples(manifest, media, tok, profile)
        pipelines: dict[str, tuple[str, dict[str, Any]]] = {
            "omnipack default (npy, uint8 pixels, row check on)": ("npy", {}),
            "omnipack default, check_rows=False": ("npy", {"check_rows": False}),
            # the previous hand-over: fresh shared memory for every worker batch
            "omnipack default, reuse_buffers=False": ("npy", {"reuse_buffers": False}),
        }
        if reference:
            pipelines.update(
                {
                    "omnipack npy, float32 pixels": ("npy", {"pixel_dtype": "float32"}),
                    "omnipack old storage (png, deflated video)": ("png", {}),
                    "omnipack old defaults (png, float32)": ("png", {"pixel_dtype": "float32"}),
                }
            )
        res: dict[tuple[str, int], list[tuple[int, int, float]]] = {}
        for _ in range(repeats):  # every pipeline once per repeat, in turn: load drift falls on all alike
            for w in (0, 2):
                res.setdefault((FLOOR, w), []).append(bench_floor(dss["npy"], w, passes))
                for name, (ds, options) in pipelines.items():
                    res.setdefault((name, w), []).append(bench_omnipack(dss[ds], w, passes, **options))
                res.setdefault(("online", w), []).append(
                    bench_online(online, seq_length, w, passes, online_batch)
                )
        check_s, loader_s, check_rows = contract_check_cost(dss["npy"])
    load_after = os.getloadavg()
    kinds = (
        "images only" if profile == "qwen2_5_vl" else "1/4 photo(s), 1/4 video, 1/4 audio, 1/4 photo+audio"
    )
    rep = f"{repeats} interleaved repeats, " if repeats > 1 else ""
    out = [
        f"### {profile} ({kinds}; {samples} samples, W={seq_length}, {passes} pass(es), {rep}"
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after)",
        "",
        "Prepare (offline, once; write stage = the `write_shard` units; png = the previous write path: png "
        "images, rows built in turn; seconds: median (min)):",
        "",
        "| storage | prepare s | write stage s | write speed vs png, median (min-max) | shard MB |",
        "|---|---:|---:|---:|---:|",
    ]
    base = prep["png"]["write_s"]
    for name, st in prep.items():
        label = (
            "npy images + stored video [default]"
            if name == "npy"
            else "png images + deflated video [old default]"
        )
        ratios = [b / w for b, w in zip(base, st["write_s"], strict=True)]
        out.append(
            f"| {label} | {statistics.median(st['prepare_s']):.1f} ({min(st['prepare_s']):.1f}) | "
            f"{statistics.median(st['write_s']):.2f} ({min(st['write_s']):.2f}) | {_ratio_cells(ratios)} | "
            f"{st['bytes'] / 1e6:.0f} |"
        )
    out += [
        "",
        *storage,
        "",
        "Loader (samples/s is the fair measure; ratio against online with the same workers in the same repeat; "
        "samples/s: median (max) over repeats):",
        "",
    ]
    out += [
        "| pipeline | workers | rows | samples | sec | samples/s | samples/s vs online, median (min-max) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (name, w), runs in res.items():
        if name == FLOOR:
            continue
        rates = [s / sec if sec else float("nan") for _, s, sec in runs]
        online_rates = [so / to if to else float("nan") for _, so, to in res[("online", w)]]
        ratios = [a / b for a, b in zip(rates, online_rates, strict=True)]
        r, s, _ = runs[0]
        secs = statistics.median(sec for _, _, sec in runs)
        out.append(
            f"| {name} | {w} | {r} | {s} | {secs:.2f} | {statistics.median(rates):.1f} ({max(rates):.1f}) | "
            f"{_ratio_cells(ratios)} |"
        )
    out += ["", *floor_table(res, "omnipack default (npy, uint8 pixels, row check on)")]
    out += [
        "",
        f"Per-row contract check: {check_s * 1e3 / check_rows:.2f} ms per row, {check_s:.3f} s of a {loader_s:.2f} s "
        f"in-process pass over {check_rows} rows = {100 * check_s / loader_s:.1f}% of loader time.",
    ]
    return out


FLOOR = "floor: tar members -> tensors, no decoding"


def floor_table(res: dict[tuple[str, int], list[tuple[int, int, float]]], default: str) -> list[str]:
    """The loader's pipelines against the physical floor with the same workers, in the same repeat:
    samples/s median (min-max) and floor rate / pipeline rate, median (min-max)."""
    out = [
        f"Against the physical floor (`{FLOOR}` = each row's tar members read at their `.tar.idx` offset into "
        "uint8 tensors, nothing decoded; with workers read into shared memory and handed over; x = floor "
        "samples/s / pipeline samples/s in the same repeat, target <= x2 for the default):",
        "",
        "| pipeline | workers | samples/s, median (min-max) | x floor, median (min-max) |",
        "|---|---:|---:|---:|",
    ]
    for w in sorted({w for _, w in res}):
        floor = [s / sec for _, s, sec in res[(FLOOR, w)]]
        for (name, w2), runs in res.items():
            if w2 != w or name == "online":
                continue
            rates = [s / sec for _, s, sec in runs]
            ratios = [f / r for f, r in zip(floor, rates, strict=True)]
            label = f"**{name}**" if name == default else name
            out.append(
                f"| {label} | {w} | {statistics.median(rates):.1f} ({min(rates):.1f}-{max(rates):.1f}) | "
                + ("x1.00 |" if name == FLOOR else
                   f"x{statistics.median(ratios):.2f} (x{min(ratios):.2f}-x{max(ratios):.2f}) |")
            )
    return out


def floor_run(profile: str, samples: int, seq_length: int, repeats: int, passes: int) -> list[str]:
    """Only the loader against its floor: the floor, the default, the default without the row check,
    without buffer reuse, with patches cut in the worker and (families with ``wave_features``) with the
    audio log-mel computed in the worker (the previous default), 0 and 2 workers,
    every pipeline once per repeat in turn (order reversed every other repeat)."""
    from omnipack.profiles import get_profile

    pipelines: dict[str, dict[str, Any]] = {
        FLOOR: {},
        "omnipack default": {},
        "omnipack default, check_rows=False": {"check_rows": False},
        "omnipack default, reuse_buffers=False": {"reuse_buffers": False},
        "omnipack, patches cut in the worker": {"patches_in_worker": True},
    }
    if get_profile(profile).inputs().wave_features():
        pipelines["omnipack, log-mel in the worker (previous default)"] = {"audio_features": "worker"}
    load_before = os.getloadavg()
    res: dict[tuple[str, int], list[tuple[int, int, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        _, _, _, dss, _ = prepare(Path(tmp), profile, samples, seq_length, ["npy"])
        for r in range(repeats):
            for w in (0, 2):
                order = list(pipelines.items()) if r % 2 == 0 else list(reversed(pipelines.items()))
                for name, options in order:
                    run = (
                        bench_floor(dss["npy"], w, passes)
                        if name == FLOOR
                        else bench_omnipack(dss["npy"], w, passes, **options)
                    )
                    res.setdefault((name, w), []).append(run)
    res = {k: res[k] for w in (0, 2) for k in [(n, w) for n in pipelines]}
    kinds = "images only" if profile == "qwen2_5_vl" else "1/4 photo(s), 1/4 video, 1/4 audio, 1/4 photo+audio"
    return [
        f"### {profile} against the floor ({kinds}; {samples} samples, W={seq_length}, {repeats} repeats of "
        f"{passes} pass(es); load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after)",
        "",
        *floor_table(res, "omnipack default"),
    ]


def reuse_ab(profile: str, samples: int, seq_length: int, rounds: int, passes: int) -> list[str]:
    """The worker batch hand-over, 2 workers, alternating in every round (order reversed every other
    round): the default (buffers reused, small tensors copied out on arrival), reuse without the copy-out
    (the previous default) and ``reuse_buffers=False``. On a shared machine the rounds differ by up to 2x,
    so the measure is each pipeline's rate over the default's in the same round (median, min-max)."""
    from omnipack.loader import buffer_pool

    variants = {
        "default (buffers reused, small tensors copied out)": ({}, buffer_pool.PIN_RATIO),
        "buffers reused, nothing copied out (previous default)": ({}, 10**12),
        "reuse_buffers=False": ({"reuse_buffers": False}, buffer_pool.PIN_RATIO),
    }
    rates: dict[str, list[float]] = {k: [] for k in variants}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        _, _, _, dss, _ = prepare(Path(tmp), profile, samples, seq_length, ["npy"])
        try:
            for r in range(rounds):
                order = list(variants.items()) if r % 2 == 0 else list(reversed(variants.items()))
                for name, (options, ratio) in order:
                    buffer_pool.PIN_RATIO = ratio  # read in this (the trainer) process on each arrival
                    _, n, sec = bench_omnipack(dss["npy"], 2, passes, **options)
                    rates[name].append(n / sec)
        finally:
            buffer_pool.PIN_RATIO = variants[next(iter(variants))][1]
    base = rates[next(iter(variants))]
    out = [
        f"### {profile} hand-over A/B ({samples} samples, W={seq_length}, 2 workers, {rounds} rounds of "
        f"{passes} pass(es); load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after)",
        "",
        "| pipeline | samples/s, median (min-max) | vs default in the same round, median (min-max) |",
        "|---|---:|---:|",
    ]
    for name, rs in rates.items():
        ratios = [a / b for a, b in zip(rs, base, strict=True)]
        out.append(
            f"| {name} | {statistics.median(rs):.1f} ({min(rs):.1f}-{max(rs):.1f}) | "
            f"x{statistics.median(ratios):.2f} (x{min(ratios):.2f}-x{max(ratios):.2f}) |"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small corpus, one pass")
    ap.add_argument("--profiles", default="qwen3_omni,qwen2_5_vl")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--seq-length", type=int, default=8192)
    ap.add_argument("--passes", type=int, default=None)
    ap.add_argument("--online-batch", type=int, default=None, help="raw samples per online batch")
    ap.add_argument("--repeats", type=int, default=1, help="prepares and loader runs per pipeline, in turn")
    ap.add_argument(
        "--no-reference", action="store_true", help="loader: only the default pipelines and online"
    )
    ap.add_argument(
        "--reuse-ab",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="only the worker hand-over: default vs no copy-out vs reuse_buffers=False, alternating",
    )
    ap.add_argument(
        "--floor",
        type=int,
        default=0,
        metavar="REPEATS",
        help="only the loader against its physical floor (0 and 2 workers), REPEATS interleaved repeats",
    )
    args = ap.parse_args()
    samples = args.samples or (24 if args.quick else 96)
    passes = args.passes or 1
    online_batch = args.online_batch or (8 if args.quick else 16)
    torch.set_num_threads(1)  # both sides single-threaded per process; workers give the parallelism
    print(f"cpus={os.cpu_count()}; timing starts after each worker's first batch\n")
    for profile in args.profiles.split(","):
        if args.floor:
            lines = floor_run(profile, samples, args.seq_length, args.floor, passes)
            print("\n".join(lines) + "\n", flush=True)
            continue
        if args.reuse_ab:
            lines = reuse_ab(profile, samples, args.seq_length, args.reuse_ab, args.passes or 2)
            print("\n".join(lines) + "\n", flush=True)
            continue
        lines = run_profile(
            profile,
            samples,
            args.seq_length,
            passes,
            online_batch,
            repeats=args.repeats,
            reference=not args.no_reference,
        )
        print("\n".join(lines) + "\n", flush=True)


if __name__ == "__main__":
    main()
