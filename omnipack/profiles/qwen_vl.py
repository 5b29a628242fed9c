"""The Qwen-VL vision rules shared by the Qwen families (``qwen2_5_vl``, ``qwen3_vl``, ``qwen3_omni``):
smart_resize grids, video frame sampling, placeholder expansion, mRoPE.

Images are resized so both sides are multiples of ``patch_size * merge_size`` within a pixel budget,
cut into ``patch_size`` patches (repeated to ``temporal_patch_size`` frames, so ``t = 1``), and every
``merge_size x merge_size`` patch group becomes one LLM token.

Videos are sampled and resized as the transformers 5.x video processors do (``Qwen2VLVideoProcessor``
for Qwen2.5-VL and Qwen3-Omni, ``Qwen3VLVideoProcessor`` for Qwen3-VL); every ``temporal_patch_size``
sampled frames form one temporal grid step (the last frame is repeated to fill the last step).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..media.errors import MediaRejected
from ..media.meta import MediaMeta
from .base import MediaPlan, MediaSpan, ModelProfile, Segment
from .cost import TransformerShape, windowed_pairs
from .hf_config import read_preprocessor_config
from .model_inputs import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    EncoderInputs,
    MediaInputOptions,
    Payload,
    PendingRows,
    item_info,
    item_kind,
    payload_frames,
)

HALF = (0.5, 0.5, 0.5)

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


def smart_resize_3d(
    num_frames: int,
    height: int,
    width: int,
    temporal_factor: int,
    factor: int,
    min_pixels: int,
    max_pixels: int,
) -> tuple[int, int]:
    """Qwen3-VL's video resize: like :func:`smart_resize` but the pixel budget counts the frames too.

    Sides below ``factor`` are first scaled up (int truncation, as the processor does).
    """
    if min(height, width) <= 0:
        raise MediaRejected(f"video frame has a zero side ({height}x{width})")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaRejected(
            f"aspect ratio {max(height, width) / min(height, width):.1f} exceeds {MAX_ASPECT_RATIO} ({height}x{width})"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class VideoSettings:
    """Frame sampling and per-frame pixel budget of a video processor.

    ``fps=None`` disables sampling (every decoded frame is used, as ``do_sample_frames=False``).
    ``cap_pixels_per_frame`` is the 5.x processors' optional qwen-vl-utils style cap (off by default in 5.24).
    """

    fps: float | None
    min_frames: int
    max_frames: int
    min_pixels: int
    max_pixels: int
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 768

    @classmethod
    def from_config(cls, cfg: dict[str, Any], default: VideoSettings, **overrides: Any) -> VideoSettings:
        size = cfg.get("size") or {}
        d = dict(default.__dict__)
        if "fps" in cfg or "do_sample_frames" in cfg:
            d["fps"] = cfg.get("fps", d["fps"]) if cfg.get("do_sample_frames", True) else None
        for k in ("min_frames", "max_frames", "max_video_tokens"):
            if cfg.get(k) is not None:
                d[k] = int(cfg[k])
        d["min_pixels"] = int(cfg.get("min_pixels") or size.get("shortest_edge") or d["min_pixels"])
        d["max_pixels"] = int(cfg.get("max_pixels") or size.get("longest_edge") or d["max_pixels"])
        if cfg.get("cap_pixels_per_frame") is not None:
            d["cap_pixels_per_frame"] = bool(cfg["cap_pixels_per_frame"])
        d.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**d)


def _pad_to_multiple(indices: list[int], multiple: int) -> tuple[int, ...]:
    """Repeat the last index so the count is a multiple of the temporal patch (the processors' padding)."""
    if pad := -len(indices) % multiple:
        indices = indices + [indices[-1]] * pad
    return tuple(indices)


def sample_frames_qwen2(total: int, src_fps: float, tps: int, v: VideoSettings) -> list[int]:
    """Frame indices as ``Qwen2VLVideoProcessor.sample_frames`` (5.x) picks them (before padding).

    ``n = floor(min(max(total/src_fps*fps, min_frames), floor(min(max_frames, total)/tps)*tps, total)/tps)*tps``
    and ``indices = arange(0, total, total/n).int()`` computed in float32 as torch does. With fewer than
    ``tps`` frames the processor divides by zero; we fall back to all frames (the model then sees the
    padded clip, as with ``do_sample_frames=False``).
    """
    if v.fps is None:
        return list(range(total))
    max_frames = math.floor(min(v.max_frames, total) / tps) * tps
    n = min(max(total / src_fps * v.fps, v.min_frames), max_frames, total)
    n = math.floor(n / tps) * tps
    if n <= 0:
        return list(range(total))
    step = total / n
    # torch.arange(0, total, step): length ceil(total/step), value i*step rounded to float32, then .int().
    count = math.ceil(total / step)
    vals = (np.arange(count, dtype=np.float64) * step).astype(np.float32)
    return [int(x) for x in vals]


def sample_frames_qwen3(total: int, src_fps: float, v: VideoSettings) -> list[int]:
    """Frame indices as ``Qwen3VLVideoProcessor.sample_frames`` (5.x) picks them (before padding).

    ``n = min(max(int(total/src_fps*fps), min_frames), max_frames, total)``, indices
    ``round(linspace(0, total-1, n))`` (numpy's round half to even). ``fps=None``: no sampling, every
    frame (``do_sample_frames=False``).
    """
    if v.fps is None:
        return list(range(total))
    n = int(total / src_fps * v.fps)
    n = min(max(n, v.min_frames), v.max_frames, total)
    return [int(i) for i in np.linspace(0, total - 1, n).round().astype(int)]


PIXEL_DTYPES = ("float32", "uint8")


def normalize_hf_float32(x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
    """In place on float32 ``x [rows, C, ...]`` holding pixel values 0..255: ``(x / 255 - mean[c]) / std[c]``.

    The same float32 operations in the same order as the HF Qwen-VL image processors (and as
    ``omnipack.loader.media.normalize_pixels`` on the GPU), so every value is bit-identical to theirs.
    """
    m = np.asarray(mean, np.float32).reshape(1, -1, *([1] * (x.ndim - 2)))
    sd = np.asarray(std, np.float32).reshape(1, -1, *([1] * (x.ndim - 2)))
    x /= np.float32(255.0)
    x -= m
    x /= sd


def _spatial_patches(
    frames: np.ndarray, patch_size: int, merge_size: int, *, out: np.ndarray | None = None
) -> np.ndarray:
    """uint8 [T, H, W, C] -> uint8 [T, gh*gw, C, ps*ps], rows in (h-block, w-block, merge-h, merge-w) order.

    The transpose runs on bytes (a quarter of the float32 traffic) and is the only full copy of the frames;
    ``out`` (C-contiguous, ``T*gh*gw*C*ps*ps`` uint8 elements): written there instead of a new array.
    """
    t, h, w, c = frames.shape
    ps, m = patch_size, merge_size
    if h % (ps * m) or w % (ps * m):
        raise ValueError(f"frame size {h}x{w} is not a multiple of {ps * m}")
    gh, gw = h // ps, w // ps
    x = frames.reshape(t, gh // m, m, ps, gw // m, m, ps, c).transpose(0, 1, 4, 2, 5, 7, 3, 6)
    if out is None:
        return np.ascontiguousarray(x).reshape(t, gh * gw, c, ps * ps)
    if out.dtype != np.uint8 or out.size != x.size or not out.flags.c_contiguous:
        raise ValueError(f"out is {out.dtype} {out.shape}, expected C-contiguous uint8 of {x.size} elements")
    np.copyto(out.reshape(x.shape), x)  # a view of out (C-contiguous): one transposing copy
    return out.reshape(t, gh * gw, c, ps * ps)


def qwen_image_patches_compact(
    frames: np.ndarray, patch_size: int, merge_size: int, *, out: np.ndarray | None = None
) -> np.ndarray:
    """uint8 image [1, H, W, 3] -> uint8 ``(gh*gw, 3*ps*ps)``: ``qwen_patches(..., pixel_dtype="uint8")``
    with its temporal slots, identical for a still image, kept once (the rows hold (channel, patch-h,
    patch-w)). Repeating each channel's slot ``tps`` times (``loader.media.expand_temporal``) gives the HF
    layout; one transposing copy straight from the frames into ``out``."""
    if frames.shape[0] != 1:
        raise ValueError(f"compact patches are for one still image, got {frames.shape[0]} frames")
    _, h, w, c = frames.shape
    shape = ((h // patch_size) * (w // patch_size), c * patch_size * patch_size)
    if out is None:
        out = np.empty(shape, dtype=np.uint8)
    elif out.shape != shape:
        raise ValueError(f"out has shape {out.shape}, expected {shape}")
    _spatial_patches(np.asarray(frames, dtype=np.uint8), patch_size, merge_size, out=out)
    return out


def qwen_patches_shape(frames_shape: tuple[int, ...], patch_size: int, tps: int) -> tuple[int, int]:
    """Shape ``(t*gh*gw, 3*tps*ps*ps)`` of ``qwen_patches`` for frames ``[T, H, W, 3]``."""
    t, h, w, c = frames_shape
    return -(-t // tps) * (h // patch_size) * (w // patch_size), c * tps * patch_size * patch_size


def qwen_patches(
    frames: np.ndarray,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    patch_size: int,
    merge_size: int,
    tps: int,
    *,
    pixel_dtype: str = "float32",
    out: np.ndarray | None = None,
) -> np.ndarray:
    """uint8 [T, H, W, 3] -> ``(t*gh*gw, 3*tps*ps*ps)`` in the Qwen-VL processors' layout.

    Frames are padded with the last one to a multiple of ``tps`` (an image becomes ``tps`` copies).
    Rows run over (t, h-block, w-block, merge-h, merge-w), so each ``merge**2`` consecutive rows form one
    LLM token; a row holds (channel, temporal, patch-h, patch-w).

    ``pixel_dtype="float32"``: rescaled and normalized with ``mean``/``std``, bit-identical to the HF
    processor output. ``"uint8"``: the raw pixel values in the same layout; the consumer applies
    ``(x/255 - mean) / std`` per channel (``omnipack.loader.media.normalize_pixels``, equally exact).
    ``out``: a C-contiguous array of that shape and dtype to write into (a slice of a batch buffer).
    """
    if pixel_dtype not in PIXEL_DTYPES:
        raise ValueError(f"pixel_dtype must be one of {PIXEL_DTYPES}, got {pixel_dtype!r}")
    dtype = np.float32 if pixel_dtype == "float32" else np.uint8
    t_in = frames.shape[0]
    u = _spatial_patches(np.asarray(frames, dtype=np.uint8), patch_size, merge_size)
    _, n, c, pp = u.shape
    gt = -(-t_in // tps)
    if out is None:
        out = np.empty((gt * n, c * tps * pp), dtype=dtype)
    elif out.shape != (gt * n, c * tps * pp) or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"out is {out.dtype} {out.shape}, expected C-contiguous {np.dtype(dtype)} {(gt * n, c * tps * pp)}")
    out5 = out.reshape(gt, n, c, tps, pp)
    # Source frame of each (temporal step, slot): the last frame repeats into the padding slots.
    src = np.minimum(np.arange(gt * tps), t_in - 1).reshape(gt, tps)
    for k in range(tps):
        # Each slot is written straight into the final layout (a strided view; the cast happens in the copy).
        idx = src[:, k]
        part = u[idx[0] :: tps] if _is_stride(idx, tps) else u[idx]
        np.copyto(out5[:, :, :, k], part, casting="unsafe")
    if pixel_dtype == "float32":
        normalize_hf_float32(out.reshape(gt * n, c, tps * pp), mean, std)
    return out


def _is_stride(idx: np.ndarray, step: int) -> bool:
    """Whether ``idx`` is ``idx[0], idx[0]+step, ...`` (then a slice view replaces a gather copy)."""
    return bool(np.array_equal(idx, idx[0] + step * np.arange(len(idx))))


def frame_group_timestamps(indices: tuple[int, ...], src_fps: float, tps: int) -> list[float]:
    """Qwen3-VL's per-group timestamp: mean time of the first and last frame of each temporal group."""
    ts = [i / src_fps for i in indices]
    return [(ts[i] + ts[i + tps - 1]) / 2 for i in range(0, len(ts), tps)]


MROPE_RULES = ("hf4", "hf5")
# How a video block with per-frame timestamps (Qwen3-VL) replaces the template's
# ``<|vision_start|><|video_pad|><|vision_end|>``: "hf5" replaces only ``<|video_pad|>`` (transformers 5.x
# ``replace_video_token``), so the template's own markers stay around the frame groups; "hf4" replaces the
# whole block (transformers 4.x).
VIDEO_LAYOUTS = ("hf4", "hf5")


class QwenVLProfile(ModelProfile):
    """Shared Qwen-VL image and video rules; subclasses set the family defaults.

    Options (constructor keywords): ``min_pixels``/``max_pixels`` (images), ``video_fps``,
    ``video_min_frames``, ``video_max_frames``, ``video_min_pixels``, ``video_max_pixels``,
    ``cap_pixels_per_frame``, ``preprocessor_config`` / ``video_preprocessor_config`` (local json or model
    dir), ``mrope_rule`` ("hf5": next text position after a block is ``p + max(h', w')`` as transformers
    5.x; "hf4": ``max(block) + 1`` as transformers 4.x and Megatron-Bridge's own ports) and
    ``tokens_per_second`` (Qwen2.5-VL's temporal position scale; the released configs use 2),
    ``video_layout`` (Qwen3-VL's timestamped video block, see ``VIDEO_LAYOUTS``; it follows ``mrope_rule``,
    so one setting picks the transformers major version, and a different explicit value is an error) and
    ``do_sample_frames`` (False: every decoded frame, as the Qwen2-VL video processor class does by
    default; omnipack's default samples at ``video_fps``, the qwen-vl-utils convention).

    ``processor_video_defaults`` are the HF processor class's own ``videos_kwargs`` defaults: the processor
    passes them to its video processor on every call, so they win over the video processor's class
    defaults and its ``video_preprocessor_config`` (but not over options given here).
    """

    default_image: ClassVar[VisionSettings]
    default_video: ClassVar[VideoSettings]
    video_sampler: ClassVar[str] = "qwen2"  # "qwen2" | "qwen3"
    per_frame_timestamps: ClassVar[bool] = False  # Qwen3-VL writes a block per temporal group
    template_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "image": ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"),
        "video": ("<|vision_start|>", "<|video_pad|>", "<|vision_end|>"),
    }
    image_pad: ClassVar[str] = "<|image_pad|>"
    video_pad: ClassVar[str] = "<|video_pad|>"
    vision_start: ClassVar[str] = "<|vision_start|>"
    vision_end: ClassVar[str] = "<|vision_end|>"
    # The image processor's normalisation (a preprocessor_config's image_mean / image_std override it).
    default_mean: ClassVar[tuple[float, ...]] = OPENAI_CLIP_MEAN
    default_std: ClassVar[tuple[float, ...]] = OPENAI_CLIP_STD
    # VideoSettings fields the HF processor class sets in its ``videos_kwargs`` (see the class docstring).
    processor_video_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(
        self,
        *,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        preprocessor_config: str | Path | None = None,
        video_preprocessor_config: str | Path | None = None,
        video_fps: float | None = None,
        video_min_frames: int | None = None,
        video_max_frames: int | None = None,
        video_min_pixels: int | None = None,
        video_max_pixels: int | None = None,
        cap_pixels_per_frame: bool | None = None,
        mrope_rule: str = "hf5",
        tokens_per_second: float = 2.0,
        video_layout: str | None = None,
        do_sample_frames: bool | None = None,
    ) -> None:
        pcfg = read_preprocessor_config(preprocessor_config)
        self.image_mean = tuple(float(x) for x in pcfg.get("image_mean", self.default_mean))
        self.image_std = tuple(float(x) for x in pcfg.get("image_std", self.default_std))
        self.image = self._image_settings_from(pcfg, min_pixels, max_pixels)
        vcfg = read_preprocessor_config(video_preprocessor_config, "video")
        self._check_video_normalization(vcfg)
        options = dict(
            fps=video_fps,
            min_frames=video_min_frames,
            max_frames=video_max_frames,
            min_pixels=video_min_pixels,
            max_pixels=video_max_pixels,
            cap_pixels_per_frame=cap_pixels_per_frame,
        )
        self.video = self._video_settings_from(vcfg, options, do_sample_frames)
        if self.video.min_pixels > self.video.max_pixels:
            raise ValueError(
                f"video_min_pixels {self.video.min_pixels} > video_max_pixels {self.video.max_pixels}"
            )
        if mrope_rule not in MROPE_RULES:
            raise ValueError(f"mrope_rule must be one of {MROPE_RULES}, got {mrope_rule!r}")
        self.mrope_rule = mrope_rule
        if video_layout is None:
            video_layout = mrope_rule
        if video_layout not in VIDEO_LAYOUTS:
            raise ValueError(f"video_layout must be one of {VIDEO_LAYOUTS}, got {video_layout!r}")
        if video_layout != mrope_rule:
            raise ValueError(
                f"video_layout={video_layout!r} with mrope_rule={mrope_rule!r} mixes transformers 4.x and 5.x "
                "conventions; set mrope_rule alone (video_layout follows it)"
            )
        self.video_layout = video_layout
        self.tokens_per_second = tokens_per_second

    def _image_settings_from(
        self, pcfg: dict[str, Any], min_pixels: int | None, max_pixels: int | None
    ) -> VisionSettings:
        """The image settings of a preprocessor config, with the pixel bounds given as options over it."""
        image = VisionSettings.from_preprocessor_config(pcfg, self.default_image)
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
        return image

    def _check_video_normalization(self, vcfg: dict[str, Any]) -> None:
        """Refuse a video processor config that normalizes otherwise than the image processor: the trainer half
        normalizes images and videos with one (mean, std) (the batch's ``pixel_mean`` / ``pixel_std``), so the
        videos would silently differ from the processor's. The released Qwen-VL checkpoints use one for both."""
        for key, image_value in (("image_mean", self.image_mean), ("image_std", self.image_std)):
            if key in vcfg and tuple(float(x) for x in vcfg[key]) != image_value:
                raise ValueError(
                    f"the video processor's {key} {list(vcfg[key])} differs from the image processor's "
                    f"{list(image_value)}; profile {self.name!r} normalizes videos and images alike (set the "
                    "video processor's image_mean / image_std to the image processor's, or use --profile hf)"
                )

    def _video_settings_from(
        self, vcfg: dict[str, Any], options: dict[str, Any], do_sample_frames: bool | None
    ) -> VideoSettings:
        """The video settings of a video preprocessor config, under the processor class's defaults and the
        options given (None: not given); ``do_sample_frames`` False keeps every frame."""
        overrides = {**self.processor_video_defaults, **{k: v for k, v in options.items() if v is not None}}
        video = VideoSettings.from_config(vcfg, self.default_video, **overrides)
        if do_sample_frames is False:
            if options["fps"] is not None:
                raise ValueError(
                    f"do_sample_frames=False uses every frame; it contradicts video_fps={options['fps']}"
                )
            video = replace(video, fps=None)
        elif do_sample_frames and video.fps is None:
            video = replace(video, fps=self.default_video.fps or 2.0)
        return video

    # ---- images ----

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

    # ---- video ----

    def sample_video_frames(self, total: int, src_fps: float) -> list[int]:
        """Indices of the sampled frames, before padding to the temporal patch."""
        if self.video_sampler == "qwen3":
            return sample_frames_qwen3(total, src_fps, self.video)
        return sample_frames_qwen2(total, src_fps, self.image.temporal_patch_size, self.video)

    def video_resize(self, num_frames: int, height: int, width: int) -> tuple[int, int]:
        """Per-frame target (h, w) for ``num_frames`` sampled (unpadded) frames."""
        v, s = self.video, self.image
        factor, tps = s.factor, s.temporal_patch_size
        if self.video_sampler == "qwen3":
            max_pixels = v.max_pixels
            if v.cap_pixels_per_frame:
                frame_cap = v.max_video_tokens * factor * factor
                per_frame = max(min(frame_cap, v.max_pixels // num_frames), int(v.min_pixels * 1.05))
                max_pixels = per_frame * num_frames
            # The processor raises below one temporal patch; a padded clip has tps frames, so budget for that.
            return smart_resize_3d(max(num_frames, tps), height, width, tps, factor, v.min_pixels, max_pixels)
        max_pixels = v.max_pixels
        if v.cap_pixels_per_frame:
            total_pixels = int(v.max_video_tokens * factor * factor * 0.9)
            max_pixels = max(min(max_pixels, total_pixels * tps // num_frames), int(v.min_pixels * 1.05))
        return smart_resize(height, width, factor, v.min_pixels, max_pixels)

    def plan_video(self, meta: MediaMeta) -> MediaPlan:
        if not meta.num_frames or meta.num_frames <= 0:
            raise MediaRejected("video has no frames")
        if not meta.fps or meta.fps <= 0:
            raise MediaRejected("video fps unknown or zero")
        if not meta.height or not meta.width:
            raise MediaRejected("video frame size unknown or zero")
        s = self.image
        tps = s.temporal_patch_size
        sampled = self.sample_video_frames(meta.num_frames, meta.fps)
        rh, rw = self.video_resize(len(sampled), meta.height, meta.width)
        indices = _pad_to_multiple(sampled, tps)
        grid = (len(indices) // tps, rh // s.patch_size, rw // s.patch_size)
        patches = grid[0] * grid[1] * grid[2]
        # The processor's sampled_fps (frames kept per second of source) and seconds per temporal step.
        sampled_fps = len(sampled) / meta.num_frames * meta.fps
        info: dict[str, Any] = {
            "src_fps": meta.fps,
            "num_sampled_frames": len(sampled),
            "second_per_grid": tps / sampled_fps,
        }
        if self.per_frame_timestamps:
            info["timestamps"] = frame_group_timestamps(indices, meta.fps, tps)
        return MediaPlan(
            kind="video",
            num_tokens=patches // s.merge_size**2,
            grid_thw=grid,
            target_hw=(rh, rw),
            frame_indices=indices,
            vision_patches=patches,
            info=info,
        )

    # ---- expansion ----

    def expand(self, plan: MediaPlan) -> list[Segment]:
        if plan.kind == "image":
            return [
                Segment(token=self.vision_start),
                Segment(token=self.image_pad, count=plan.num_tokens, placeholder=True),
                Segment(token=self.vision_end),
            ]
        if plan.kind == "video":
            if not self.per_frame_timestamps:
                return [
                    Segment(token=self.vision_start),
                    Segment(token=self.video_pad, count=plan.num_tokens, placeholder=True),
                    Segment(token=self.vision_end),
                ]
            assert plan.grid_thw is not None
            t, gh, gw = plan.grid_thw
            per_frame = gh * gw // self.image.merge_size**2
            segs: list[Segment] = []
            for ts in plan.info["timestamps"]:
                segs += [
                    Segment(text=f"<{ts:.1f} seconds>"),
                    Segment(token=self.vision_start),
                    Segment(token=self.video_pad, count=per_frame, placeholder=True),
                    Segment(token=self.vision_end),
                ]
            if self.video_layout == "hf5":  # the template's own markers stay around the frame groups
                segs = [Segment(token=self.vision_start), *segs, Segment(token=self.vision_end)]
            return segs
        raise MediaRejected(f"profile {self.name} cannot expand {plan.kind}")

    # ---- mRoPE ----

    def vision_runs(self, input_ids: np.ndarray, span: MediaSpan) -> list[tuple[int, int, int, int, float]]:
        """(start, t, h', w', interval) of each vision grid run of a block; placeholders are contiguous."""
        plan = span.plan
        assert plan.grid_thw is not None
        t, gh, gw = plan.grid_thw
        m = self.image.merge_size
        if plan.kind == "video" and self.per_frame_timestamps:
            # One [1, h, w] run per temporal group, each starting at a run of the placeholder id.
            pad_id = input_ids[span.placeholder_start]
            per = gh * gw // m**2
            runs, i = [], span.placeholder_start
            while i < span.end and len(runs) < t:
                if input_ids[i] == pad_id:
                    runs.append((i, 1, gh // m, gw // m, 1.0))
                    i += per
                else:
                    i += 1
            if len(runs) != t:
                raise ValueError(f"found {len(runs)} frame groups in a video block, expected {t}")
            return runs
        interval = 1.0
        if plan.kind == "video":
            interval = self.video_time_interval(plan)
        return [(span.placeholder_start, t, gh // m, gw // m, interval)]

    def video_time_interval(self, plan: MediaPlan) -> float:
        """Temporal position step per grid step: Qwen2.5-VL ``tokens_per_second * second_per_grid``."""
        # float32 as the model computes it (second_per_grid_ts is a float32 tensor).
        return float(np.float32(self.tokens_per_second) * np.float32(plan.info["second_per_grid"]))

    def mrope_position_ids(self, input_ids: Any, spans: list[MediaSpan]) -> np.ndarray:
        """int32 [3, L] positions of one sample: text runs count up, vision grids get (T, H, W) offsets.

        After a grid, the next text position is ``p + max(h', w')`` (hf5) or ``max(grid) + 1`` (hf4).
        """
        ids = np.asarray(input_ids)
        n = ids.shape[0]
        runs = sorted(
            r for sp in spans if sp.plan.kind in ("image", "video") for r in self.vision_runs(ids, sp)
        )
        out = np.empty((3, n), dtype=np.int64)
        i, p = 0, 0
        for start, t, h, w, interval in runs:
            k = start - i
            out[:, i:start] = np.arange(k) + p
            p += k
            tt = (np.arange(t, dtype=np.float32) * np.float32(interval)).astype(np.int64)
            grid = np.stack(np.meshgrid(tt, np.arange(h), np.arange(w), indexing="ij")).reshape(3, -1) + p
            out[:, start : start + t * h * w] = grid
            p = int(grid.max()) + 1 if self.mrope_rule == "hf4" else p + max(h, w)
            i = start + t * h * w
        out[:, i:] = np.arange(n - i) + p
        return out.astype(np.int32)

    def settings(self) -> dict[str, Any]:
        return {
            "image": self.image.__dict__,
            "video": self.video.__dict__,
            "video_sampler": self.video_sampler,
            "mrope_rule": self.mrope_rule,
            "video_layout": self.video_layout,
            "tokens_per_second": self.tokens_per_second,
            "normalize": {"mean": list(self.image_mean), "std": list(self.image_std)},
        }

    # ---- training cost model (profiles.cost): new methods ----

    # Vision attention layout: every layer attends over a whole frame unless ``vision_window_layers``
    # of them attend in windows of ``vision_window_px`` pixels (Qwen2.5-VL); ``vision_mergers`` counts
    # the patch mergers (Qwen3-VL's deepstack adds one per tapped layer).
    vision_window_layers: ClassVar[int] = 0
    vision_window_px: ClassVar[int] = 112
    vision_mergers: ClassVar[int] = 1

    def media_cost(self, plan: MediaPlan, shapes: dict[str, TransformerShape]) -> float:
        """Vision tower FLOPs of an image or video: patch embedding, the transformer over every patch
        (attention within each frame group, or within windows on the windowed layers), the mergers."""
        if plan.kind not in ("image", "video") or plan.grid_thw is None:
            return super().media_cost(plan, shapes)
        vision, lm = shapes["vision"], shapes["lm"]
        s = self.image
        t, gh, gw = plan.grid_thw
        patches = t * gh * gw
        per_frame = gh * gw
        full_layers = vision.layers - self.vision_window_layers
        window = windowed_pairs(gh, gw, s.merge_size, max(1, self.vision_window_px // s.factor))
        pair_flops = 4.0 * vision.heads * vision.dim_head
        attention = (
            pair_flops * t * (full_layers * per_frame * per_frame + self.vision_window_layers * window)
        )
        embed = 2.0 * 3 * s.temporal_patch_size * s.patch_size**2 * vision.hidden
        merged_in = vision.hidden * s.merge_size**2
        merger = 2.0 * (merged_in * merged_in + merged_in * lm.hidden) * self.vision_mergers
        return patches * (vision.token_flops() + embed) + attention + patches // s.merge_size**2 * merger


# Encoder inputs of a Qwen-VL image / video batch (HF forward argument names); a family adds its
# per-video time input (``second_per_grid_key``) when it has one.
VISION_BATCH_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")


class QwenVLInputs(EncoderInputs):
    """Trainer half of the Qwen-VL families: stored frames -> pixel patches and grids in the HF layout.

    Built from the recorded settings ``image`` (patch, merge, temporal patch) and ``normalize``
    (mean / std). Subclasses set ``name`` and ``second_per_grid_key``.
    """

    placeholder_tokens: ClassVar[dict[str, tuple[str, ...]]] = {
        "image": ("<|image_pad|>",),
        "video": ("<|video_pad|>",),
    }
    pixel_keys: ClassVar[tuple[str, ...]] = ("pixel_values", "pixel_values_videos")
    batch_keys: ClassVar[tuple[str, ...]] = VISION_BATCH_KEYS
    # Name of the per-video seconds-per-temporal-step input of the model forward (None: not an input).
    second_per_grid_key: ClassVar[str | None] = "second_per_grid_ts"

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.image = VisionSettings(**settings["image"])
        self.image_mean = tuple(float(x) for x in settings["normalize"]["mean"])
        self.image_std = tuple(float(x) for x in settings["normalize"]["std"])

    def stored_grid(self, frames: np.ndarray) -> tuple[int, int, int]:
        """(t, gh, gw) of stored frames [T, H, W, 3]; sides must be multiples of patch * merge."""
        s = self.image
        t, h, w = frames.shape[:3]
        if h % s.factor or w % s.factor:
            raise ValueError(f"stored frame size {h}x{w} is not a multiple of {s.factor} (patch * merge)")
        return -(-t // s.temporal_patch_size), h // s.patch_size, w // s.patch_size

    def vision_feature_count(self, frames: np.ndarray) -> int:
        t, gh, gw = self.stored_grid(frames)
        return t * gh * gw // self.image.merge_size**2

    def feature_count(self, item: Any, payload: Payload) -> int:
        kind = item_kind(item)
        if kind not in ("image", "video"):
            return super().feature_count(item, payload)
        frames = payload_frames(payload)
        if kind == "image" and frames.shape[0] != 1:
            raise ValueError(f"image payload holds {frames.shape[0]} frames")
        return self.vision_feature_count(frames)

    def pixel_normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        return self.image_mean, self.image_std

    def pixel_repeats(self, pixel_dtype: str) -> dict[str, int]:
        # A still image fills every temporal slot of its patches with the same frame.
        tps = self.image.temporal_patch_size
        return {"pixel_values": tps} if pixel_dtype == "uint8" and tps > 1 else {}

    def unpatched_pixels(self, pixel_dtype: str) -> dict[str, tuple[str, int, int, int]]:
        # Still images one frame (patchified: the compact layout, repeated as ``pixel_repeats`` says),
        # videos whole temporal patches.
        if pixel_dtype != "uint8":
            return {}
        s = self.image
        return {
            "pixel_values": ("image_grid_thw", s.patch_size, s.merge_size, 1),
            "pixel_values_videos": ("video_grid_thw", s.patch_size, s.merge_size, s.temporal_patch_size),
        }

    def vision_inputs(
        self, kind: str, item: Any, frames: np.ndarray, options: MediaInputOptions
    ) -> dict[str, Any]:
        """Patches and grid of stored frames; ``options.deferred``: patches as ``PendingRows`` that
        ``collate_media`` writes straight into the batch tensor (built once, never concatenated again).
        ``options.compact`` (with uint8): image patches hold their temporal slot once (``pixel_repeats``).
        ``options.unpatched`` (with uint8): the stored frames in the patches' place, one copy of their
        bytes (``unpatched_pixels``); a still image is held once, so patchified it is the compact layout."""
        pixel_dtype, deferred = options.pixel_dtype, options.deferred
        s = self.image
        grid = np.asarray([self.stored_grid(frames)], dtype=np.int64)
        if options.unpatched and pixel_dtype == "uint8":
            return self._unpatched_inputs(kind, item, frames, grid, deferred)
        if options.compact and kind == "image" and self.pixel_repeats(pixel_dtype):
            build_compact = functools.partial(qwen_image_patches_compact, frames, s.patch_size, s.merge_size)
            if deferred:
                _, h, w, c = frames.shape
                shape = ((h // s.patch_size) * (w // s.patch_size), c * s.patch_size**2)
                return {
                    "pixel_values": PendingRows(shape, np.dtype(np.uint8), lambda out: build_compact(out=out)),
                    "image_grid_thw": grid,
                }
            return {"pixel_values": build_compact(), "image_grid_thw": grid}
        build = functools.partial(
            qwen_patches,
            frames,
            self.image_mean,
            self.image_std,
            s.patch_size,
            s.merge_size,
            s.temporal_patch_size,
            pixel_dtype=pixel_dtype,
        )
        if deferred:
            shape = qwen_patches_shape(frames.shape, s.patch_size, s.temporal_patch_size)
            dtype = np.dtype(np.float32 if pixel_dtype == "float32" else np.uint8)
            patches: Any = PendingRows(shape, dtype, lambda out: build(out=out))
        else:
            patches = build()
        if kind == "image":
            return {"pixel_values": patches, "image_grid_thw": grid}
        out = {"pixel_values_videos": patches, "video_grid_thw": grid}
        spg = item_info(item).get("info", {}).get("second_per_grid")
        if self.second_per_grid_key and spg is not None:
            out[self.second_per_grid_key] = np.asarray([spg], dtype=np.float32)
        return out


    def _unpatched_inputs(
        self, kind: str, item: Any, frames: np.ndarray, grid: np.ndarray, deferred: bool
    ) -> dict[str, Any]:
        """``vision_inputs`` under ``options.unpatched``: the frames as stored in the rows of their patches
        (videos padded with their last frame to whole temporal patches, as ``qwen_patches`` pads)."""
        key = "pixel_values" if kind == "image" else "pixel_values_videos"
        grid_key, ps, _, per_step = self.unpatched_pixels("uint8")[key]
        t, gh, gw = (int(v) for v in grid[0])
        shape = (t * gh * gw, frames.shape[-1] * per_step * ps * ps)

        def fill(out: np.ndarray) -> np.ndarray:
            held = out.reshape(t * per_step, *frames.shape[1:])
            n = min(frames.shape[0], len(held))
            np.copyto(held[:n], frames[:n])
            held[n:] = frames[n - 1]
            return out

        pixels: Any = PendingRows(shape, np.dtype(np.uint8), fill)
        if not deferred:
            pixels = fill(np.empty(shape, np.uint8))
        out = {key: pixels, grid_key: grid}
        spg = item_info(item).get("info", {}).get("second_per_grid") if kind == "video" else None
        if self.second_per_grid_key and spg is not None:
            out[self.second_per_grid_key] = np.asarray([spg], dtype=np.float32)
        return out

    def media_inputs(self, item: Any, payload: Payload, options: MediaInputOptions) -> dict[str, Any]:
        kind = item_kind(item)
        if kind not in ("image", "video"):
            return super().media_inputs(item, payload, options)
        return self.vision_inputs(kind, item, payload_frames(payload), options)

