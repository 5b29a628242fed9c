"""The torch log-mel front ends equal the transformers feature extractors the profiles used to call.

Oracles: ``WhisperFeatureExtractor(feature_size=128)`` with ``padding=True, truncation=False`` (Qwen3-Omni)
and ``ParakeetFeatureExtractor(feature_size=num_mel_bins, sampling_rate=16000)`` (Nemotron Omni), each on
one clip alone, as the profiles configured them. Max abs difference <= 1e-4 on the log-mel, lengths and
masks exact.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnipack.profiles import get_profile
from omnipack.profiles.audio_features import slaney_mel_filters
from omnipack.profiles.model_inputs import MediaInputOptions, audio_waveform, wave_samples_key
from omnipack.profiles.nemotron_omni import parakeet_features
from omnipack.profiles.qwen3_omni import whisper_features

PLAIN = MediaInputOptions()  # float32 pixels, built eagerly, private memory

transformers = pytest.importorskip("transformers")
TOL = 1e-4
RATE = 16000


def _clips() -> list[tuple[str, np.ndarray]]:
    """Stored clips (int16 and float32) of the kinds datasets hold: tones, speech-like noise bursts,
    quiet and clipped signals, silence, lengths around the hop and the Whisper minimum."""
    rng = np.random.default_rng(11)
    out = []
    for n in (201, 399, 1600, 16000, 27_777, 16000 * 31 + 7):
        t = np.arange(n) / RATE
        tone = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 3100 * t)
        bursts = rng.standard_normal(n) * (np.sin(2 * np.pi * 3 * t) > 0)
        wave = (tone + 0.05 * bursts).astype(np.float32)
        out.append((f"tone{n}-int16", np.round(wave * 32767).astype(np.int16)))
        out.append((f"tone{n}-float32", wave))
    quiet = (1e-3 * rng.standard_normal(20_000)).astype(np.float32)
    out.append(("quiet-float32", quiet))
    out.append(
        ("clipped-int16", np.clip(rng.standard_normal(12_345) * 30_000, -32768, 32767).astype(np.int16))
    )
    out.append(("silence-int16", np.zeros(8000, np.int16)))
    return out


CLIPS = _clips()


def _hf_whisper(wave: np.ndarray) -> np.ndarray:
    fe = transformers.WhisperFeatureExtractor(feature_size=128)
    out = fe(
        wave,
        sampling_rate=RATE,
        padding=True,
        truncation=False,
        return_attention_mask=True,
        return_tensors="np",
    )
    return out["input_features"][0][:, : int(out["attention_mask"][0].sum())]


def _hf_parakeet(wave: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    fe = transformers.ParakeetFeatureExtractor(feature_size=bins, sampling_rate=RATE)
    out = fe(wave, sampling_rate=RATE, return_attention_mask=True, return_tensors="np")
    return out["input_features"][0], out["attention_mask"][0].astype(bool)


@pytest.mark.parametrize("label,stored", CLIPS, ids=[c[0] for c in CLIPS])
def test_whisper_log_mel_equals_the_extractor(label, stored):
    want = _hf_whisper(audio_waveform(stored))
    got = whisper_features(stored)
    assert got.dtype == np.float32 and got.shape == want.shape == (128, len(stored) // 160)
    assert float(np.abs(got - want).max()) <= TOL


@pytest.mark.parametrize("bins", [128, 80])
@pytest.mark.parametrize("label,stored", [c for c in CLIPS if len(c[1]) > 320], ids=lambda c: str(c)[:20])
def test_parakeet_features_equal_the_extractor(label, stored, bins):
    want, want_mask = _hf_parakeet(audio_waveform(stored), bins)
    got, mask = parakeet_features(stored, bins)
    assert got.dtype == np.float32 and got.shape == want.shape == (len(stored) // 160 + 1, bins)
    np.testing.assert_array_equal(mask, want_mask)
    assert int(mask.sum()) == len(stored) // 160
    assert float(np.abs(got - want).max()) <= TOL


def test_mel_filters_are_the_extractors_bit_for_bit():
    whisper = transformers.WhisperFeatureExtractor(feature_size=128).mel_filters.T.astype(np.float32)
    np.testing.assert_array_equal(slaney_mel_filters(400, 128, RATE, 8000.0), whisper)
    parakeet = transformers.ParakeetFeatureExtractor(feature_size=80).mel_filters.numpy()
    np.testing.assert_array_equal(slaney_mel_filters(512, 80, RATE, 8000.0, round_before_norm=True), parakeet)


def test_profiles_use_them_through_the_trainer_half():
    """The encoder inputs of audio items are these features (collated and masked as the models take them)."""
    clips = [s for label, s in CLIPS if label in ("tone1600-int16", "tone27777-float32")]
    item = {"kind": "audio", "info": {}}
    qwen = get_profile("qwen3_omni").inputs()
    batch = qwen.collate_media([qwen.media_inputs(item, c, PLAIN) for c in clips], PLAIN)
    for i, c in enumerate(clips):
        n = len(c) // 160
        assert int(batch["audio_feature_lengths"][i]) == n == int(batch["feature_attention_mask"][i].sum())
        assert (
            float(np.abs(batch["input_features"][i, :, :n].numpy() - _hf_whisper(audio_waveform(c))).max())
            <= TOL
        )
    nemo = get_profile("nemotron_omni", num_mel_bins=80).inputs()
    batch = nemo.collate_media([nemo.media_inputs(item, c, PLAIN) for c in clips], PLAIN)
    for i, c in enumerate(clips):
        want, want_mask = _hf_parakeet(audio_waveform(c), 80)
        k = len(want)
        assert float(np.abs(batch["input_features"][i, :k].numpy() - want).max()) <= TOL
        np.testing.assert_array_equal(batch["input_features_mask"][i, :k].numpy(), want_mask)


def _waves_batch(clips: list[np.ndarray]) -> dict:
    """A Qwen3-Omni audio batch built as the loader's workers build it by default (stored samples)."""
    qwen = get_profile("qwen3_omni").inputs()
    waves = MediaInputOptions(waves=True)
    item = {"kind": "audio", "info": {}}
    return qwen.collate_media([qwen.media_inputs(item, c, waves) for c in clips], waves)


@pytest.mark.parametrize("dtypes", ["int16", "mixed"])
def test_whisper_front_end_on_shipped_samples_equals_the_extractor_per_clip(dtypes):
    """The loader's default audio path: workers ship each clip's stored samples (int16 kept when every
    clip is), the batch's accessor runs ``WhisperLogMel`` over all clips at once; every clip's features
    are the extractor's (1e-4), the same bits as that clip computed alone, zero past its frames."""
    clips = [s for label, s in CLIPS if dtypes == "mixed" or label.endswith("int16")]
    batch = _waves_batch(clips)
    assert "input_features" not in batch  # the samples have a key of their own, never the features'
    waves, lens = batch[wave_samples_key("input_features")], batch["audio_feature_lengths"].tolist()
    assert waves.dtype == (torch.int16 if dtypes == "int16" else torch.float32)
    assert tuple(waves.shape) == (len(clips), max(len(c) for c in clips) + 400)
    assert lens == [len(c) // 160 for c in clips] == batch["feature_attention_mask"].sum(1).tolist()
    front_end = get_profile("qwen3_omni").inputs().wave_features()["input_features"]
    feats = front_end(waves, lens)
    assert feats.dtype == torch.float32 and tuple(feats.shape) == (len(clips), 128, max(lens))
    for i, c in enumerate(clips):
        got = feats[i, :, : lens[i]].numpy()
        np.testing.assert_array_equal(got, whisper_features(c))
        assert float(np.abs(got - _hf_whisper(audio_waveform(c))).max()) <= TOL
        assert float(feats[i, :, lens[i] :].abs().sum()) == 0.0


def test_whisper_front_end_refuses_a_clip_too_short_for_its_padding():
    qwen = get_profile("qwen3_omni").inputs()
    with pytest.raises(ValueError, match="more than 200 samples"):
        qwen.media_inputs({"kind": "audio", "info": {}}, np.zeros(200, np.int16), MediaInputOptions(waves=True))
