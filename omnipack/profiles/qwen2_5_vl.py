"""Qwen2.5-VL: the shared Qwen-VL rules (``qwen_vl``) at patch 14, windowed ViT, ``second_per_grid_ts``."""

from __future__ import annotations

from typing import ClassVar

from .cost import TransformerShape
from .qwen_vl import VISION_BATCH_KEYS, QwenVLInputs, QwenVLProfile, VideoSettings, VisionSettings


class Qwen25VLInputs(QwenVLInputs):
    """Trainer half: pixel patches and grids, plus ``second_per_grid_ts`` [n_videos] (float32)."""

    name = "qwen2_5_vl"
    second_per_grid_key = "second_per_grid_ts"
    batch_keys = (*VISION_BATCH_KEYS, "second_per_grid_ts")


class Qwen25VLProfile(QwenVLProfile):
    name = "qwen2_5_vl"
    model_types = ("qwen2_5_vl",)
    inputs_class = Qwen25VLInputs
    # Qwen2.5-VL's released preprocessor_config: patch 14, merge 2, min 56*56, max 12845056 pixels.
    default_image = VisionSettings(14, 2, 2, 3136, 12845056)
    # Qwen2VLVideoProcessor class defaults (per-frame budget 128..768 tokens), sampled at 2 fps.
    default_video = VideoSettings(2.0, 4, 768, 128 * 28 * 28, 28 * 28 * 768, False, 128000)
    video_sampler = "qwen2"
    # the model's temporal mRoPE scale (2 in the released configs; the config class's default is 4)
    model_config_options = {"tokens_per_second": ("vision_config", "tokens_per_second")}

    # ---- training cost model (profiles.cost): new methods ----

    vision_window_layers: ClassVar[int] = 28  # 32 layers, full attention only at 7, 15, 23, 31

    def cost_shapes(self) -> dict[str, TransformerShape]:
        """Qwen2.5-VL-7B: LM hidden 3584, 28 layers, 28/4 heads, SwiGLU 18944; ViT 32 x 1280, 16 heads,
        SwiGLU 3420, windows of 112 px (4x4 merged tokens) except 4 full-attention layers."""
        return {
            "lm": TransformerShape(hidden=3584, layers=28, heads=28, kv_heads=4, ffn=18944),
            "vision": TransformerShape(hidden=1280, layers=32, heads=16, ffn=3420),
        }


PROFILE = Qwen25VLProfile
