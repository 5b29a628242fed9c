"""A small synthetic corpus: chat samples with generated images, plus a few broken ones.

The broken samples show that bad input becomes a reject with a reason instead of a crash or a silent drop.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from .media import sine, write_audio, write_video

WORDS = [
    "red",
    "blue",
    "green",
    "square",
    "circle",
    "picture",
    "shows",
    "left",
    "right",
    "corner",
    "small",
    "large",
    "bright",
    "dark",
    "object",
]


def _sentence(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(WORDS, size=n)).capitalize() + "."


def _image(rng: np.random.Generator, path: Path, height: int, width: int) -> None:
    # Gradients and a checkerboard: structure for resizing to act on, yet small as PNG.
    y, x = np.mgrid[0:height, 0:width]
    checker = ((x // 16 + y // 16) % 2) * int(rng.integers(32, 96))
    base = np.stack([x * 255 // max(width, 1), y * 255 // max(height, 1), checker], axis=-1)
    Image.fromarray(base.clip(0, 255).astype(np.uint8)).save(path)


# The demo's clips, (frames, fps, width, height): odd frame counts and a one-frame clip, each with its own
# audio track.
DEMO_CLIPS: tuple[tuple[int, int, int, int], ...] = ((12, 6, 96, 64), (5, 5, 64, 64), (1, 1, 80, 48), (9, 3, 128, 96))


def _video_and_audio(
    rng: np.random.Generator, media: Path, kinds: tuple[str, ...], clips: Sequence[tuple[int, int, int, int]]
) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"video": [], "audio": []}
    if "video" in kinds:
        for i, (n, fps, w, h) in enumerate(clips):
            write_video(media / f"clip{i}.mp4", n=n, fps=fps, w=w, h=h, audio_rate=16000)
            out["video"].append(f"clip{i}.mp4")
    if "audio" in kinds:
        for i, (secs, rate, ext) in enumerate(
            [(1.0, 16000, "wav"), (2.3, 44100, "flac"), (0.62, 22050, "wav")]
        ):
            write_audio(media / f"sound{i}.{ext}", sine(int(secs * rate), rate, 220.0 * (i + 1)), rate)
            out["audio"].append(f"sound{i}.{ext}")
    return out


def build_demo_corpus(
    root: Path,
    num_samples: int = 200,
    seed: int = 0,
    kinds: tuple[str, ...] = ("image",),
    clips: Sequence[tuple[int, int, int, int]] = DEMO_CLIPS,
) -> tuple[Path, Path]:
    """Write ``root/media/*`` and ``root/manifest.jsonl``; returns (manifest, media_root).

    ``kinds`` selects the media the corpus uses (a profile's ``kinds``): images always, video and audio
    when listed; ``clips`` the videos' (frames, fps, width, height).
    """
    rng = np.random.default_rng(seed)
    media = root / "media"
    media.mkdir(parents=True, exist_ok=True)
    sizes = [(480, 640), (224, 224), (100, 1000), (20, 30), (900, 600), (64, 64)]
    for i, (h, w) in enumerate(sizes):
        _image(rng, media / f"img{i}.png", h, w)
    Image.fromarray(rng.integers(0, 255, (50, 80, 3), dtype=np.uint8)).save(media / "photo.jpg", quality=90)
    av_media = _video_and_audio(rng, media, kinds, clips)
    lines = [_demo_sample(rng, i, av_media, len(sizes)) for i in range(num_samples)]
    lines += _broken_samples(media)
    manifest = root / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return manifest, media


def _demo_sample(rng: np.random.Generator, i: int, av_media: dict[str, list[str]], num_images: int) -> dict:
    """Sample ``i`` of the corpus: a mix of text-only, one-image, two-image and two-turn chats, with a video
    every third sample and an audio clip every fifth when the corpus has them."""
    kind = i % 4
    user: list[dict] = []
    if i % 3 == 0 and av_media["video"]:
        user.append({"type": "video", "video": str(rng.choice(av_media["video"]))})
    if i % 5 == 0 and av_media["audio"]:
        user.append({"type": "audio", "audio": str(rng.choice(av_media["audio"]))})
    if kind in (1, 2):
        user.append({"type": "image", "image": f"img{rng.integers(num_images)}.png"})
    if kind == 2:
        user.append({"type": "image", "image": "photo.jpg"})
    user.append({"type": "text", "text": _sentence(rng, int(rng.integers(3, 40)))})
    messages = [
        {"role": "user", "content": user},
        {"role": "assistant", "content": _sentence(rng, int(rng.integers(2, 60)))},
    ]
    if kind == 3:
        messages += [
            {"role": "user", "content": _sentence(rng, 8)},
            {"role": "assistant", "content": [{"type": "text", "text": _sentence(rng, 20)}]},
        ]
    return {"id": f"demo-{i:05d}", "messages": messages}


def _broken_samples(media: Path) -> list[dict]:
    """Deliberately broken samples, each rejected with its own reason (writes the corrupt image they use)."""
    (media / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png")
    ask = {"role": "assistant", "content": "ok"}
    return [
        {
            "id": "bad-missing",
            "messages": [{"role": "user", "content": [{"type": "image", "image": "nope.png"}]}, ask],
        },
        {
            "id": "bad-corrupt",
            "messages": [{"role": "user", "content": [{"type": "image", "image": "corrupt.png"}]}, ask],
        },
        {
            "id": "bad-escape",
            "messages": [{"role": "user", "content": [{"type": "image", "image": "../../etc/passwd"}]}, ask],
        },
        {"id": "bad-role", "messages": [{"role": "robot", "content": "hi"}, ask]},
        {
            "id": "bad-empty",
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}],
        },
        {"id": "bad-long", "messages": [{"role": "user", "content": "word " * 5000}, ask]},
    ]
