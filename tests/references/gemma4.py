"""Gemma 4: ``Gemma4Processor``'s own replacements (``replace_image_token`` from the PIL image processor's
soft-token counts on the image file, ``replace_audio_token`` from the feature extractor's mask on the
waveform, ``replace_video_token`` from the class's frame sampler and timestamps: its video processor needs
torchvision), rendered by the model folder's chat template and tokenized."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.family_kit import FamilyReference, KitMedia


def gemma4_model_dir(out: Path, name: str) -> Path:
    from tests.test_profiles_gemma4 import build_gemma4_model_dir

    return build_gemma4_model_dir(out)


def hf_input_ids(model_dir: Path, messages: list[dict], media: list[KitMedia], profile) -> list[int]:
    import soundfile
    from PIL import Image
    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    from tests.test_profiles_gemma4 import build_processor

    proc = build_processor(model_dir)
    replacements: dict[str, list[str]] = {"image": [], "video": [], "audio": []}
    for m in media:
        if m.kind == "image":
            px = proc.image_processor([Image.open(m.path).convert("RGB")], return_tensors="np")
            replacements["image"].append(proc.replace_image_token(px, 0))
        elif m.kind == "audio":
            wave, rate = soundfile.read(m.path, dtype="float32")
            assert rate == proc.feature_extractor.sampling_rate
            feats = proc.feature_extractor(raw_speech=[wave], return_tensors="np")
            replacements["audio"].append(proc.replace_audio_token(feats, 0))
        else:
            meta = VideoMetadata(total_num_frames=m.meta.num_frames, fps=m.meta.fps)
            meta.frames_indices = default_sample_indices_fn(meta, num_frames=profile.video_num_frames)
            per_frame = m.plan.num_tokens // len(meta.frames_indices)
            replacements["video"].append(
                proc.replace_video_token({"num_soft_tokens_per_video": [per_frame], "video_metadata": [meta]}, 0)
            )
    text = proc.tokenizer.apply_chat_template(messages, tokenize=False)
    expanded, _ = proc.get_text_with_replacements(
        [text],
        images_replacements=replacements["image"],
        videos_replacements=replacements["video"],
        audio_replacements=replacements["audio"],
    )
    return np.asarray(proc.tokenizer(expanded, add_special_tokens=False)["input_ids"][0]).tolist()


REFERENCE = FamilyReference(hf_input_ids, tokenizer=gemma4_model_dir)
