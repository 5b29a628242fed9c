"""Audio: container probing, decoding to mono at the profile's rate, lossless int16 encoding.

Why PyAV and not torchaudio: torchaudio is in maintenance mode since 2.9; its load/save now route
through TorchCodec, which pins one exact torch release, so it would tie this offline tool to the
trainer's torch. PyAV bundles FFmpeg (any container: wav, flac, mp3, m4a, the audio track of an mp4)
and its ``AudioResampler`` is libswresample, so decoding and resampling need no torch at all.

Sample counts: the plan's count is computed from container metadata at probe time (cheap); when
materialising, the decoded waveform is padded with zeros or trimmed to exactly that count so the
stored samples always match the placeholder count. A decoded length far from the metadata (more than
``LENGTH_TOLERANCE``) means a broken or truncated file and is rejected instead.
"""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import numpy as np

from ..profiles.base import MediaMeta
from ..profiles.base import resampled_length as _resampled_length
from .errors import MediaError

AUDIO_RATE = 16000  # every supported profile's encoder consumes 16 kHz mono
AUDIO_ENCODING = "npy"  # int16 [N] little-endian .npy: lossless after quantisation, trivially loadable
# Relative and absolute slack between metadata and decoded length (codec priming / padding frames).
LENGTH_TOLERANCE = 0.05
LENGTH_SLACK_S = 0.1


def resampled_length(num_samples: int, src_rate: int, dst_rate: int = AUDIO_RATE) -> int:
    """Samples after resampling a whole clip (see :func:`omnipack.profiles.base.resampled_length`)."""
    if src_rate <= 0:
        raise MediaError(f"audio sample rate is {src_rate}")
    return _resampled_length(num_samples, src_rate, dst_rate)


def _open(path: Path):
    import av

    try:
        return av.open(str(path))
    except av.error.FFmpegError as e:
        raise MediaError(f"unreadable audio container: {type(e).__name__}: {e}") from None


def _stream_samples(container, stream) -> int | None:
    """Sample count of an audio stream at its own rate from metadata, or None if unknown."""
    rate = stream.sample_rate or stream.codec_context.sample_rate
    if stream.duration is not None and stream.time_base is not None:
        return int(round(stream.duration * stream.time_base * rate))
    if container.duration is not None:
        import av

        return int(round(Fraction(container.duration, av.time_base) * rate))
    return None


def probe_audio_stream(path: Path, *, required: bool = False) -> tuple[int, int] | None:
    """(num_samples, sample_rate) of the first audio stream, or None if there is none (and not required)."""
    container = _open(path)
    try:
        if not container.streams.audio:
            if required:
                raise MediaError("no audio track")
            return None
        stream = container.streams.audio[0]
        rate = stream.sample_rate or stream.codec_context.sample_rate or 0
        if rate <= 0:
            raise MediaError("audio sample rate is 0")
        if stream.codec_context.codec is None:
            raise MediaError(f"unsupported audio codec {stream.codec_context.name!r}")
        n = _stream_samples(container, stream)
        if n is None:
            raise MediaError("audio duration unknown from the container")
        if n <= 0:
            raise MediaError("zero-length audio")
        return n, rate
    finally:
        container.close()


def probe_audio(path: Path) -> MediaMeta:
    """Duration and sample rate from the container (no decode)."""
    info = probe_audio_stream(path, required=True)
    assert info is not None
    n, rate = info
    return MediaMeta(kind="audio", num_samples=n, sample_rate=rate)


def decode_audio(path: Path, rate: int = AUDIO_RATE) -> np.ndarray:
    """The first audio stream decoded, mixed to mono (channel mean) and resampled to ``rate``; float32 [N].

    Resampling keeps the source layout and the mono mix is an explicit mean, so the mix does not depend on
    libswresample's downmix matrix.
    """
    import av

    container = _open(path)
    chunks: list[np.ndarray] = []
    try:
        if not container.streams.audio:
            raise MediaError("no audio track")
        stream = container.streams.audio[0]
        if not (stream.sample_rate or stream.codec_context.sample_rate):
            raise MediaError("audio sample rate is 0")
        resampler = None
        for frame in container.decode(stream):
            if resampler is None:
                resampler = av.AudioResampler(format="fltp", layout=frame.layout.name, rate=rate)
            for out in resampler.resample(frame):
                chunks.append(out.to_ndarray().mean(axis=0))
        if resampler is not None:
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().mean(axis=0))
    except av.error.FFmpegError as e:
        raise MediaError(f"audio decode failed: {type(e).__name__}: {e}") from None
    finally:
        container.close()
    if not chunks:
        raise MediaError("zero-length audio (no decodable audio frames)")
    wave = np.concatenate(chunks).astype(np.float32)
    if wave.size == 0:
        raise MediaError("zero-length audio")
    return wave


def fit_length(wave: np.ndarray, num_samples: int) -> np.ndarray:
    """Pad with zeros or trim to exactly ``num_samples``; reject lengths far off the plan (truncated file)."""
    n = wave.shape[0]
    if n != num_samples:
        slack = max(LENGTH_TOLERANCE * num_samples, LENGTH_SLACK_S * AUDIO_RATE)
        if n < num_samples - slack:
            raise MediaError(
                f"audio truncated: decoded {n} samples, container metadata says {num_samples} at {AUDIO_RATE} Hz"
            )
        if n > num_samples:
            wave = wave[:num_samples]
        else:
            wave = np.concatenate([wave, np.zeros(num_samples - n, dtype=wave.dtype)])
    return wave


def to_int16(wave: np.ndarray) -> np.ndarray:
    """float [-1, 1] to int16 with rounding and clipping."""
    return np.clip(np.rint(wave * 32767.0), -32768, 32767).astype(np.int16)


def load_audio(path: Path, num_samples: int, rate: int = AUDIO_RATE) -> np.ndarray:
    """Mono int16 [num_samples] at ``rate``, exactly as the profile's plan says."""
    if num_samples <= 0:
        raise MediaError("zero-length audio")
    return to_int16(fit_length(decode_audio(path, rate), num_samples))


def encode_audio(samples: np.ndarray) -> tuple[str, bytes]:
    """(extension, bytes): int16 mono .npy."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(samples, dtype=np.int16), allow_pickle=False)
    return AUDIO_ENCODING, buf.getvalue()
