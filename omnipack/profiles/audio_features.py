"""Log-mel front ends of the audio encoders, in torch alone (the trainer install has no transformers).

Two front ends (their normalisation statistics are per clip):

- ``whisper_log_mel``: Whisper's log10 mel spectrogram (Qwen3-Omni, 128 bins): a centred, reflect-padded
  STFT (periodic Hann of 400, hop 160), power, slaney mel filters up to 8 kHz, ``log10(max(x, 1e-10))``
  floored at the clip maximum minus 8 and mapped by ``(x + 4) / 4``; the last STFT frame is dropped, so a
  clip of ``n`` samples gives ``n // 160`` frames. ``WhisperLogMel`` computes it for a batch of clips at
  once (each as if alone) from the stored samples that ``whisper_padded_waves`` lays out, where the
  loader's batch is used; ``whisper_log_mel`` is it on one clip.
- ``parakeet_log_mel``: the Parakeet / NeMo front end (Nemotron Omni): pre-emphasis 0.97, a centred,
  zero-padded STFT (symmetric Hann of 400 inside an FFT of 512, hop 160), power, slaney mel filters up to
  half the rate, ``ln(x + 2**-24)``, then per-bin mean / unbiased std over the ``n // 160`` valid frames;
  ``n // 160 + 1`` frames come out, the last zeroed and masked.

These are the transformers 5.x ``WhisperFeatureExtractor`` / ``ParakeetFeatureExtractor`` computations;
``tests/test_profiles_audio_features.py`` holds them to the real classes (max abs difference <= 1e-4).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..media.audio_storage import INT16_SCALE
from .model_inputs import audio_waveform

HOP_LENGTH = 160


def hz_to_slaney_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear (3 per 200 Hz) below 1 kHz, logarithmic (27 steps per ln 6.4) above."""
    hz = np.asarray(hz, dtype=np.float64)
    mel = hz * 3.0 / 200.0
    log_part = 15.0 + np.log(np.maximum(hz, 1e-12) / 1000.0) * (27.0 / math.log(6.4))
    return np.where(hz >= 1000.0, log_part, mel)


def slaney_mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    hz = mel * 200.0 / 3.0
    log_part = 1000.0 * np.exp((mel - 15.0) * (math.log(6.4) / 27.0))
    return np.where(mel >= 15.0, log_part, hz)


@functools.lru_cache(maxsize=8)
def slaney_mel_filters(
    n_fft: int, num_mels: int, sample_rate: int, max_hz: float, *, round_before_norm: bool = False
) -> np.ndarray:
    """float32 ``[num_mels, n_fft // 2 + 1]`` triangular filters, area-normalised (slaney norm).

    Band edges are ``num_mels + 2`` points equally spaced on the slaney mel scale from 0 to ``max_hz``;
    bin frequencies are equally spaced from 0 to ``sample_rate // 2``. Computed in float64, stored float32;
    ``round_before_norm`` rounds the triangles to float32 before the normalisation (Parakeet's filters are
    built that way, Whisper's are normalised in float64), so each matches its extractor bit for bit.
    """
    bins = np.linspace(0.0, sample_rate // 2, n_fft // 2 + 1)
    edges = slaney_mel_to_hz(np.linspace(hz_to_slaney_mel(0.0), hz_to_slaney_mel(max_hz), num_mels + 2))
    width = np.diff(edges)
    rel = edges[None, :] - bins[:, None]  # [bins, edges]
    rising = -rel[:, :-2] / width[:-1]
    falling = rel[:, 2:] / width[1:]
    tri = np.maximum(0.0, np.minimum(rising, falling))  # [bins, mels]
    if round_before_norm:
        tri = tri.astype(np.float32)
    tri *= 2.0 / (edges[2:] - edges[:-2])
    return np.ascontiguousarray(tri.T, dtype=np.float32)


@functools.lru_cache(maxsize=8)
def _filters_tensor(
    n_fft: int, num_mels: int, sample_rate: int, max_hz: float, round_before_norm: bool
) -> Any:
    import torch

    filters = slaney_mel_filters(n_fft, num_mels, sample_rate, max_hz, round_before_norm=round_before_norm)
    return torch.from_numpy(filters)


def _wave_tensor(wave: np.ndarray) -> Any:
    """float32 torch view of a clip (a copy when the array is read-only, e.g. a view of payload bytes)."""
    import torch

    arr = np.ascontiguousarray(wave, dtype=np.float32)
    return torch.from_numpy(arr if arr.flags.writeable else arr.copy())


WHISPER_N_FFT = 400
# Whisper's centred STFT reflect-pads each clip by n_fft // 2 samples at both ends.
WHISPER_PAD = WHISPER_N_FFT // 2


def whisper_log_mel(wave: np.ndarray, num_mels: int = 128, sample_rate: int = 16000) -> np.ndarray:
    """float32 ``[num_mels, n // 160]`` Whisper log-mel of one float32 clip of ``n`` samples (``n > 200``):
    ``WhisperLogMel`` on a batch of this clip alone (so a clip's features are the same bits in either)."""
    import torch

    x = _wave_tensor(wave)
    check_whisper_clip(tuple(x.shape))
    padded = torch.nn.functional.pad(x[None], (WHISPER_PAD, WHISPER_PAD), mode="reflect")
    front_end = WhisperLogMel(lengths_key="", num_mels=num_mels, sample_rate=sample_rate)
    return front_end(padded, [x.numel() // HOP_LENGTH])[0].numpy()


def check_whisper_clip(shape: tuple[int, ...]) -> None:
    """ValueError unless ``shape`` is a 1-D clip long enough for Whisper's reflect padding."""
    if len(shape) != 1 or shape[0] <= WHISPER_PAD:
        raise ValueError(f"whisper log-mel needs a 1-D clip of more than {WHISPER_PAD} samples, got {shape}")


def whisper_padded_waves(waves: Sequence[np.ndarray], out: np.ndarray) -> None:
    """Write clips (int16 or float32 ``[n_i]``, ``n_i > 200``) into the rows of ``out`` (``[N, L]``, ``L >=
    max(n_i) + 400``, same dtype or float32) as ``WhisperLogMel`` takes them: each clip reflect-padded by
    200 samples at both ends (as the centred STFT pads it), zeros after. int16 clips stay int16 when ``out``
    is (scaled on the device), else become ``k / 32768`` (``model_inputs.audio_waveform``'s float32)."""
    p = WHISPER_PAD
    for row, wave in zip(out, waves, strict=True):
        check_whisper_clip(tuple(wave.shape))
        x = wave if wave.dtype == out.dtype else audio_waveform(wave)
        n = x.shape[0]
        row[p : p + n] = x
        row[:p] = x[1 : p + 1][::-1]  # reflect (the edge not repeated): x[p], ..., x[1]
        row[p + n : n + 2 * p] = x[n - 1 - p : n - 1][::-1]  # x[n-2], ..., x[n-1-p]
        row[n + 2 * p :] = 0


@dataclass(frozen=True)
class WhisperLogMel:
    """Whisper's log-mel front end over a batch of clips, where the batch is used (the GPU for
    ``PackedBatch.as_dict(device)``): the loader ships each clip's stored samples (int16: 1.6x fewer bytes
    than its float32 features) and no STFT runs in the loader.

    ``__call__(waves, frames)``: ``waves`` ``[N, L]`` (int16 stored samples, scaled by 1/32768 here, or
    float32) laid out by ``whisper_padded_waves``; ``frames``: each clip's ``n_i // 160`` (Python ints,
    read from the batch's ``lengths_key`` tensor on the host). Returns float32 ``[N, num_mels, max(frames)]``,
    zero past each clip's frames (as the Qwen3-Omni collate pads them). Each clip's features are computed as
    if it were alone (its own reflect padding and maximum); the STFT, log and floor run batched, the mel
    projection per clip on its own frames, so the bits do not depend on the batch's other clips. On CPU
    within 1e-4 of ``WhisperFeatureExtractor`` and bit-identical to ``whisper_log_mel`` of each clip
    (``tests/test_profiles_audio_features.py``); on a GPU the FFT and matmul round differently (not yet
    measured against the extractor there).
    """

    lengths_key: str
    num_mels: int = 128
    sample_rate: int = 16000

    def __call__(self, waves: Any, frames: Sequence[int]) -> Any:
        import torch

        x = waves.to(torch.float32)
        if waves.dtype == torch.int16:
            x = x / INT16_SCALE  # exact, as audio_waveform's numpy division
        window = torch.hann_window(WHISPER_N_FFT, device=x.device)
        spec = torch.stft(x, WHISPER_N_FFT, HOP_LENGTH, window=window, center=False, return_complex=True)
        power = spec.abs() ** 2  # [N, bins, frames]
        filters = _filters_tensor(WHISPER_N_FFT, self.num_mels, self.sample_rate, 8000.0, False).to(x.device)
        width = max(frames)
        mel = torch.zeros((x.shape[0], self.num_mels, width), dtype=torch.float32, device=x.device)
        for i, f in enumerate(frames):  # the last STFT frame of each clip is dropped, as Whisper does
            mel[i, :, :f] = filters @ power[i, :, :f].contiguous()
        lengths = torch.tensor(list(frames), device=x.device)
        valid = torch.arange(width, device=x.device)[None, :] < lengths[:, None]
        log = torch.clamp(mel, min=1e-10).log10()
        top = log.masked_fill(~valid[:, None, :], float("-inf")).amax(dim=(1, 2), keepdim=True)
        log = torch.maximum(log, top - 8.0)
        return ((log + 4.0) / 4.0).masked_fill_(~valid[:, None, :], 0.0)


def parakeet_log_mel(
    wave: np.ndarray, num_mels: int = 128, sample_rate: int = 16000, preemphasis: float = 0.97
) -> tuple[np.ndarray, np.ndarray]:
    """(float32 ``[n // 160 + 1, num_mels]``, bool ``[n // 160 + 1]``) Parakeet features and valid-frame mask
    of one float32 clip of ``n`` samples."""
    import torch

    n_fft, win = 512, 400
    x = _wave_tensor(wave)
    if x.ndim != 1 or x.numel() < 1:
        raise ValueError(f"parakeet log-mel needs a non-empty 1-D clip, got {tuple(x.shape)}")
    if preemphasis:
        x = torch.cat([x[:1], x[1:] - preemphasis * x[:-1]])
    spec = torch.stft(
        x[None],
        n_fft,
        hop_length=HOP_LENGTH,
        win_length=win,
        window=torch.hann_window(win, periodic=False),
        center=True,
        pad_mode="constant",
        return_complex=True,
    )
    power = torch.view_as_real(spec).pow(2).sum(-1).sqrt().pow(2)  # |z|^2 through the magnitude
    mel = _filters_tensor(n_fft, num_mels, sample_rate, sample_rate / 2, True) @ power
    feats = torch.log(mel + 2.0**-24).permute(0, 2, 1)[0]  # [frames, mels]
    valid = (x.numel() + n_fft // 2 * 2 - n_fft) // HOP_LENGTH
    mask = torch.arange(feats.shape[0]) < valid
    m = mask[:, None]
    masked = feats * m
    mean = masked.sum(0, keepdim=True) / valid
    var = ((masked - mean) ** 2 * m).sum(0, keepdim=True) / (valid - 1)
    out = (feats - mean) / (var.sqrt() + 1e-5) * m
    return out.numpy(), mask.numpy()
