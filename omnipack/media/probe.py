"""One entry point to probe any media kind cheaply, and to materialise it for a shard."""

from __future__ import annotations

from pathlib import Path

from ..profiles.base import MediaMeta, MediaPlan
from .errors import MediaError


def probe(path: Path, kind: str) -> MediaMeta:
    """Cheap metadata of a media file (header / container only)."""
    if not path.is_file():
        raise MediaError(f"missing {kind} file: {path}")
    if kind == "image":
        from .image import probe_image

        return probe_image(path)
    raise MediaError(f"unsupported media kind {kind!r}")


def materialize(path: Path, plan: MediaPlan, *, image_encoding: str = "png") -> tuple[str, bytes]:
    """Decode ``path`` exactly as ``plan`` says and return (extension, bytes) for the shard."""
    if plan.kind == "image":
        from .image import encode_image, load_image

        return encode_image(load_image(path, plan.target_hw), image_encoding)
    raise MediaError(f"unsupported media kind {plan.kind!r}")
