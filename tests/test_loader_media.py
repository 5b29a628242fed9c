"""Media parts -> encoder inputs: layouts against the HF processors, feature counts, the load-time check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnipack.dataset.contract import MediaItem
from omnipack.loader.media import MediaMismatchError, check_row_media, decode_payload
from omnipack.profiles import get_profile
from omnipack.profiles.model_inputs import MediaInputOptions
from omnipack.profiles.qwen3_omni import audio_output_length
from tests.hf_oracles import qwen_image_processor

PLAIN = MediaInputOptions()  # float32 pixels, built eagerly, private memory
U8 = MediaInputOptions(pixel_dtype="uint8")

RNG = np.random.default_rng(0)


def _hf(proc, img: np.ndarray, **kw) -> dict:
    return proc(images=[img], return_tensors="np", **kw)


def _item(kind: str, num_tokens: int = 0, **kw) -> MediaItem:
    return MediaItem(
        kind=kind,
        part=f"media.0.{'npz' if kw.pop('npz', False) else 'npy'}",
        sample_index=0,
        token_start=kw.pop("token_start", 0),
        num_tokens=num_tokens,
        block_start=0,
        block_end=num_tokens,
        **kw,
    )


@pytest.mark.parametrize(
    ("name", "hw"), [("qwen2_5_vl", (56, 84)), ("qwen3_vl", (256, 320)), ("qwen3_omni", (96, 64))]
)
def test_image_patches_match_theqwen_image_processor(name, hw):
    profile = get_profile(name)
    img = RNG.integers(0, 256, (*hw, 3), dtype=np.uint8)  # already at a target size (multiple of factor)
    ours = profile.inputs().media_inputs(_item("image"), img, PLAIN)
    ref = _hf(qwen_image_processor(profile), img)
    assert ours["pixel_values"].shape == ref["pixel_values"].shape
    np.testing.assert_allclose(ours["pixel_values"], ref["pixel_values"], atol=1e-5, rtol=0)
    assert ours["image_grid_thw"].tolist() == ref["image_grid_thw"].tolist()
    t, gh, gw = ref["image_grid_thw"][0]
    assert profile.inputs().feature_count(_item("image"), img) == t * gh * gw // 4


def _reference_video_patches(frames: np.ndarray, mean, std, ps: int, m: int, tps: int) -> np.ndarray:
    """Row-by-row construction from the documented layout (independent of reshape/transpose)."""
    if pad := -len(frames) % tps:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, 0)])
    x = (frames.astype(np.float64) / 255 - np.asarray(mean)) / np.asarray(std)  # [T, H, W, C]
    gt, gh, gw = len(frames) // tps, frames.shape[1] // ps, frames.shape[2] // ps
    rows = []
    for t in range(gt):
        for bh in range(gh // m):
            for bw in range(gw // m):
                for mh in range(m):
                    for mw in range(m):
                        h0, w0 = (bh * m + mh) * ps, (bw * m + mw) * ps
                        block = x[t * tps : (t + 1) * tps, h0 : h0 + ps, w0 : w0 + ps, :]  # [tps, ps, ps, C]
                        rows.append(block.transpose(3, 0, 1, 2).reshape(-1))  # (C, tps, ph, pw)
    return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl", "qwen3_omni"])
def test_video_patches_follow_the_processor_layout(name):
    profile = get_profile(name)
    s = profile.image
    h, w = 2 * s.factor, s.factor
    frames = RNG.integers(0, 256, (5, h, w, 3), dtype=np.uint8)  # odd count: the last frame pads
    item = _item("video", info={"info": {"second_per_grid": 1.0}})
    ours = profile.inputs().media_inputs(item, frames, PLAIN)
    ref = _reference_video_patches(frames, profile.image_mean, profile.image_std, s.patch_size, 2, 2)
    np.testing.assert_allclose(ours["pixel_values_videos"], ref, atol=1e-5, rtol=0)
    assert ours["video_grid_thw"].tolist() == [[3, h // s.patch_size, w // s.patch_size]]
    assert profile.inputs().feature_count(item, frames) == 3 * (h // s.patch_size) * (w // s.patch_size) // 4
    # Pairs of equal frames are what the image processor sees for one image: same patches, per step.
    a, b = frames[0], frames[1]
    pairs = profile.inputs().media_inputs(item, np.stack([a, a, b, b]), PLAIN)["pixel_values_videos"]
    proc = qwen_image_processor(profile)
    expect = np.concatenate([_hf(proc, f, do_resize=False)["pixel_values"] for f in (a, b)])
    np.testing.assert_allclose(pairs, expect, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl", "qwen3_omni"])
def test_both_pixel_paths_are_bit_identical_to_theqwen_image_processor(name):
    """Every uint8 value of every channel: the worker's float32 patches and the uint8 patches normalized by
    ``normalize_pixels`` (what the trainer runs on the GPU) equal Qwen2VLImageProcessorPil's bits."""
    from omnipack.loader.media import normalize_pixels

    profile = get_profile(name)
    f = profile.image.factor
    hw = (f * 10, f * 9)  # >= every profile's min_pixels, so the processor does not resize
    img = (np.arange(hw[0] * hw[1] * 3).reshape(*hw, 3) * 7 % 256).astype(np.uint8)
    img[:f, :f] = RNG.integers(0, 256, (f, f, 3), dtype=np.uint8)
    assert all(len(np.unique(img[..., c])) == 256 for c in range(3))
    ref = _hf(qwen_image_processor(profile), img)["pixel_values"]
    f32 = profile.inputs().media_inputs(_item("image"), img, PLAIN)["pixel_values"]
    u8 = profile.inputs().media_inputs(_item("image"), img, U8)["pixel_values"]
    gpu_path = normalize_pixels(torch.from_numpy(u8), *profile.inputs().pixel_normalization()).numpy()
    assert f32.dtype == gpu_path.dtype == ref.dtype == np.float32
    assert np.array_equal(f32, ref)
    assert np.array_equal(gpu_path, ref)


def test_deferred_patches_build_once_into_the_batch_tensor():
    """``deferred=True`` gives PendingRows that collate_media writes into one batch tensor, equal to the
    eager inputs concatenated; no per-item patch array is built first."""
    from omnipack.profiles.model_inputs import PendingRows

    profile = get_profile("qwen2_5_vl")
    f = profile.image.factor
    imgs = [RNG.integers(0, 256, (f * a, f * b, 3), dtype=np.uint8) for a, b in ((2, 3), (1, 1), (4, 2))]
    eager = [profile.inputs().media_inputs(_item("image"), x, U8) for x in imgs]
    deferred = MediaInputOptions(pixel_dtype="uint8", deferred=True)
    lazy = [profile.inputs().media_inputs(_item("image"), x, deferred) for x in imgs]
    assert all(isinstance(d["pixel_values"], PendingRows) for d in lazy)
    assert [d["pixel_values"].shape for d in lazy] == [d["pixel_values"].shape for d in eager]
    got = profile.inputs().collate_media(lazy, PLAIN)
    want = np.concatenate([d["pixel_values"] for d in eager])
    assert got["pixel_values"].dtype == torch.uint8 and np.array_equal(got["pixel_values"].numpy(), want)
    assert got["image_grid_thw"].tolist() == np.concatenate([d["image_grid_thw"] for d in eager]).tolist()


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl", "qwen3_omni"])
@pytest.mark.parametrize("frames", [1, 4, 5])
def test_uint8_patches_normalize_to_the_float32_patches(name, frames):
    from omnipack.loader.media import normalize_pixels

    profile = get_profile(name)
    f = profile.image.factor
    x = RNG.integers(0, 256, (frames, 2 * f, 3 * f, 3), dtype=np.uint8)
    kind, key = ("image", "pixel_values") if frames == 1 else ("video", "pixel_values_videos")
    item = _item(kind, info={"info": {"second_per_grid": 1.0}})
    payload = x[0] if kind == "image" else x
    f32 = profile.inputs().media_inputs(item, payload, PLAIN)
    u8 = profile.inputs().media_inputs(item, payload, U8)
    assert u8[key].dtype == np.uint8 and u8[key].shape == f32[key].shape
    assert {k: v.tolist() for k, v in u8.items() if k != key} == {
        k: v.tolist() for k, v in f32.items() if k != key
    }
    mean, std = profile.inputs().pixel_normalization()
    got = normalize_pixels(torch.from_numpy(u8[key]), mean, std)
    assert np.array_equal(got.numpy(), f32[key])  # the GPU normalization gives the worker's float32 bits
    # The uint8 rows are the stored pixel values themselves, in the documented layout.
    ref = _reference_video_patches(x, (0.0,) * 3, (1 / 255,) * 3, profile.image.patch_size, 2, 2)
    np.testing.assert_array_equal(u8[key], ref.astype(np.uint8))


def _whisper_reference(wave: np.ndarray) -> np.ndarray:
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=128)
    out = fe(
        wave.astype(np.float32) / 32768.0,
        sampling_rate=16000,
        return_attention_mask=True,
        padding=True,
        truncation=False,
        return_tensors="np",
    )
    return out["input_features"][0][:, : int(out["attention_mask"][0].sum())]


def test_qwen3_omni_audio_features_match_whisper_and_the_token_rule():
    profile = get_profile("qwen3_omni")
    waves = [(RNG.standard_normal(n) * 3000).astype(np.int16) for n in (16000, 9920, 33333)]
    per_item = []
    for wave in waves:
        item = _item("audio")
        got = profile.inputs().media_inputs(item, wave, PLAIN)
        ref = _whisper_reference(wave)
        assert got["input_features"].shape == (128, len(wave) // 160) == ref.shape
        np.testing.assert_allclose(got["input_features"], ref, atol=1e-5, rtol=0)
        assert profile.inputs().feature_count(item, wave) == audio_output_length(len(wave) // 160)
        per_item.append(got)
    assert [profile.inputs().feature_count(_item("audio"), w) for w in waves[:2]] == [13, 8]
    batch = profile.inputs().collate_media(per_item, PLAIN)
    lens = [len(w) // 160 for w in waves]
    assert batch["input_features"].shape == (3, 128, max(lens))
    assert batch["audio_feature_lengths"].tolist() == lens
    assert batch["feature_attention_mask"].sum(1).tolist() == lens
    assert float(batch["input_features"][1, :, lens[1] :].abs().sum()) == 0.0


def test_qwen3_omni_audio_in_video_counts_and_inputs_both():
    profile = get_profile("qwen3_omni", use_audio_in_video=True)
    payload = {
        "frames": RNG.integers(0, 256, (4, 32, 64, 3), dtype=np.uint8),
        "audio": (RNG.standard_normal(16000) * 1000).astype(np.int16),
    }
    item = _item("video", npz=True, info={"info": {"second_per_grid": 2.0}})
    assert profile.inputs().feature_count(item, payload) == 2 * 2 * 4 // 4 + 13
    got = profile.inputs().media_inputs(item, payload, PLAIN)
    assert got["video_grid_thw"].tolist() == [[2, 2, 4]]
    assert got["input_features"].shape == (128, 100)
    assert got["video_second_per_grid"].tolist() == [2.0]
    image = profile.inputs().media_inputs(_item("image"), payload["frames"][0], PLAIN)
    batch = profile.inputs().collate_media([got, image], PLAIN)
    assert batch["pixel_values"].shape[0] == 8 and batch["pixel_values_videos"].shape[0] == 16
    assert batch["input_features"].shape == (1, 128, 100)


def test_nemotron_feature_counts_from_stored_media():
    p = get_profile("nemotron_omni")
    assert p.inputs().feature_count(_item("image"), np.zeros((448, 640, 3), np.uint8)) == 28 * 40 // 4
    assert p.inputs().feature_count(_item("video"), np.zeros((3, 512, 512, 3), np.uint8)) == 2 * 256
    assert p.inputs().feature_count(_item("audio"), np.zeros(16000, np.int16)) == 13
    assert p.inputs().feature_count(_item("audio"), np.zeros(1300, np.int16)) == 1  # max(1, ...) as Bridge
    with pytest.raises(ValueError, match="multiple of 32"):
        p.inputs().feature_count(_item("image"), np.zeros((40, 64, 3), np.uint8))
    with pytest.raises(ValueError, match="multiple of 32"):
        p.inputs().media_inputs(_item("image"), np.zeros((40, 64, 3), np.uint8), PLAIN)


def test_decode_payload_kinds():
    import io

    from PIL import Image

    img = RNG.integers(0, 256, (8, 6, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    assert np.array_equal(decode_payload("media.0.png", buf.getvalue()), img)
    buf = io.BytesIO()
    np.savez(buf, frames=img[None], audio=np.arange(5, dtype=np.int16))
    z = decode_payload("media.1.npz", buf.getvalue())
    assert set(z) == {"frames", "audio"} and z["audio"].tolist() == list(range(5))
    with pytest.raises(ValueError, match="unsupported"):
        decode_payload("media.2.pkl", b"")


def test_check_row_media_names_row_and_sample_on_mismatch():
    profile = get_profile("qwen2_5_vl")
    pad = 7
    tokens = np.array([1, 2] + [pad] * 4 + [3, 9, 9, 9] + [1] + [pad] * 4 + [3], np.int32)
    items = [
        MediaItem("image", "media.0.png", 0, 2, 4, 1, 7),
        MediaItem("image", "media.1.png", 1, 11, 4, 10, 16),
    ]
    img = np.zeros((56, 56, 3), np.uint8)  # 4x4 patches -> 4 tokens
    kw = dict(placeholder_ids={"image": [pad]}, row_key="000000007", sample_ids=["s-a", "s-b"])
    check_row_media(profile.inputs(), items, [img, img], tokens, **kw)
    with pytest.raises(
        MediaMismatchError, match=r"row '000000007', sample 's-b'.*features of the stored image = 16"
    ):
        check_row_media(profile.inputs(), items, [img, np.zeros((112, 112, 3), np.uint8)], tokens, **kw)
    bad = tokens.copy()
    bad[3] = 5  # one placeholder token lost in the first block
    with pytest.raises(MediaMismatchError, match=r"sample 's-a'.*placeholder tokens in tokens\[1:7\] = 3"):
        check_row_media(profile.inputs(), items, [img, img], bad, **kw)


def test_default_collate_concatenates_in_order():
    p = get_profile("qwen2_5_vl")
    a = p.inputs().media_inputs(_item("image"), np.zeros((28, 56, 3), np.uint8), PLAIN)
    b = p.inputs().media_inputs(_item("image"), np.full((56, 28, 3), 255, np.uint8), PLAIN)
    out = p.inputs().collate_media([a, b], PLAIN)
    assert out["image_grid_thw"].tolist() == [[1, 2, 4], [1, 4, 2]]
    assert isinstance(out["pixel_values"], torch.Tensor) and out["pixel_values"].shape == (
        16,
        3 * 2 * 14 * 14,
    )
    assert torch.equal(out["pixel_values"][8:], torch.from_numpy(b["pixel_values"]))


def test_patchify_frames_gives_the_processor_layout() -> None:
    """Stored frames in the rows of their patches (as the loader's uint8 batches hold them) -> exactly the
    uint8 patches ``qwen_patches`` builds: images one frame (the compact slot), videos whole temporal
    patches with the last frame repeated into the padding, several items in one tensor."""
    from omnipack.loader.media import patchify_frames
    from omnipack.profiles.qwen_vl import qwen_image_patches_compact, qwen_patches

    rng = np.random.default_rng(3)
    ps, merge, tps = 14, 2, 2
    mean = std = (0.5, 0.5, 0.5)
    images = [rng.integers(0, 256, (1, 28 * a, 28 * b, 3), dtype=np.uint8) for a, b in [(2, 3), (1, 1), (4, 2)]]
    held = torch.from_numpy(np.concatenate([f.reshape(-1) for f in images]).reshape(-1, 3 * ps * ps))
    grids = [[1, f.shape[1] // ps, f.shape[2] // ps] for f in images]
    want = np.concatenate([qwen_image_patches_compact(f, ps, merge) for f in images])
    assert np.array_equal(patchify_frames(held, grids, 3, ps, merge, 1).numpy(), want)
    videos = [rng.integers(0, 256, (t, 28 * a, 28 * b, 3), dtype=np.uint8) for t, a, b in [(3, 1, 2), (4, 2, 1)]]
    padded = [np.concatenate([v, v[-1:].repeat(len(v) % tps, 0)]) for v in videos]
    held = torch.from_numpy(np.concatenate([f.reshape(-1) for f in padded]).reshape(-1, 3 * tps * ps * ps))
    grids = [[len(f) // tps, f.shape[1] // ps, f.shape[2] // ps] for f in padded]
    want = np.concatenate([qwen_patches(v, mean, std, ps, merge, tps, pixel_dtype="uint8") for v in videos])
    assert np.array_equal(patchify_frames(held, grids, 3, ps, merge, tps).numpy(), want)
    with pytest.raises(ValueError, match="grids cover"):
        patchify_frames(held, grids[:1], 3, ps, merge, tps)
