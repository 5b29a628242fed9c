"""Qwen2.5-VL and Qwen3-VL: smart_resize grids and ``<|image_pad|>`` expansion.

Images are resized so both sides are multiples of ``patch_size * merge_size`` within a pixel budget,
cut into ``patch_size`` patches (repeated to ``temporal_patch_size`` frames, so ``t = 1``), and every
``merge_size x merge_size`` patch group becomes one LLM token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .base import MediaMeta, MediaPlan, MediaRejected, ModelProfile, Segment, read_preprocessor_config

MAX_ASPECT_RATIO = 200


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen's resize rule: sides rounded to ``factor`` (Python round, ties to even), area kept in budget.

    The float arithmetic follows the model's processor step by step so results agree bit for bit.
    """
    if min(height, width) <= 0:
        raise MediaRejected(f"image has a zero side ({height}x{width})")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaRejected(
            f"aspect ratio {max(height, width) / min(height, width):.1f} exceeds {MAX_ASPECT_RATIO} ({height}x{width})"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class VisionSettings:
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_preprocessor_config(cls, cfg: dict[str, Any], default: VisionSettings) -> VisionSettings:
        size = cfg.get("size") or {}
        return cls(
            patch_size=int(cfg.get("patch_size", default.patch_size)),
            merge_size=int(cfg.get("merge_size", default.merge_size)),
            temporal_patch_size=int(cfg.get("temporal_patch_size", default.temporal_patch_size)),
            min_pixels=int(cfg.get("min_pixels") or size.get("shortest_edge") or default.min_pixels),
            max_pixels=int(cfg.get("max_pixels") or size.get("longest_edge") or default.max_pixels),
        )


class QwenVLProfile(ModelProfile):
    """Shared Qwen-VL image rules; subclasses set the family defaults."""

    family = "qwen_vl"
    default_image: ClassVar[VisionSettings]
    template_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "image": ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"),
    }
    image_pad: ClassVar[str] = "<|image_pad|>"

    def __init__(
        self,
        *,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        preprocessor_config: str | Path | None = None,
    ) -> None:
        image = VisionSettings.from_preprocessor_config(
            read_preprocessor_config(preprocessor_config), self.default_image
        )
        if min_pixels is not None or max_pixels is not None:
            image = VisionSettings(
                image.patch_size,
                image.merge_size,
                image.temporal_patch_size,
                min_pixels if min_pixels is not None else image.min_pixels,
                max_pixels if max_pixels is not None else image.max_pixels,
            )
        if image.min_pixels > image.max_pixels:
            raise ValueError(f"min_pixels {image.min_pixels} > max_pixels {image.max_pixels}")
        self.image = image

    def image_grid(self, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int, int]]:
        """Resized (h, w) and patch grid (t, gh, gw) of an image."""
        s = self.image
        rh, rw = smart_resize(height, width, s.factor, s.min_pixels, s.max_pixels)
        return (rh, rw), (1, rh // s.patch_size, rw // s.patch_size)

    def plan_image(self, meta: MediaMeta) -> MediaPlan:
        if not meta.height or not meta.width:
            raise MediaRejected("image size unknown or zero")
        (rh, rw), grid = self.image_grid(meta.height, meta.width)
        patches = grid[0] * grid[1] * grid[2]
        return MediaPlan(
            kind="image",
            num_tokens=patches // self.image.merge_size**2,
            grid_thw=grid,
            target_hw=(rh, rw),
            vision_patches=patches,
        )

    def expand(self, plan: MediaPlan) -> list[Segment]:
        if plan.kind == "image":
            return [
                Segment(token="<|vision_start|>"),
                Segment(token=self.image_pad, count=plan.num_tokens, placeholder=True),
                Segment(token="<|vision_end|>"),
            ]
        raise MediaRejected(f"profile {self.name} cannot expand {plan.kind}")

    def settings(self) -> dict[str, Any]:
        return {"image": self.image.__dict__}


class Qwen25VLProfile(QwenVLProfile):
    name = "qwen2_5_vl"
    # Qwen2.5-VL's released preprocessor_config: patch 14, merge 2, min 56*56, max 12845056 pixels.
    default_image = VisionSettings(14, 2, 2, 3136, 12845056)


class Qwen3VLProfile(QwenVLProfile):
    name = "qwen3_vl"
    # Qwen3-VL: patch 16 (factor 32); size.shortest_edge / longest_edge in its preprocessor_config.
    default_image = VisionSettings(16, 2, 2, 65536, 16777216)
