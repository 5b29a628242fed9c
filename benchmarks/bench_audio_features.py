"""Audio encoder features at load time (torch front ends) vs stored at prepare time: bytes and loader speed.

For clips of several lengths, per front end (Whisper 128-mel for Qwen3-Omni, Parakeet 128-mel for
Nemotron Omni):

- stored bytes per second of audio: the waveform as datasets store it (int16, 16 kHz) against the features
  stored instead (float32, or float16 at the cost of exactness);
- loader time per second of audio, from the stored part's bytes to the encoder input array:
  the transformers extractor (the baseline: what the loader called before, and the fidelity oracle),
  omnipack's torch front end on the stored waveform, and reading stored float32 features (npy view + copy
  into the batch);
- the max abs difference of the torch front end against the extractor.

Ratios are against the transformers extractor measured in the same run.

    PYTHONPATH=. python benchmarks/bench_audio_features.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import io
import time

import numpy as np
import torch

RATE = 16000
SECONDS = (2.0, 10.0, 30.0)


def _clip(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    wave = 0.3 * np.sin(2 * np.pi * 220 * t * (1 + 0.1 * np.sin(t))) + 0.05 * rng.standard_normal(n)
    return np.round(np.clip(wave, -1, 1) * 32767).astype(np.int16)


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _best(fn, arg, repeat: int) -> float:
    """Best of ``repeat`` timings of ``fn(view_npy(arg))`` (from the stored part's bytes)."""
    from omnipack.dataset.codec import view_npy

    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(view_npy(arg))
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a loader worker uses 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import ParakeetFeatureExtractor, WhisperFeatureExtractor

    from omnipack.dataset.codec import view_npy
    from omnipack.profiles.model_inputs import audio_waveform
    from omnipack.profiles.nemotron_omni import parakeet_features
    from omnipack.profiles.qwen3_omni import whisper_features

    whisper_fe = WhisperFeatureExtractor(feature_size=128)
    parakeet_fe = ParakeetFeatureExtractor(feature_size=128, sampling_rate=RATE)

    def hf_whisper(stored: np.ndarray) -> np.ndarray:
        out = whisper_fe(
            audio_waveform(stored),
            sampling_rate=RATE,
            padding=True,
            truncation=False,
            return_attention_mask=True,
            return_tensors="np",
        )
        return out["input_features"][0][:, : int(out["attention_mask"][0].sum())]

    def hf_parakeet(stored: np.ndarray) -> np.ndarray:
        out = parakeet_fe(audio_waveform(stored), sampling_rate=RATE, return_tensors="np")
        return out["input_features"][0]

    fronts = {
        "whisper (qwen3_omni)": (hf_whisper, whisper_features),
        "parakeet (nemotron_omni)": (hf_parakeet, lambda s: parakeet_features(s, 128)[0]),
    }
    hdr = (
        f"| {'front end':<25} | {'clip s':>6} | {'wave B/s':>8} | {'f32 feat B/s':>12} | {'x wave':>6} "
        f"| {'f16 x wave':>10} | {'HF ms/s':>7} | {'torch ms/s':>10} | {'x HF':>5} | {'stored ms/s':>11} "
        f"| {'x HF':>6} | {'max abs diff':>12} |"
    )
    print(hdr)
    print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    for label, (hf, ours) in fronts.items():
        for i, sec in enumerate(SECONDS):
            stored = _clip(sec, i)
            wave_part = _npy(stored)
            want = hf(stored)
            got = ours(view_npy(wave_part))
            assert got.shape == want.shape
            diff = float(np.abs(got - want).max())
            feat_part = _npy(np.ascontiguousarray(want, dtype=np.float32))
            f16_bytes = want.size * 2 + 128
            t_hf = _best(hf, wave_part, args.repeat)
            t_ours = _best(ours, wave_part, args.repeat)
            t_stored = _best(np.array, feat_part, args.repeat)
            wave_bps, feat_bps = len(wave_part) / sec, len(feat_part) / sec
            print(
                f"| {label:<25} | {sec:>6.0f} | {wave_bps:>8.0f} | {feat_bps:>12.0f} | {feat_bps / wave_bps:>6.2f} "
                f"| {f16_bytes / len(wave_part):>10.2f} | {1e3 * t_hf / sec:>7.3f} | {1e3 * t_ours / sec:>10.3f} "
                f"| {t_ours / t_hf:>5.2f} | {1e3 * t_stored / sec:>11.4f} | {t_stored / t_hf:>6.3f} | {diff:>12.2e} |"
            )


if __name__ == "__main__":
    main()
