"""Audio fidelity and cost: omnipack's audio path against the reference loader, with the previous path as
the baseline measured in the same run.

Reference: ``librosa.load(path, sr=16000)`` where libsndfile reads the file; for AAC (m4a, an mp4's track)
Qwen's helper's PyAV branch (FFmpeg decode, channel mean, ``librosa.resample``). Baseline: the previous
omnipack path (PyAV decode, libswresample to 16 kHz, channel mean, length from container metadata padded or
cut, int16 written as ``x * 32767`` and read back as ``/ 32768``). For each file: the sample count, the max
log-mel difference of the Whisper front end (Qwen3-Omni) against the reference, the probe and materialise
times, and the stored bytes per second.

    PYTHONPATH=. python benchmarks/bench_audio.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np

RATE = 16000


def _signal(n: int, rate: int, channels: int, amp: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    t = np.arange(n) / rate
    x = np.stack(
        [
            0.6 * np.sin(2 * np.pi * (440 + 220 * c) * t) + 0.3 * np.sin(2 * np.pi * 1733 * t + c)
            for c in range(channels)
        ],
        axis=1,
    )
    x += 0.05 * rng.standard_normal(x.shape)
    return x / np.abs(x).max() * amp


def _write_aac(path: Path, x: np.ndarray, rate: int) -> None:
    import av

    layout = "stereo" if x.shape[1] == 2 else "mono"
    with av.open(str(path), "w") as c:
        s = c.add_stream("aac", rate=rate)
        s.layout = layout
        for st in range(0, x.shape[0], 1024):
            fr = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(x[st : st + 1024].T, dtype=np.float32), format="fltp", layout=layout
            )
            fr.sample_rate, fr.pts = rate, st
            for pk in s.encode(fr):
                c.mux(pk)
        for pk in s.encode():
            c.mux(pk)


def make_files(root: Path, seconds: float) -> list[tuple[str, Path]]:
    import soundfile as sf

    specs = [
        ("wav s16 16k mono 0.9", "a.wav", 16000, 1, 0.9, "PCM_16"),
        ("wav s16 16k stereo", "b.wav", 16000, 2, 0.9, "PCM_16"),
        ("wav s24 48k stereo", "c.wav", 48000, 2, 0.9, "PCM_24"),
        ("wav f32 22.05k quiet", "d.wav", 22050, 1, 1e-3, "FLOAT"),
        ("flac s16 44.1k stereo", "e.flac", 44100, 2, 0.9, "PCM_16"),
        ("mp3 44.1k stereo", "f.mp3", 44100, 2, 0.9, "MPEG_LAYER_III"),
        ("aac m4a 44.1k stereo", "g.m4a", 44100, 2, 0.9, None),
        ("aac m4a 8k mono quiet", "h.m4a", 8000, 1, 1e-3, None),
    ]
    out = []
    for label, name, rate, ch, amp, subtype in specs:
        p = root / name
        x = _signal(int(seconds * rate), rate, ch, amp)
        if subtype is None:
            _write_aac(p, x, rate)
        else:
            sf.write(str(p), x, rate, subtype=subtype)
        out.append((label, p))
    return out


def reference(path: Path) -> np.ndarray:
    import av
    import librosa
    import soundfile as sf

    try:
        sf.info(str(path))
    except sf.SoundFileRuntimeError:
        with av.open(str(path)) as c:
            s = c.streams.audio[0]
            y = np.concatenate([f.to_ndarray().mean(axis=0) for f in c.decode(s)])
        return librosa.resample(y, orig_sr=s.sample_rate, target_sr=RATE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return librosa.load(str(path), sr=RATE)[0]


def baseline(path: Path) -> tuple[np.ndarray, float, float]:
    """The previous path: (waveform as read back, probe s, materialise s)."""
    import av

    t0 = time.perf_counter()
    with av.open(str(path)) as c:
        s = c.streams.audio[0]
        if s.duration is not None:
            n_src = int(round(s.duration * s.time_base * s.sample_rate))
        else:
            n_src = int(round(Fraction(c.duration, av.time_base) * s.sample_rate))
        rate = s.sample_rate
    n = -(-n_src * RATE // rate)
    t1 = time.perf_counter()
    chunks = []
    with av.open(str(path)) as c:
        res = None
        for fr in c.decode(audio=0):
            if res is None:
                res = av.AudioResampler(format="fltp", layout=fr.layout.name, rate=RATE)
            chunks += [o.to_ndarray().mean(axis=0) for o in res.resample(fr)]
        chunks += [o.to_ndarray().mean(axis=0) for o in res.resample(None)]
    w = np.concatenate(chunks).astype(np.float32)
    w = w[:n] if len(w) >= n else np.concatenate([w, np.zeros(n - len(w), np.float32)])
    stored = np.clip(np.rint(w * 32767.0), -32768, 32767).astype(np.int16)
    t2 = time.perf_counter()
    return stored.astype(np.float32) / 32768.0, t1 - t0, t2 - t1


def omnipack_path(path: Path) -> tuple[np.ndarray, float, float, int]:
    from omnipack.loader.media import decode_payload
    from omnipack.media.probe import materialize, probe
    from omnipack.profiles import get_profile
    from omnipack.profiles.model_inputs import audio_waveform

    t0 = time.perf_counter()
    meta = probe(path, "audio")
    t1 = time.perf_counter()
    ext, data = materialize(path, get_profile("qwen3_omni").plan(meta))
    t2 = time.perf_counter()
    stored = decode_payload(f"x.{ext}", data)
    return audio_waveform(stored), t1 - t0, t2 - t1, stored.dtype.itemsize


def mel_diff(a: np.ndarray, ref_feats: np.ndarray) -> float:
    from omnipack.profiles.qwen3_omni import whisper_features

    f = whisper_features(a)
    if f.shape != ref_feats.shape:
        return float("nan")  # a different length: a different token count
    return float(np.abs(f - ref_feats).max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from omnipack.profiles.qwen3_omni import whisper_features

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in make_files(Path(tmp), args.seconds):
            ref = reference(path)
            ref_feats = whisper_features(ref)
            base = [baseline(path) for _ in range(args.repeat)]
            new = [omnipack_path(path) for _ in range(args.repeat)]
            bw, nw = base[0][0], new[0][0]
            rows.append(
                (
                    label,
                    len(ref),
                    len(bw),
                    len(nw),
                    mel_diff(bw, ref_feats),
                    mel_diff(nw, ref_feats),
                    int(np.sum(nw != ref)),
                    min(b[1] for b in base) * 1e3,
                    min(n[1] for n in new) * 1e3,
                    min(b[2] for b in base) * 1e3,
                    min(n[2] for n in new) * 1e3,
                    new[0][3] * RATE // 1000,
                )
            )
    head = (
        "| file | ref samples | base samples | new samples | base max Δlog-mel | new max Δlog-mel | new samples ≠ ref "
        "| probe ms base / new | materialise ms base / new (×) | stored kB/s base / new |"
    )
    print(f"{args.seconds:g} s clips, best of {args.repeat}\n")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        print(
            f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.2e} | {r[5]:.2e} | {r[6]} | {r[7]:.1f} / {r[8]:.1f} "
            f"| {r[9]:.1f} / {r[10]:.1f} (×{r[10] / r[9]:.2f}) | 32 / {r[11]} |"
        )


if __name__ == "__main__":
    main()
