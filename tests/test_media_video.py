"""Video probing and materialisation with synthesized mp4 files."""

from __future__ import annotations

import io

import numpy as np
import pytest

from omnipack.demo.media import write_video
from omnipack.media.errors import MediaError
from omnipack.media.probe import materialize, probe
from omnipack.profiles import get_profile

pytest.importorskip("av")
pytest.importorskip("decord")


@pytest.mark.parametrize("n", [1, 7, 20])
@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl", "qwen3_omni", "nemotron_omni"])
def test_probe_plan_materialize(tmp_path, name, n):
    p = tmp_path / "v.mp4"
    src = write_video(p, n=n, fps=10, w=96, h=64)
    meta = probe(p, "video")
    assert (meta.num_frames, meta.fps, meta.width, meta.height, meta.has_audio) == (n, 10.0, 96, 64, False)
    kw = {} if name == "nemotron_omni" else {"video_min_pixels": 3136, "video_max_pixels": 96 * 64}
    plan = get_profile(name, **kw).plan(meta)
    ext, data = materialize(p, plan)
    assert ext == "npz"
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        assert z.files == ["frames"]
        frames = z["frames"]
    assert frames.dtype == np.uint8 and frames.shape == (len(plan.frame_indices), *plan.target_hw, 3)
    # solid frames: the stored frame k is source frame frame_indices[k] (lossless x264, then resized)
    levels = frames.reshape(len(frames), -1).mean(axis=1)
    want = src[list(plan.frame_indices)].reshape(len(frames), -1).mean(axis=1)
    np.testing.assert_allclose(levels, want, atol=3)
    t = plan.grid_thw[0]
    assert len(plan.frame_indices) == 2 * t


def test_audio_in_video(tmp_path):
    p = tmp_path / "va.mp4"
    write_video(p, n=20, fps=10, w=64, h=64, audio_rate=44100)
    meta = probe(p, "video")
    assert meta.has_audio and abs(meta.audio_num_samples - 32000) <= 1600
    plan = get_profile("qwen3_omni", use_audio_in_video=True, video_min_pixels=3136).plan(meta)
    assert plan.audio_num_tokens > 0 and plan.num_audio_samples == meta.audio_num_samples
    ext, data = materialize(p, plan)
    assert ext == "npz"
    z = np.load(io.BytesIO(data))
    assert z["frames"].shape[0] == len(plan.frame_indices)
    assert z["audio"].dtype == np.float32 and z["audio"].shape == (plan.num_audio_samples,)


def test_audio_in_video_missing_track(tmp_path):
    p = tmp_path / "v.mp4"
    write_video(p, n=20, fps=10)
    meta = probe(p, "video")
    from omnipack.profiles import MediaRejected

    with pytest.raises(MediaRejected, match="no audio track"):
        get_profile("qwen3_omni", use_audio_in_video=True).plan(meta)
    # a plan that asks for the track (e.g. made from stale metadata) fails at materialisation
    ok = get_profile("qwen3_omni", use_audio_in_video=True).plan(
        meta.__class__(**{**meta.__dict__, "has_audio": True, "audio_num_samples": 32000})
    )
    with pytest.raises(MediaError, match="no audio track"):
        materialize(p, ok)


def test_audio_track_of_mp4_as_audio(tmp_path):
    p = tmp_path / "va.mp4"
    write_video(p, n=20, fps=10, audio_rate=16000)
    meta = probe(p, "audio")
    plan = get_profile("nemotron_omni").plan(meta)
    ext, data = materialize(p, plan)
    assert np.load(io.BytesIO(data)).shape == (plan.num_audio_samples,)


def test_bad_videos(tmp_path):
    junk = tmp_path / "j.mp4"
    junk.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 200)
    with pytest.raises(MediaError):
        probe(junk, "video")
    p = tmp_path / "v.mp4"
    write_video(p, n=30, fps=10, w=64, h=64)
    data = p.read_bytes()
    trunc = tmp_path / "t.mp4"
    trunc.write_bytes(data[: len(data) // 4])
    with pytest.raises(MediaError):
        probe(trunc, "video")
    audio_only = tmp_path / "a.wav"
    from omnipack.demo.media import sine, write_audio

    write_audio(audio_only, sine(16000, 16000), 16000)
    with pytest.raises(MediaError):
        probe(audio_only, "video")


def test_uncompressed_video_storage_holds_the_same_frames():
    from omnipack.media.video import encode_video

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (4, 16, 16, 3), dtype=np.uint8)
    audio = rng.integers(-1000, 1000, 320).astype(np.int16)
    packed, raw = encode_video(frames, audio), encode_video(frames, audio, compress=False)
    assert packed[0] == raw[0] == "npz"
    for _, data in (packed, raw):
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            assert np.array_equal(z["frames"], frames) and np.array_equal(z["audio"], audio)
    # raw storage is the uncompressed payload; deflate only ever shrinks this noisy-but-bounded data slightly
    assert len(raw[1]) >= frames.nbytes + audio.nbytes
