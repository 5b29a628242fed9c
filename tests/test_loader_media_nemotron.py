"""Nemotron Omni encoder inputs against transformers 5.24's nemotron_h_omni processors and Parakeet.

The image processor needs torchvision only for ``tvF.normalize`` once the image is already at its planned
size (any resize would fail loudly on the stand-in); the video processor and ``ParakeetFeatureExtractor``
run on torch alone.
"""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

from omnipack.dataset.contract import MediaItem
from omnipack.profiles import MediaMeta, get_profile
from omnipack.profiles.model_inputs import MediaInputOptions
from omnipack.profiles.nemotron_omni import parakeet_tokens, radio_patches
from tests.hf_oracles import import_hf

PLAIN = MediaInputOptions()  # float32 pixels, built eagerly, private memory

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

RNG = np.random.default_rng(0)


def _item(kind: str, num_tokens: int = 0) -> MediaItem:
    return MediaItem(kind, "media.0.npy", 0, 0, num_tokens, 0, num_tokens)


def _tv_normalize(image, mean, std, inplace: bool = False):
    """Stand-in for ``torchvision.transforms.v2.functional.normalize`` on tensors: ``(x - mean) / std``."""
    mean = torch.as_tensor(mean, dtype=image.dtype).view(-1, 1, 1)
    std = torch.as_tensor(std, dtype=image.dtype).view(-1, 1, 1)
    return (image - mean) / std


@pytest.fixture
def hf_image_processor(monkeypatch):
    m = import_hf("models.nemotron_h_omni.image_processing_nemotron_h_omni")
    import transformers.image_processing_backends as backends

    if not hasattr(backends, "tvF"):  # no torchvision: only normalize is reached for unresized images
        monkeypatch.setattr(backends, "tvF", types.SimpleNamespace(normalize=_tv_normalize), raising=False)
    return m.NemotronH_Omni_Reasoning_V3ImageProcessor()


@pytest.mark.parametrize("src_hw", [(480, 640), (100, 1000), (900, 600)])
def test_image_pixels_match_the_hf_image_processor(hf_image_processor, src_hw):
    profile = get_profile("nemotron_omni")
    plan = profile.plan_image(MediaMeta("image", width=src_hw[1], height=src_hw[0]))
    img = RNG.integers(0, 256, (*plan.target_hw, 3), dtype=np.uint8)  # what the writer stored
    ours = profile.inputs().media_inputs(_item("image"), img, PLAIN)
    ref = hf_image_processor(images=[img], return_tensors="np", do_convert_rgb=False)
    assert ours["image_grid_hw"].tolist() == ref["image_grid_hw"].tolist() == [list(plan.grid_thw[1:])]
    assert ours["pixel_values"].shape == ref["pixel_values"].shape
    np.testing.assert_allclose(ours["pixel_values"], ref["pixel_values"], atol=1e-5, rtol=0)
    gh, gw = ref["image_grid_hw"][0]
    assert profile.inputs().feature_count(_item("image"), img) == gh * gw // 4 == plan.num_tokens


def test_video_tubelets_match_the_hf_video_processor():
    m = import_hf("models.nemotron_h_omni.video_processing_nemotron_h_omni")
    profile = get_profile("nemotron_omni")
    proc = m.NemotronH_Omni_Reasoning_V3VideoProcessor(
        norm_mean=list(profile.image_mean), norm_std=list(profile.image_std)
    )
    assert proc._compute_target_patches(512, 512) == (32, 32)  # a 512 square frame is not resized
    frames = RNG.integers(0, 256, (3, 512, 512, 3), dtype=np.uint8)  # odd: the last frame pads
    ours = profile.inputs().media_inputs(_item("video"), frames, PLAIN)["pixel_values_videos"]
    ref = proc(videos=[frames], return_tensors="np", do_sample_frames=False)  # frames already sampled
    assert ours.shape == ref["pixel_values_videos"].shape == (1, 2, 6, 512, 512)
    np.testing.assert_allclose(ours, ref["pixel_values_videos"], atol=1e-5, rtol=0)
    # one tubelet per 256 placeholders; stored videos are already padded to whole tubelets
    assert profile.inputs().feature_count(_item("video"), frames) == 2 * 256


def _parakeet_oracle(waves: list[np.ndarray]) -> dict:
    from transformers import ParakeetFeatureExtractor

    fe = ParakeetFeatureExtractor(feature_size=128)
    return fe(
        [w.astype(np.float32) / 32768.0 for w in waves],
        sampling_rate=16000,
        return_attention_mask=True,
        return_tensors="np",
    )


def _hf_subsampled(lengths: torch.Tensor) -> list[int]:
    """HF ``ParakeetEncoder._get_subsampling_output_length`` (unbound, stub config: kernel 3, stride 2, x8)."""
    from transformers.models.parakeet.modeling_parakeet import ParakeetEncoder

    cfg = types.SimpleNamespace(
        subsampling_conv_kernel_size=3, subsampling_conv_stride=2, subsampling_factor=8
    )
    stub = types.SimpleNamespace(config=cfg)
    return ParakeetEncoder._get_subsampling_output_length(stub, lengths).tolist()


def test_audio_features_match_parakeet_batched_and_the_token_rules():
    profile = get_profile("nemotron_omni")
    hf_rule = get_profile("nemotron_omni", audio_count_rule="hf")
    waves = [(RNG.standard_normal(n) * 3000).astype(np.int16) for n in (16000, 1280, 24321)]
    per_item = [profile.inputs().media_inputs(_item("audio"), w, PLAIN) for w in waves]
    for w, d in zip(waves, per_item, strict=True):
        assert d["input_features"].shape == (1, len(w) // 160 + 1, 128)
        assert d["input_features_mask"].sum() == len(w) // 160
    batch = profile.inputs().collate_media(per_item, PLAIN)
    # HF's batched extraction (padding to the longest) equals per-clip extraction right-padded
    ref = _parakeet_oracle(waves)
    assert batch["input_features"].shape == ref["input_features"].shape
    np.testing.assert_allclose(batch["input_features"].numpy(), ref["input_features"], atol=1e-4, rtol=0)
    assert np.array_equal(batch["input_features_mask"].numpy(), ref["attention_mask"])
    valid = batch["input_features_mask"].sum(-1)
    # HF's model sizes each clip from mask.sum + 1 (the "hf" rule), Bridge from sound_length (the default)
    assert _hf_subsampled(valid + 1) == [hf_rule.inputs().feature_count(_item("audio"), w) for w in waves]
    bridge = profile.inputs().bridge_media_inputs(batch)
    assert bridge["sound_length"].tolist() == [len(w) // 160 for w in waves]
    counts = [profile.inputs().feature_count(_item("audio"), w) for w in waves]
    assert [max(1, x) for x in _hf_subsampled(bridge["sound_length"])] == counts == [13, 1, 19]
    assert [parakeet_tokens(len(w) // 160) for w in waves] == counts
    assert hf_rule.inputs().feature_count(_item("audio"), waves[1]) == 2  # the documented off-by-one (8 mel frames)
    hf_proc = import_hf(
        "models.nemotron_h_omni.processing_nemotron_h_omni"
    ).NemotronH_Omni_Reasoning_V3Processor
    stub = types.SimpleNamespace(audio_hop_length=160, audio_subsampling_factor=8)
    assert [hf_proc._estimate_audio_num_embeddings(stub, len(w)) for w in waves] == [
        hf_rule.inputs().feature_count(_item("audio"), w) for w in waves
    ]


def test_collate_and_bridge_layout():
    profile = get_profile("nemotron_omni")
    inputs = profile.inputs()
    a = inputs.media_inputs(_item("image"), RNG.integers(0, 256, (64, 96, 3), dtype=np.uint8), PLAIN)
    b = inputs.media_inputs(_item("image"), RNG.integers(0, 256, (32, 32, 3), dtype=np.uint8), PLAIN)
    v1 = RNG.integers(0, 256, (4, 64, 64, 3), dtype=np.uint8)
    v2 = RNG.integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
    vids = [profile.inputs().media_inputs(_item("video"), v, PLAIN) for v in (v1, v2)]
    out = profile.inputs().collate_media([a, vids[0], b, vids[1]], PLAIN)
    assert out["image_grid_hw"].tolist() == [[4, 6], [2, 2]]
    assert out["pixel_values"].shape == (28, 768)
    assert torch.equal(out["pixel_values"][24:], torch.from_numpy(b["pixel_values"]))
    assert out["pixel_values_videos"].shape == (1, 3, 6, 64, 64)
    # features emitted == placeholders: images grid/4, videos 16 tokens per 64x64 tubelet... / 4
    tokens = int((out["image_grid_hw"].prod(-1) // 4).sum()) + out["pixel_values_videos"].shape[1] * 4
    n_ph = sum(profile.inputs().feature_count(_item(k), x) for k, x in [("video", v1), ("video", v2)])
    n_ph += (4 * 6 + 2 * 2) // 4
    assert tokens == n_ph
    with pytest.raises(ValueError, match="does not mix"):
        profile.inputs().bridge_media_inputs(out)
    bv = profile.inputs().bridge_media_inputs({"pixel_values_videos": out["pixel_values_videos"]})
    lut = profile.inputs()._lut()
    expect = radio_patches(np.concatenate([v1, v2]), lut, 16)  # Bridge's per-frame patch layout
    np.testing.assert_array_equal(bv["pixel_values"][0].numpy(), expect)
    assert bv["imgs_sizes"].tolist() == [[64, 64]] * 6 and bv["num_frames"].tolist() == [6]
    bi = profile.inputs().bridge_media_inputs({k: out[k] for k in ("pixel_values", "image_grid_hw")})
    assert bi["imgs_sizes"].tolist() == [[64, 96], [32, 32]] and bi["num_image_tiles"].tolist() == [6, 1]
    assert bi["pixel_values"].shape == (1, 28, 768)


@pytest.fixture(scope="module")
def nemotron_dataset(tmp_path_factory) -> tuple[Path, Path]:
    from omnipack.demo.corpus import build_demo_corpus
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.pipeline import PrepareConfig, run_prepare

    root = tmp_path_factory.mktemp("nemotron")
    tok = build_demo_tokenizer(root / "tok", profile="nemotron_omni")
    kinds = get_profile("nemotron_omni").kinds
    manifest, media = build_demo_corpus(root / "src", num_samples=12, kinds=kinds)
    out = root / "ds"
    run_prepare(
        PrepareConfig(
            manifest=[str(manifest)],
            media_root=str(media),
            tokenizer=str(tok),
            output=str(out),
            profile="nemotron_omni",
            seq_length=4096,
            progress=False,
        )
    )
    return out, tok


def test_energon_batches_carry_nemotron_inputs(nemotron_dataset):
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset
    from transformers import AutoTokenizer

    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    path, tok_dir = nemotron_dataset
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    image_id, sound_id = tok.convert_tokens_to_ids("<image>"), tok.convert_tokens_to_ids("<so_embedding>")
    te = OmnipackTaskEncoder.from_dataset(path, decode_media=True)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_val_dataset(str(path), split_part="train", worker_config=wc, batch_size=2, task_encoder=te)
    seen: set[str] = set()
    for batch in get_loader(ds):
        media = batch.media_inputs()
        seen |= set(media)
        vision = 0
        if "image_grid_hw" in media:
            grid = media["image_grid_hw"]
            assert media["pixel_values"].shape == (int(grid.prod(-1).sum()), 768)
            vision += int((grid.prod(-1) // 4).sum())
        if "pixel_values_videos" in media:
            v = media["pixel_values_videos"]
            assert v.shape[0] == 1 and tuple(v.shape[2:]) == (6, 512, 512)
            vision += v.shape[1] * 256
        assert vision == int((batch.tokens == image_id).sum())
        audio = 0
        if "input_features" in media:
            assert media["input_features"].shape[-1] == 128
            valid = batch.as_dict()["input_features_mask"].sum(-1)
            audio = sum(max(1, parakeet_tokens(int(n))) for n in valid)
        assert audio == int((batch.tokens == sound_id).sum())
    assert {"pixel_values", "image_grid_hw", "pixel_values_videos", "input_features"} <= seen
