"""Nemotron Omni: ``NemotronH_Omni_Reasoning_V3Processor``'s own replacements; image grids from the image
processor module's ``get_patch_grid_size``, audio tokens from the processor's ``_estimate_audio_num_embeddings``
on the decoded clip, video tubelets from the plan's sampled frames. Compared under ``audio_count_rule="hf"``
(the default follows Megatron-Bridge, see ``test_profiles_nemotron_omni``)."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np

from tests.family_kit import FamilyReference, KitMedia
from tests.hf_oracles import bare_processor, import_hf, processor_input_ids


def hf_input_ids(tokenizer_dir: Path, messages: list[dict], media: list[KitMedia], profile) -> list[int]:
    import soundfile
    from transformers import AutoTokenizer
    from transformers.models.nemotron_h_omni.processing_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3Processor as P,
    )
    from transformers.video_utils import VideoMetadata

    grid = import_hf("models.nemotron_h_omni.image_processing_nemotron_h_omni").get_patch_grid_size
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ratio = 1 / profile.merge
    proc = bare_processor(
        "models.nemotron_h_omni.processing_nemotron_h_omni", "NemotronH_Omni_Reasoning_V3Processor", tok,
        image_token="<image>", video_token="<video>", audio_token="<so_embedding>",
        image_start_token="<img>", image_end_token="</img>", audio_start_token="<so_start>",
        audio_end_token="<so_end>", video_temporal_patch_dim=2, audio_hop_length=160, audio_subsampling_factor=8,
        image_processor=types.SimpleNamespace(downsample_ratio=ratio),
        video_processor=types.SimpleNamespace(patch_size=profile.patch_size, downsample_ratio=ratio),
    )  # fmt: skip
    reps: dict[str, list[str]] = {"image": [], "video": [], "audio": []}
    for m in media:
        if m.kind == "image":
            args = (m.meta.height, m.meta.width, profile.patch_size, profile.merge, profile.min_num_patches)
            hw = {"image_grid_hw": np.asarray([grid(*args, profile.image_budget())])}
            reps["image"].append(proc.replace_image_token(hw, 0))
        elif m.kind == "video":
            p = m.plan
            n = p.info["num_sampled_frames"]
            h, w = p.target_hw
            inputs = {
                "num_frames": [n],
                "video_metadata": [
                    VideoMetadata(total_num_frames=None, fps=m.meta.fps, frames_indices=list(p.frame_indices[:n]))
                ],
                "pixel_values_videos": types.SimpleNamespace(shape=(1, p.grid_thw[0], 6, h, w)),
            }
            reps["video"].append(proc.replace_video_token(inputs, 0))
        else:
            wave, _ = soundfile.read(m.path, dtype="float32")
            tokens = max(1, P._estimate_audio_num_embeddings(proc, len(wave)))
            reps["audio"].append(proc.replace_audio_token({"num_tokens": [tokens]}, 0))
    return processor_input_ids(proc, tok, messages, reps)


REFERENCE = FamilyReference(hf_input_ids, profile_options={"audio_count_rule": "hf"})
