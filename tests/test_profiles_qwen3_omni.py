"""Qwen3-Omni profile against WhisperFeatureExtractor, the processor's interleaving and get_rope_index."""

from __future__ import annotations

import types

import numpy as np
import pytest

from omnipack.profiles import MediaMeta, MediaRejected, MediaSpan, get_profile
from omnipack.profiles.qwen3_omni import audio_output_length, mel_frames

pytest.importorskip("transformers")

# mel frames around chunk boundaries (100 frames = 16000 samples), under one chunk, tiny clips
N_SAMPLES = [
    160,
    161,
    399,
    400,
    401,
    1599,
    1600,
    15840,
    15999,
    16000,
    16159,
    16160,
    31999,
    32000,
    32160,
    48000,
    160 * 333 + 7,
]


@pytest.mark.parametrize("n", N_SAMPLES)
def test_mel_frames_match_whisper(n):
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=128)
    wave = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 0.1
    if n < 201:  # Whisper's reflect padding cannot handle it; the profile rejects such clips
        with pytest.raises(RuntimeError):
            fe(wave, sampling_rate=16000, return_attention_mask=True, padding=True, truncation=False)
        with pytest.raises(MediaRejected):
            get_profile("qwen3_omni").plan(MediaMeta(kind="audio", num_samples=n, sample_rate=16000))
        return
    out = fe(
        wave,
        sampling_rate=16000,
        return_attention_mask=True,
        padding=True,
        truncation=False,
        return_tensors="np",
    )
    assert int(out["attention_mask"].sum()) == mel_frames(n)
    assert out["input_features"].shape[-1] == mel_frames(n)


def test_audio_tokens_match_hf():
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
        _get_feat_extract_output_lengths as hf,
    )

    lens = np.arange(1, 6001)
    np.testing.assert_array_equal([audio_output_length(int(x)) for x in lens], hf(lens))
    golden = {99: 13, 100: 13, 101: 14, 200: 26, 3000: 390, 1: 1}
    assert {k: audio_output_length(k) for k in golden} == golden


def test_audio_plan_and_rejects():
    prof = get_profile("qwen3_omni")
    plan = prof.plan(MediaMeta(kind="audio", num_samples=44100 * 2, sample_rate=44100))
    assert plan.num_audio_samples == 32000 and plan.audio_frames == 200 and plan.num_tokens == 26
    with pytest.raises(MediaRejected):
        prof.plan(MediaMeta(kind="audio", num_samples=100, sample_rate=16000))  # under one mel frame
    with pytest.raises(MediaRejected):
        prof.plan(MediaMeta(kind="audio", num_samples=0, sample_rate=16000))
    with pytest.raises(MediaRejected):
        prof.plan(MediaMeta(kind="audio", num_samples=16000, sample_rate=0))
    with pytest.raises(MediaRejected):
        get_profile("qwen3_omni", max_audio_seconds=1).plan(
            MediaMeta(kind="audio", num_samples=32000, sample_rate=16000)
        )


def _proc_stub(pps):
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    return Qwen3OmniMoeProcessor, types.SimpleNamespace(
        video_processor=types.SimpleNamespace(merge_size=2),
        audio_bos_token="<|audio_start|>",
        audio_eos_token="<|audio_end|>",
        video_token="<|video_pad|>",
        audio_token="<|audio_pad|>",
    )


VIDEOS = [
    (50, 10.0, 80000, None),  # 5 s, 2 fps sampling
    (13, 10.0, 20800, None),  # odd frame count
    (1, 24.0, 16000, None),  # one frame
    (300, 30.0, 15000, None),  # audio shorter than the video
    (61, 29.97, 33000, 1.0),  # processor default fps=1.0 for positions
    (90, 30.0, 48000, 3.0),  # fractional temporal positions (2/3 * 13)
]


@pytest.mark.parametrize("frames,fps,audio_n,pos_fps", VIDEOS)
def test_audio_in_video_interleaving_matches_processor(frames, fps, audio_n, pos_fps):
    cls, stub = _proc_stub(13.0)
    prof = get_profile("qwen3_omni", use_audio_in_video=True, position_fps=pos_fps, video_min_pixels=3136)
    meta = MediaMeta(
        kind="video",
        height=96,
        width=128,
        num_frames=frames,
        fps=fps,
        has_audio=True,
        audio_num_samples=audio_n,
    )
    plan = prof.plan(meta)
    want = cls.replace_video_with_audio_token(
        stub,
        {
            "video_grid_thw": [np.array(plan.grid_thw)],
            "video_second_per_grid": [plan.info["second_per_grid"]],
        },
        0,
        {"num_audio_tokens": [plan.audio_num_tokens]},
        0,
        position_id_per_seconds=13.0,
    )
    segs = prof.expand(plan)
    got = "".join(s.token * s.count for s in segs)
    assert got == "<|vision_start|>" + want + "<|vision_end|>"
    assert sum(s.count for s in segs if s.placeholder) == plan.num_tokens
    assert plan.audio_num_tokens == audio_output_length(audio_n // 160)


def test_audio_in_video_requires_track():
    prof = get_profile("qwen3_omni", use_audio_in_video=True)
    with pytest.raises(MediaRejected, match="no audio track"):
        prof.plan(MediaMeta(kind="video", height=64, width=64, num_frames=20, fps=10.0, has_audio=False))


# ---- mRoPE ----

TOK = {
    "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|image_pad|>": 151655, "<|video_pad|>": 151656,
    "<|audio_start|>": 151669, "<|audio_end|>": 151670, "<|audio_pad|>": 151675,
}  # fmt: skip
TXT = 100


def _build(prof, metas):
    ids: list[int] = [TXT] * 4
    spans = []
    for meta in metas:
        plan = prof.plan(meta)
        start = len(ids)
        ph = None
        for seg in prof.expand(plan):
            if seg.placeholder and ph is None:
                ph = len(ids)
            ids += [TOK[seg.token]] * seg.count
        spans.append(MediaSpan(plan, start, len(ids), ph, plan.num_tokens))
        ids += [TXT] * 3
    return np.array(ids), spans


def _hf_rope(ids, spans, use_audio_in_video):
    torch = pytest.importorskip("torch")
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as mod

    cls = mod.Qwen3OmniMoePreTrainedModelForConditionalGeneration
    cfg = types.SimpleNamespace(
        image_token_id=TOK["<|image_pad|>"], video_token_id=TOK["<|video_pad|>"], audio_token_id=TOK["<|audio_pad|>"],
        vision_start_token_id=TOK["<|vision_start|>"], audio_start_token_id=TOK["<|audio_start|>"],
        position_id_per_seconds=13.0, audio_config=types.SimpleNamespace(n_window=50),
    )  # fmt: skip
    stub = types.SimpleNamespace(spatial_merge_size=2, config=cfg)
    stub.get_llm_pos_ids_for_vision = types.MethodType(cls.get_llm_pos_ids_for_vision, stub)
    img = [sp.plan.grid_thw for sp in spans if sp.plan.kind == "image"]
    vid = [sp.plan.grid_thw for sp in spans if sp.plan.kind == "video"]
    spg = [sp.plan.info["second_per_grid"] for sp in spans if sp.plan.kind == "video"]
    mel = [
        sp.plan.audio_frames for sp in spans if sp.plan.kind in ("audio", "video") and sp.plan.audio_frames
    ]
    pos, _ = cls.get_rope_index(
        stub,
        torch.tensor(ids)[None],
        image_grid_thw=torch.tensor(img) if img else None,
        video_grid_thw=torch.tensor(vid) if vid else None,
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        use_audio_in_video=use_audio_in_video,
        audio_seqlens=torch.tensor(mel) if mel else None,
        second_per_grids=torch.tensor(spg) if spg else None,
    )
    return pos[:, 0].numpy()


IMG = MediaMeta(kind="image", height=300, width=500)
AUD = MediaMeta(kind="audio", num_samples=16000 * 3 + 123, sample_rate=16000)
VID = MediaMeta(kind="video", height=96, width=160, num_frames=50, fps=10.0)


@pytest.mark.parametrize("metas", [[IMG], [VID], [AUD, IMG], [IMG, AUD, VID, AUD], [VID, VID]])
def test_mrope_matches_get_rope_index(metas):
    prof = get_profile("qwen3_omni", video_min_pixels=3136)
    ids, spans = _build(prof, metas)
    got = prof.mrope_position_ids(ids, spans)
    assert got.dtype == np.int32 and got.shape == (3, len(ids))
    np.testing.assert_array_equal(got, _hf_rope(ids, spans, False))


@pytest.mark.parametrize("frames,fps,audio_n,pos_fps", VIDEOS)
def test_mrope_audio_in_video_matches_get_rope_index(frames, fps, audio_n, pos_fps):
    prof = get_profile("qwen3_omni", use_audio_in_video=True, position_fps=pos_fps, video_min_pixels=3136)
    meta = MediaMeta(
        kind="video",
        height=96,
        width=128,
        num_frames=frames,
        fps=fps,
        has_audio=True,
        audio_num_samples=audio_n,
    )
    ids, spans = _build(prof, [IMG, meta, AUD])
    got = prof.mrope_position_ids(ids, spans)
    want = _hf_rope(ids, spans, True)
    if np.all(want == np.floor(want)):
        np.testing.assert_array_equal(got, want)
    else:  # HF keeps fractional positions; Bridge (and omnipack) truncate them inside the block
        sp = spans[1]
        np.testing.assert_array_equal(got[:, : sp.end], np.floor(want[:, : sp.end]))


# ---- video size: the processor class's own videos_kwargs ----


def _omni_video_kwargs():
    from tests.hf_oracles import processor_videos_kwargs

    return processor_videos_kwargs("models.qwen3_omni_moe.processing_qwen3_omni_moe", "Qwen3OmniMoeProcessor")


@pytest.mark.parametrize("hw", [(64, 64), (480, 640), (1080, 1920), (100, 40), (2000, 60)])
@pytest.mark.parametrize(
    "frames,fps,sample", [(7, 10.0, True), (50, 25.0, True), (7, 10.0, False), (9, 3.0, False)]
)
def test_video_size_uses_processor_level_defaults(hw, frames, fps, sample):
    """Qwen3OmniMoeProcessor hands its video processor ``size`` on every call; the grid follows it."""
    from tests.hf_oracles import import_hf

    m = import_hf("models.qwen2_vl.video_processing_qwen2_vl")
    kw = _omni_video_kwargs()
    size = kw.get("size") or m.Qwen2VLVideoProcessor.size
    prof = get_profile("qwen3_omni", do_sample_frames=sample)
    h, w = hw
    plan = prof.plan(MediaMeta(kind="video", height=h, width=w, num_frames=frames, fps=fps))
    n = plan.info["num_sampled_frames"]
    if not sample:
        assert n == frames
    vp = object.__new__(m.Qwen2VLVideoProcessor)  # class defaults; the checkpoint's patch 16 as its config
    patches = m.Qwen2VLVideoProcessor.get_num_of_video_patches(vp, n, h, w, {**kw, "patch_size": 16})
    assert plan.vision_patches == patches
    assert plan.target_hw == m.smart_resize(h, w, 32, size["shortest_edge"], size["longest_edge"])


def test_seven_frame_clip_golden():
    """The reported case: a 7-frame 64x64 clip (4 frames sampled) is [2, 24, 24] at 384x384, 288 tokens."""
    plan = get_profile("qwen3_omni").plan(
        MediaMeta(kind="video", height=64, width=64, num_frames=7, fps=10.0)
    )
    assert (plan.grid_thw, plan.target_hw, plan.num_tokens) == ((2, 24, 24), (384, 384), 288)
    # an explicit option still wins over the processor's default
    small = get_profile("qwen3_omni", video_min_pixels=3136)
    assert small.plan(MediaMeta(kind="video", height=64, width=64, num_frames=7, fps=10.0)).target_hw == (
        64,
        64,
    )


def test_rejects_qwen_vl_only_rules():
    for opt in ("mrope_rule", "video_layout", "tokens_per_second"):
        with pytest.raises(TypeError, match=opt):
            get_profile("qwen3_omni", **{opt: "hf4"})
