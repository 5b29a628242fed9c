"""Model profiles, selected by name. Adding a family is one new module registered here."""

from __future__ import annotations

from typing import Any

from .base import MediaMeta, MediaPlan, MediaRejected, MediaSpan, ModelProfile, Segment
from .nemotron_omni import NemotronOmniProfile
from .qwen3_omni import Qwen3OmniProfile
from .qwen_vl import Qwen3VLProfile, Qwen25VLProfile

PROFILES: dict[str, type[ModelProfile]] = {
    cls.name: cls for cls in (Qwen25VLProfile, Qwen3VLProfile, Qwen3OmniProfile, NemotronOmniProfile)
}


def get_profile(name: str, **options: Any) -> ModelProfile:
    """Instantiate the profile called ``name`` with its options (e.g. ``max_pixels``)."""
    try:
        cls = PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; available: {', '.join(sorted(PROFILES))}") from None
    return cls(**options)


__all__ = [
    "PROFILES",
    "MediaMeta",
    "MediaPlan",
    "MediaRejected",
    "MediaSpan",
    "ModelProfile",
    "Segment",
    "get_profile",
]
