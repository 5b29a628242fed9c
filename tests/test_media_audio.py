"""Audio probing and materialisation against the reference loading path, on real encoded files.

Reference: ``librosa.load(path, sr=16000)`` (Qwen's ``qwen_omni_utils`` and transformers' soundfile backend,
checked equal here) for what libsndfile reads; for AAC in mp4/m4a, Qwen's helper's PyAV branch (FFmpeg
decode, channel mean, ``librosa.resample``). The loader's mel features must equal the HF feature extractors'
on the reference audio, and every sample count must be the reference's length.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest

from omnipack.demo.media import sine, write_audio, write_video
from omnipack.loader.media import decode_payload
from omnipack.media.errors import MediaError
from omnipack.media.probe import materialize, probe
from omnipack.media.storage_plan import StoragePlan
from omnipack.profiles import MediaPlan, get_profile
from omnipack.profiles.model_inputs import MediaInputOptions

PLAIN = MediaInputOptions()  # float32 pixels, built eagerly, private memory

av = pytest.importorskip("av")
sf = pytest.importorskip("soundfile")
librosa = pytest.importorskip("librosa")

RATE = 16000
FEATURE_TOL = 1e-4  # the bound; exact storage gives 0


def _signal(n: int, rate: int, channels: int, level: str, seed: int = 0) -> np.ndarray:
    """float64 [n, channels]: distinct tones per channel plus noise, near full scale or very quiet."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    cols = []
    for c in range(channels):
        f = 440.0 * (1.5**c) + 37.0 * c
        x = (
            0.6 * np.sin(2 * np.pi * f * t)
            + 0.3 * np.sin(2 * np.pi * 3.1 * f * t + c)
            + 0.05 * rng.standard_normal(n)
        )
        cols.append(x)
    x = np.stack(cols, axis=1)
    x = x / np.abs(x).max() * (0.97 if level == "loud" else 1e-3)
    return x


def _write_sf(path, x: np.ndarray, rate: int, fmt: str, subtype: str) -> None:
    sf.write(str(path), x, rate, format=fmt, subtype=subtype)


def _write_aac(path, x: np.ndarray, rate: int) -> None:
    """AAC in an mp4/m4a container with per-channel content (PyAV's native encoder)."""
    layout = "stereo" if x.shape[1] == 2 else "mono"
    with av.open(str(path), "w") as c:
        s = c.add_stream("aac", rate=rate)
        s.layout = layout
        size = s.codec_context.frame_size or 1024
        for st in range(0, x.shape[0], size):
            chunk = np.ascontiguousarray(x[st : st + size].T, dtype=np.float32)
            fr = av.AudioFrame.from_ndarray(chunk, format="fltp", layout=layout)
            fr.sample_rate, fr.pts = rate, st
            for pk in s.encode(fr):
                c.mux(pk)
        for pk in s.encode():
            c.mux(pk)


def reference_load(path, *, video: bool = False) -> np.ndarray:
    """The reference loader's float32 16 kHz mono waveform (not omnipack code)."""
    if not video:
        try:
            sf.info(str(path))
        except sf.SoundFileRuntimeError:
            pass
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                y = librosa.load(str(path), sr=RATE)[0]
            from transformers.audio_utils import load_audio

            # transformers' own soundfile backend is the same loader, sample for sample
            np.testing.assert_array_equal(load_audio(str(path), RATE, backend="soundfile"), y)
            return y
    # qwen_omni_utils' PyAV branch: decode, mean over channels, librosa.resample (soxr_hq)
    with av.open(str(path)) as c:
        stream = c.streams.audio[0]
        rate = stream.sample_rate
        y = np.concatenate([np.mean(f.to_ndarray(), axis=0) for f in c.decode(stream)])
    assert y.dtype == np.float32
    return y if rate == RATE else librosa.resample(y, orig_sr=rate, target_sr=RATE)


def hf_whisper(wave: np.ndarray) -> tuple[np.ndarray, int]:
    """Qwen3-Omni's audio front end as its processor calls it: (log-mel [128, L], audio tokens)."""
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
        Qwen3OmniMoeProcessor,
        _get_feat_extract_output_lengths,
    )

    kw = Qwen3OmniMoeProcessor.audio_kwargs  # the processor class's own defaults
    out = WhisperFeatureExtractor(feature_size=128)(wave, return_tensors="np", **kw)
    valid = int(out["attention_mask"][0].sum())
    return out["input_features"][0][:, :valid], int(_get_feat_extract_output_lengths(np.array(valid)))


def hf_parakeet(wave: np.ndarray) -> np.ndarray:
    from transformers import ParakeetFeatureExtractor

    out = ParakeetFeatureExtractor(feature_size=128, sampling_rate=RATE)(
        wave, sampling_rate=RATE, return_attention_mask=True, return_tensors="np"
    )
    return out["input_features"][0]


def _stored(ext: str, data: bytes):
    return decode_payload(f"x.{ext}", data)


# (file suffix, writer, source rate, channels, level)
CASES = [
    ("pcm16.wav", ("WAV", "PCM_16"), 16000, 1, "loud"),
    ("pcm16.wav", ("WAV", "PCM_16"), 16000, 2, "loud"),
    ("pcm16.wav", ("WAV", "PCM_16"), 8000, 1, "quiet"),
    ("u8.wav", ("WAV", "PCM_U8"), 8000, 1, "loud"),
    ("pcm24.wav", ("WAV", "PCM_24"), 48000, 2, "loud"),
    ("pcm24.wav", ("WAV", "PCM_24"), 16000, 1, "quiet"),
    ("float.wav", ("WAV", "FLOAT"), 22050, 1, "quiet"),
    ("float.wav", ("WAV", "FLOAT"), 44100, 2, "loud"),
    ("pcm16.flac", ("FLAC", "PCM_16"), 44100, 2, "loud"),
    ("pcm24.flac", ("FLAC", "PCM_24"), 22050, 1, "quiet"),
    ("sf.mp3", ("MP3", "MPEG_LAYER_III"), 44100, 2, "loud"),
    ("sf.mp3", ("MP3", "MPEG_LAYER_III"), 22050, 1, "quiet"),
    ("aac.m4a", "aac", 44100, 2, "loud"),
    ("aac.m4a", "aac", 48000, 1, "quiet"),
    ("aac.m4a", "aac", 22050, 2, "quiet"),
]


@pytest.mark.parametrize("name,writer,rate,channels,level", CASES)
def test_stored_audio_and_features_are_the_reference(tmp_path, name, writer, rate, channels, level):
    p = tmp_path / f"{rate}_{channels}_{level}_{name}"
    x = _signal(int(rate * 1.37), rate, channels, level)
    if writer == "aac":
        _write_aac(p, x, rate)
    else:
        _write_sf(p, x, rate, *writer)
    ref = reference_load(p)
    ref_feats, ref_tokens = hf_whisper(ref)

    meta = probe(p, "audio")
    assert meta.sample_rate == rate
    qwen, nemo = get_profile("qwen3_omni"), get_profile("nemotron_omni")
    for prof in (qwen, nemo):
        plan = prof.plan(meta)
        assert plan.num_audio_samples == len(ref)  # the count comes from what the reference decodes
        ext, data = materialize(p, plan)
        stored = _stored(ext, data)
        assert stored.dtype in (np.int16, np.float32) and stored.shape == (len(ref),)
        item = {"kind": "audio", "info": plan.info}
        assert prof.inputs().feature_count(item, stored) == plan.num_tokens
        inputs = prof.inputs().media_inputs(item, stored, PLAIN)
        if prof is qwen:
            assert plan.num_tokens == ref_tokens
            got = inputs["input_features"]
            assert got.shape == ref_feats.shape
            assert float(np.abs(got - ref_feats).max()) <= FEATURE_TOL
        else:
            got, want = inputs["input_features"][0], hf_parakeet(ref)
            assert got.shape == want.shape
            assert float(np.abs(got - want).max()) <= FEATURE_TOL
    # storage is exact: int16 only where the waveform sits on the int16 grid (16 kHz mono, <= 16-bit)
    from omnipack.profiles.model_inputs import audio_waveform

    np.testing.assert_array_equal(audio_waveform(stored), ref)
    int16_exact = rate == RATE and channels == 1 and writer in (("WAV", "PCM_16"), ("WAV", "PCM_U8"))
    assert (stored.dtype == np.int16) == int16_exact


def test_pcm16_round_trip_is_bit_exact(tmp_path):
    """Issue 15: a 16 kHz PCM-16 tone at 0.9 came back with 19,961 of 32,000 samples one step off."""
    p = tmp_path / "tone.wav"
    x = 0.9 * np.sin(2 * np.pi * 440 * np.arange(32000) / RATE)
    sf.write(str(p), x, RATE, subtype="PCM_16")
    ints = sf.read(str(p), dtype="int16")[0]
    assert np.abs(ints).max() >= 29000  # many samples with |x| >= 0.5
    plan = get_profile("qwen3_omni").plan(probe(p, "audio"))
    stored = _stored(*materialize(p, plan))
    assert stored.dtype == np.int16
    np.testing.assert_array_equal(stored, ints)


def test_float_source_beyond_int16_grid_is_stored_as_float32(tmp_path):
    """A float WAV at 16 kHz mono is not resampled, but its samples are not k / 32768: int16 would round."""
    p = tmp_path / "f.wav"
    x = _signal(20000, RATE, 1, "quiet")
    sf.write(str(p), x, RATE, subtype="FLOAT")
    plan = get_profile("qwen3_omni").plan(probe(p, "audio"))
    ext, data = materialize(p, plan)
    stored = _stored(ext, data)
    assert stored.dtype == np.float32
    np.testing.assert_array_equal(stored, x[:, 0].astype(np.float32))
    assert len(data) >= 4 * len(stored)  # float32 costs 4 bytes a sample (int16: 2)


def test_pyav_encoded_mp3_matches_reference(tmp_path):
    """An MP3 from FFmpeg's libmp3lame (LAME gapless header): libsndfile/mpg123 is the reference decoder."""
    p = tmp_path / "lame.mp3"
    write_audio(p, sine(int(44100 * 1.5), 44100), 44100, 2)
    ref = reference_load(p)
    plan = get_profile("qwen3_omni").plan(probe(p, "audio"))
    assert plan.num_audio_samples == len(ref) == math.ceil(44100 * 1.5 * RATE / 44100)
    stored = _stored(*materialize(p, plan))
    np.testing.assert_array_equal(stored, ref)


def test_integer_pcm_in_a_container_libsndfile_cannot_read(tmp_path):
    """Interleaved int16 PCM in Matroska goes through FFmpeg (packed s16 frames): the same int16 samples in a
    WAV, loaded by the reference, give the same stored waveform (scale 1 / 32768, channel mean, soxr HQ)."""
    rate = 44100
    ints = np.round(_signal(int(rate * 0.8), rate, 2, "loud") * 32767).astype(np.int16)
    wav, mkv = tmp_path / "a.wav", tmp_path / "a.mkv"
    sf.write(str(wav), ints, rate, subtype="PCM_16")
    with av.open(str(mkv), "w") as c:
        s = c.add_stream("pcm_s16le", rate=rate)
        s.layout = "stereo"
        for st in range(0, len(ints), 4096):
            chunk = np.ascontiguousarray(ints[st : st + 4096]).reshape(1, -1)
            fr = av.AudioFrame.from_ndarray(chunk, format="s16", layout="stereo")
            fr.sample_rate, fr.pts = rate, st
            for pk in s.encode(fr):
                c.mux(pk)
        for pk in s.encode():
            c.mux(pk)
    with pytest.raises(sf.SoundFileRuntimeError):
        sf.info(str(mkv))
    ref = reference_load(wav)
    plan = get_profile("qwen3_omni").plan(probe(mkv, "audio"))
    assert plan.num_audio_samples == len(ref)
    np.testing.assert_array_equal(_stored(*materialize(mkv, plan)), ref)


def test_video_audio_track_uses_the_decoded_length(tmp_path):
    """Issue 9 item 3: a 2 s 44.1 kHz AAC track decodes to 89088 samples (padded last frame), not the
    container's 88200; the count and the stored audio follow the decode, as the reference does."""
    p = tmp_path / "va.mp4"
    write_video(p, n=20, fps=10, w=64, h=64, audio_rate=44100)
    with av.open(str(p)) as c:
        s = c.streams.audio[0]
        container_n = int(s.duration * s.time_base * s.sample_rate)
    ref = reference_load(p, video=True)
    assert container_n == 88200
    assert len(ref) == math.ceil(89088 * RATE / 44100) != math.ceil(container_n * RATE / 44100)
    ref_feats, ref_tokens = hf_whisper(ref)
    assert ref_tokens == 27  # 26 from the container duration

    meta = probe(p, "video")
    assert meta.has_audio and meta.audio_num_samples == len(ref)
    prof = get_profile("qwen3_omni", use_audio_in_video=True, video_min_pixels=3136)
    plan = prof.plan(meta)
    assert plan.audio_num_tokens == ref_tokens and plan.num_audio_samples == len(ref)
    ext, data = materialize(p, plan)
    stored = _stored(ext, data)
    assert stored["audio"].dtype == np.float32
    np.testing.assert_array_equal(stored["audio"], ref)
    item = {"kind": "video", "info": plan.info}
    assert prof.inputs().feature_count(item, stored) == plan.num_tokens
    got = prof.inputs().media_inputs(item, stored, PLAIN)["input_features"]
    assert got.shape == ref_feats.shape and float(np.abs(got - ref_feats).max()) <= FEATURE_TOL


def test_nemotron_30s_cap_stores_the_reference_prefix(tmp_path):
    p = tmp_path / "long.flac"
    x = _signal(22050 * 31, 22050, 1, "loud")
    sf.write(str(p), x, 22050, subtype="PCM_16")
    ref = reference_load(p)
    plan = get_profile("nemotron_omni").plan(probe(p, "audio"))
    assert plan.truncate and plan.num_audio_samples == 30 * RATE < len(ref)
    stored = _stored(*materialize(p, plan))
    np.testing.assert_array_equal(stored, ref[: 30 * RATE])
    # the writer decodes by the typed storage plan alone: its truncate flag, not the family's info
    assert plan.storage == StoragePlan("audio", sample_rate=RATE, num_audio_samples=30 * RATE, truncate=True)
    np.testing.assert_array_equal(_stored(*materialize(p, plan.storage)), stored)
    with pytest.raises(MediaError, match="planned with 480000"):
        materialize(p, dataclasses.replace(plan.storage, truncate=False))
    # the row records the cap in the family's info as before (dataset bytes unchanged), not as "truncate"
    assert "truncate" in plan.to_json() and MediaPlan.from_json(plan.to_json()) == plan


def test_wav_exact_counts(tmp_path):
    p = tmp_path / "a.wav"
    write_audio(p, sine(16000 + 1, 16000), 16000)
    meta = probe(p, "audio")
    assert meta.num_samples == 16001
    plan = get_profile("qwen3_omni").plan(meta)
    assert plan.audio_frames == 100 and plan.num_tokens == 13


def test_errors(tmp_path):
    empty = tmp_path / "e.wav"
    empty.write_bytes(b"")
    with pytest.raises(MediaError, match="empty"):
        probe(empty, "audio")
    junk = tmp_path / "j.mp3"
    junk.write_bytes(b"not audio at all" * 100)
    with pytest.raises(MediaError):
        probe(junk, "audio")
    with pytest.raises(MediaError, match="missing"):
        probe(tmp_path / "nope.wav", "audio")
    # zero-length: a valid wav header with no samples
    z = tmp_path / "z.wav"
    write_audio(z, np.zeros(0, np.float32), 16000)
    with pytest.raises(MediaError):
        probe(z, "audio")
    # a video container without an audio track, given as audio
    v = tmp_path / "v.mp4"
    write_video(v, n=5, fps=10)
    with pytest.raises(MediaError, match="no audio track"):
        probe(v, "audio")


def test_truncated_file(tmp_path):
    p = tmp_path / "a.flac"
    write_audio(p, sine(16000 * 4, 16000), 16000)
    meta = probe(p, "audio")
    plan = get_profile("qwen3_omni").plan(meta)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 3])
    with pytest.raises(MediaError, match="decode failed|truncated or changed"):
        materialize(p, plan)


def test_file_changed_since_probe_is_rejected_not_padded(tmp_path):
    p = tmp_path / "a.wav"
    write_audio(p, sine(24000, 16000), 16000)
    plan = get_profile("qwen3_omni").plan(probe(p, "audio"))
    write_audio(p, sine(23000, 16000), 16000)
    with pytest.raises(MediaError, match="planned with 24000"):
        materialize(p, plan)


def test_stored_audio_dtypes(tmp_path):
    """Old datasets (int16) still read; other dtypes fail clearly."""
    prof = get_profile("qwen3_omni")
    item = {"kind": "audio", "info": {}}
    old = (np.sin(np.arange(16000) / 7) * 20000).astype(np.int16)
    feats = prof.inputs().media_inputs(item, old, PLAIN)["input_features"]
    np.testing.assert_array_equal(feats, hf_whisper(old.astype(np.float32) / 32768)[0])
    with pytest.raises(ValueError, match="dtype float64"):
        prof.inputs().feature_count(item, np.zeros(16000))
    with pytest.raises(ValueError, match="dtype int32"):
        get_profile("nemotron_omni").inputs().media_inputs(item, np.zeros(16000, np.int32), PLAIN)
