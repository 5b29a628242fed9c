"""Qwen3-VL: the shared Qwen-VL rules (``qwen_vl``) at patch 16, per-frame-group timestamp text, deepstack."""

from __future__ import annotations

from typing import ClassVar

from .base import MediaPlan
from .cost import TransformerShape
from .qwen_vl import HALF, VISION_BATCH_KEYS, QwenVLInputs, QwenVLProfile, VideoSettings, VisionSettings


class Qwen3VLInputs(QwenVLInputs):
    """Trainer half: pixel patches and grids; no time input (Qwen3-VL carries time as timestamp text)."""

    name = "qwen3_vl"
    second_per_grid_key = None
    batch_keys = VISION_BATCH_KEYS


class Qwen3VLProfile(QwenVLProfile):
    name = "qwen3_vl"
    model_types = ("qwen3_vl", "qwen3_vl_moe")
    inputs_class = Qwen3VLInputs
    # Qwen3-VL: patch 16 (factor 32); size.shortest_edge / longest_edge in its preprocessor_config.
    default_image = VisionSettings(16, 2, 2, 65536, 16777216)
    # Qwen3VLVideoProcessor class defaults: fps 2, 4..768 frames, budget over all frames 128..768 tokens.
    default_video = VideoSettings(2.0, 4, 768, 128 * 32 * 32, 32 * 32 * 768, False, 768)
    video_sampler = "qwen3"
    per_frame_timestamps = True
    default_mean = HALF
    default_std = HALF

    def video_time_interval(self, plan: MediaPlan) -> float:
        return 1.0  # every frame group is its own t=1 block

    # ---- training cost model (profiles.cost): new methods ----

    vision_mergers: ClassVar[int] = 4  # the final merger and 3 deepstack mergers (layers 8, 16, 24)

    def cost_shapes(self) -> dict[str, TransformerShape]:
        """Qwen3-VL-8B: LM hidden 4096, 36 layers, 32/8 heads of 128, SwiGLU 12288; ViT 27 x 1152,
        16 heads, GELU MLP 4304, full attention within each frame group."""
        return {
            "lm": TransformerShape(hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=12288),
            "vision": TransformerShape(hidden=1152, layers=27, heads=16, ffn=4304, gated_ffn=False),
        }


PROFILE = Qwen3VLProfile
