"""Audio probing and materialisation with synthesized files."""

from __future__ import annotations

import io

import numpy as np
import pytest

from omnipack.demo.media import sine, write_audio
from omnipack.media.errors import MediaError
from omnipack.media.probe import materialize, probe
from omnipack.profiles import get_profile

pytest.importorskip("av")


@pytest.mark.parametrize(
    "suffix,rate,channels",
    [(".wav", 16000, 1), (".wav", 44100, 2), (".flac", 48000, 2), (".mp3", 44100, 1), (".m4a", 22050, 2)],
)
def test_probe_and_materialize(tmp_path, suffix, rate, channels):
    p = tmp_path / f"a{suffix}"
    n = int(rate * 1.5)
    write_audio(p, sine(n, rate), rate, channels)
    meta = probe(p, "audio")
    assert meta.sample_rate == rate
    tol = 0 if suffix in (".wav", ".flac") else int(0.06 * rate)  # lossy codecs add priming/padding
    assert abs(meta.num_samples - n) <= tol
    for name in ("qwen3_omni", "nemotron_omni"):
        plan = get_profile(name).plan(meta)
        ext, data = materialize(p, plan)
        assert ext == "npy"
        arr = np.load(io.BytesIO(data))
        assert arr.dtype == np.int16 and arr.shape == (plan.num_audio_samples,)
        assert plan.num_audio_samples == -(-meta.num_samples * 16000 // rate)
        # a 440 Hz sine at amplitude 0.3: check the level survived decode, mix and resample
        mid = arr[4000:12000].astype(np.float64) / 32767
        assert 0.15 < np.sqrt(np.mean(mid**2)) < 0.25


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


def test_truncated_file(tmp_path):
    p = tmp_path / "a.flac"
    write_audio(p, sine(16000 * 4, 16000), 16000)
    meta = probe(p, "audio")
    plan = get_profile("qwen3_omni").plan(meta)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 3])
    with pytest.raises(MediaError):
        materialize(p, plan)
