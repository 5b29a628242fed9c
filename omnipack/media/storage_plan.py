"""What the writer decodes and stores for one media item: the storage half of a profile's plan, typed, so the
decoders need nothing of the profile that made it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class StoragePlan:
    """How one media item is materialised for a shard (see ``omnipack.media.probe.materialize``)."""

    kind: str  # "image" | "video" | "audio"
    target_hw: tuple[int, int] | None = None  # resized (height, width) of an image or the video frames
    frame_indices: tuple[int, ...] | None = None  # video frames to sample, padded to the temporal patch
    sample_rate: int | None = None  # audio, and a video's own audio track
    # audio: the clip's samples after resampling (and truncation); video: its own audio track's samples when
    # the block interleaves it (None: frames only)
    num_audio_samples: int | None = None
    # (top, left, bottom, right) boxes of the upright image, each resized to ``target_hw`` and stored as one
    # view of a [V, H, W, 3] payload; None: the whole image at ``target_hw``, stored [H, W, 3]
    image_views: tuple[tuple[int, int, int, int], ...] | None = None
    resample: str | None = None  # a PIL resampling name; None: ``omnipack.media.image.RESAMPLE``
    truncate: bool = False  # audio: the decoded clip may be longer and is cut to ``num_audio_samples``


class HasStoragePlan(Protocol):
    """Anything that carries a storage plan (a profile's ``MediaPlan``)."""

    @property
    def storage(self) -> StoragePlan: ...


def storage_of(plan: StoragePlan | HasStoragePlan) -> StoragePlan:
    """The storage plan itself, or the one ``plan`` carries."""
    return plan if isinstance(plan, StoragePlan) else plan.storage
