"""Synthesize media files with PyAV for the demo and the tests (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_video(
    path: Path, n: int = 10, fps: int = 10, w: int = 64, h: int = 48, audio_rate: int | None = None
) -> np.ndarray:
    """libx264 mp4 with ``n`` solid-colour frames (value 20*i); optional stereo aac track as long as the video."""
    import av

    frames = np.stack([np.full((h, w, 3), (i * 20) % 256, np.uint8) for i in range(n)])
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.options = {"crf": "0"}
        a = None
        if audio_rate:
            a = c.add_stream("aac", rate=audio_rate)
            a.layout = "stereo"
        for f in frames:
            for pk in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(pk)
        for pk in s.encode():
            c.mux(pk)
        if a is not None:
            _encode_audio(c, a, sine(int(n / fps * audio_rate), audio_rate), audio_rate, 2)
    return frames


def sine(n: int, rate: int, freq: float = 440.0) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * freq * np.arange(n) / rate)).astype(np.float32)


def _encode_audio(c, stream, wave: np.ndarray, rate: int, channels: int) -> None:
    import av

    layout = "stereo" if channels == 2 else "mono"
    fmt = stream.codec_context.format.name if stream.codec_context.format else "fltp"
    size = stream.codec_context.frame_size or 1024
    # one converter for the stream (a new one per chunk builds a filter graph each time: most of the cost)
    convert = av.AudioResampler(format=fmt, layout=layout, rate=rate) if fmt != "fltp" else None
    pts = 0
    for st in range(0, len(wave), size):
        chunk = np.stack([wave[st : st + size]] * channels)
        frame = av.AudioFrame.from_ndarray(chunk.astype(np.float32), format="fltp", layout=layout)
        frame.sample_rate, frame.pts = rate, pts
        pts += chunk.shape[1]
        if convert is not None:
            frame = convert.resample(frame)[0]
            frame.pts = pts - chunk.shape[1]
        for pk in stream.encode(frame):
            c.mux(pk)
    for pk in stream.encode():
        c.mux(pk)


def write_audio(path: Path, wave: np.ndarray, rate: int, channels: int = 1) -> None:
    """wav (pcm_s16le), flac, mp3 or m4a (aac) by suffix."""
    import av

    codec = {".wav": "pcm_s16le", ".flac": "flac", ".mp3": "libmp3lame", ".m4a": "aac"}[path.suffix]
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=rate)
        s.layout = "stereo" if channels == 2 else "mono"
        _encode_audio(c, s, wave, rate, channels)
