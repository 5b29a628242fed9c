"""Nemotron Omni (Nemotron-H + RADIO vision + Parakeet sound), as Megatron-Bridge consumes it.

Images use RADIO's dynamic resolution: the patch grid (patch 16) stays close to the image's own grid,
scaled into ``[min_num_patches, budget]`` and made even on both sides; a 2x2 pixel shuffle then turns
every 4 patches into one token. Videos follow Bridge's temporal path: frames resized to a fixed square,
two frames per tubelet. Audio follows Parakeet: ``n // 160`` valid mel frames, three stride-2 convs.

Where Bridge and the HF processor disagree, the consumer (Bridge) wins; the choice is a named option:
``audio_count_rule`` ("bridge": ``max(1, h(h(h(n // 160))))`` after 30 s truncation; "hf": the HF
processor's estimate from ``1 + n // 160`` on the whole clip, no truncation) and ``video_path`` ("bridge_temporal": fixed 512x512 frames).
No mRoPE: the LLM uses ordinary 1-D positions.

Trainer side (``media_inputs`` / ``collate_media``) emits the HF ``NemotronH_Omni_Reasoning_V3`` forward
arguments (transformers 5.24): ``pixel_values`` + ``image_grid_hw`` (images), ``pixel_values_videos``
(tubelets), ``input_features`` + ``input_features_mask`` (Parakeet mel). ``bridge_media_inputs`` renames
a collated batch to what Megatron-Bridge's ``nemotron_omni_collate_fn`` hands its model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..media.audio import audio_samples_at
from ..media.audio_storage import AUDIO_LOADING
from ..media.errors import MediaRejected
from ..media.meta import MediaMeta
from .audio_features import parakeet_log_mel
from .base import MediaPlan, ModelProfile, Segment
from .cost import TransformerShape, blocks_pairs, encoder_flops
from .hf_config import read_preprocessor_config
from .model_inputs import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    EncoderInputs,
    MediaInputOptions,
    Payload,
    audio_waveform,
    item_kind,
    normalize_lut,
    payload_audio,
    payload_frames,
)

AUDIO_RATE = 16000
HOP_LENGTH = 160
AUDIO_COUNT_RULES = ("bridge", "hf")
# Waveform cap (seconds) of each audio rule: Bridge truncates clips to 30 s; the HF processor keeps them whole.
RULE_MAX_AUDIO_SECONDS: dict[str, float | None] = {"bridge": 30.0, "hf": None}


def patch_grid(
    height: int, width: int, patch_size: int, merge: int, min_patches: int, max_patches: int
) -> tuple[int, int]:
    """RADIO dynamic-resolution patch grid (gh, gw) of an image, both sides multiples of ``merge``.

    Starts from ``floor(side/patch) + 1`` (the side itself when it divides evenly), scales down with
    ``floor(sqrt(budget/area) * side)`` to fit, up with ``ceil`` to reach ``min_patches``, then rounds each
    side to a multiple of ``merge``, upward only while the area stays within budget.
    """
    gh = round(height / patch_size + 0.5)  # round(x + .5) is floor(x) + 1, or x when x is an integer
    gw = round(width / patch_size + 0.5)
    scale = min(math.sqrt(max_patches / (gh * gw)), 1.0)
    gh, gw = math.floor(scale * gh), math.floor(scale * gw)
    if max_patches > min_patches and gh * gw < min_patches:
        scale = math.sqrt(min_patches / (gh * gw))
        gh, gw = math.ceil(scale * gh), math.ceil(scale * gw)
    if r := gh % merge:
        gh = gh + merge - r if (gh + merge - r) * gw <= max_patches else max(merge, gh - r)
    if r := gw % merge:
        gw = gw + merge - r if gh * (gw + merge - r) <= max_patches else max(merge, gw - r)
    return gh, gw


def _half(x: int) -> int:
    """One Parakeet subsampling conv (kernel 3, stride 2, padding 1)."""
    return (x - 1) // 2 + 1


def parakeet_tokens(mel_frames: int, stages: int = 3) -> int:
    """Sound-encoder output length for ``mel_frames`` valid mel frames (subsampling ``2**stages``)."""
    x = mel_frames
    for _ in range(stages):
        x = _half(x)
    return x


def audio_tokens(num_samples_16k: int, rule: str) -> int:
    """Sound tokens of a 16 kHz clip under an ``AUDIO_COUNT_RULES`` rule (see the module docstring)."""
    if rule == "hf":
        return max(1, parakeet_tokens(1 + num_samples_16k // HOP_LENGTH))
    return max(1, parakeet_tokens(num_samples_16k // HOP_LENGTH))


def radio_patches(frames: np.ndarray, lut: np.ndarray, patch_size: int) -> np.ndarray:
    """uint8 [T, H, W, 3] -> float32 ``(T*gh*gw, 3*ps*ps)``: HF ``convert_image_to_patches`` layout.

    Rows run over (frame, patch row, patch col) in row-major order; a row holds (channel, ph, pw).
    ``lut`` (``normalize_lut``) does rescale and normalize in one lookup.
    """
    t, h, w, c = frames.shape
    if h % patch_size or w % patch_size:
        raise ValueError(f"frame size {h}x{w} is not a multiple of patch {patch_size}")
    gh, gw = h // patch_size, w // patch_size
    x = np.stack([lut[ch][frames[..., ch]] for ch in range(c)], axis=1)  # [T, C, H, W]
    x = x.reshape(t, c, gh, patch_size, gw, patch_size).transpose(0, 2, 4, 1, 3, 5)
    return np.ascontiguousarray(x).reshape(t * gh * gw, c * patch_size * patch_size)


def radio_tubelets(frames: np.ndarray, lut: np.ndarray, tps: int) -> np.ndarray:
    """uint8 [T, H, W, 3] -> float32 ``(ceil(T/tps), tps*3, H, W)``: the HF video processor's tubelets.

    An incomplete last tubelet is filled with the last frame (as the processor and MCore do); channels of
    a tubelet run frame-major (frame 0's RGB, then frame 1's).
    """
    if pad := -len(frames) % tps:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
    t, h, w, c = frames.shape
    x = np.stack([lut[ch][frames[..., ch]] for ch in range(c)], axis=1)  # [T, C, H, W]
    return np.ascontiguousarray(x.reshape(t // tps, tps * c, h, w))


def parakeet_features(stored: np.ndarray, num_mel_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """One clip alone -> (float32 [n // 160 + 1, bins], bool [n // 160 + 1]) as
    ``ParakeetFeatureExtractor(feature_size=num_mel_bins)`` returns them, computed without transformers.

    A zeroed boundary frame follows the ``n // 160`` valid ones (the mask marks them). A clip runs alone
    because its mel normalisation statistics are per clip.
    """
    return parakeet_log_mel(audio_waveform(stored), num_mels=num_mel_bins, sample_rate=AUDIO_RATE)


class NemotronOmniInputs(EncoderInputs):
    """Trainer half: the HF ``NemotronH_Omni_Reasoning_V3`` forward inputs (see the module docstring),
    built from the recorded ``patch_size``, ``pixel_shuffle``, ``image_mean``/``image_std``,
    ``num_mel_bins`` and ``audio_count_rule``; Parakeet features in torch (no transformers)."""

    name = "nemotron_omni"
    # Video tubelets reuse the image token (each tubelet is an <image> run after its frame text).
    placeholder_tokens: ClassVar[dict[str, tuple[str, ...]]] = {
        "image": ("<image>",),
        "video": ("<image>",),
        "audio": ("<so_embedding>",),
    }
    batch_keys = ("pixel_values", "image_grid_hw", "pixel_values_videos", "input_features", "input_features_mask")
    temporal_patch: ClassVar[int] = 2  # frames per tubelet

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.patch_size = int(settings["patch_size"])
        self.merge = int(settings["pixel_shuffle"])
        self.image_mean = tuple(float(x) for x in settings["image_mean"])
        self.image_std = tuple(float(x) for x in settings["image_std"])
        self.num_mel_bins = int(settings["num_mel_bins"])
        self.audio_count_rule = str(settings["audio_count_rule"])
        if self.audio_count_rule not in AUDIO_COUNT_RULES:
            raise ValueError(f"audio_count_rule must be one of {AUDIO_COUNT_RULES}, got {self.audio_count_rule!r}")

    def feature_count(self, item: Any, payload: Payload) -> int:
        """Image: pixel-shuffled patches ``(H/16)*(W/16)/4``; video: ``ceil(T/2)`` tubelets of the same;
        audio: the configured Parakeet rule on the stored sample count."""
        kind = item_kind(item)
        if kind == "audio":
            return audio_tokens(int(payload_audio(payload).shape[0]), self.audio_count_rule)
        frames = payload_frames(payload)
        unit = self.patch_size * self.merge
        t, h, w = frames.shape[:3]
        if h % unit or w % unit:
            raise ValueError(f"stored frame size {h}x{w} is not a multiple of {unit} (patch * pixel shuffle)")
        per_frame = (h // self.patch_size) * (w // self.patch_size) // self.merge**2
        if kind == "image":
            return per_frame
        return -(-t // self.temporal_patch) * per_frame

    def _lut(self) -> np.ndarray:
        lut = getattr(self, "_lut_cache", None)
        if lut is None:
            lut = self._lut_cache = normalize_lut(self.image_mean, self.image_std)
        return lut

    def media_inputs(self, item: Any, payload: Payload, options: MediaInputOptions) -> dict[str, np.ndarray]:
        """One item's HF forward inputs (numpy), with a leading item axis the collate joins on; float32
        pixels only (no uint8 path: RADIO's inputs are built normalized), never deferred or compact.

        Image: ``pixel_values`` float32 [gh*gw, 3*16*16] (the stored image is already at the planned size,
        so this is the image processor's output without its resize) and ``image_grid_hw`` int64 [1, 2].
        Video: ``pixel_values_videos`` float32 [1, tubelets, 2*3, H, W] (Bridge's fixed square frames).
        Audio: ``input_features`` float32 [1, n//160 + 1, num_mel_bins] and ``input_features_mask`` bool
        [1, n//160 + 1] from ``ParakeetFeatureExtractor`` on the clip alone.
        """
        if options.pixel_dtype != "float32":
            raise ValueError(f"profile {self.name} gives float32 pixels only, not {options.pixel_dtype}")
        kind = item_kind(item)
        if kind == "audio":
            feats, mask = parakeet_features(payload_audio(payload), self.num_mel_bins)
            return {"input_features": feats[None], "input_features_mask": mask[None]}
        frames = payload_frames(payload)
        self.feature_count(item, payload)  # rejects sizes the pixel shuffle cannot take
        if kind == "image":
            if len(frames) != 1:
                raise ValueError(f"image payload holds {len(frames)} frames")
            h, w = frames.shape[1:3]
            grid = np.asarray([[h // self.patch_size, w // self.patch_size]], dtype=np.int64)
            return {
                "pixel_values": radio_patches(frames, self._lut(), self.patch_size),
                "image_grid_hw": grid,
            }
        if kind == "video":
            return {"pixel_values_videos": radio_tubelets(frames, self._lut(), self.temporal_patch)[None]}
        return super().media_inputs(item, payload, options)

    def collate_media(self, per_item: list[dict[str, Any]], options: MediaInputOptions) -> dict[str, Any]:
        """Items' inputs (placeholder order) -> HF batch tensors.

        ``pixel_values`` [patches, 768] and ``image_grid_hw`` [n_images, 2] are concatenated. Videos become
        one ``pixel_values_videos`` [1, total tubelets, 6, H, W]: HF stacks videos only when their tubelet
        counts agree, and since the tower encodes tubelets independently and the forward concatenates the
        video embeddings in order, one joined "video" gives the same embeddings (not with EVS pruning,
        ``video_pruning_rate > 0``, which works per video). Mel features are right-padded to the longest
        clip: ``input_features`` [clips, frames, bins], ``input_features_mask`` bool [clips, frames].
        """
        import torch

        out: dict[str, Any] = {}
        images = [d for d in per_item if "pixel_values" in d]
        if images:
            out["pixel_values"] = torch.from_numpy(np.concatenate([d["pixel_values"] for d in images]))
            out["image_grid_hw"] = torch.from_numpy(np.concatenate([d["image_grid_hw"] for d in images]))
        videos = [d["pixel_values_videos"] for d in per_item if "pixel_values_videos" in d]
        if videos:
            if len({v.shape[2:] for v in videos}) > 1:
                raise ValueError(f"videos of one batch differ in tubelet shape: {[v.shape for v in videos]}")
            out["pixel_values_videos"] = torch.from_numpy(np.concatenate(videos, axis=1))
        clips = [d for d in per_item if "input_features" in d]
        if clips:
            frames = max(d["input_features"].shape[1] for d in clips)
            x = np.zeros((len(clips), frames, self.num_mel_bins), dtype=np.float32)
            mask = np.zeros((len(clips), frames), dtype=bool)
            for i, d in enumerate(clips):
                n = d["input_features"].shape[1]
                x[i, :n] = d["input_features"][0]
                mask[i, :n] = d["input_features_mask"][0]
            out["input_features"] = torch.from_numpy(x)
            out["input_features_mask"] = torch.from_numpy(mask)
        return out

    def bridge_media_inputs(self, media: dict[str, Any]) -> dict[str, Any]:
        """A collated batch under Megatron-Bridge ``nemotron_omni_collate_fn`` names (torch tensors).

        Dynamic images: ``pixel_values`` [1, patches, 768], ``imgs_sizes`` (pixels), ``num_frames`` (ones),
        ``num_image_tiles`` (tokens per image). Temporal video: ``pixel_values`` [1, frames*patches, 768]
        per frame (tubelets unpacked; the padding frame of an odd count is kept, which MCore would add
        anyway), ``imgs_sizes`` per frame, ``num_frames`` (all videos' frames as one item, as collated).
        Audio: ``sound_clips`` [clips, frames, bins], ``sound_length`` (valid mel frames). Bridge batches
        either images or videos (its temporal path also squares images), so a batch with both is refused.
        The trainer casts pixels to bf16.
        """
        import torch

        if "pixel_values" in media and "pixel_values_videos" in media:
            raise ValueError(
                "Bridge's Omni collation does not mix dynamic-resolution images and temporal video"
            )
        out: dict[str, Any] = {}
        ps, m = self.patch_size, self.merge
        if "pixel_values" in media:
            grid = media["image_grid_hw"].to(torch.long)
            out["pixel_values"] = media["pixel_values"].unsqueeze(0)
            out["imgs_sizes"] = grid * ps
            out["num_frames"] = torch.ones(len(grid), dtype=torch.long)
            out["num_image_tiles"] = (grid.prod(-1) // m**2).to(torch.int)
        if "pixel_values_videos" in media:
            v = media["pixel_values_videos"]
            _, n, tc, h, w = v.shape
            frames = v.reshape(n * self.temporal_patch, tc // self.temporal_patch, h, w)
            patches = frames.reshape(-1, 3, h // ps, ps, w // ps, ps).permute(0, 2, 4, 1, 3, 5)
            out["pixel_values"] = patches.reshape(1, -1, 3 * ps * ps)
            out["imgs_sizes"] = torch.tensor([[h, w]] * len(frames), dtype=torch.long)
            out["num_frames"] = torch.tensor([len(frames)], dtype=torch.long)
        if "input_features" in media:
            out["sound_clips"] = media["input_features"]
            out["sound_length"] = media["input_features_mask"].sum(-1).to(torch.long)
        return out


class NemotronOmniProfile(ModelProfile):
    """Nemotron Omni inputs for Megatron-Bridge.

    Options: ``max_model_len`` / ``min_num_patches`` / ``max_num_patches`` (image budget, per image:
    ``clamp((max_model_len - 4) * 4, min, max)`` since each image is processed alone), ``patch_size``,
    ``video_frame_size`` (Bridge's ``VISION_FRAME_SIZE``, 512), ``video_fps`` / ``video_max_frames``
    (omnipack's frame sampling; Bridge receives sampled frames), ``audio_count_rule`` ("bridge" | "hf"),
    ``max_audio_seconds`` (longer clips are truncated; default "rule": 30 s under "bridge", as Bridge
    truncates, and no cap under "hf", as the HF processor; a number or None overrides), ``num_mel_bins`` (Parakeet
    mel bins; Bridge's default 128), ``preprocessor_config`` (also ``image_mean``/``norm_mean`` and
    ``image_std``/``norm_std``; RADIO uses the OpenAI CLIP statistics by default).
    """

    name = "nemotron_omni"
    model_types = ("nemotron_h_omni",)
    inputs_class = NemotronOmniInputs
    turn_end = "<|im_end|>"
    template_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "image": ("<image>",),
        "video": ("<video>",),
        "audio": ("<so_embedding>",),
    }
    expansion_tokens: ClassVar[tuple[str, ...]] = ("<img>", "</img>", "<so_start>", "<so_end>")
    image_start: ClassVar[str] = "<img>"
    image_end: ClassVar[str] = "</img>"
    image_token: ClassVar[str] = "<image>"
    audio_start: ClassVar[str] = "<so_start>"
    audio_end: ClassVar[str] = "<so_end>"
    audio_token: ClassVar[str] = "<so_embedding>"
    video_path: ClassVar[str] = (
        "bridge_temporal"  # HF's video processor picks an aspect-preserving grid instead
    )
    temporal_patch: ClassVar[int] = 2  # frames per tubelet

    def __init__(
        self,
        *,
        max_model_len: int = 16384,
        min_num_patches: int = 1024,
        max_num_patches: int = 13312,
        patch_size: int = 16,
        downsample_ratio: float = 0.5,
        video_frame_size: int = 512,
        video_fps: float = 2.0,
        video_max_frames: int = 128,
        audio_count_rule: str = "bridge",
        max_audio_seconds: float | str | None = "rule",
        num_mel_bins: int = 128,
        preprocessor_config: str | Path | None = None,
    ) -> None:
        cfg = read_preprocessor_config(preprocessor_config)
        # Released checkpoints name the statistics norm_mean/norm_std (the HF processor accepts both).
        self.image_mean = tuple(
            float(x) for x in cfg.get("image_mean", cfg.get("norm_mean", OPENAI_CLIP_MEAN))
        )
        self.image_std = tuple(float(x) for x in cfg.get("image_std", cfg.get("norm_std", OPENAI_CLIP_STD)))
        self.num_mel_bins = int(num_mel_bins)
        self.patch_size = int(cfg.get("patch_size", patch_size))
        self.merge = round(1 / float(cfg.get("downsample_ratio", downsample_ratio)))
        self.min_num_patches = int(cfg.get("min_num_patches", min_num_patches))
        self.max_num_patches = int(cfg.get("max_num_patches", max_num_patches))
        self.max_model_len = int(cfg.get("max_model_len", max_model_len))
        if audio_count_rule not in AUDIO_COUNT_RULES:
            raise ValueError(f"audio_count_rule must be one of {AUDIO_COUNT_RULES}, got {audio_count_rule!r}")
        if video_frame_size % (self.patch_size * self.merge):
            raise ValueError(
                f"video_frame_size {video_frame_size} is not a multiple of {self.patch_size * self.merge}"
            )
        self.video_frame_size = video_frame_size
        self.video_fps = video_fps
        self.video_max_frames = video_max_frames
        self.audio_count_rule = audio_count_rule
        if max_audio_seconds == "rule":
            max_audio_seconds = RULE_MAX_AUDIO_SECONDS[audio_count_rule]
        elif isinstance(max_audio_seconds, str):
            raise ValueError(f'max_audio_seconds must be a number, None or "rule", got {max_audio_seconds!r}')
        self.max_audio_seconds = max_audio_seconds

    # ---- images ----

    def image_budget(self, images_per_call: int = 1) -> int:
        """Patch budget per image: the processor clamps the context length (in patches) to [min, max]."""
        n = max((self.max_model_len - 4) * self.merge**2, self.min_num_patches * images_per_call)
        if self.max_num_patches:
            n = min(n, self.max_num_patches)
        return max(n, self.min_num_patches)

    def plan_image(self, meta: MediaMeta) -> MediaPlan:
        if not meta.height or not meta.width:
            raise MediaRejected("image size unknown or zero")
        gh, gw = patch_grid(
            meta.height, meta.width, self.patch_size, self.merge, self.min_num_patches, self.image_budget()
        )
        patches = gh * gw
        return MediaPlan(
            kind="image",
            num_tokens=patches // self.merge**2,
            grid_thw=(1, gh, gw),
            target_hw=(gh * self.patch_size, gw * self.patch_size),
            vision_patches=patches,
        )

    # ---- video ----

    def sample_video_frames(self, total: int, src_fps: float) -> list[int]:
        """``n = clamp(floor(duration * video_fps), 1, min(video_max_frames, total))`` uniform frames."""
        n = min(max(math.floor(total / src_fps * self.video_fps), 1), self.video_max_frames, total)
        return [int(i) for i in np.linspace(0, total - 1, n).round().astype(int)]

    def plan_video(self, meta: MediaMeta) -> MediaPlan:
        if not meta.num_frames or meta.num_frames <= 0:
            raise MediaRejected("video has no frames")
        if not meta.fps or meta.fps <= 0:
            raise MediaRejected("video fps unknown or zero")
        sampled = self.sample_video_frames(meta.num_frames, meta.fps)
        # A lone frame is duplicated and an odd count padded with the last frame: every tubelet has 2 frames.
        padded = sampled + [sampled[-1]] * (-len(sampled) % self.temporal_patch)
        tubelets = len(padded) // self.temporal_patch
        side = self.video_frame_size // self.patch_size
        per_tubelet = side * side // self.merge**2
        frame_ms = int(1000.0 / meta.fps)
        return MediaPlan(
            kind="video",
            num_tokens=tubelets * per_tubelet,
            grid_thw=(tubelets, side, side),
            target_hw=(self.video_frame_size, self.video_frame_size),
            frame_indices=tuple(padded),
            vision_patches=len(padded) * side * side,
            info={
                "src_fps": meta.fps,
                "num_sampled_frames": len(sampled),
                "tokens_per_tubelet": per_tubelet,
                # the processor's label time: source index * whole milliseconds per frame
                "timestamps": [i * frame_ms / 1000.0 for i in sampled],
            },
        )

    # ---- audio ----

    def audio_tokens(self, num_samples_16k: int) -> int:
        return audio_tokens(num_samples_16k, self.audio_count_rule)

    def plan_audio(self, meta: MediaMeta) -> MediaPlan:
        n = audio_samples_at(meta, AUDIO_RATE)
        truncated = False
        if self.max_audio_seconds is not None and n > int(self.max_audio_seconds * AUDIO_RATE):
            n, truncated = int(self.max_audio_seconds * AUDIO_RATE), True
        return MediaPlan(
            kind="audio",
            num_tokens=self.audio_tokens(n),
            sample_rate=AUDIO_RATE,
            num_audio_samples=n,
            audio_frames=n // HOP_LENGTH,
            truncate=truncated,  # the writer cuts the decoded clip to ``num_audio_samples``
        )

    # ---- expansion ----

    def expand(self, plan: MediaPlan) -> list[Segment]:
        if plan.kind == "image":
            return [
                Segment(token=self.image_start),
                Segment(token=self.image_token, count=plan.num_tokens, placeholder=True),
                Segment(token=self.image_end),
            ]
        if plan.kind == "audio":
            return [
                Segment(token=self.audio_start),
                Segment(token=self.audio_token, count=plan.num_tokens, placeholder=True),
                Segment(token=self.audio_end),
            ]
        if plan.kind == "video":
            ts = plan.info["timestamps"]
            per = plan.info["tokens_per_tubelet"]
            segs: list[Segment] = []
            for g in range(plan.grid_thw[0] if plan.grid_thw else 0):
                parts = []
                for off in range(self.temporal_patch):
                    k = g * self.temporal_patch + off
                    if k >= len(ts):
                        break  # the last tubelet of an odd count is labelled with its one real frame
                    parts.append(f"{'Frame' if off == 0 else 'frame'} {k + 1} sampled at {ts[k]:.2f} seconds")
                segs += [
                    Segment(text=("\n" if g else "") + " and ".join(parts) + ": "),
                    Segment(token=self.image_start),
                    Segment(token=self.image_token, count=per, placeholder=True),
                    Segment(token=self.image_end),
                ]
            return segs
        raise MediaRejected(f"profile {self.name} cannot expand {plan.kind}")

    def special_tokens(self) -> list[str]:
        toks = super().special_tokens()
        for t in (self.image_start, self.image_end, self.audio_start, self.audio_end):
            if t not in toks:
                toks.append(t)
        return toks

    def settings(self) -> dict[str, Any]:
        return {
            "patch_size": self.patch_size,
            "pixel_shuffle": self.merge,
            "min_num_patches": self.min_num_patches,
            "max_num_patches": self.max_num_patches,
            "max_model_len": self.max_model_len,
            "image_budget": self.image_budget(),
            "video_path": self.video_path,
            "video_frame_size": self.video_frame_size,
            "video_fps": self.video_fps,
            "video_max_frames": self.video_max_frames,
            "audio_count_rule": self.audio_count_rule,
            "max_audio_seconds": self.max_audio_seconds,
            "audio_rate": AUDIO_RATE,
            "audio_loading": AUDIO_LOADING,
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
            "num_mel_bins": self.num_mel_bins,
            "mel": "parakeet, one clip per call (n // 160 valid frames + 1 zeroed boundary frame)",
        }

    # ---- training cost model (profiles.cost): new methods ----

    def cost_shapes(self) -> dict[str, TransformerShape]:
        """Approximate published shapes: LM a Nemotron-H hybrid like Nemotron-Nano-12B-v2 (hidden 5120,
        28 MLP layers of 20480 (squared ReLU), 6 attention layers with 40/8 heads of 128, 28 Mamba-2 mixers
        of about 168M weights each); vision RADIO v2.5-H (ViT-H/16: 32 x 1280, 16 heads, GELU 5120);
        audio a Parakeet FastConformer (24 x 1024, 8 heads, two half FFNs of 4096). Override in ``cost``."""
        mamba_flops = 28 * 2.0 * 168e6
        return {
            "lm": TransformerShape(
                hidden=5120,
                layers=28,
                heads=40,
                kv_heads=8,
                head_dim=128,
                ffn=20480,
                gated_ffn=False,
                attention_layers=6,
                extra_token_flops=mamba_flops,
            ),
            "vision": TransformerShape(hidden=1280, layers=32, heads=16, ffn=5120, gated_ffn=False),
            "audio": TransformerShape(hidden=1024, layers=24, heads=8, ffn=2 * 4096, gated_ffn=False),
        }

    def media_cost(self, plan: MediaPlan, shapes: dict[str, TransformerShape]) -> float:
        """RADIO: full attention over each image (or each 2-frame tubelet of a video) plus the pixel-shuffle
        projector; Parakeet: full attention over the clip's encoder frames (8x subsampled mel)."""
        lm = shapes["lm"]
        if plan.kind == "audio":
            audio = shapes["audio"]
            tokens = plan.num_tokens
            return (
                encoder_flops(audio, tokens, float(tokens) * tokens) + 2.0 * tokens * audio.hidden * lm.hidden
            )
        if plan.grid_thw is None:
            return super().media_cost(plan, shapes)
        vision = shapes["vision"]
        t, gh, gw = plan.grid_thw
        per_block = gh * gw
        frames = self.temporal_patch if plan.kind == "video" else 1
        embed = 2.0 * 3 * frames * self.patch_size**2 * vision.hidden
        merged_in = vision.hidden * self.merge**2
        projector = 2.0 * (merged_in * lm.hidden + lm.hidden * lm.hidden)
        tower = encoder_flops(vision, t * per_block, blocks_pairs([per_block] * t))
        return tower + t * per_block * embed + t * per_block // self.merge**2 * projector


PROFILE = NemotronOmniProfile
