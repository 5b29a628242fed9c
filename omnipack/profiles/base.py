"""What a model profile is: the model-specific rules as pure functions of media metadata.

A profile answers, for one media item, how it is materialised (target size, sampled frames, sample rate)
and how many placeholder tokens it expands to, and which tokens the chat template writes for it.
Nothing outside ``omnipack/profiles`` knows which model it serves.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..packing.cost import CostModel, TransformerShape, build_cost_model

MEDIA_KINDS = ("image", "video", "audio")


class MediaRejected(ValueError):
    """The media item cannot be used with this profile; the message is the reject reason."""


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


@dataclass(frozen=True)
class MediaPlan:
    """A profile's decision for one media item.

    ``num_tokens`` is the exact number of placeholder tokens (= encoder features) for the item, all of
    them, also when a video block interleaves its own audio (``audio_num_tokens`` is that audio share);
    ``vision_patches`` / ``audio_frames`` are the encoder-side costs used for per-row budgets.
    """

    kind: str
    num_tokens: int
    grid_thw: tuple[int, int, int] | None = None
    target_hw: tuple[int, int] | None = None  # resized (height, width) for images and video frames
    frame_indices: tuple[int, ...] | None = None  # video frames to sample, padded to the temporal patch
    sample_rate: int | None = None  # audio
    num_audio_samples: int | None = None  # audio samples after resampling (and truncation)
    audio_num_tokens: int = 0  # audio-in-video tokens interleaved into a video block
    vision_patches: int = 0
    audio_frames: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MediaPlan:
        kw = dict(d)
        for k in ("grid_thw", "target_hw", "frame_indices"):
            if kw.get(k) is not None:
                kw[k] = tuple(kw[k])
        return cls(**kw)


@dataclass(frozen=True)
class Segment:
    """A piece of an expanded media block: literal text, or a special token repeated ``count`` times."""

    text: str | None = None
    token: str | None = None
    count: int = 1
    placeholder: bool = False  # counts toward the item's feature count


@dataclass(frozen=True)
class MediaSpan:
    """Where one expanded media block sits in a sample's token ids.

    ``[start, end)`` is the whole block (start/end markers, timestamps text, placeholders);
    ``placeholder_start`` / ``num_placeholders`` locate the first placeholder and how many there are
    (placeholders of one block may be interleaved with other tokens, e.g. audio-in-video).
    """

    plan: MediaPlan
    start: int
    end: int
    placeholder_start: int
    num_placeholders: int


class ModelProfile(ABC):
    """Base class of a model family profile. Subclasses are registered by name."""

    name: ClassVar[str]
    family: ClassVar[str]
    # Text the chat template emits for one media item of each kind (a run of special tokens).
    template_blocks: ClassVar[dict[str, tuple[str, ...]]]
    # End-of-turn marker: the last supervised token of an assistant turn.
    turn_end: ClassVar[str] = "<|im_end|>"
    # Special tokens an expansion writes beyond the template blocks (e.g. Nemotron's <img>, </img>).
    expansion_tokens: ClassVar[tuple[str, ...]] = ()

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.template_blocks)

    def plan(self, meta: MediaMeta) -> MediaPlan:
        if meta.kind not in self.template_blocks:
            raise MediaRejected(f"profile {self.name} does not support {meta.kind} inputs")
        return getattr(self, f"plan_{meta.kind}")(meta)

    def plan_image(self, meta: MediaMeta) -> MediaPlan:
        raise MediaRejected(f"profile {self.name} does not support image inputs")

    def plan_video(self, meta: MediaMeta) -> MediaPlan:
        raise MediaRejected(f"profile {self.name} does not support video inputs")

    def plan_audio(self, meta: MediaMeta) -> MediaPlan:
        raise MediaRejected(f"profile {self.name} does not support audio inputs")

    @abstractmethod
    def expand(self, plan: MediaPlan) -> list[Segment]:
        """The token segments that replace ``template_blocks[plan.kind]`` for this item."""

    def mrope_position_ids(self, input_ids: Any, spans: list[MediaSpan]) -> Any | None:
        """Per-sample 3-D rotary position ids ``int32 [3, L]`` for mRoPE models; None if not used."""
        return None

    def special_tokens(self) -> list[str]:
        """Every special token the profile emits (the demo tokenizer registers them)."""
        toks: list[str] = [self.turn_end]
        for tok in [t for block in self.template_blocks.values() for t in block] + list(
            self.expansion_tokens
        ):
            if tok not in toks:
                toks.append(tok)
        return toks

    def settings(self) -> dict[str, Any]:
        """JSON-able settings recorded in the dataset metadata."""
        return {}

    # ---- trainer side: stored payloads -> encoder inputs ----
    # Placeholder tokens of a block of each kind (every token that stands for one encoder feature).
    placeholder_tokens: ClassVar[dict[str, tuple[str, ...]]] = {}

    def feature_count(self, item: Any, payload: Payload) -> int:
        """Encoder features (= placeholder tokens) the stored ``payload`` of ``item`` produces.

        ``item`` is a row's media entry (``contract.MediaItem`` or its JSON dict); ``payload`` the decoded
        part (see ``omnipack.loader.media.decode_payload``). Computed from the stored data, not from the
        recorded plan, so a mismatch between what was written and what was planned shows up.
        """
        raise NotImplementedError(f"profile {self.name} has no feature count for {item_kind(item)} media")

    def media_inputs(
        self, item: Any, payload: Payload, *, pixel_dtype: str = "float32"
    ) -> dict[str, np.ndarray]:
        """One item's encoder inputs (numpy), keyed by the HF model forward argument names.

        ``pixel_dtype="uint8"`` asks for un-normalized pixel patches (same layout) for trainers that
        normalize on the GPU with :meth:`pixel_normalization`; profiles without it raise ValueError.
        """
        raise NotImplementedError(
            f"profile {self.name} cannot build encoder inputs for {item_kind(item)} media yet; "
            "load with decode_media=False"
        )

    def pixel_normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """Per-channel (mean, std) of pixel inputs, ``x = (u8 / 255 - mean) / std``; None if not applicable."""
        return None

    # Whether ``media_inputs`` takes ``deferred=True`` (pixel patches as ``PendingRows``).
    supports_deferred_inputs: ClassVar[bool] = False

    def collate_media(self, per_item: list[dict[str, Any]]) -> dict[str, Any]:
        """Items' inputs (placeholder order across the micro-batch) -> batch tensors.

        Default: concatenate every key along dim 0 (patch rows, grid rows, per-item scalars) into one
        tensor allocated for the batch (in shared memory inside a loader worker, so handing it to the
        trainer process copies nothing); ``PendingRows`` are built straight into their slice of it.
        """
        keys: list[str] = []
        for d in per_item:
            keys += [k for k in d if k not in keys]
        return {k: concat_into_batch_tensor([d[k] for d in per_item if k in d]) for k in keys}

    # ---- training cost model (packing.cost): new methods, used by balanced packing ----

    def cost_shapes(self) -> dict[str, TransformerShape]:
        """Default shapes of the LM (``"lm"``) and each media encoder (``"vision"``, ``"audio"``)."""
        raise ValueError(f"profile {self.name} has no cost model")

    def media_cost(self, plan: MediaPlan, shapes: dict[str, TransformerShape]) -> float:
        """Forward FLOPs of the encoder(s) for one media item (``shapes`` holds the LM's too)."""
        raise ValueError(f"profile {self.name} has no cost model for {plan.kind} inputs")

    def cost_model(self, overrides: dict[str, Any] | None = None) -> CostModel:
        """The profile's cost model with a config's ``cost`` overrides applied."""
        return build_cost_model(self.cost_shapes(), overrides)


@dataclass(frozen=True)
class PendingRows:
    """Rows of a batch tensor built late: ``fill(out)`` writes an array of ``shape``/``dtype`` into ``out``
    (its C-contiguous slice of the batch buffer), so large inputs are written exactly once."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fill: Callable[[np.ndarray], Any]


def empty_batch_tensor(shape: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialised torch tensor for a batch; in a DataLoader worker its storage is created in shared
    memory (as torch's own default collate does), so sending it to the main process copies no bytes."""
    import torch

    tdtype = torch.from_numpy(np.empty(0, dtype)).dtype
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=tdtype)
    numel = int(np.prod(shape, dtype=np.int64))
    storage = torch.UntypedStorage._new_shared(numel * np.dtype(dtype).itemsize)
    return torch.empty(0, dtype=tdtype).set_(storage, 0, shape)


def concat_into_batch_tensor(parts: list[Any]) -> Any:
    """Arrays / ``PendingRows`` joined along dim 0 into one new batch tensor, each written once."""
    first = parts[0]
    dtype = first.dtype
    tail = tuple(first.shape[1:])
    for p in parts:
        if p.dtype != dtype or tuple(p.shape[1:]) != tail:
            raise ValueError(f"cannot join inputs {dtype} {tail} and {p.dtype} {tuple(p.shape[1:])}")
    rows = sum(int(p.shape[0]) for p in parts)
    out = empty_batch_tensor((rows, *tail), dtype)
    buf = out.numpy()
    at = 0
    for p in parts:
        n = int(p.shape[0])
        if isinstance(p, PendingRows):
            p.fill(buf[at : at + n])
        else:
            buf[at : at + n] = p
        at += n
    return out


def dataset_placeholder_ids(
    meta: Mapping[str, Any], profile: ModelProfile, tokenizer_path: str | None = None
) -> tuple[dict[str, list[int]] | None, str]:
    """A dataset's placeholder token ids per kind and where they came from: recorded in omnipack.json,
    else (or when ``tokenizer_path`` is given) from the tokenizer; None when neither is available."""
    tok = meta.get("tokenizer") or {}
    if tok.get("placeholder_token_ids") and tokenizer_path is None:
        return {k: [int(i) for i in v] for k, v in tok["placeholder_token_ids"].items()}, "omnipack.json"
    path = tokenizer_path or tok.get("path")
    if not path or not Path(path).exists():
        return None, f"not recorded in omnipack.json and no tokenizer at {path!r}"
    from transformers import AutoTokenizer

    return placeholder_token_ids(profile, AutoTokenizer.from_pretrained(path)), f"tokenizer {path}"


def placeholder_token_ids(profile: ModelProfile, tokenizer: Any) -> dict[str, list[int]]:
    """{kind: token ids} of ``profile.placeholder_tokens`` under an HF ``tokenizer``."""
    out = {}
    for kind, toks in profile.placeholder_tokens.items():
        ids = [tokenizer.convert_tokens_to_ids(t) for t in toks]
        if any(i is None or i == tokenizer.unk_token_id for i in ids):
            raise ValueError(f"tokenizer lacks a {kind} placeholder token of {toks}")
        out[kind] = [int(i) for i in ids]
    return out


# A decoded media part: an array (image [H,W,3], video [T,H,W,3], audio [n]) or named arrays (npz).
Payload = np.ndarray | Mapping[str, np.ndarray]


def item_kind(item: Any) -> str:
    return item["kind"] if isinstance(item, Mapping) else item.kind


def item_info(item: Any) -> dict[str, Any]:
    """The plan facts the writer recorded for an item (``MediaItem.info``)."""
    return dict(item.get("info", {}) if isinstance(item, Mapping) else item.info)


def payload_frames(payload: Payload) -> np.ndarray:
    """Vision frames uint8 [T, H, W, 3] of an image or video payload."""
    arr = payload["frames"] if isinstance(payload, Mapping) else payload
    arr = np.asarray(arr)
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise ValueError(f"vision payload has shape {arr.shape}, expected [H,W,3] or [T,H,W,3]")
    return arr


# How audio payloads are loaded and stored (``omnipack.media.audio``); recorded in profile settings so a
# dataset says which rule its audio follows (datasets without it stored int16 scaled by 32767).
AUDIO_LOADING = (
    "librosa.load reference: soundfile decode (FFmpeg via PyAV where libsndfile cannot read), float32 channel "
    "mean, soxr_hq, decoded length; stored int16 k (= k / 32768) when exact, else float32"
)
INT16_SCALE = 32768.0  # libsndfile's int16 <-> float scale: the writer's and the reader's, both ways
# The dtypes an audio payload may have (int16 where that is exact, else float32).
STORED_AUDIO_DTYPES = (np.dtype(np.int16), np.dtype(np.float32))


def audio_waveform(stored: np.ndarray) -> np.ndarray:
    """float32 [n] waveform of a stored audio array: int16 ``k`` is ``k / 32768`` (libsndfile's scale, the
    writer's inverse), float32 is the waveform itself; both are exactly what the counts came from."""
    arr = np.asarray(stored)
    if arr.dtype == np.int16:
        return arr.astype(np.float32) / np.float32(INT16_SCALE)
    if arr.dtype == np.float32:
        return arr
    raise ValueError(f"audio payload has dtype {arr.dtype}, expected int16 or float32")


def payload_audio(payload: Payload) -> np.ndarray | None:
    """Stored mono audio [n] (int16 or float32, see ``audio_waveform``) of an audio payload or a video's own
    track; None when there is none. Its length is the sample count; ``audio_waveform`` gives the samples."""
    if isinstance(payload, Mapping):
        if "audio" not in payload:
            return None
        arr = np.asarray(payload["audio"])
    else:
        arr = np.asarray(payload)
    if arr.ndim != 1:
        raise ValueError(f"audio payload has shape {arr.shape}, expected [n]")
    if arr.dtype not in STORED_AUDIO_DTYPES:
        raise ValueError(f"audio payload has dtype {arr.dtype}, expected int16 or float32")
    return arr


def audio_samples_at(meta: MediaMeta, rate: int) -> int:
    """The probed clip's sample count after resampling to ``rate``; rejects unusable audio."""
    if not meta.sample_rate:
        raise MediaRejected("audio sample rate unknown or zero")
    if not meta.num_samples or meta.num_samples <= 0:
        raise MediaRejected("zero-length audio")
    return resampled_length(meta.num_samples, meta.sample_rate, rate)


def resampled_length(num_samples: int, src_rate: int, dst_rate: int) -> int:
    """Samples after resampling a whole clip: ``ceil(n * (dst / src))`` in float64, exactly as
    ``librosa.resample(fix=True)`` computes it (the reference loader's length).

    The stored waveform has exactly this many samples, so it also defines token counts.
    """
    if src_rate <= 0:
        raise MediaRejected(f"audio sample rate is {src_rate}")
    if src_rate == dst_rate:
        return num_samples
    return int(np.ceil(num_samples * (float(dst_rate) / src_rate)))


def read_preprocessor_config(path: str | Path | None) -> dict[str, Any]:
    """A local ``preprocessor_config.json`` (file or model directory), or {}."""
    if path is None:
        return {}
    p = Path(path)
    if p.is_dir():
        p = p / "preprocessor_config.json"
    if not p.exists():
        return {}
    return json.loads(p.read_text())
