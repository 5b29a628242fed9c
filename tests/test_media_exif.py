"""EXIF orientation: probing and materialising see the photo upright, as transformers' ``load_image`` does."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from omnipack.media.image import load_image
from omnipack.media.probe import materialize, probe
from omnipack.profiles import MediaMeta, get_profile

PROFILES = ["qwen2_5_vl", "qwen3_vl", "qwen3_omni", "nemotron_omni"]


def _photo(path, orientation: int, w: int = 400, h: int = 300):
    """A JPEG as a camera writes it: stored w x h pixels plus an EXIF orientation tag."""
    yy, xx = np.mgrid[0:h, 0:w]
    px = np.stack([xx * 255 // w, yy * 255 // h, np.full_like(xx, 40)], -1).astype(np.uint8)
    px[: h // 4, : w // 4] = (255, 255, 255)  # a marker in the stored top-left corner
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(px).save(path, format="JPEG", quality=95, exif=exif)
    return path


@pytest.mark.parametrize("orientation", range(1, 9))
def test_probe_and_load_follow_exif_like_transformers(tmp_path, orientation):
    from transformers.image_utils import load_image as hf_load_image

    path = _photo(tmp_path / f"o{orientation}.jpg", orientation)
    upright = hf_load_image(str(path))  # applies exif_transpose, then RGB
    meta = probe(path, "image")
    assert (meta.width, meta.height) == upright.size
    assert (meta.width, meta.height) == ((300, 400) if orientation >= 5 else (400, 300))
    np.testing.assert_array_equal(load_image(path), np.asarray(upright))


@pytest.mark.parametrize("name", PROFILES)
def test_rotated_photo_is_planned_and_stored_upright(tmp_path, name):
    from transformers.image_utils import load_image as hf_load_image

    path = _photo(tmp_path / "rot.jpg", 6)
    prof = get_profile(name)
    plan = prof.plan(probe(path, "image"))
    upright = hf_load_image(str(path))
    assert plan == prof.plan(MediaMeta(kind="image", width=upright.width, height=upright.height))
    _, gh, gw = plan.grid_thw
    assert gh > gw  # portrait once turned: 300 wide, 400 tall
    ext, data = materialize(path, plan)
    import io

    stored = np.asarray(Image.open(io.BytesIO(data))) if ext == "png" else np.load(io.BytesIO(data))
    want = upright.resize((plan.target_hw[1], plan.target_hw[0]), resample=Image.Resampling.BICUBIC)
    np.testing.assert_array_equal(stored, np.asarray(want))


def test_qwen_grid_of_rotated_photo_matches_image_processor(tmp_path):
    from transformers.image_utils import load_image as hf_load_image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    path = _photo(tmp_path / "rot.jpg", 6)
    prof = get_profile("qwen2_5_vl")
    s = prof.image
    proc = Qwen2VLImageProcessorPil(
        patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=s.min_pixels, max_pixels=s.max_pixels
    )
    out = proc(images=[hf_load_image(str(path))], return_tensors="np")
    plan = prof.plan(probe(path, "image"))
    assert plan.grid_thw == tuple(int(x) for x in out["image_grid_thw"][0])


@pytest.mark.parametrize("fmt,ext", [("PNG", "png"), ("WEBP", "webp"), ("JPEG", "jpg")])
def test_other_formats_probe_without_decoding_and_follow_exif(tmp_path, fmt, ext):
    from transformers.image_utils import load_image as hf_load_image

    px = np.zeros((30, 50, 3), np.uint8)
    plain, rotated = tmp_path / f"plain.{ext}", tmp_path / f"rot.{ext}"
    Image.fromarray(px).save(plain, format=fmt)
    exif = Image.Exif()
    exif[0x0112] = 8
    Image.fromarray(px).save(rotated, format=fmt, exif=exif)
    for path in (plain, rotated):
        meta = probe(path, "image")
        assert (meta.width, meta.height) == hf_load_image(str(path)).size
    assert (probe(rotated, "image").width, probe(plain, "image").width) == (30, 50)
