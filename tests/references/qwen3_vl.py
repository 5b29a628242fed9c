"""Qwen3-VL: ``Qwen3VLProcessor``'s own replacements (per-frame-group timestamps from the sampled frames'
metadata); image grids from ``Qwen2VLImageProcessorPil`` on the image file, video grids from the plan
(checked against the video processor in ``test_hf_video_processors``)."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np

from tests.family_kit import FamilyReference, KitMedia
from tests.hf_oracles import bare_processor, processor_input_ids, qwen_image_grids


def hf_input_ids(tokenizer_dir: Path, messages: list[dict], media: list[KitMedia], profile) -> list[int]:
    from transformers import AutoTokenizer
    from transformers.video_utils import VideoMetadata

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    s = profile.image
    proc = bare_processor(
        "models.qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor", tok,
        image_token="<|image_pad|>", video_token="<|video_pad|>",
        vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>",
        image_processor=types.SimpleNamespace(merge_size=s.merge_size),
        video_processor=types.SimpleNamespace(merge_size=s.merge_size, temporal_patch_size=s.temporal_patch_size),
    )  # fmt: skip
    images = {"image_grid_thw": qwen_image_grids(profile, [m.path for m in media if m.kind == "image"])}
    plans = [m.plan for m in media if m.kind == "video"]
    videos = {
        "video_grid_thw": [np.array(p.grid_thw) for p in plans],
        "video_metadata": [
            VideoMetadata(
                total_num_frames=None,
                fps=p.info["src_fps"],
                frames_indices=list(p.frame_indices[: p.info["num_sampled_frames"]]),
            )
            for p in plans
        ],
    }
    return processor_input_ids(
        proc,
        tok,
        messages,
        {
            "image": [proc.replace_image_token(images, i) for i in range(len(images["image_grid_thw"]))],
            "video": [proc.replace_video_token(videos, i) for i in range(len(plans))],
        },
    )


REFERENCE = FamilyReference(hf_input_ids)
