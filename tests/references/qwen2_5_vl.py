"""Qwen2.5-VL: ``Qwen2_5_VLProcessor``'s own replacements; image grids from ``Qwen2VLImageProcessorPil`` on the
image file, video grids from the plan (checked against the video processor in ``test_hf_video_processors``)."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np

from tests.family_kit import FamilyReference, KitMedia
from tests.hf_oracles import bare_processor, processor_input_ids, qwen_image_grids


def hf_input_ids(tokenizer_dir: Path, messages: list[dict], media: list[KitMedia], profile) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    s = profile.image
    proc = bare_processor(
        "models.qwen2_5_vl.processing_qwen2_5_vl", "Qwen2_5_VLProcessor", tok,
        image_token="<|image_pad|>", video_token="<|video_pad|>",
        image_processor=types.SimpleNamespace(merge_size=s.merge_size),
        video_processor=types.SimpleNamespace(merge_size=s.merge_size),
    )  # fmt: skip
    images = {"image_grid_thw": qwen_image_grids(profile, [m.path for m in media if m.kind == "image"])}
    videos = {"video_grid_thw": [np.array(m.plan.grid_thw) for m in media if m.kind == "video"]}
    return processor_input_ids(
        proc,
        tok,
        messages,
        {
            "image": [proc.replace_image_token(images, i) for i in range(len(images["image_grid_thw"]))],
            "video": [proc.replace_video_token(videos, i) for i in range(len(videos["video_grid_thw"]))],
        },
    )


REFERENCE = FamilyReference(hf_input_ids)
