"""Qwen3-Omni: ``Qwen3OmniMoeProcessor``'s own replacements; image grids from ``Qwen2VLImageProcessorPil`` on
the image file, audio tokens from ``WhisperFeatureExtractor(feature_size=128)`` on the decoded clip and the
processor module's ``_get_feat_extract_output_lengths``, video grids from the plan (checked against the
video processor in ``test_hf_video_processors``)."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np

from tests.family_kit import FamilyReference, KitMedia
from tests.hf_oracles import bare_processor, processor_input_ids, qwen_image_grids


def _audio_tokens(path: Path) -> int:
    import soundfile
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

    wave, rate = soundfile.read(path, dtype="float32")
    assert rate == 16000 and wave.ndim == 1
    fe = WhisperFeatureExtractor(feature_size=128)
    out = fe(
        wave, sampling_rate=rate, return_attention_mask=True, padding=True, truncation=False, return_tensors="np"
    )
    return int(_get_feat_extract_output_lengths(np.asarray([out["attention_mask"].sum()]))[0])


def hf_input_ids(tokenizer_dir: Path, messages: list[dict], media: list[KitMedia], profile) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    s = profile.image
    proc = bare_processor(
        "models.qwen3_omni_moe.processing_qwen3_omni_moe", "Qwen3OmniMoeProcessor", tok,
        image_token="<|image_pad|>", video_token="<|video_pad|>", audio_token="<|audio_pad|>",
        image_processor=types.SimpleNamespace(merge_size=s.merge_size),
        video_processor=types.SimpleNamespace(merge_size=s.merge_size),
    )  # fmt: skip
    images = {"image_grid_thw": qwen_image_grids(profile, [m.path for m in media if m.kind == "image"])}
    videos = {"video_grid_thw": [np.array(m.plan.grid_thw) for m in media if m.kind == "video"]}
    audio = {"num_audio_tokens": [_audio_tokens(m.path) for m in media if m.kind == "audio"]}
    no_track = [None] * len(videos["video_grid_thw"])
    return processor_input_ids(
        proc,
        tok,
        messages,
        {
            "image": [proc.replace_image_token(images, i) for i in range(len(images["image_grid_thw"]))],
            "video": [
                proc.replace_video_token(videos, i, video_to_audio_indices=no_track, load_audio_from_video=False)
                for i in range(len(no_track))
            ],
            "audio": [proc.replace_audio_token(audio, i) for i in range(len(audio["num_audio_tokens"]))],
        },
    )


REFERENCE = FamilyReference(hf_input_ids)
