"""One entry point to probe any media kind cheaply, and to materialise it for a shard."""

from __future__ import annotations

from pathlib import Path

from ..profiles.base import MediaMeta, MediaPlan
from .errors import MediaError


def probe(path: Path, kind: str) -> MediaMeta:
    """Cheap metadata of a media file (header / container only)."""
    path = Path(path)
    if not path.is_file():
        raise MediaError(f"missing {kind} file: {path}")
    if path.stat().st_size == 0:
        raise MediaError(f"empty {kind} file")
    if kind == "image":
        from .image import probe_image

        return probe_image(path)
    if kind == "video":
        from .video import probe_video

        return probe_video(path)
    if kind == "audio":
        from .audio import probe_audio

        return probe_audio(path)
    raise MediaError(f"unsupported media kind {kind!r}")


def materialize(
    path: Path, plan: MediaPlan, *, image_encoding: str = "npy", compress_video: bool = False
) -> tuple[str, bytes]:
    """Decode ``path`` exactly as ``plan`` says and return (extension, bytes) for the shard.

    image: npy (default) or png uint8 RGB [H,W,3] (npy [V,H,W,3] when the plan has ``image_views``); video: npz (stored by default, deflated with ``compress_video``)
    with ``frames`` uint8 [T,H,W,3] (plus ``audio`` when the plan interleaves the video's own audio);
    audio: npy mono at ``plan.sample_rate``, int16 when exact else float32
    (``omnipack.media.audio.storage_array``).
    """
    path = Path(path)
    if plan.kind == "image":
        from .image import encode_image, load_image

        pixels = load_image(path, plan.target_hw, views=plan.image_views, resample=plan.resample)
        # png holds one picture: views are always npy
        return encode_image(pixels, image_encoding if pixels.ndim == 3 else "npy")
    if plan.kind == "video":
        from .video import materialize_video

        return materialize_video(path, plan, compress=compress_video)
    if plan.kind == "audio":
        from .audio import AUDIO_RATE, encode_audio, load_audio

        if not plan.num_audio_samples:
            raise MediaError("audio plan has no sample count")
        wave = load_audio(
            path,
            plan.num_audio_samples,
            plan.sample_rate or AUDIO_RATE,
            truncate=bool(plan.info.get("truncated")),  # a profile's length cap (Nemotron's 30 s)
        )
        return encode_audio(wave)
    raise MediaError(f"unsupported media kind {plan.kind!r}")
