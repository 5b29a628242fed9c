"""Gemma 4 (``gemma4``): aspect-preserving images with a soft-token budget, USM log-mel audio, Gemma 4 turns.

The rules of transformers 5.24 ``Gemma4Processor`` with ``Gemma4ImageProcessor`` (its PIL backend,
``Gemma4ImageProcessorPil``, is what the class resolves to without torchvision) and
``Gemma4AudioFeatureExtractor``:

- images: resized (PIL bicubic, aspect kept) to the largest size whose sides are multiples of
  ``pooling_kernel_size * patch_size`` (3 x 16 = 48) and that holds at most ``max_soft_tokens * 9`` patches
  (280 soft tokens by default; 70, 140, 560 and 1120 are the other budgets the class accepts); rescaled by
  1/255, not normalized; cut into 16 x 16 patches (row-major, each patch ``(y, x, channel)``), zero-padded to
  ``max_soft_tokens * 9`` rows with ``image_position_ids`` (x, y) and -1 on padding; one soft token per 3 x 3
  patches. The chat template writes ``<|image|>``; the processor replaces it with
  ``<|image>`` + soft tokens x ``<|image|>`` + ``<image|>``;
- audio: 16 kHz mono, at most 30 s (480000 samples; longer clips are truncated, as the feature extractor's
  ``truncation=True``), padded to a multiple of 128 samples; a semicausal (160 zeros in front) 20 ms / 10 ms
  frame STFT (periodic Hann of 320 in an FFT of 512) magnitude, 128 HTK mel filters up to 8 kHz,
  ``ln(mel + 0.001)``, frames zeroed where their window passes the clip's end (``input_features_mask``);
  one audio soft token per 4 valid mel frames (the processor's two stride-2 steps over the mask). The
  template writes ``<|audio|>``; the processor replaces it with ``<|audio>`` + soft tokens + ``<audio|>``;
- video: ``num_frames`` = 32 frames sampled uniformly (``arange(32) * T // 32``; the video processor refuses
  videos with fewer frames), each resized like an image under a budget of 70 soft tokens (x / 255); the
  template writes ``<|video|>``, the processor replaces it with one ``mm:ss <|image>`` + soft tokens x
  ``<|video|>`` + ``<image|>`` per frame (frame index / fps, whole seconds), joined by spaces. Its resize is
  torchvision's (antialiased bicubic on tensors); frames are stored resized with PIL bicubic, as every
  family's video frames are here (``omnipack.media.video``);
- turns are ``<|turn>{system|user|model}\\n ... <turn|>\\n``; text is trimmed; positions are plain 1-D;
  ``mm_token_type_ids`` (1 on image soft tokens, 2 on video, 3 on audio) is what the model's forward reads to
  attend each run of vision soft tokens bidirectionally (on its sliding-window layers).

Stored payloads: the resized image, uint8 [H, W, 3] (PIL bicubic at prepare time, exactly the processor's
resize), the sampled and resized video frames uint8 [32, H, W, 3], and the (truncated) 16 kHz waveform.
The trainer half (:class:`Gemma4Inputs`) patchifies and rescales pixels and computes the log-mel features
in numpy, the feature extractor's own operations in its order (bit-identical): no Pillow, transformers or
resize at train time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..media.audio import audio_samples_at
from ..media.audio_storage import AUDIO_LOADING
from ..media.errors import MediaRejected
from ..media.meta import MediaMeta
from .base import MediaPlan, ModelProfile, Segment
from .hf_config import read_preprocessor_config
from .model_inputs import (
    EncoderInputs,
    MediaInputOptions,
    Payload,
    PendingRows,
    audio_waveform,
    concat_into_batch_tensor,
    item_kind,
    payload_audio,
    payload_frames,
)

BOI_TOKEN = "<|image>"
EOI_TOKEN = "<image|>"
IMAGE_TOKEN = "<|image|>"
BOA_TOKEN = "<|audio>"
EOA_TOKEN = "<audio|>"
AUDIO_TOKEN = "<|audio|>"
VIDEO_TOKEN = "<|video|>"
TURN_START = "<|turn>"
TURN_END = "<turn|>"

PATCH_SIZE = 16
POOLING_KERNEL_SIZE = 3
MAX_SOFT_TOKENS = 280
VIDEO_MAX_SOFT_TOKENS = 70  # the video processor's ``max_soft_tokens`` (per frame)
VIDEO_NUM_FRAMES = 32  # the video processor's ``num_frames`` (``do_sample_frames`` is on)
SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)  # the image processor refuses any other budget
PIL_BICUBIC = 3  # PILImageResampling.BICUBIC, the image processor's ``resample``
# PIL's resampling filters by number (a preprocessor_config's ``resample``) -> the name a plan records.
PIL_RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
# mm_token_type_ids of the processor (``ProcessorMixin.create_mm_token_type_ids``): text 0.
MM_TOKEN_TYPES = {"image": 1, "video": 2, "audio": 3}

AUDIO_RATE = 16000
MAX_AUDIO_SAMPLES = 480_000  # the feature extractor's ``max_length`` (30 s), with ``truncation=True``
PAD_TO_MULTIPLE_OF = 128  # its ``pad_to_multiple_of``
NUM_MELS = 128
FRAME_MS, HOP_MS = 20.0, 10.0
MEL_FLOOR = 1e-3
MAX_FREQUENCY = 8000.0
# Masked frames after a clip's own padded length that can still overlap its last samples (their sign of
# zero shows in a longer batch-mate's padding): frame ``F + k`` starts ``160 * k`` after frame ``F``.
TAIL_FRAMES = 3

# Gemma 4's chat template conventions (the -it checkpoints' chat_template.jinja without tools and thinking):
# an optional system turn, ``<|turn>{role}\n`` turns (the assistant is "model") closed by ``<turn|>\n``,
# trimmed text, media written inline as ``<|image|>`` / ``<|audio|>`` / ``<|video|>``. A real checkpoint's
# tokenizer carries its own; tests and demos that build a tokenizer offline use this copy.
CHAT_TEMPLATE = (
    "{{- bos_token -}}\n"
    "{%- set loop_messages = messages -%}\n"
    "{%- if messages[0]['role'] in ['system', 'developer'] -%}\n"
    "    {{- '<|turn>system\\n' -}}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {{- messages[0]['content'] | trim -}}\n"
    "    {%- else -%}\n"
    "        {%- for item in messages[0]['content'] -%}\n"
    "            {{- item['text'] | trim + ' ' -}}\n"
    "        {%- endfor -%}\n"
    "    {%- endif -%}\n"
    "    {{- '<turn|>\\n' -}}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\n"
    "    {{- '<|turn>' + role + '\\n' -}}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{- message['content'] | trim -}}\n"
    "    {%- else -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'text' -%}\n"
    "                {{- item['text'] | trim -}}\n"
    "            {%- elif item['type'] == 'image' -%}\n"
    "                {{- '<|image|>' -}}\n"
    "            {%- elif item['type'] == 'audio' -%}\n"
    "                {{- '<|audio|>' -}}\n"
    "            {%- elif item['type'] == 'video' -%}\n"
    "                {{- '<|video|>' -}}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- endif -%}\n"
    "    {{- '<turn|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{- '<|turn>model\\n' -}}\n"
    "{%- endif -%}\n"
)


# ---- images ----


def aspect_preserving_size(
    height: int, width: int, patch_size: int, max_patches: int, pooling: int
) -> tuple[int, int]:
    """(height, width) the image processor resizes an image to: scaled by
    ``sqrt(max_patches * patch^2 / area)``, each side floored to a multiple of ``pooling * patch_size``; a
    side that floors to 0 becomes one multiple, the other ``floor(long / short)`` multiples (at most
    ``max_patches / pooling^2``). Rejects what the processor refuses (both sides 0, or over the budget)."""
    side = pooling * patch_size
    factor = math.sqrt(max_patches * patch_size**2 / (height * width))
    th = int(math.floor(factor * height / side)) * side
    tw = int(math.floor(factor * width / side)) * side
    if th == 0 and tw == 0:
        raise MediaRejected(f"image {height}x{width} resizes to 0x0 under the Gemma 4 patch budget")
    longest = (max_patches // pooling**2) * side
    if th == 0:
        th, tw = side, min(int(math.floor(width / height)) * side, longest)
    elif tw == 0:
        th, tw = min(int(math.floor(height / width)) * side, longest), side
    if th * tw > max_patches * patch_size**2:
        raise MediaRejected(f"image {height}x{width} resizes to {th}x{tw}, over {max_patches} patches")
    return th, tw


def patchify(image: np.ndarray, patch_size: int, out: np.ndarray) -> None:
    """uint8 ``image [H, W, C]`` -> its patches into ``out [>= H*W/p^2, p*p*C]`` (row-major patches, each
    ``(y, x, channel)``, as the processor's ``convert_image_to_patches``); rows after them are zeroed."""
    h, w, c = image.shape
    ph, pw = h // patch_size, w // patch_size
    patches = image.reshape(ph, patch_size, pw, patch_size, c).transpose(0, 2, 1, 3, 4)
    n = ph * pw
    np.copyto(out[:n].reshape(ph, pw, patch_size, patch_size, c), patches, casting="unsafe")
    out[n:] = 0


def patch_positions(height: int, width: int, patch_size: int, max_patches: int) -> np.ndarray:
    """int64 [max_patches, 2]: each patch's (x, y) in the patch grid, row-major; -1 on padding rows."""
    ph, pw = height // patch_size, width // patch_size
    pos = np.full((max_patches, 2), -1, dtype=np.int64)
    ys, xs = np.divmod(np.arange(ph * pw), pw)
    pos[: ph * pw, 0] = xs
    pos[: ph * pw, 1] = ys
    return pos


# ---- audio ----


def padded_audio_length(num_samples: int) -> int:
    """Samples the feature extractor runs on for one clip alone: truncated to 30 s, padded to a multiple
    of 128."""
    n = min(num_samples, MAX_AUDIO_SAMPLES)
    return -(-n // PAD_TO_MULTIPLE_OF) * PAD_TO_MULTIPLE_OF


def mel_frame_counts(num_samples: int, frame_length: int = 320, hop: int = 160) -> tuple[int, int]:
    """(mel frames, valid mel frames) of one clip of ``num_samples`` (<= 30 s) alone: frames of ``frame_length
    + 1`` samples every ``hop`` over the clip padded to 128 with ``frame_length // 2`` zeros in front; a frame
    is valid when its last sample is a real one."""
    pad_left = frame_length // 2
    frames = max(0, (padded_audio_length(num_samples) + pad_left - frame_length - 1) // hop + 1)
    valid = min(frames, max(0, (num_samples + pad_left - 1 - frame_length) // hop + 1))
    return frames, valid


def audio_soft_tokens(num_samples: int) -> int:
    """Audio soft tokens of a clip of ``num_samples`` (<= 30 s): the processor halves the valid-frame mask
    twice (``mask[::2]``), i.e. one token per 4 valid frames, rounded up."""
    _, valid = mel_frame_counts(num_samples)
    return -(-valid // 4)


def hz_to_htk_mel(hz: Any) -> Any:
    return 2595.0 * np.log10(1.0 + (hz / 700.0))


def htk_mel_to_hz(mel: Any) -> Any:
    return 700.0 * (np.power(10, mel / 2595.0) - 1.0)


@functools.lru_cache(maxsize=4)
def htk_mel_filters(num_bins: int, num_mels: int, min_hz: float, max_hz: float, rate: int) -> np.ndarray:
    """float64 ``[num_bins, num_mels]`` triangular HTK mel filters without normalization, computed with the
    operations of ``transformers.audio_utils.mel_filter_bank(norm=None, mel_scale="htk")`` (same bits)."""
    mel_freqs = np.linspace(hz_to_htk_mel(min_hz), hz_to_htk_mel(max_hz), num_mels + 2)
    edges = htk_mel_to_hz(mel_freqs)
    bins = np.linspace(0, rate // 2, num_bins)
    diff = np.diff(edges)
    slopes = np.expand_dims(edges, 0) - np.expand_dims(bins, 1)
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    return np.maximum(np.zeros(1), np.minimum(down, up))


@functools.lru_cache(maxsize=4)
def periodic_hann(length: int) -> np.ndarray:
    """float32 periodic Hann window (``window_function(length)`` of transformers)."""
    return np.hanning(length + 1)[:-1].astype(np.float32)


def usm_log_mel(
    wave: np.ndarray, num_frames: int, num_samples: int, settings: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """(float32 ``[num_frames, mels]`` masked log-mel, bool ``[num_frames]`` mask) of float32 ``wave`` (the
    clip zero-padded to at least ``num_frames`` frames) whose first ``num_samples`` are real.

    ``Gemma4AudioFeatureExtractor._extract_spectrogram`` with its defaults, operation for operation (numpy
    float32 frames and window, rfft, float64 mel matmul and log, float32 result times the mask)."""
    frame = int(settings["frame_length"])
    hop = int(settings["hop_length"])
    fft = int(settings["fft_length"])
    pad_left = frame // 2
    size = frame + 1
    length = (num_frames - 1) * hop + size  # padded samples the frames read
    x = np.zeros((1, max(length, pad_left + len(wave))), dtype=np.float32)
    x[0, pad_left : pad_left + len(wave)] = wave
    real = np.zeros(x.shape[1], dtype=bool)
    real[pad_left : pad_left + num_samples] = True
    frames = np.lib.stride_tricks.as_strided(
        x, shape=(1, num_frames, size), strides=(x.strides[0], x.strides[1] * hop, x.strides[1])
    )[..., :-1]
    frames = frames * periodic_hann(frame)
    magnitude = np.abs(np.fft.rfft(frames, n=fft, axis=-1))
    filters = htk_mel_filters(fft // 2 + 1, int(settings["num_mels"]), float(settings["min_frequency"]),
                              float(settings["max_frequency"]), int(settings["sampling_rate"]))  # fmt: skip
    log_mel = np.log(np.matmul(magnitude, filters) + np.array(settings["mel_floor"], dtype=np.float64))
    mask = real[np.arange(num_frames) * hop + size - 1]
    return log_mel[0].astype(np.float32) * mask[..., None], mask


class Gemma4Inputs(EncoderInputs):
    """Trainer half: stored images uint8 [H, W, 3] -> ``pixel_values`` [1, max_patches, 768] and
    ``image_position_ids``; stored 16 kHz clips -> ``input_features`` [1, frames, 128] and
    ``input_features_mask`` (batches padded to their longest clip, as one processor call pads them)."""

    name = "gemma4"
    placeholder_tokens: ClassVar[dict[str, tuple[str, ...]]] = {
        "image": (IMAGE_TOKEN,),
        "video": (VIDEO_TOKEN,),
        "audio": (AUDIO_TOKEN,),
    }
    batch_keys: ClassVar[tuple[str, ...]] = (
        "pixel_values",
        "image_position_ids",
        "pixel_values_videos",
        "video_position_ids",
        "num_frames_per_video",
        "input_features",
        "input_features_mask",
    )
    pixel_keys: ClassVar[tuple[str, ...]] = ("pixel_values", "pixel_values_videos")

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        image = settings["image"]
        self.patch_size = int(image["patch_size"])
        self.pooling = int(image["pooling_kernel_size"])
        self.max_patches = int(image["max_soft_tokens"]) * self.pooling**2
        video = settings["video"]
        self.video_max_patches = int(video["max_soft_tokens"]) * self.pooling**2
        self.video_num_frames = int(video["num_frames"])
        self.image_mean = tuple(float(x) for x in image["normalize"]["mean"])
        self.image_std = tuple(float(x) for x in image["normalize"]["std"])
        self.audio = dict(settings["audio"])

    # ---- images ----

    def stored_frames(self, payload: Payload, kind: str) -> np.ndarray:
        """The stored frames uint8 [T, H, W, 3] (one for an image, ``num_frames`` for a video); their sides
        must be multiples of ``pooling * patch_size`` within the patch budget (as the processor resizes)."""
        frames = payload_frames(payload)
        count = 1 if kind == "image" else self.video_num_frames
        if frames.shape[0] != count:
            raise ValueError(f"stored {kind} has {frames.shape[0]} frames, expected {count}")
        h, w = frames.shape[1:3]
        side = self.pooling * self.patch_size
        budget = self.max_patches if kind == "image" else self.video_max_patches
        if h % side or w % side or (h // self.patch_size) * (w // self.patch_size) > budget:
            raise ValueError(f"stored {kind} is {h}x{w}: not a multiple of {side} within {budget} patches")
        return frames

    def stored_image(self, payload: Payload) -> np.ndarray:
        """The stored image uint8 [H, W, 3] (see ``stored_frames``)."""
        return self.stored_frames(payload, "image")[0]

    def pixel_normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """Mean 0 and std 1: the model input is ``x / 255`` (the processor does not normalize). The same for
        every channel, so it also holds for these channel-last patches viewed as ``[N, 3, -1]``."""
        if self.image_mean != (0.0, 0.0, 0.0) or self.image_std != (1.0, 1.0, 1.0):
            raise ValueError(
                f"profile gemma4 takes x / 255 pixels, not mean {self.image_mean} / std {self.image_std}"
            )
        return self.image_mean, self.image_std

    def vision_inputs(self, frames: np.ndarray, kind: str, options: MediaInputOptions) -> dict[str, Any]:
        """Patches of each frame, padded to the budget: ``pixel_values`` / ``image_position_ids`` of an image
        ``[1, ...]``, ``pixel_values_videos`` / ``video_position_ids`` ``[T, ...]`` and
        ``num_frames_per_video`` of a video."""
        dtype = np.dtype(np.float32 if options.pixel_dtype == "float32" else np.uint8)
        budget = self.max_patches if kind == "image" else self.video_max_patches
        shape = (frames.shape[0], budget, self.patch_size**2 * 3)
        fill = functools.partial(self._fill_pixels, frames)
        pos = patch_positions(frames.shape[1], frames.shape[2], self.patch_size, budget)
        positions = np.ascontiguousarray(np.broadcast_to(pos, (frames.shape[0], *pos.shape)))
        pixels: Any = PendingRows(shape, dtype, fill)
        if not options.deferred:
            pixels = np.empty(shape, dtype=dtype)
            fill(pixels)
        if kind == "image":
            return {"pixel_values": pixels, "image_position_ids": positions}
        return {
            "pixel_values_videos": pixels,
            "video_position_ids": positions,
            "num_frames_per_video": np.array([frames.shape[0]], dtype=np.int64),
        }

    def _fill_pixels(self, frames: np.ndarray, out: np.ndarray) -> None:
        n = (frames.shape[1] // self.patch_size) * (frames.shape[2] // self.patch_size)
        for frame, rows in zip(frames, out, strict=True):
            patchify(frame, self.patch_size, rows)
            if rows.dtype == np.float32:
                real = rows[:n]
                real /= np.float32(255.0)  # the processor's x * (1/255) (float64, then float32): same bits

    # ---- audio ----

    def audio_features(self, stored: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(features [frames, mels], mask [frames], tail [TAIL_FRAMES, mels]) of one stored clip, as the
        feature extractor computes them for the clip alone; ``tail``: the masked frames that follow in a
        batch padded further (a longer clip beside it)."""
        n = int(stored.shape[0])
        if n > int(self.audio["max_samples"]):
            raise ValueError(f"stored audio has {n} samples, over the {self.audio['max_samples']} it takes")
        frames, _ = mel_frame_counts(n, int(self.audio["frame_length"]), int(self.audio["hop_length"]))
        feats, mask = usm_log_mel(audio_waveform(stored), frames + TAIL_FRAMES, n, self.audio)
        return feats[:frames], mask[:frames], feats[frames:]

    # ---- the EncoderInputs interface ----

    def feature_count(self, item: Any, payload: Payload) -> int:
        kind = item_kind(item)
        if kind in ("image", "video"):
            frames = self.stored_frames(payload, kind)
            patches = (frames.shape[1] // self.patch_size) * (frames.shape[2] // self.patch_size)
            return frames.shape[0] * (patches // self.pooling**2)
        if kind == "audio":
            wave = payload_audio(payload)
            if wave.shape[0] > int(self.audio["max_samples"]):
                raise ValueError(
                    f"stored audio has {wave.shape[0]} samples, over {self.audio['max_samples']}"
                )
            return audio_soft_tokens(int(wave.shape[0]))
        return super().feature_count(item, payload)

    def media_inputs(self, item: Any, payload: Payload, options: MediaInputOptions) -> dict[str, Any]:
        """Images and videos: ``vision_inputs``, pixels float32 as the processor gives them, or uint8 (the
        model input is then ``x / 255``, see ``pixel_normalization``). Audio: ``input_features`` and
        ``input_features_mask`` of the clip alone, plus ``input_features_tail`` that ``collate_media`` uses
        (and drops) to pad a batch exactly as the feature extractor pads it."""
        kind = item_kind(item)
        if kind in ("image", "video"):
            frames = self.stored_frames(payload, kind)
            return self.vision_inputs(frames, kind, options)
        if kind == "audio":
            feats, mask, tail = self.audio_features(payload_audio(payload))
            return {
                "input_features": feats[None],
                "input_features_mask": mask[None],
                "input_features_tail": tail,
            }
        return super().media_inputs(item, payload, options)

    def collate_media(self, per_item: list[dict[str, Any]], options: MediaInputOptions) -> dict[str, Any]:
        """Image and video inputs concatenated (videos along frames); audio clips padded to the longest one's
        frames: each clip's masked frames beyond its own are what the feature extractor gives them in one
        call (the tail frames that still read the clip's last samples, then silence: ``-0.0``, as
        ``log(0.001) * False`` is)."""
        out: dict[str, Any] = {}
        for key in (
            "pixel_values",
            "image_position_ids",
            "pixel_values_videos",
            "video_position_ids",
            "num_frames_per_video",
        ):
            parts = [d[key] for d in per_item if key in d]
            if parts:
                out[key] = concat_into_batch_tensor(parts, options.allocate)
        clips = [d for d in per_item if "input_features" in d]
        if clips:
            frames = max(int(d["input_features"].shape[1]) for d in clips)
            feats = np.full((len(clips), frames, int(self.audio["num_mels"])), -0.0, dtype=np.float32)
            mask = np.zeros((len(clips), frames), dtype=bool)
            for k, d in enumerate(clips):
                f = int(d["input_features"].shape[1])
                feats[k, :f] = d["input_features"][0]
                tail = d["input_features_tail"][: frames - f]
                feats[k, f : f + len(tail)] = tail
                mask[k, :f] = d["input_features_mask"][0]
            out["input_features"] = concat_into_batch_tensor([feats], options.allocate)
            out["input_features_mask"] = concat_into_batch_tensor([mask], options.allocate)
        return out

    def token_inputs(self, tokens: Any, placeholder_ids: Mapping[str, Any]) -> dict[str, Any]:
        """``mm_token_type_ids`` (int64, like ``tokens``): 1 on image soft tokens, 2 on video, 3 on audio, 0
        elsewhere (the processor's). Gemma 4's forward attends each run of vision soft tokens
        bidirectionally on its sliding-window layers when it is given, causally otherwise."""
        types = None
        for kind, ids in placeholder_ids.items():
            if kind not in MM_TOKEN_TYPES:
                continue
            for i in ids:
                hit = (tokens == i).long() * MM_TOKEN_TYPES[kind]
                types = hit if types is None else types + hit
        return {} if types is None else {"mm_token_type_ids": types}


class Gemma4Profile(ModelProfile):
    """Gemma 4 image and audio rules (see the module docstring).

    Options: ``preprocessor_config`` (local json or model dir: the image processor's ``patch_size``,
    ``max_soft_tokens``, ``pooling_kernel_size``, ``resample``, ``do_normalize`` / ``image_mean`` /
    ``image_std``), ``max_soft_tokens`` (a processor call's keyword: the image token budget, one of
    70/140/280/560/1120), ``video_max_soft_tokens`` (the video processor's per-frame budget, 70) and
    ``video_num_frames`` (its ``num_frames``, 32).
    """

    name = "gemma4"
    inputs_class = Gemma4Inputs
    model_types = ("gemma4",)
    template_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "image": (IMAGE_TOKEN,),
        "video": (VIDEO_TOKEN,),
        "audio": (AUDIO_TOKEN,),
    }
    turn_start: ClassVar[str] = TURN_START
    turn_end: ClassVar[str] = TURN_END
    expansion_tokens: ClassVar[tuple[str, ...]] = (BOI_TOKEN, EOI_TOKEN, BOA_TOKEN, EOA_TOKEN)
    chat_template: ClassVar[str | None] = CHAT_TEMPLATE

    def __init__(
        self,
        *,
        preprocessor_config: str | Path | None = None,
        max_soft_tokens: int | None = None,
        video_max_soft_tokens: int = VIDEO_MAX_SOFT_TOKENS,
        video_num_frames: int = VIDEO_NUM_FRAMES,
    ) -> None:
        cfg = read_preprocessor_config(preprocessor_config)
        self.patch_size = int(cfg.get("patch_size") or PATCH_SIZE)
        self.pooling = int(cfg.get("pooling_kernel_size") or POOLING_KERNEL_SIZE)
        self.max_soft_tokens = int(max_soft_tokens or cfg.get("max_soft_tokens") or MAX_SOFT_TOKENS)
        if self.max_soft_tokens not in SUPPORTED_SOFT_TOKENS:
            raise ValueError(
                f"max_soft_tokens must be one of {SUPPORTED_SOFT_TOKENS}, got {self.max_soft_tokens}"
            )
        self.video_max_soft_tokens = int(video_max_soft_tokens)
        if self.video_max_soft_tokens not in SUPPORTED_SOFT_TOKENS:
            raise ValueError(
                f"video_max_soft_tokens must be one of {SUPPORTED_SOFT_TOKENS}, got {video_max_soft_tokens}"
            )
        if int(video_num_frames) <= 0:
            raise ValueError(f"video_num_frames must be positive, got {video_num_frames}")
        self.video_num_frames = int(video_num_frames)
        resample = int(cfg.get("resample") if cfg.get("resample") is not None else PIL_BICUBIC)
        if resample not in PIL_RESAMPLE_NAMES:
            raise ValueError(f"resample {resample} is not a PIL resampling filter")
        self.resample = resample
        if cfg.get("rescale_factor") not in (None, 1 / 255) or cfg.get("do_rescale") is False:
            raise ValueError("only the 1/255 rescale is supported")
        # Gemma 4 was trained on x / 255 (``do_normalize`` false); a normalization that changes pixels is
        # not what the checkpoints expect, and not supported here.
        mean = tuple(float(x) for x in cfg.get("image_mean") or (0.0, 0.0, 0.0))
        std = tuple(float(x) for x in cfg.get("image_std") or (1.0, 1.0, 1.0))
        if cfg.get("do_normalize") and (set(mean) != {0.0} or set(std) != {1.0}):
            raise ValueError(f"image normalization mean {mean} / std {std} is not supported (only x / 255)")
        self.image_mean, self.image_std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)

    def special_tokens(self) -> list[str]:
        """The profile's tokens plus ``<|turn>``, which the Gemma 4 chat template writes."""
        return [*super().special_tokens(), TURN_START]

    # ---- planning ----

    def plan_image(self, meta: MediaMeta) -> MediaPlan:
        """The whole image resized to the processor's aspect-preserving size, stored at prepare time."""
        if not meta.height or not meta.width:
            raise MediaRejected("image size unknown or zero")
        max_patches = self.max_soft_tokens * self.pooling**2
        th, tw = aspect_preserving_size(meta.height, meta.width, self.patch_size, max_patches, self.pooling)
        patches = (th // self.patch_size) * (tw // self.patch_size)
        return MediaPlan(
            kind="image",
            num_tokens=patches // self.pooling**2,
            target_hw=(th, tw),
            vision_patches=patches,
            resample=PIL_RESAMPLE_NAMES[self.resample],
        )

    def plan_video(self, meta: MediaMeta) -> MediaPlan:
        """``video_num_frames`` frames sampled uniformly, each resized as an image under the video budget;
        the block's timestamps are the frames' source times (index / fps)."""
        if not meta.height or not meta.width:
            raise MediaRejected("video frame size unknown or zero")
        if not meta.fps or not meta.num_frames:
            raise MediaRejected("video fps or frame count unknown or zero")
        if meta.num_frames < self.video_num_frames:
            raise MediaRejected(
                f"video has {meta.num_frames} frames, fewer than the {self.video_num_frames} sampled"
            )
        max_patches = self.video_max_soft_tokens * self.pooling**2
        th, tw = aspect_preserving_size(meta.height, meta.width, self.patch_size, max_patches, self.pooling)
        patches = (th // self.patch_size) * (tw // self.patch_size)
        indices = [k * meta.num_frames // self.video_num_frames for k in range(self.video_num_frames)]
        per_frame = patches // self.pooling**2
        return MediaPlan(
            kind="video",
            num_tokens=len(indices) * per_frame,
            target_hw=(th, tw),
            frame_indices=tuple(indices),
            vision_patches=len(indices) * patches,
            info={"tokens_per_frame": per_frame, "timestamps": [i / meta.fps for i in indices]},
        )

    def plan_audio(self, meta: MediaMeta) -> MediaPlan:
        """The clip at 16 kHz, truncated to 30 s as the feature extractor truncates it."""
        n = audio_samples_at(meta, AUDIO_RATE)
        truncated = n > MAX_AUDIO_SAMPLES
        n = min(n, MAX_AUDIO_SAMPLES)
        tokens = audio_soft_tokens(n)
        if tokens <= 0:
            raise MediaRejected(f"audio of {n} samples at 16 kHz is too short for one mel frame")
        return MediaPlan(
            kind="audio",
            num_tokens=tokens,
            sample_rate=AUDIO_RATE,
            num_audio_samples=n,
            audio_frames=mel_frame_counts(n)[0],
            truncate=truncated,  # the writer cuts the decoded clip to ``num_audio_samples``
        )

    def expand(self, plan: MediaPlan) -> list[Segment]:
        if plan.kind == "video":  # "mm:ss <|image><|video|>...<image|>" per frame, joined by spaces
            segs: list[Segment] = []
            per_frame = int(plan.info["tokens_per_frame"])
            for k, seconds in enumerate(plan.info["timestamps"]):
                stamp = f"{int(seconds // 60):02d}:{int(seconds % 60):02d} "
                segs += [
                    Segment(text=(" " if k else "") + stamp),
                    Segment(token=BOI_TOKEN),
                    Segment(token=VIDEO_TOKEN, count=per_frame, placeholder=True),
                    Segment(token=EOI_TOKEN),
                ]
            return segs
        if plan.kind == "image":
            begin, token, end = BOI_TOKEN, IMAGE_TOKEN, EOI_TOKEN
        elif plan.kind == "audio":
            begin, token, end = BOA_TOKEN, AUDIO_TOKEN, EOA_TOKEN
        else:
            raise MediaRejected(f"profile {self.name} cannot expand {plan.kind}")
        return [
            Segment(token=begin),
            Segment(token=token, count=plan.num_tokens, placeholder=True),
            Segment(token=end),
        ]

    def settings(self) -> dict[str, Any]:
        frame = int(round(AUDIO_RATE * FRAME_MS / 1000.0))
        return {
            "image": {
                "patch_size": self.patch_size,
                "pooling_kernel_size": self.pooling,
                "max_soft_tokens": self.max_soft_tokens,
                "resample": self.resample,
                "normalize": {"mean": list(self.image_mean), "std": list(self.image_std)},
            },
            "video": {"max_soft_tokens": self.video_max_soft_tokens, "num_frames": self.video_num_frames},
            "audio": {
                "sampling_rate": AUDIO_RATE,
                "num_mels": NUM_MELS,
                "frame_length": frame,
                "hop_length": int(round(AUDIO_RATE * HOP_MS / 1000.0)),
                "fft_length": 2 ** math.ceil(math.log2(frame)),
                "min_frequency": 0.0,
                "max_frequency": MAX_FREQUENCY,
                "mel_floor": MEL_FLOOR,
                "max_samples": MAX_AUDIO_SAMPLES,
                "pad_to_multiple_of": PAD_TO_MULTIPLE_OF,
                "loading": AUDIO_LOADING,
            },
        }


PROFILE = Gemma4Profile
