"""Family-neutral hooks a profile fills in: images stored as views (``MediaPlan.image_views``: boxes of the
upright original, each resized on its own with the plan's ``resample`` filter, stored npy [V, H, W, 3];
plans without them record and store what they did), and a family's own demo chat template."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from omnipack.loader.media import decode_payload
from omnipack.media.errors import MediaError
from omnipack.media.probe import materialize
from omnipack.profiles.base import MediaPlan
from omnipack.stages.measure import media_bytes_estimate
from omnipack.tools.verify import _expected_arrays


def _png(tmp_path, h=60, w=90):
    rng = np.random.default_rng(0)
    px = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    Image.fromarray(px).save(tmp_path / "a.png")
    return tmp_path / "a.png", px


@pytest.mark.parametrize("encoding", ["npy", "png"])
def test_views_are_cut_from_the_original_and_resized_each(tmp_path, encoding):
    path, px = _png(tmp_path)
    boxes = ((0, 0, 60, 90), (0, 0, 60, 45), (0, 45, 60, 90))
    plan = MediaPlan(kind="image", num_tokens=3, target_hw=(32, 32), image_views=boxes, resample="bilinear")
    ext, data = materialize(path, plan, image_encoding=encoding)
    assert ext == "npy"  # a png holds one picture: views are npy whatever the encoding
    got = decode_payload(f"media.0.{ext}", data)
    assert got.shape == (3, 32, 32, 3) and got.dtype == np.uint8
    for view, (t, left, b, r) in zip(got, boxes, strict=True):
        want = Image.fromarray(px[t:b, left:r]).resize((32, 32), resample=Image.Resampling.BILINEAR)
        assert np.array_equal(view, np.asarray(want))
    # the filter is the plan's: bicubic differs on this noise
    bicubic = decode_payload("m.npy", materialize(path, MediaPlan("image", 3, target_hw=(32, 32), image_views=boxes))[1])
    assert not np.array_equal(bicubic, got)
    m = type("Item", (), {"kind": "image", "info": plan.to_json()})
    assert _expected_arrays(m)["frames"][0] == (3, 32, 32, 3)
    assert media_bytes_estimate(plan) == 3 * 32 * 32 * 3


def test_plan_json_round_trips_and_omits_unset_storage_fields():
    plan = MediaPlan(kind="image", num_tokens=4, target_hw=(8, 8), image_views=((0, 0, 4, 4),), resample="box")
    d = json.loads(json.dumps(plan.to_json()))
    assert d["image_views"] == [[0, 0, 4, 4]] and MediaPlan.from_json(d) == plan
    plain = MediaPlan(kind="image", num_tokens=4, target_hw=(8, 8)).to_json()
    assert "image_views" not in plain and "resample" not in plain


def test_bad_views_and_filters_are_media_errors(tmp_path):
    path, _ = _png(tmp_path)
    with pytest.raises(MediaError, match="outside the 60x90 image"):
        materialize(path, MediaPlan("image", 1, target_hw=(8, 8), image_views=((0, 0, 61, 90),)))
    with pytest.raises(MediaError, match="unknown resampling filter 'sinc'"):
        materialize(path, MediaPlan("image", 1, target_hw=(8, 8), resample="sinc"))


def test_demo_tokenizer_takes_a_familys_own_chat_template(monkeypatch):
    from omnipack.demo.tokenizer import chat_template
    from omnipack.profiles import profile_class

    cls = profile_class("qwen2_5_vl")
    assert "<|im_start|>" in chat_template("qwen2_5_vl") and "<|vision_start|>" in chat_template("qwen2_5_vl")
    monkeypatch.setattr(cls, "chat_template", "{{ bos_token }}{% for m in messages %}{{ m['role'] }}{% endfor %}")
    assert chat_template("qwen2_5_vl") == cls.chat_template
