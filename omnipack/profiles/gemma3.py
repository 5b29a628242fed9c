"""Gemma 3 (``gemma3``): a fixed 256 soft tokens per image, optional pan-and-scan crops, Gemma chat turns.

The rules of transformers 5.x ``Gemma3Processor`` with ``Gemma3ImageProcessor`` (its PIL backend,
``Gemma3ImageProcessorPil``, is what the class resolves to without torchvision):

- every image, and every pan-and-scan crop of it, is resized to ``size`` (896 x 896, aspect not kept,
  bilinear), rescaled by 1/255 and normalized with mean = std = 0.5; the SigLIP tower (patch 14, 64 x 64
  patches) and a 4 x 4 average pool turn each into ``image_seq_length`` = 256 soft tokens;
- pan-and-scan (off by default) cuts a wide or tall image into 2..``max_num_crops`` equal crops along its
  long side, from the original pixels (the last crop may be narrower), when the aspect ratio reaches
  ``min_ratio_to_activate`` and every crop side reaches ``min_crop_size``;
- the chat template writes ``<start_of_image>`` per image; the processor replaces it with
  ``"\\n\\n<start_of_image>" + 256 x "<image_soft_token>" + "<end_of_image>\\n\\n"``, or with crops
  ``"Here is the original image {that} and here are some crops to help you see better {that} {that} ..."``;
- only ``<image_soft_token>`` carries image features (``token_type_ids`` is 1 exactly there, which makes
  each run attend bidirectionally); positions are plain 1-D (no mRoPE).

Stored payload: the views exactly as the image processor resizes them, uint8 [1 + crops, 896, 896, 3]
(the plan's ``image_views`` boxes cut from the upright original, each resized with PIL bilinear at prepare
time). The trainer half (:class:`Gemma3Inputs`) only lays the bytes out channel-first and normalizes them:
no Pillow, transformers or resize at train time.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..media.errors import MediaRejected
from ..media.meta import MediaMeta
from .base import MediaPlan, ModelProfile, Segment
from .cost import TransformerShape, blocks_pairs, encoder_flops
from .hf_config import read_preprocessor_config
from .model_inputs import EncoderInputs, MediaInputOptions, Payload, PendingRows, item_kind, payload_frames

BOI_TOKEN = "<start_of_image>"
EOI_TOKEN = "<end_of_image>"
IMAGE_TOKEN = "<image_soft_token>"
START_OF_TURN = "<start_of_turn>"
END_OF_TURN = "<end_of_turn>"

IMAGE_SIZE = 896  # released checkpoints' preprocessor_config ``size`` (the class default is 224)
IMAGE_SEQ_LENGTH = 256  # processor_config ``image_seq_length``
PATCH_SIZE = 14  # SigLIP patch: 64 x 64 patches per 896 x 896 image
HALF = (0.5, 0.5, 0.5)
PIL_BILINEAR = 2  # PILImageResampling.BILINEAR, the image processor's ``resample``
# PIL's resampling filters by number (a preprocessor_config's ``resample``) -> the name a plan records.
PIL_RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
CROPS_INTRO = "Here is the original image "
CROPS_OUTRO = " and here are some crops to help you see better "

# Google's Gemma 3 chat template (tokenizer_config.json of the -it checkpoints): turns are
# ``<start_of_turn>{user|model}\n ... <end_of_turn>\n``, a system message is folded into the first user turn,
# text is trimmed, images are ``<start_of_image>``. The tokenizer directory of a real checkpoint carries it;
# tests and demos that build a tokenizer offline use this copy.
CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)


@dataclass(frozen=True)
class PanAndScan:
    """Pan-and-scan settings: ``Gemma3Processor``'s own ``images_kwargs`` defaults.

    The processor passes these on every call, so they win over a preprocessor_config's values (null in the
    released ones); a user changes them only per call, as the profile options do here.
    """

    enabled: bool = False
    min_crop_size: int = 256
    max_num_crops: int = 4
    min_ratio_to_activate: float = 1.2


def pan_and_scan_boxes(height: int, width: int, pas: PanAndScan) -> list[tuple[int, int, int, int]]:
    """(top, left, bottom, right) of each pan-and-scan crop of an image, row-major; [] when it does not apply.

    The image processor's rule: along the long side ``n = floor(ratio + 0.5)`` crops, at most
    ``floor(long / min_crop_size)``, then clamped to ``[2, max_num_crops]``; crop sides ``ceil(side / n)``
    (the last crop is cut at the image edge); no crops below ``min_ratio_to_activate`` or when a crop side
    would be under ``min_crop_size``.
    """
    if not pas.enabled:
        return []
    if width >= height:
        if width / height < pas.min_ratio_to_activate:
            return []
        n_w = min(int(math.floor(width / pas.min_crop_size)), int(math.floor(width / height + 0.5)))
        n_w, n_h = min(pas.max_num_crops, max(2, n_w)), 1
    else:
        if height / width < pas.min_ratio_to_activate:
            return []
        n_h = min(int(math.floor(height / pas.min_crop_size)), int(math.floor(height / width + 0.5)))
        n_w, n_h = 1, min(pas.max_num_crops, max(2, n_h))
    crop_w, crop_h = int(math.ceil(width / n_w)), int(math.ceil(height / n_h))
    if min(crop_w, crop_h) < pas.min_crop_size:
        return []
    return [
        (top, left, min(top + crop_h, height), min(left + crop_w, width))
        for top, left in itertools.product(range(0, crop_h * n_h, crop_h), range(0, crop_w * n_w, crop_w))
    ]


def image_block_segments(num_crops: int, image_seq_length: int = IMAGE_SEQ_LENGTH) -> list[Segment]:
    """What ``Gemma3Processor`` writes for one ``<start_of_image>``: the image's own block, and with
    ``num_crops`` crops the introduction text and one block per crop (blocks joined by a space)."""
    block = [
        Segment(text="\n\n"),
        Segment(token=BOI_TOKEN),
        Segment(token=IMAGE_TOKEN, count=image_seq_length, placeholder=True),
        Segment(token=EOI_TOKEN),
        Segment(text="\n\n"),
    ]
    if not num_crops:
        return block
    segs = [Segment(text=CROPS_INTRO), *block, Segment(text=CROPS_OUTRO)]
    for k in range(num_crops):
        segs += ([Segment(text=" ")] if k else []) + block
    return _merge_text(segs)


def _merge_text(segs: list[Segment]) -> list[Segment]:
    """Adjacent text segments joined, so each literal run is tokenized as the processor's string has it."""
    out: list[Segment] = []
    for s in segs:
        if s.text is not None and out and out[-1].text is not None:
            out[-1] = Segment(text=out[-1].text + s.text)
        else:
            out.append(s)
    return out


def normalize_float32(x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
    """In place on float32 ``x [N, 3, H, W]`` holding 0..255: ``(x / 255 - mean[c]) / std[c]`` in float32.

    Bit-identical to the image processor's float64 rescale cast to float32 then float32 normalize (checked
    for all 256 values), and to ``omnipack.loader.media.normalize_pixels`` on uint8 views.
    """
    m = np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(std, np.float32).reshape(1, -1, 1, 1)
    x /= np.float32(255.0)
    x -= m
    x /= s


def image_token_type_ids(input_ids: np.ndarray, image_token_id: int) -> np.ndarray:
    """int64 ``token_type_ids`` of Gemma 3's forward: 1 on image soft tokens, 0 elsewhere (the processor's
    ``mm_token_type_ids``; each run of 1s is one image or crop, attended bidirectionally)."""
    return (np.asarray(input_ids) == image_token_id).astype(np.int64)


class Gemma3Inputs(EncoderInputs):
    """Trainer half: stored views uint8 [V, H, W, 3] -> ``pixel_values`` [V, 3, H, W].

    Built from the recorded ``size``, ``image_seq_length`` and ``normalize`` (mean / std); the views were
    resized at prepare time, so this only transposes (and, for float32, normalizes) bytes.
    """

    name = "gemma3"
    placeholder_tokens: ClassVar[dict[str, tuple[str, ...]]] = {"image": (IMAGE_TOKEN,)}
    batch_keys: ClassVar[tuple[str, ...]] = ("pixel_values",)
    pixel_keys: ClassVar[tuple[str, ...]] = ("pixel_values",)

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.size = tuple(int(x) for x in settings["size"])
        self.image_seq_length = int(settings["image_seq_length"])
        self.image_mean = tuple(float(x) for x in settings["normalize"]["mean"])
        self.image_std = tuple(float(x) for x in settings["normalize"]["std"])

    def stored_views(self, payload: Payload) -> np.ndarray:
        """The stored views uint8 [V, H, W, 3]; each must be ``size``."""
        views = payload_frames(payload)
        if tuple(views.shape[1:3]) != self.size:
            raise ValueError(f"stored image views are {views.shape[1]}x{views.shape[2]}, expected {self.size}")
        return views

    def feature_count(self, item: Any, payload: Payload) -> int:
        """``image_seq_length`` soft tokens per stored view (the whole image and each crop)."""
        if item_kind(item) != "image":
            return super().feature_count(item, payload)
        return self.stored_views(payload).shape[0] * self.image_seq_length

    def pixel_normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        return self.image_mean, self.image_std

    def token_inputs(self, tokens: Any, placeholder_ids: Mapping[str, Any]) -> dict[str, Any]:
        """``token_type_ids`` (int64, like ``tokens``): 1 on image soft tokens, as ``image_token_type_ids``.
        An HF Gemma 3 forward attends each run of them bidirectionally, and causally without this input."""
        ids = list(placeholder_ids.get("image", ()))
        if not ids:
            return {}
        is_image = tokens == ids[0]
        for i in ids[1:]:
            is_image = is_image | (tokens == i)
        return {"token_type_ids": is_image.long()}

    def media_inputs(self, item: Any, payload: Payload, options: MediaInputOptions) -> dict[str, Any]:
        """``pixel_values`` [V, 3, H, W]: float32 as the image processor gives them, or uint8 (the model input
        is ``(x / 255 - mean[c]) / std[c]``, see ``pixel_normalization``); ``PendingRows`` when deferred."""
        if item_kind(item) != "image":
            return super().media_inputs(item, payload, options)
        views = self.stored_views(payload)
        dtype = np.dtype(np.float32 if options.pixel_dtype == "float32" else np.uint8)
        shape = (views.shape[0], 3, *self.size)
        fill = functools.partial(self._fill_pixels, views)
        if options.deferred:
            return {"pixel_values": PendingRows(shape, dtype, fill)}
        out = np.empty(shape, dtype=dtype)
        fill(out)
        return {"pixel_values": out}

    def _fill_pixels(self, views: np.ndarray, out: np.ndarray) -> None:
        np.copyto(out, views.transpose(0, 3, 1, 2), casting="unsafe")
        if out.dtype == np.float32:
            normalize_float32(out, self.image_mean, self.image_std)


class Gemma3Profile(ModelProfile):
    """Gemma 3 image rules (see the module docstring).

    Options: ``preprocessor_config`` (local json or model dir: ``size``, ``image_mean``, ``image_std``,
    ``resample``), ``image_seq_length`` (processor_config, 256), ``do_pan_and_scan`` and
    ``pan_and_scan_min_crop_size`` / ``pan_and_scan_max_num_crops`` / ``pan_and_scan_min_ratio_to_activate``
    (the processor call's keywords; defaults are the processor class's own).
    """

    name = "gemma3"
    model_types = ("gemma3",)
    inputs_class = Gemma3Inputs
    template_blocks: ClassVar[dict[str, tuple[str, ...]]] = {"image": (BOI_TOKEN,)}
    turn_start: ClassVar[str] = START_OF_TURN
    turn_end: ClassVar[str] = END_OF_TURN
    expansion_tokens: ClassVar[tuple[str, ...]] = (EOI_TOKEN, IMAGE_TOKEN)
    chat_template: ClassVar[str | None] = CHAT_TEMPLATE

    def __init__(
        self,
        *,
        preprocessor_config: str | Path | None = None,
        image_seq_length: int = IMAGE_SEQ_LENGTH,
        do_pan_and_scan: bool = False,
        pan_and_scan_min_crop_size: int | None = None,
        pan_and_scan_max_num_crops: int | None = None,
        pan_and_scan_min_ratio_to_activate: float | None = None,
    ) -> None:
        cfg = read_preprocessor_config(preprocessor_config)
        size = cfg.get("size") or {}
        self.size = (int(size.get("height", IMAGE_SIZE)), int(size.get("width", IMAGE_SIZE)))
        self.image_mean = tuple(float(x) for x in cfg.get("image_mean") or HALF)
        self.image_std = tuple(float(x) for x in cfg.get("image_std") or HALF)
        resample = int(cfg.get("resample") if cfg.get("resample") is not None else PIL_BILINEAR)
        if resample not in PIL_RESAMPLE_NAMES:
            raise ValueError(f"resample {resample} is not a PIL resampling filter")
        self.resample = resample
        if cfg.get("rescale_factor") not in (None, 1 / 255):
            raise ValueError(f"rescale_factor {cfg['rescale_factor']} is not 1/255; unsupported")
        if image_seq_length <= 0:
            raise ValueError(f"image_seq_length must be positive, got {image_seq_length}")
        self.image_seq_length = int(image_seq_length)
        d = PanAndScan()
        self.pan_and_scan = PanAndScan(
            enabled=bool(do_pan_and_scan),
            min_crop_size=int(pan_and_scan_min_crop_size or d.min_crop_size),
            max_num_crops=int(pan_and_scan_max_num_crops or d.max_num_crops),
            min_ratio_to_activate=float(pan_and_scan_min_ratio_to_activate or d.min_ratio_to_activate),
        )
        if self.pan_and_scan.min_crop_size <= 0 or self.pan_and_scan.max_num_crops < 2:
            raise ValueError(
                f"pan-and-scan needs min_crop_size > 0 and max_num_crops >= 2: {self.pan_and_scan}"
            )

    def special_tokens(self) -> list[str]:
        """The profile's tokens plus ``<start_of_turn>``, which the Gemma chat template writes."""
        return [*super().special_tokens(), START_OF_TURN]

    # ---- planning ----

    def plan_image(self, meta: MediaMeta) -> MediaPlan:
        """The whole image and its pan-and-scan crops, each one view of ``size`` stored at prepare time."""
        if not meta.height or not meta.width:
            raise MediaRejected("image size unknown or zero")
        boxes = pan_and_scan_boxes(meta.height, meta.width, self.pan_and_scan)
        if any(b <= t or r <= left for t, left, b, r in boxes):
            raise MediaRejected(f"pan-and-scan would cut an empty crop from {meta.height}x{meta.width}")
        views = ((0, 0, meta.height, meta.width), *boxes)
        return MediaPlan(
            kind="image",
            num_tokens=len(views) * self.image_seq_length,
            target_hw=self.size,
            vision_patches=len(views) * (self.size[0] // PATCH_SIZE) * (self.size[1] // PATCH_SIZE),
            info={"num_crops": len(boxes)},
            image_views=views,
            resample=PIL_RESAMPLE_NAMES[self.resample],
        )

    def expand(self, plan: MediaPlan) -> list[Segment]:
        if plan.kind != "image":
            raise MediaRejected(f"profile {self.name} cannot expand {plan.kind}")
        return image_block_segments(int(plan.info.get("num_crops", 0)), self.image_seq_length)

    def settings(self) -> dict[str, Any]:
        return {
            "size": list(self.size),
            "image_seq_length": self.image_seq_length,
            "resample": self.resample,
            "pan_and_scan": asdict(self.pan_and_scan),
            "normalize": {"mean": list(self.image_mean), "std": list(self.image_std)},
        }

    # ---- training cost model (profiles.cost) ----

    def cost_shapes(self) -> dict[str, TransformerShape]:
        """Gemma 3 4B: LM hidden 2560, 34 layers, 8/4 heads of 256, GeGLU 10240 (sliding-window layers are
        counted as full attention); SigLIP-So400m/14: 27 x 1152, 16 heads, GELU MLP 4304."""
        return {
            "lm": TransformerShape(hidden=2560, layers=34, heads=8, kv_heads=4, head_dim=256, ffn=10240),
            "vision": TransformerShape(hidden=1152, layers=27, heads=16, ffn=4304, gated_ffn=False),
        }

    def media_cost(self, plan: MediaPlan, shapes: dict[str, TransformerShape]) -> float:
        """SigLIP over each view (full attention within it), patch embedding, and the projector of each
        view's pooled soft tokens into the LM."""
        if plan.kind != "image":
            return super().media_cost(plan, shapes)
        vision, lm = shapes["vision"], shapes["lm"]
        views = 1 + int(plan.info.get("num_crops", 0))
        per_view = plan.vision_patches // views
        embed = 2.0 * 3 * PATCH_SIZE**2 * vision.hidden
        projector = 2.0 * vision.hidden * lm.hidden
        tower = encoder_flops(vision, views * per_view, blocks_pairs([per_view] * views))
        return tower + views * per_view * embed + plan.num_tokens * projector


PROFILE = Gemma3Profile
