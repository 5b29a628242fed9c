"""Audio: probing, decoding to mono at the profile's rate as the reference loader does, exact storage.

Reference loader: ``librosa.load(path, sr=16000)`` with its defaults, which is what Qwen's own loading helper
(``qwen_omni_utils.process_mm_info``) calls for audio files and for a video's audio track, and what
transformers 5.x ``audio_utils.load_audio(..., backend="soundfile")`` reproduces ("identical to librosa.load"):

1. decode with soundfile (libsndfile: WAV, FLAC, OGG, MP3 through mpg123, AIFF, ...) to float32, with
   libsndfile's integer scaling (16-bit ``k / 2**15``, 24/32-bit ``k / 2**31``);
2. mix to mono by the float32 mean over channels (``librosa.to_mono``);
3. resample with soxr at high quality (librosa's default ``res_type="soxr_hq"``), then cut or zero-pad to
   ``ceil(n * (target / source))`` as ``librosa.resample(fix=True)`` computes it.

Containers libsndfile cannot read (mp4/m4a/mov/mkv/webm, AAC, the audio track of any video) are decoded by
FFmpeg through PyAV, keeping the decoder's float samples, then steps 2 and 3. That is Qwen's helper for a
video given as bytes (PyAV decode, channel mean, ``librosa.resample``); for a path, librosa < 1.0 falls back
to audioread, which pipes the same FFmpeg decode through the ``ffmpeg`` CLI as int16 (at most one int16 step
apart; librosa 1.0 drops that fallback), and transformers' torchcodec backend resamples with libswresample
instead of soxr. The decoded length is used as it is: AAC's last frame is padded (a 2 s 44.1 kHz clip decodes
to 89088 samples, not the container's 88200: FFmpeg drops the encoder delay but keeps the padded frame) and
the FFmpeg-based loaders above return it, so the plan's sample count is probed from the decoded stream, never from the
container duration.

Why PyAV and not torchaudio for those containers: torchaudio is in maintenance mode since 2.9 and its
load/save go through TorchCodec, which pins one exact torch release, tying this offline tool to the trainer's
torch. PyAV bundles FFmpeg and needs no torch.

Storage (``storage_array``): the waveform the counts and features come from, bit for bit. When every sample
is ``k / 32768`` for an int16 ``k`` (a 16 kHz mono 8/16-bit source: no resampling, no channel mean) it is
stored as int16 ``k`` (2 bytes per sample, 32 kB per second); otherwise as float32 (4 bytes per sample,
64 kB per second), since resampled, mixed, 24-bit or float audio has no exact int16 form. The reader scales
int16 by ``1 / 32768``, the same scale as libsndfile, so both round-trip exactly. Datasets written before
this rule stored int16 scaled by 32767; they still load (read by ``1 / 32768``), one int16 step off for
samples with ``|x| >= 0.5``.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from .audio_storage import INT16_SCALE
from .errors import MediaError, MediaRejected
from .meta import MediaMeta

AUDIO_RATE = 16000  # every supported profile's encoder consumes 16 kHz mono
AUDIO_ENCODING = "npy"  # mono [N] .npy: int16 when that is exact, else float32 (see storage_array)
RESAMPLE_QUALITY = "soxr_hq"  # librosa.load's default res_type
# libsndfile subtypes whose header frame count is exactly what decodes (lossy codecs are counted by decoding)
_EXACT_HEADER_SUBTYPES = ("PCM_", "FLOAT", "DOUBLE", "ULAW", "ALAW")
_READ_BLOCK = 1 << 16


def resampled_length(num_samples: int, src_rate: int, dst_rate: int = AUDIO_RATE) -> int:
    """Samples after resampling a whole clip: ``ceil(n * (dst / src))`` in float64, exactly as
    ``librosa.resample(fix=True)`` computes it (the reference loader's length).

    The stored waveform has exactly this many samples, so it also defines token counts.
    """
    if src_rate <= 0:
        raise MediaError(f"audio sample rate is {src_rate}")
    if src_rate == dst_rate:
        return num_samples
    return int(np.ceil(num_samples * (float(dst_rate) / src_rate)))


def audio_samples_at(meta: MediaMeta, rate: int) -> int:
    """The probed clip's sample count after resampling to ``rate``; rejects unusable audio."""
    if not meta.sample_rate:
        raise MediaRejected("audio sample rate unknown or zero")
    if not meta.num_samples or meta.num_samples <= 0:
        raise MediaRejected("zero-length audio")
    if meta.sample_rate < 0:
        raise MediaRejected(f"audio sample rate is {meta.sample_rate}")
    return resampled_length(meta.num_samples, meta.sample_rate, rate)


# ---- decoders: soundfile (the reference's own) and FFmpeg via PyAV (containers libsndfile cannot read) ----


def _soundfile(path: Path):
    """An open ``soundfile.SoundFile``, or None when libsndfile does not read this format (librosa's fallback
    condition: ``SoundFileRuntimeError``)."""
    import soundfile as sf

    try:
        return sf.SoundFile(str(path))
    except sf.SoundFileRuntimeError:
        return None


def _av_open(path: Path):
    import av

    try:
        return av.open(str(path))
    except av.error.FFmpegError as e:
        raise MediaError(f"unreadable audio container: {type(e).__name__}: {e}") from None


def _av_stream(container, required: bool):
    if not container.streams.audio:
        if required:
            raise MediaError("no audio track")
        return None
    stream = container.streams.audio[0]
    if not (stream.sample_rate or stream.codec_context.sample_rate):
        raise MediaError("audio sample rate is 0")
    if stream.codec_context.codec is None:
        raise MediaError(f"unsupported audio codec {stream.codec_context.name!r}")
    return stream


# Integer sample formats -> float32 with libsndfile's scales (an FFmpeg decoder's native output format).
_AV_INT_SCALE = {"u8": 128.0, "s16": 32768.0, "s32": 2.0**31, "s64": 2.0**63}


def _av_frame_channels(frame) -> np.ndarray:
    """float32 [C, n] of one decoded frame."""
    arr = frame.to_ndarray()
    fmt = frame.format.name.rstrip("p")
    if not frame.format.is_planar:
        arr = arr.reshape(-1, frame.layout.nb_channels).T
    if fmt == "u8":
        return (arr.astype(np.float32) - 128.0) / np.float32(128.0)
    if fmt in _AV_INT_SCALE:
        return (arr.astype(np.float64) / _AV_INT_SCALE[fmt]).astype(np.float32)
    return arr.astype(np.float32, copy=False)


def _av_decode(path: Path, *, count_only: bool) -> tuple[np.ndarray | int, int]:
    """(mono float32 waveform at the source rate, or its sample count; source rate) of the first audio stream."""
    import av

    container = _av_open(path)
    chunks: list[np.ndarray] = []
    n = 0
    try:
        stream = _av_stream(container, required=True)
        rate = stream.sample_rate or stream.codec_context.sample_rate
        for frame in container.decode(stream):
            if frame.sample_rate != rate:
                raise MediaError(f"audio sample rate changes mid-stream ({rate} -> {frame.sample_rate} Hz)")
            n += frame.samples
            if not count_only:
                chunks.append(_av_frame_channels(frame).mean(axis=0))  # librosa.to_mono: channel mean
    except av.error.FFmpegError as e:
        raise MediaError(f"audio decode failed: {type(e).__name__}: {e}") from None
    finally:
        container.close()
    if n == 0:
        raise MediaError("zero-length audio (no decodable audio frames)")
    if count_only:
        return n, rate
    return np.concatenate(chunks).astype(np.float32, copy=False), rate


def _sf_count(f) -> int:
    """Frames libsndfile decodes: the header count for PCM/FLAC, else counted by decoding (MP3/Vorbis/Opus
    headers can be estimates)."""
    if f.format == "FLAC" or f.subtype.startswith(_EXACT_HEADER_SUBTYPES):
        return int(f.frames)
    n = 0
    while block := len(f.read(_READ_BLOCK, dtype="float32", always_2d=True)):
        n += block
    return n


def _sf_decode(f) -> np.ndarray:
    """Mono float32 waveform at the source rate, read as librosa reads it."""
    try:
        data = f.read(dtype="float32", always_2d=True)  # [n, C]
    except RuntimeError as e:
        raise MediaError(f"audio decode failed: {e}") from None
    return data[:, 0] if data.shape[1] == 1 else data.T.mean(axis=0)


def has_audio_track(path: Path) -> bool:
    """Whether the container has an audio stream (metadata only)."""
    c = _av_open(path)
    try:
        return bool(c.streams.audio)
    finally:
        c.close()


def probe_audio_stream(
    path: Path, *, required: bool = False, container: bool = False
) -> tuple[int, int] | None:
    """(decoded samples at the source rate, source rate) of the first audio stream, or None if there is none
    (and not ``required``). ``container=True`` skips libsndfile (the audio track of a video)."""
    f = None if container else _soundfile(path)
    if f is not None:
        with f:
            rate = int(f.samplerate)
            if rate <= 0:
                raise MediaError("audio sample rate is 0")
            try:
                n = _sf_count(f)
            except RuntimeError as e:
                raise MediaError(f"audio decode failed: {e}") from None
    else:
        if not required and not has_audio_track(path):
            return None
        n, rate = _av_decode(path, count_only=True)
    if n <= 0:
        raise MediaError("zero-length audio")
    return int(n), int(rate)


def probe_audio(path: Path) -> MediaMeta:
    """Decoded sample count and sample rate of an audio file (header only for PCM/FLAC)."""
    info = probe_audio_stream(path, required=True)
    assert info is not None
    n, rate = info
    return MediaMeta(kind="audio", num_samples=n, sample_rate=rate)


def resample(wave: np.ndarray, src_rate: int, rate: int = AUDIO_RATE) -> np.ndarray:
    """``librosa.resample(wave, orig_sr=src_rate, target_sr=rate)`` with its defaults: soxr HQ, fixed length."""
    if src_rate == rate:
        return wave
    import soxr

    out = soxr.resample(wave, src_rate, rate, quality=RESAMPLE_QUALITY)
    n = resampled_length(wave.shape[0], src_rate, rate)
    if out.shape[0] >= n:
        return np.ascontiguousarray(out[:n], dtype=np.float32)
    return np.concatenate([out, np.zeros(n - out.shape[0], dtype=np.float32)]).astype(np.float32, copy=False)


def decode_audio(path: Path, rate: int = AUDIO_RATE, *, container: bool = False) -> np.ndarray:
    """The first audio stream as the reference loader returns it: mono float32 [N] at ``rate``.

    ``container=True`` decodes with FFmpeg even if libsndfile could read the file (a video's audio track).
    """
    f = None if container else _soundfile(path)
    if f is not None:
        with f:
            src_rate = int(f.samplerate)
            wave = _sf_decode(f)
    else:
        wave, src_rate = _av_decode(path, count_only=False)
    if wave.size == 0:
        raise MediaError("zero-length audio")
    return resample(wave, src_rate, rate)


def load_audio(
    path: Path,
    num_samples: int,
    rate: int = AUDIO_RATE,
    *,
    truncate: bool = False,
    container: bool = False,
) -> np.ndarray:
    """The decoded clip (float32 mono at ``rate``), which must be exactly the plan's ``num_samples`` long
    (``truncate``: or longer, cut to it, for profiles that cap the clip's length).

    The plan's count was probed from the same decode, so any other length means the file changed or is
    damaged (e.g. truncated behind an intact header); it is rejected, never padded."""
    if num_samples <= 0:
        raise MediaError("zero-length audio")
    wave = decode_audio(path, rate, container=container)
    n = wave.shape[0]
    if n == num_samples or (truncate and n > num_samples):
        return wave[:num_samples]
    raise MediaError(
        f"audio decodes to {n} samples at {rate} Hz but was planned with {num_samples}: the file is "
        "truncated or changed since it was probed"
    )


def storage_array(wave: np.ndarray) -> np.ndarray:
    """The stored form of a float waveform: int16 ``k`` when every sample is exactly ``k / 32768``, else
    float32; ``audio_waveform`` of the result is ``wave`` again, bit for bit. An int16 input is kept as is."""
    wave = np.asarray(wave)
    if wave.dtype == np.int16:
        return wave
    wave = wave.astype(np.float32, copy=False)
    scaled = wave * np.float32(INT16_SCALE)  # exact: a power of two
    if (
        wave.size
        and np.array_equal(scaled, np.rint(scaled))
        and scaled.min() >= -32768
        and scaled.max() <= 32767
    ):
        return scaled.astype(np.int16)
    return wave


def encode_audio(samples: np.ndarray) -> tuple[str, bytes]:
    """(extension, bytes): mono .npy in :func:`storage_array` form (int16 when exact, else float32)."""
    arr = storage_array(samples)
    if arr.ndim != 1:
        raise MediaError(f"audio to store has shape {arr.shape}, expected [n]")
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return AUDIO_ENCODING, buf.getvalue()
