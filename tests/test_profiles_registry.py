"""Every registered profile: keyword options, JSON-able settings, plans that survive a JSON round trip."""

from __future__ import annotations

import json

import pytest

from omnipack.profiles import PROFILES, get_profile
from omnipack.profiles.base import MediaMeta, MediaPlan

METAS = {
    "image": MediaMeta(kind="image", height=333, width=500),
    "video": MediaMeta(
        kind="video", height=240, width=320, num_frames=45, fps=15.0, has_audio=True, audio_num_samples=48000
    ),
    "audio": MediaMeta(kind="audio", num_samples=50000, sample_rate=22050),
}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_roundtrip(name):
    opts = {"use_audio_in_video": True} if name == "qwen3_omni" else {}
    prof = get_profile(name, **opts)
    json.dumps(prof.settings())
    for kind in prof.kinds:
        plan = prof.plan(METAS[kind])
        back = MediaPlan.from_json(json.loads(json.dumps(plan.to_json())))
        assert back.num_tokens == plan.num_tokens and back.frame_indices == plan.frame_indices
        segs, segs2 = prof.expand(plan), prof.expand(back)
        assert segs == segs2
        assert sum(s.count for s in segs if s.placeholder) == plan.num_tokens


def test_unknown_option_is_an_error():
    with pytest.raises(TypeError):
        get_profile("qwen3_vl", not_an_option=1)
    with pytest.raises(ValueError):
        get_profile("qwen2_5_vl", mrope_rule="hf6")
