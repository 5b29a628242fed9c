"""Video: probing, frame sampling by the profile's indices, resizing, lossless storage.

Frame counts come from decord, not from the container header: decord is what decodes the frames, so its
``len(VideoReader)`` is the index space the plan's frame indices live in (a container's ``nb_frames`` can
be missing or disagree with what actually decodes, e.g. after edit lists or B-frame reordering).
Size comes from PyAV's container metadata (no decode); the audio track's sample count from decoding it, since
that is what the reference loaders return (AAC pads its last frame beyond the container duration).

Frames are stored as the model will see them: uint8 RGB ``frames`` ``[T, H, W, 3]``, already sampled
(incl. the repeated frames that pad to the temporal patch) and resized to the plan's target size, in a
deflate-compressed ``.npz`` (lossless, numpy-only to read, never pickled; raw frames are large). A video
whose own audio track is used (audio-in-video) adds ``audio``: mono at 16 kHz, decoded, mixed and resampled as
``omnipack.media.audio`` documents, exactly the plan's length, stored int16 when exact else float32.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from .audio import (
    AUDIO_RATE,
    has_audio_track,
    load_audio,
    probe_audio_stream,
    resampled_length,
    storage_array,
)
from .errors import MediaError
from .meta import MediaMeta
from .storage_plan import StoragePlan

VIDEO_ENCODING = "npz"
RESAMPLE = Image.Resampling.BICUBIC  # as for images; the trainer never resizes again


def _reader(path: Path):
    import decord

    try:
        return decord.VideoReader(str(path), ctx=decord.cpu(0), num_threads=1)
    except (decord.DECORDError, RuntimeError) as e:
        raise MediaError(f"unreadable video: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None


def _container_size(path: Path) -> tuple[int, int] | None:
    """(width, height) of the first video stream from container metadata, or None."""
    import av

    try:
        with av.open(str(path)) as c:
            if not c.streams.video:
                raise MediaError("no video stream")
            s = c.streams.video[0]
            if s.codec_context.codec is None:
                raise MediaError(f"unsupported video codec {s.codec_context.name!r}")
            if s.width and s.height:
                return s.width, s.height
    except av.error.FFmpegError as e:
        raise MediaError(f"unreadable video container: {type(e).__name__}: {e}") from None
    return None


def probe_video(path: Path, *, audio_rate: int = AUDIO_RATE) -> MediaMeta:
    """Frame count and fps (decord), size (PyAV) and the audio track's decoded length (PyAV); no frame decode
    except as a fallback."""
    size = _container_size(path)
    vr = _reader(path)
    num_frames = len(vr)
    if num_frames <= 0:
        raise MediaError("video has no decodable frames")
    fps = float(vr.get_avg_fps())
    if not fps > 0:
        raise MediaError(f"video fps is {fps}")
    if size is None:
        h, w = vr[0].shape[:2]
        size = (w, h)
    audio = probe_audio_stream(path, required=False, container=True)
    audio_n = resampled_length(audio[0], audio[1], audio_rate) if audio else None
    return MediaMeta(
        kind="video",
        width=size[0],
        height=size[1],
        num_frames=num_frames,
        fps=fps,
        has_audio=audio is not None,
        audio_num_samples=audio_n,
    )


def load_frames(path: Path, indices: tuple[int, ...], target_hw: tuple[int, int] | None) -> np.ndarray:
    """uint8 [len(indices), H, W, 3]: the frames at ``indices`` (repeats allowed), resized to ``target_hw``."""
    if not indices:
        raise MediaError("no frames to sample")
    vr = _reader(path)
    n = len(vr)
    if n <= 0:
        raise MediaError("video has no decodable frames")
    if max(indices) >= n or min(indices) < 0:
        raise MediaError(f"frame index out of range: {max(indices)} >= {n} decodable frames")
    uniq = sorted(set(indices))
    try:
        batch = vr.get_batch(uniq).asnumpy()
    except Exception as e:  # decord raises its own error types from C++
        # decord's frame copy fails on some small frame widths (e.g. 96 px); PyAV decodes the same stream
        # in the same order, so its i-th frame is decord's frame i.
        batch = _decode_frames_av(path, uniq)
        if batch is None:
            raise MediaError(
                f"video decode failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            ) from None
    if batch.shape[0] != len(uniq):
        raise MediaError("video decode returned fewer frames than requested")
    pos = {idx: i for i, idx in enumerate(uniq)}
    frames = []
    for idx in indices:
        f = batch[pos[idx]]
        if target_hw is not None and f.shape[:2] != tuple(target_hw):
            f = np.asarray(Image.fromarray(f).resize((target_hw[1], target_hw[0]), resample=RESAMPLE))
        frames.append(f)
    return np.ascontiguousarray(np.stack(frames).astype(np.uint8))


def _decode_frames_av(path: Path, wanted: list[int]) -> np.ndarray | None:
    """Frames at sorted ``wanted`` indices by sequential PyAV decode; None if they cannot all be decoded."""
    import av

    want = set(wanted)
    got: dict[int, np.ndarray] = {}
    try:
        with av.open(str(path)) as c:
            for i, frame in enumerate(c.decode(video=0)):
                if i in want:
                    got[i] = frame.to_ndarray(format="rgb24")
                if i >= wanted[-1]:
                    break
    except av.error.FFmpegError:
        return None
    if len(got) != len(want):
        return None
    return np.stack([got[i] for i in wanted])


def encode_video(
    frames: np.ndarray, audio: np.ndarray | None = None, *, compress: bool = True
) -> tuple[str, bytes]:
    """(extension, bytes): ``.npz`` with ``frames`` (and ``audio`` for audio-in-video); deflate-compressed
    unless ``compress`` is False (larger shards, no inflate at load time)."""
    buf = io.BytesIO()
    arrays = {"frames": frames} if audio is None else {"frames": frames, "audio": storage_array(audio)}
    (np.savez_compressed if compress else np.savez)(buf, **arrays)
    return VIDEO_ENCODING, buf.getvalue()


def materialize_video(path: Path, plan: StoragePlan, *, compress: bool = True) -> tuple[str, bytes]:
    """Frames (and, when the plan interleaves it, the video's own audio track) as the model consumes them."""
    if plan.frame_indices is None:
        raise MediaError("video plan has no frame indices")
    frames = load_frames(path, plan.frame_indices, plan.target_hw)
    audio = None
    if plan.num_audio_samples:
        if not has_audio_track(path):
            raise MediaError("use_audio_in_video requested but the video has no audio track")
        audio = load_audio(path, plan.num_audio_samples, plan.sample_rate or AUDIO_RATE, container=True)
    return encode_video(frames, audio, compress=compress)
