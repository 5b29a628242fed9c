"""What a cheap probe learns about one media file: the facts a model profile plans from."""

from __future__ import annotations

from dataclasses import dataclass

MEDIA_KINDS = ("image", "video", "audio")


@dataclass(frozen=True)
class MediaMeta:
    """Cheaply probed facts about one media file (no full decode)."""

    kind: str
    width: int | None = None
    height: int | None = None
    num_frames: int | None = None  # video
    fps: float | None = None  # video
    num_samples: int | None = None  # audio, at ``sample_rate``
    sample_rate: int | None = None  # audio
    has_audio: bool = False  # video with an audio track
    audio_num_samples: int | None = None  # the video's audio track, at the profile's rate

    @property
    def duration(self) -> float | None:
        if self.kind == "audio" and self.num_samples is not None and self.sample_rate:
            return self.num_samples / self.sample_rate
        if self.kind == "video" and self.num_frames is not None and self.fps:
            return self.num_frames / self.fps
        return None
