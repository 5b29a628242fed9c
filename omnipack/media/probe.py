"""One entry point to probe any media kind cheaply, and to materialise it for a shard.

Both take what the source resolver gives (:class:`~omnipack.media.sources.MediaSource`) or a local path, bytes
or an open binary file. Images are read from a file object (a remote one in ranged blocks, so a probe reads
the header only); video and audio decoders need a local file, so remote, embedded and tar-member sources are
spooled to a temporary file first.
"""

from __future__ import annotations

import io
import os
from typing import IO

from .audio import AUDIO_RATE, encode_audio, load_audio, probe_audio
from .errors import MediaError
from .image import encode_image, load_image, probe_image
from .meta import MediaMeta
from .sources import MediaSource, as_source
from .storage_plan import HasStoragePlan, StoragePlan, storage_of
from .video import materialize_video, probe_video

SourceLike = MediaSource | str | os.PathLike | bytes | IO[bytes]


def _check_present(src: MediaSource, kind: str) -> None:
    path = src.local_file()
    if path is not None:
        if not path.is_file():
            raise MediaError(f"missing {kind} file: {path}")
        if path.stat().st_size == 0:
            raise MediaError(f"empty {kind} file")
    elif src.kind == "bytes" and not src.data:
        raise MediaError(f"empty {kind} data")


def probe(source: SourceLike, kind: str) -> MediaMeta:
    """Cheap metadata of a media object (header / container only)."""
    src = as_source(source)
    _check_present(src, kind)
    if kind == "image":
        with src.open() as f:
            return probe_image(f)
    if kind not in ("video", "audio"):
        raise MediaError(f"unsupported media kind {kind!r}")
    with src.local_path() as path:
        if path.stat().st_size == 0:
            raise MediaError(f"empty {kind} file")
        if kind == "video":
            return probe_video(path)
        return probe_audio(path)


def materialize(
    source: SourceLike,
    plan: StoragePlan | HasStoragePlan,
    *,
    image_encoding: str = "npy",
    compress_video: bool = False,
) -> tuple[str, bytes]:
    """Decode ``source`` exactly as ``plan`` (a :class:`StoragePlan`, or a profile's plan carrying one) says
    and return (extension, bytes) for the shard.

    image: npy (default) or png uint8 RGB [H,W,3] (npy [V,H,W,3] when the plan has ``image_views``); video: npz (stored by default, deflated with ``compress_video``)
    with ``frames`` uint8 [T,H,W,3] (plus ``audio`` when the plan interleaves the video's own audio);
    audio: npy mono at ``plan.sample_rate``, int16 when exact else float32
    (``omnipack.media.audio.storage_array``).
    """
    src = as_source(source)
    plan = storage_of(plan)
    if plan.kind == "image":
        # the whole object is decoded: fetched in one (retried) read rather than in probe-sized ranges
        with src.open() if src.kind == "file" else io.BytesIO(src.read_bytes()) as f:
            pixels = load_image(f, plan.target_hw, views=plan.image_views, resample=plan.resample)
        # png holds one picture: views are always npy
        return encode_image(pixels, image_encoding if pixels.ndim == 3 else "npy")
    if plan.kind == "video":
        with src.local_path() as path:
            return materialize_video(path, plan, compress=compress_video)
    if plan.kind == "audio":
        if not plan.num_audio_samples:
            raise MediaError("audio plan has no sample count")
        with src.local_path() as path:
            wave = load_audio(
                path,
                plan.num_audio_samples,
                plan.sample_rate or AUDIO_RATE,
                truncate=plan.truncate,  # a profile's length cap (Nemotron's 30 s)
            )
        return encode_audio(wave)
    raise MediaError(f"unsupported media kind {plan.kind!r}")
