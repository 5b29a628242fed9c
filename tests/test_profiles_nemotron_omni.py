"""Nemotron Omni profile against transformers' nemotron_h_omni and parakeet functions."""

from __future__ import annotations

import itertools
import types

import numpy as np
import pytest

from omnipack.profiles import MediaMeta, MediaRejected, get_profile
from omnipack.profiles.nemotron_omni import parakeet_tokens, patch_grid
from tests.hf_oracles import import_hf

pytest.importorskip("transformers")


def test_patch_grid_matches_hf():
    m = import_hf("models.nemotron_h_omni.image_processing_nemotron_h_omni")
    rng = np.random.default_rng(3)
    sizes = [
        (1, 1),
        (16, 16),
        (15, 17),
        (480, 640),
        (512, 512),
        (3, 4000),
        (4000, 3),
        (1080, 1920),
        (8000, 8000),
    ]
    sizes += [tuple(int(x) for x in rng.integers(1, 6000, 2)) for _ in range(400)]
    for (h, w), budget in itertools.product(sizes, [1024, 4096, 13312]):
        assert patch_grid(h, w, 16, 2, 1024, budget) == m.get_patch_grid_size(h, w, 16, 2, 1024, budget), (
            h,
            w,
        )


@pytest.mark.parametrize("max_model_len", [16384, 1024, 300])
def test_image_plan(max_model_len):
    prof = get_profile("nemotron_omni", max_model_len=max_model_len)
    budget = min(max((max_model_len - 4) * 4, 1024), 13312)
    assert prof.image_budget() == max(budget, 1024)
    plan = prof.plan(MediaMeta(kind="image", height=480, width=640))
    _, gh, gw = plan.grid_thw
    assert gh % 2 == 0 and gw % 2 == 0 and gh * gw <= prof.image_budget()
    assert plan.target_hw == (gh * 16, gw * 16)
    # Bridge's check: (H/16/2) * (W/16/2)
    assert plan.num_tokens == (plan.target_hw[0] // 32) * (plan.target_hw[1] // 32)
    segs = get_profile("nemotron_omni").expand(plan)
    assert [s.token for s in segs] == ["<img>", "<image>", "</img>"] and segs[1].count == plan.num_tokens


def test_parakeet_subsampling_matches_hf():
    torch = pytest.importorskip("torch")
    from transformers.models.parakeet.modeling_parakeet import ParakeetEncoder

    stub = types.SimpleNamespace(
        config=types.SimpleNamespace(
            subsampling_conv_kernel_size=3, subsampling_conv_stride=2, subsampling_factor=8
        )
    )
    x = torch.arange(0, 5000)
    want = ParakeetEncoder._get_subsampling_output_length(stub, x).tolist()
    assert [parakeet_tokens(int(i)) for i in x] == want


@pytest.mark.parametrize("n", [400, 1279, 1280, 1281, 16000, 16001, 48000 + 77])
def test_parakeet_valid_mel_frames(n):
    pytest.importorskip("torch")
    from transformers.models.parakeet.feature_extraction_parakeet import ParakeetFeatureExtractor

    fe = ParakeetFeatureExtractor()
    out = fe(
        np.zeros(n, np.float32) + 0.01, sampling_rate=16000, return_attention_mask=True, return_tensors="np"
    )
    assert int(out["attention_mask"].sum()) == n // 160


def test_audio_rules_bridge_vs_hf():
    from transformers.models.nemotron_h_omni.processing_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3Processor as P,
    )

    stub = types.SimpleNamespace(audio_hop_length=160, audio_subsampling_factor=8)
    bridge, hf = get_profile("nemotron_omni"), get_profile("nemotron_omni", audio_count_rule="hf")
    for n in [1, 159, 160, 1280, 1281, 1439, 16000, 160 * 8, 160 * 9 - 1, 100000]:
        meta = MediaMeta(kind="audio", num_samples=n, sample_rate=16000)
        assert hf.plan(meta).num_tokens == max(1, P._estimate_audio_num_embeddings(stub, n))
        h = lambda x: (x - 1) // 2 + 1  # noqa: E731
        assert bridge.plan(meta).num_tokens == max(1, h(h(h(n // 160))))
    # the documented disagreement: n // 160 == 8 -> Bridge 1, HF 2
    meta = MediaMeta(kind="audio", num_samples=160 * 8, sample_rate=16000)
    assert (bridge.plan(meta).num_tokens, hf.plan(meta).num_tokens) == (1, 2)


def test_audio_truncation_30s():
    prof = get_profile("nemotron_omni")
    plan = prof.plan(MediaMeta(kind="audio", num_samples=44100 * 40, sample_rate=44100))
    assert plan.num_audio_samples == 480000 and plan.truncate
    assert plan.num_tokens == parakeet_tokens(3000)
    assert (
        get_profile("nemotron_omni", max_audio_seconds=None)
        .plan(MediaMeta(kind="audio", num_samples=16000 * 40, sample_rate=16000))
        .num_audio_samples
        == 640000
    )
    with pytest.raises(MediaRejected):
        prof.plan(MediaMeta(kind="audio", num_samples=0, sample_rate=16000))


@pytest.mark.parametrize("frames,fps", [(1, 25.0), (2, 25.0), (3, 10.0), (50, 10.0), (301, 29.97), (7, 2.0)])
def test_video_tubelets_and_labels_match_processor(frames, fps):
    from transformers.models.nemotron_h_omni.processing_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3Processor as P,
    )
    from transformers.video_utils import VideoMetadata

    prof = get_profile("nemotron_omni")
    plan = prof.plan(MediaMeta(kind="video", height=240, width=320, num_frames=frames, fps=fps))
    n = plan.info["num_sampled_frames"]
    assert plan.grid_thw[0] == -(-n // 2) and len(plan.frame_indices) == 2 * plan.grid_thw[0]
    assert plan.num_tokens == plan.grid_thw[0] * 256 and plan.target_hw == (512, 512)
    stub = types.SimpleNamespace(
        image_start_token="<img>", image_end_token="</img>", image_token="<image>", video_temporal_patch_dim=2,
        video_processor=types.SimpleNamespace(patch_size=16, downsample_ratio=0.5),
    )  # fmt: skip
    meta = VideoMetadata(total_num_frames=frames, fps=fps, frames_indices=list(plan.frame_indices[:n]))
    pv = types.SimpleNamespace(shape=(1, plan.grid_thw[0], 3, 512, 512))
    want = P.replace_video_token(
        stub, {"num_frames": [n], "video_metadata": [meta], "pixel_values_videos": pv}, 0
    )
    got = "".join(s.text if s.text is not None else s.token * s.count for s in prof.expand(plan))
    assert got == want


def test_hf_audio_rule_counts_the_whole_clip():
    """audio_count_rule="hf" follows the HF processor, which keeps long clips whole (no 30 s cap)."""
    from transformers.models.nemotron_h_omni.processing_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3Processor as P,
    )

    stub = types.SimpleNamespace(audio_hop_length=160, audio_subsampling_factor=8)
    n = 65 * 16000 + 4321  # a 65 s clip
    meta = MediaMeta(kind="audio", num_samples=n, sample_rate=16000)
    hf = get_profile("nemotron_omni", audio_count_rule="hf")
    plan = hf.plan(meta)
    assert plan.num_tokens == max(1, P._estimate_audio_num_embeddings(stub, n)) > 800
    assert plan.num_audio_samples == n and plan.truncate is False
    assert hf.settings()["max_audio_seconds"] is None
    bridge = get_profile("nemotron_omni")
    assert bridge.settings()["max_audio_seconds"] == 30.0
    assert bridge.plan(meta).num_audio_samples == 480000
    # an explicit cap applies under either rule
    capped = get_profile("nemotron_omni", audio_count_rule="hf", max_audio_seconds=10)
    assert capped.plan(meta).num_audio_samples == 160000
    with pytest.raises(ValueError, match="max_audio_seconds"):
        get_profile("nemotron_omni", max_audio_seconds="30s")
