"""hf: any Hugging Face multimodal model, its own processor deciding every count (``--profile hf``).

The model folder's ``AutoProcessor`` is run on each media item's shape: the text it substitutes for the item's
placeholder token (``return_text_replacement_offsets``) is the item's expansion, exactly as the processor
writes it, and the tokens in it that the model's features replace (``_find_feature_token``: Gemma 3's
``<image_soft_token>``, not the ``<start_of_image>`` its text holds) are the item's feature count. A count depends on the item's shape only
(an image's size, an audio clip's length in samples at the processor's ``sampling_rate``), so the processor
runs once per distinct shape (``cache_stats``), on a blank item of that shape (a black image, a silent
clip): a corpus of 10k images of 50 sizes calls it 50 times per process.

Audio is decoded by omnipack's own loader (``omnipack.media.audio``: mono, resampled to the rate the plan
carries, the feature extractor's ``sampling_rate``) and handed to the processor as that waveform.

Text is the checkpoint's chat template with the processor's replacement: runs of added tokens become token
segments, the text between them literal text (tokenized as the processor's one tokenization splits it, at
the added tokens). Labels come from the template's assistant turns as for every profile; a turn ends at the
first special token the template writes after an assistant's text.

Payloads: the write stage runs the processor on each decoded item alone (``store_media``) and stores its
non-text outputs (``pixel_values``, ``pixel_attention_mask``, ``input_features``, ``feature_attention_mask``,
... whatever it returns, in its dtype) as an npz, so the stored tensors are the processor's. How the
processor batches each key (the axis along which two items' outputs join: 1 for Idefics3's
``[1, tiles, 3, H, W]``, 0 for LLaVA's ``[images, 3, H, W]`` and Qwen2-Audio's ``[clips, mels, frames]``) is
found at start by running it on one and on two items, and recorded; the trainer half joins a micro-batch's
items along it, reading nothing but numpy. Keys shaped like the token ids (per-token inputs: Gemma 3's
``token_type_ids``) are not stored: each must be a function of the token ids, recorded as such and derived
from the packed tokens by the trainer half.
Stored per item, the outputs must not depend on the sample's other items: a probe item beside a smaller one
must give its outputs alone (joined as the loader joins them). Where they do (Gemma3n and Phi-4-multimodal
pad a sample's clips to the longest before computing features; LLaVA-OneVision tiles an image alone, not one
of several), that kind is run per sample's media set (``media_joint``, ``_find_joint_layout``): counts from
the processor on the sample's shapes together (``plan_sample``, cached by the tuple of shapes), arrays from
it on the sample's decoded items together, each item storing its rows (``store_sample_media``; images and
audio only: videos so are unplanned); else the processor is refused at start.

Video (``plan_video``): the processor is given a video as transformers' own decord reader gives it to a user,
``transformers.video_utils.load_video(path, backend="decord")``: the decoded frames and a ``VideoMetadata`` of the
file (``total_num_frames`` = decord's frame count, ``fps`` = its average rate, ``duration`` = frames / fps, the
frame size). omnipack decodes with decord too (``omnipack.media.video``), so its frame count, rate and frames are
that reader's; the processor's own ``sample_frames`` then picks the frames from that metadata, as it does for the
user. A count depends on (frames, height, width, fps) and the processor options only, so the planner runs the
processor once per such shape on a blank video (all-zero frames: only the sampled ones are ever read) and
reads off the expansion (GLM-4.6V's frame timestamps are part of its text), the stored arrays' shapes and the
frame indices it sampled (``return_metadata``). The write stage decodes just those frames and hands them to the
processor with that metadata, its ``frames_indices`` set to them and ``do_sample_frames=False``: what the
processor does after sampling the full video itself, so the stored ``pixel_values_videos``, ``video_grid_thw``
... and the timestamps are the ones it gives for the file. A processor whose videos cannot be planned so (a
probe fails) keeps its images and audio; its videos are rejected with the reason (``settings()["unplanned"]``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..media.audio import audio_samples_at
from ..media.errors import MediaRejected
from ..media.meta import MediaMeta
from .base import MediaPlan, ModelProfile, Segment
from .model_inputs import (
    EncoderInputs,
    MediaInputOptions,
    Payload,
    audio_waveform,
    item_info,
    item_kind,
    join_into_batch_tensor,
)

# What the processor gives for one item's shape: (placeholder count, expansion runs, stored arrays'
# ``{key: [shape, dtype]}``).
_Counted = tuple[int, list[list[Any]], dict[str, list[Any]]]

# A sentinel assistant answer: what the template writes right after it ends the turn.
_ANSWER = "omnipack probe answer"
# The probe items whose outputs, for one and for two of them, show how the processor batches each key; and a
# smaller one, beside which a probe item must give its outputs alone (padded as a batch pads). Shapes: an
# image's (height, width); a clip's (seconds,); a video's (frames, height, width, fps).
_PROBE_SHAPE = {"image": (224, 224), "audio": (1.0,), "video": (8, 64, 96, 4.0)}
_SMALL_SHAPE = {"image": (96, 160), "audio": (0.3,), "video": (4, 56, 56, 2.0)}


class _SampleDependent(ValueError):
    """A processor's outputs for an item differ with the sample's other items of its kind."""


def _first_sentence(e: Exception) -> str:
    """``Type: first sentence`` of an error whose message may start with a blank line and wrap (transformers'
    "X requires the Torchvision library but it was not found in your environment. Check out ...")."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text.split('. ')[0]}"


def with_token_regions(tokens: Any, values: Any, regions: list[tuple[Any, ...]]) -> Any:
    """``values`` (a tensor shaped like the ``[.., T]`` token tensor ``tokens``) with each region's values set
    on its tokens between its marks (from an open mark up to its close mark; the rows' whole token stream, so
    that a block's marks are both in it)."""
    for open_id, close_id, pairs in regions:
        depth = (tokens == open_id).cumsum(-1) - (tokens == close_id).cumsum(-1)
        for token_id, value in pairs:
            values[(depth > 0) & (tokens == token_id)] = value
    return values


class HFInputs(EncoderInputs):
    """Trainer half: the stored processor outputs as they are, under the processor's keys, joined per
    micro-batch along each key's recorded item axis. Placeholder tokens as the processor named them; an
    item's feature count is its recorded one, once its stored arrays have the shapes the processor gave for
    its size (the count is the processor's function of that size)."""

    name = "hf"

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.placeholder_tokens = {k: tuple(v) for k, v in settings["placeholder_tokens"].items()}
        # {kind: {key: item axis}}: what the processor returns per item, and how its batch joins items
        self.item_axes = {kind: dict(axes) for kind, axes in settings["media_arrays"].items()}
        self.batch_keys = tuple(dict.fromkeys(k for axes in self.item_axes.values() for k in axes))
        # {key: value} the processor pads a batch's other axes with, where not 0 (Phi-4-multimodal's masks: 1)
        self.pad_values = {k: float(v) for k, v in settings.get("media_pad_values", {}).items()}
        # {mask key: (key it masks, dtype, ndim)}: masks the processor gives for several items only (of a kind
        # stored from each sample's media set, ``HFProfile._find_joint_layout``)
        joint = settings.get("media_joint", {})
        self.joint_kinds = frozenset(joint)
        self.masks = {
            k: (str(of), np.dtype(dtype), int(ndim))
            for layout in joint.values()
            for k, (of, dtype, ndim) in layout["masks"].items()
        }
        # {key: [[token id, value], ...]}: the processor's per-token outputs, a function of the token ids
        self.token_values = {k: [(int(t), int(v)) for t, v in pairs] for k, pairs in settings.get("token_inputs", {}).items()}
        # {key: [[open id, close id, [[token id, value], ...]], ...]}: values a token takes between a kind's
        # marks instead (GLM-4.6V: ``<|image|>`` is 2 between ``<|begin_of_video|>`` and ``<|end_of_video|>``)
        self.token_regions = {k: [tuple(r) for r in regions] for k, regions in settings.get("token_regions", {}).items()}

    def stored_arrays(self, item: Any, payload: Payload) -> dict[str, np.ndarray]:
        """The item's stored arrays by key, checked against the keys of its kind and the shapes and dtypes its
        plan recorded (ValueError naming the difference)."""
        kind = item_kind(item)
        keys = self.item_axes.get(kind)
        if keys is None:
            raise ValueError(f"profile hf: the processor stored no arrays for {kind} media")
        planned = (item_info(item).get("info") or {}).get("stored_arrays") or {}
        if kind in self.joint_kinds:  # stored from its sample's media set: the keys its plan recorded
            if not set(planned) <= set(keys):
                raise ValueError(
                    f"its plan stores {sorted(planned)}, the processor's {kind} outputs are {sorted(keys)}"
                )
            keys = {k: keys[k] for k in planned}
        if not isinstance(payload, Mapping):  # a single stored array (how verify passes a one-key npz)
            if len(keys) != 1:
                raise ValueError(f"stored one array, the processor's {kind} outputs are {sorted(keys)}")
            payload = {next(iter(keys)): payload}
        if set(payload) != set(keys):
            raise ValueError(f"stores {sorted(payload)}, the processor's {kind} outputs are {sorted(keys)}")
        for k, (shape, dtype) in planned.items():
            v = payload.get(k)
            if v is None or tuple(v.shape) != tuple(shape) or np.dtype(v.dtype) != np.dtype(dtype):
                got = "nothing" if v is None else f"{tuple(v.shape)} {v.dtype}"
                raise ValueError(f"{k} stored {got}, the processor gives {tuple(shape)} {np.dtype(dtype)}")
        return {k: np.asarray(payload[k]) for k in keys}

    def feature_count(self, item: Any, payload: Payload) -> int:
        self.stored_arrays(item, payload)
        return int(item["num_tokens"] if isinstance(item, Mapping) else item.num_tokens)

    def media_inputs(self, item: Any, payload: Payload, options: MediaInputOptions) -> dict[str, Any]:
        return self.stored_arrays(item, payload)  # views of the stored bytes; collate_media copies them once

    def token_inputs(self, tokens: Any, placeholder_ids: Mapping[str, Any]) -> dict[str, Any]:
        """The processor's per-token outputs (``token_type_ids``, ``mm_token_type_ids``): each token's recorded
        value, 0 elsewhere, in the tokens' dtype (int64, as the processor's)."""
        out = {}
        for key, pairs in self.token_values.items():
            values = tokens.new_zeros(tokens.shape)
            for token_id, value in pairs:
                values[tokens == token_id] = value
            out[key] = values
        for key, regions in self.token_regions.items():
            out[key] = with_token_regions(tokens, out.get(key, tokens.new_zeros(tokens.shape)), regions)
        return out

    def collate_media(self, per_item: list[dict[str, Any]], options: MediaInputOptions) -> dict[str, Any]:
        """Items' arrays joined along each key's item axis, as the processor batches one sample's items (other
        axes padded to the largest with the processor's pad value, as it pads a batch)."""
        axes = {k: a for kind_axes in self.item_axes.values() for k, a in kind_axes.items()}
        per_item = self._with_masks(per_item)
        keys: list[str] = []
        for d in per_item:
            keys += [k for k in d if k not in keys]
        return {
            k: join_into_batch_tensor(
                [d[k] for d in per_item if k in d], axes[k], options.allocate, self.pad_values.get(k, 0)
            )
            for k in keys
        }

    def _with_masks(self, per_item: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Items with the masks the processor gives for several items only: where a micro-batch joins
        several items of the masked key, an item whose sample had one gets its mask as the processor would
        give it beside others (true over its own extent; the join pads it with false)."""
        for mask, (of, dtype, ndim) in self.masks.items():
            having = [d for d in per_item if of in d]
            if len(having) > 1 and any(mask not in d for d in having):
                per_item = [
                    {**d, mask: np.ones(np.shape(d[of])[:ndim], dtype)} if of in d and mask not in d else d
                    for d in per_item
                ]
        return per_item


class HFProfile(ModelProfile):
    """The model's own processor as the profile.

    Options: ``model_dir`` (the model folder holding the processor; a run sets it from ``--model`` / the
    tokenizer folder; without it the profile has no media kinds), ``processor_kwargs`` (a mapping passed to every processor call, e.g. ``{"do_image_splitting":
    false}``; part of the cache key by being the profile's), ``image_backend`` (``"pil"`` or ``"torchvision"``:
    the image processor's backend; by default transformers' choice, torchvision's where it is installed, whose
    resize rounds unlike PIL's: pinning it keeps a dataset's pixels independent of the install).
    """

    name = "hf"
    inputs_class = HFInputs
    processor_backed = True
    template_blocks: ClassVar[dict[str, tuple[str, ...]]] = {}  # per model: the processor's tokens

    def __init__(
        self,
        *,
        model_dir: str | Path | None = None,
        processor_kwargs: Mapping[str, Any] | None = None,
        image_backend: str | None = None,
    ):
        self.model_dir = None if model_dir is None else str(model_dir)
        self.processor_kwargs = dict(processor_kwargs or {})
        self.image_backend = image_backend
        # {(kind, *shape): _Counted, (kind, (shape, ...)): [_Counted, ...]}: an item's, a media set's
        self._expansions: dict[tuple[Any, ...], Any] = {}
        self.processor_calls: Counter[str] = Counter()
        self.cache_hits: Counter[str] = Counter()
        self.template_blocks = {}
        self.feature_tokens: dict[str, str] = {}  # {kind: the token the model's features replace}
        self.media_arrays: dict[str, dict[str, int]] = {}
        self.media_pad_values: dict[str, float] = {}  # {key: pad value} where the processor pads with no 0
        # {kind: {"per_sample": [key], "masks": {key: [key it masks, dtype]}}} of the kinds processed per
        # sample's media set (``_find_joint_layout``); {kind: {key: rows per item}} of their item axes
        self.media_joint: dict[str, dict[str, Any]] = {}
        self._joint_rows: dict[str, dict[str, int]] = {}
        self.token_inputs: dict[str, list[list[int]]] = {}  # {key: [[token id, value], ...]}
        self.token_regions: dict[str, list[list[Any]]] = {}  # {key: [[open id, close id, [[id, value], ...]]]}
        self.sampling_rate: int | None = None  # audio's: the rate clips are decoded at (the extractor's)
        self.unplanned: dict[str, str] = {}  # {kind: why} the processor's kinds whose items cannot be planned
        self._frame_indices: dict[tuple[Any, ...], tuple[int, ...]] = {}  # {video shape: frames it samples}
        if self.model_dir is None:  # no model: no media kinds (a run always passes the model folder)
            return
        self.processor = self._load_processor()
        tokenizer = getattr(self.processor, "tokenizer", None)
        if tokenizer is None or not hasattr(self.processor, "replace_image_token"):
            raise ValueError(f"profile hf: {type(self.processor).__name__} of {self.model_dir} is no multimodal processor")
        self.tokenizer = tokenizer
        self._tensors = "np"
        try:  # some processors return torch tensors only (AudioFlamingo3, GLM-ASR): read back as numpy
            self.processor(text=["omnipack"], return_tensors="np")
        except Exception:
            self._tensors = "pt"
        self.template_blocks = self._find_kinds()
        if "audio" in self.template_blocks:  # the rate omnipack decodes audio at: the one the extractor takes
            self.sampling_rate = int(self._audio_processor().sampling_rate)
        self.turn_end = self._find_turn_end()
        self._added = {int(i) for i in tokenizer.backend_tokenizer.get_added_tokens_decoder()}
        self._probe_videos()
        self.feature_tokens = {kind: self._find_feature_token(kind) for kind in self.template_blocks}
        self.media_arrays = {kind: self._find_media_layout(kind) for kind in self.template_blocks}
        self.token_inputs = self._find_token_inputs()
        self.token_regions = self._find_token_regions()

    def _load_processor(self) -> Any:
        """The model folder's processor, offline; its image processor built with ``image_backend`` if set."""
        from transformers import AutoImageProcessor, AutoProcessor

        try:
            given = {}
            if self.image_backend is not None:  # the sub-processor built with that backend, the rest as saved
                given["image_processor"] = AutoImageProcessor.from_pretrained(
                    self.model_dir, local_files_only=True, backend=self.image_backend
                )
            return AutoProcessor.from_pretrained(self.model_dir, local_files_only=True, **given)
        except Exception as e:  # a processor that can not be built here can not count anything
            raise ValueError(
                f"profile hf: the processor of {self.model_dir} cannot be loaded offline ({_first_sentence(e)})"
            ) from None

    def _audio_processor(self) -> Any:
        """The processor's audio front end (a feature extractor), None when it takes no audio."""
        return getattr(self.processor, "audio_processor", None) or getattr(self.processor, "feature_extractor", None)

    def _find_kinds(self) -> dict[str, tuple[str, ...]]:
        """{kind: (placeholder token,)} of the media kinds the processor takes: a placeholder token and the
        sub-processor that turns that kind into the model's inputs."""
        name = type(self.processor).__name__
        kinds = {}
        image_token = getattr(self.processor, "image_token", None)
        if image_token and hasattr(self.processor, "image_processor"):
            kinds["image"] = (str(image_token),)
        audio_token = getattr(self.processor, "audio_token", None)
        if audio_token and self._audio_processor() is not None:
            if not getattr(self._audio_processor(), "sampling_rate", None):
                raise ValueError(f"profile hf: the audio front end of {name} of {self.model_dir} names no sampling_rate")
            kinds["audio"] = (str(audio_token),)
        video_token = getattr(self.processor, "video_token", None)
        if video_token and getattr(self.processor, "video_processor", None) is not None:
            kinds["video"] = (str(video_token),)
        if not kinds:
            raise ValueError(f"profile hf: {name} of {self.model_dir} takes no images, videos or audio")
        return kinds

    def _probe_videos(self) -> None:
        """Drop video from the kinds, the reason kept in ``unplanned``, when the processor cannot be run on a
        video as ``plan_video`` runs it (the probes at start raise: no per-item layout, no sampled frames'
        indices): its images and audio stay usable. A video-only processor is refused."""
        if "video" not in self.template_blocks:
            return
        name = type(self.processor).__name__
        shape = self._shape("video", _PROBE_SHAPE["video"])
        try:
            self._find_feature_token("video")
            self._find_media_layout("video")
            try:  # the frames it samples, as ``_run_processor`` reads them
                out = self._call("video", [self._blank("video", shape)], return_metadata=True)
            except Exception as e:
                raise ValueError(f"profile hf: {name} of {self.model_dir} cannot process a video offline ({e})") from None
            try:
                self._sampled_frames(out, shape)
            except MediaRejected as e:
                raise ValueError(f"profile hf: {e}") from None
        except ValueError as e:
            if len(self.template_blocks) == 1:  # a video-only processor: refused at start, as for the other kinds
                raise
            self.unplanned["video"] = _first_sentence(e)
            self.template_blocks = {k: v for k, v in self.template_blocks.items() if k != "video"}

    def _find_feature_token(self, kind: str) -> str:
        """The token the model's features replace in a ``kind`` item's expansion. Not always the one the text
        holds: Gemma 3's text holds ``<start_of_image>``, which its processor expands to ``<start_of_image>``,
        256 ``<image_soft_token>`` and ``<end_of_image>``. Candidates, first one in a probe item's expansion
        wins: the model config's ``{kind}_token_id`` / ``{kind}_token_index`` (what its forward replaces), the
        tokenizer's ``{kind}_token`` (transformers' multimodal tokenizer attribute), the processor's."""
        name = type(self.processor).__name__
        candidates = [self._config_token(kind), getattr(self.tokenizer, f"{kind}_token", None)]
        candidates.append(self.template_blocks[kind][0])
        if kind == "video":  # frames written as images (GLM-4.6V: each frame's ``<|image|>`` run)
            candidates.append(getattr(self.processor, "image_token", None))
        blank = self._blank(kind, self._shape(kind, _PROBE_SHAPE[kind]))
        try:
            out = self._call(kind, [blank], return_text_replacement_offsets=True)
        except Exception as e:
            raise ValueError(f"profile hf: {name} of {self.model_dir} cannot process a sample's {kind}s offline ({e})") from None
        replacements = out.get("text_replacement_offsets") or [[]]
        if len(replacements[0]) != 1:
            raise ValueError(f"profile hf: {name} of {self.model_dir} reports no text replacement for an {kind}")
        expanded = {r[1] for r in self._runs(replacements[0][0]["replacement"], "") if r[0] == "token"}
        for token in candidates:
            if token and str(token) in expanded:
                return str(token)
        raise ValueError(
            f"profile hf: {name} of {self.model_dir} expands an {kind} to {sorted(expanded)}, none of them the "
            f"model's {kind} token ({[str(t) for t in candidates if t]})"
        )

    def _config_token(self, kind: str) -> str | None:
        """The token of the model config's ``{kind}_token_id`` / ``{kind}_token_index`` (None without one)."""
        path = Path(str(self.model_dir)) / "config.json"
        if not path.is_file():
            return None
        config = json.loads(path.read_text())
        token_id = config.get(f"{kind}_token_id", config.get(f"{kind}_token_index"))
        if not isinstance(token_id, int) or not 0 <= token_id < len(self.tokenizer):
            return None
        return str(self.tokenizer.convert_ids_to_tokens(token_id))

    def _call(self, kind: str, items: list[Any], text: str | None = None, **kwargs: Any) -> Any:
        """The processor on one text holding ``items`` (each at its placeholder; ``text``: that text, by
        default the placeholders alone), numpy outputs."""
        token = self.template_blocks[kind][0]
        out = self.processor(
            text=[token * len(items) if text is None else text],
            return_tensors=self._tensors,
            **self._media({kind: items}),
            **kwargs,
            **self.processor_kwargs,
        )
        return {k: v.numpy() if hasattr(v, "numpy") else v for k, v in out.items()}

    def _media(self, items: Mapping[str, list[Any]]) -> dict[str, Any]:
        """The processor's media arguments for one sample's ``{kind: items}``."""
        media: dict[str, Any] = {}
        for kind, some in items.items():
            if kind == "image":
                media["images"] = [some]
            elif kind == "video":  # (frames, metadata) pairs: fresh metadata dicts (the processor sets them)
                media.update(videos=[frames for frames, _ in some], video_metadata=[dict(m) for _, m in some])
            else:  # audio: float32 waveforms at the extractor's rate, said so (it warns or refuses otherwise)
                media.update(audio=some, sampling_rate=self.sampling_rate)
        return media

    def _blank(self, kind: str, shape: tuple[int, ...]) -> Any:
        """A blank item of ``shape``: a black (height, width) image, a silent clip of (samples,)."""
        if kind == "image":
            from PIL import Image

            height, width = shape
            return Image.new("RGB", (width, height))
        if kind == "video":  # np.zeros: pages never read (the frames a processor skips) take no memory
            return np.zeros((*shape[:3], 3), dtype=np.uint8), self._video_metadata(shape)
        return np.zeros(shape[0], dtype=np.float32)

    @staticmethod
    def _video_metadata(shape: tuple[Any, ...], frames: tuple[int, ...] | None = None) -> dict[str, Any]:
        """The ``VideoMetadata`` transformers' decord reader gives for a video of ``shape`` (frames, height,
        width, fps), as ``load_video(path, backend="decord")`` returns it; ``frames``: the decoded frames'
        indices (all of them by default, as that reader decodes them)."""
        n, height, width, fps = shape
        indices = list(range(int(n))) if frames is None else [int(i) for i in frames]
        return {
            "total_num_frames": int(n), "fps": float(fps), "width": int(width), "height": int(height),
            "duration": int(n) / float(fps), "video_backend": "decord", "frames_indices": indices,
        }  # fmt: skip

    @staticmethod
    def _describe(kind: str, shape: tuple[int, ...]) -> str:
        if kind == "video":
            return f"a video of {shape[0]} {shape[1]}x{shape[2]} frames at {shape[3]} fps"
        return f"a {shape[0]}x{shape[1]} image" if kind == "image" else f"a clip of {shape[0]} samples"

    def _find_item_axes(self, kind: str) -> dict[str, int]:
        """{key: item axis} of the processor's per-item outputs: the one axis along which its output for two
        (blank) items is its output for one, twice. Keys the text alone gives, or shaped like the token ids
        (per-token inputs), are no media outputs."""
        name = type(self.processor).__name__
        blank = self._blank(kind, self._shape(kind, _PROBE_SHAPE[kind]))
        try:
            one, two = (self._call(kind, [blank] * n) for n in (1, 2))
            text_keys = set(self.processor(text=["omnipack"], return_tensors=self._tensors))
        except Exception as e:
            raise ValueError(
                f"profile hf: {name} of {self.model_dir} cannot process a sample's {kind}s offline ({e})"
            ) from None
        axes = {}
        for k in one:
            if k in text_keys or k == "text_replacement_offsets":
                continue
            a, b = np.asarray(one[k]), np.asarray(two[k])
            if a.shape == np.shape(one["input_ids"]) and b.shape == np.shape(two["input_ids"]):
                continue  # per token, not per item
            diff = [d for d in range(a.ndim) if a.ndim == b.ndim and a.shape[d] != b.shape[d]]
            if len(diff) != 1 or not np.array_equal(b, np.concatenate([a, a], axis=diff[0])):
                raise _SampleDependent(
                    f"profile hf: {name} of {self.model_dir} returns {k!r} {a.shape} for one {kind} and "
                    f"{b.shape} for two, not one item axis: its outputs cannot be stored per {kind}"
                )
            axes[k] = diff[0]
        if not axes:
            raise ValueError(f"profile hf: {name} of {self.model_dir} returns no {kind} inputs")
        self._check_items_independent(kind, axes)
        return axes

    def _find_token_inputs(self) -> dict[str, list[list[int]]]:
        """{key: [[token id, value], ...]} of the processor's per-token outputs (shaped like the token ids:
        Gemma 3's ``token_type_ids``, the ``mm_token_type_ids`` of others), which the trainer half derives
        from the packed tokens; read off a sample holding an item of every kind, refused unless each is a
        function of the token ids (0 on text)."""
        name = type(self.processor).__name__
        outs = [self._call(kind, [self._blank(kind, self._shape(kind, _PROBE_SHAPE[kind]))]) for kind in self.template_blocks]
        found: dict[str, dict[int, int]] = {}
        for out in outs:
            ids = np.asarray(out["input_ids"])
            for k, v in out.items():
                v = np.asarray(v)
                if k in ("input_ids", "attention_mask") or v.shape != ids.shape or v.dtype.kind not in "iub":
                    continue
                values = found.setdefault(k, {})
                for token_id, value in zip(ids.reshape(-1).tolist(), v.reshape(-1).tolist(), strict=True):
                    if values.setdefault(int(token_id), int(value)) != int(value):
                        raise ValueError(
                            f"profile hf: {name} of {self.model_dir} gives per-token {k!r} that is no function of "
                            f"the token ids (token {token_id}: {values[int(token_id)]} and {value})"
                        )
        return {k: [[t, v] for t, v in sorted(values.items()) if v] for k, values in found.items()}

    def _template_marks(self, kind: str) -> tuple[str, str]:
        """The added tokens the chat template writes right before and after a ``kind`` item's placeholder
        (GLM-4.6V's ``<|begin_of_video|>``, ``<|end_of_video|>``); "" where it writes none."""
        token = self.template_blocks[kind][0]
        messages = [{"role": "user", "content": [{"type": kind, kind: "omnipack"}, {"type": "text", "text": "q"}]}]
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False)
        except Exception:  # a template that renders no such item: no marks to read
            return "", ""
        if token not in text:
            return "", ""
        before, after = text.split(token, 1)
        runs = self._runs(before, ""), self._runs(after, "")
        last = runs[0][-1] if runs[0] and runs[0][-1][0] == "token" else None
        first = runs[1][0] if runs[1] and runs[1][0][0] == "token" else None
        return ("" if last is None else last[1]), ("" if first is None else first[1])

    def _find_token_regions(self) -> dict[str, list[list[Any]]]:
        try:
            return self._read_token_regions()
        except ValueError:
            raise
        except Exception as e:  # a processor that fails on its own template's marks cannot be planned offline
            raise ValueError(
                f"profile hf: {type(self.processor).__name__} of {self.model_dir} cannot process a sample's media "
                f"in the chat template's marks offline ({_first_sentence(e)})"
            ) from None

    def _read_token_regions(self) -> dict[str, list[list[Any]]]:
        """{key: [[open id, close id, [[token id, value], ...]], ...]}: per-token outputs that differ between a
        kind's template marks from ``token_inputs`` (GLM-4.6V gives its ``<|image|>`` 2 in a video's block,
        1 in an image's), read off each item in its marks. Always checked on a sample of one item of every kind
        as the chat template writes it (marks not right beside the placeholder included, which the reading
        above misses): the values the trainer half derives must be the processor's, else it is refused."""
        found: dict[str, list[list[Any]]] = {}
        context = {kind: self._template_marks(kind) for kind in self.template_blocks}
        for kind, (open_mark, close_mark) in context.items():
            if not open_mark or not close_mark:
                continue
            blank = self._blank(kind, self._shape(kind, _PROBE_SHAPE[kind]))
            out = self._call(kind, [blank], text=open_mark + self.template_blocks[kind][0] + close_mark)
            ids = np.asarray(out["input_ids"]).reshape(-1).tolist()
            ends = [int(i) for i in self.tokenizer.convert_tokens_to_ids([open_mark, close_mark])]
            if ends[0] not in ids or ends[1] not in ids:
                raise ValueError(
                    f"profile hf: {type(self.processor).__name__} of {self.model_dir} drops the chat template's "
                    f"{kind} marks {open_mark!r} {close_mark!r} from its token ids"
                )
            a, b = ids.index(ends[0]) + 1, len(ids) - 1 - ids[::-1].index(ends[1])  # the tokens between the marks
            for key in self._per_token_keys(out):
                base = dict(map(tuple, self.token_inputs.get(key, [])))
                values = np.asarray(out[key]).reshape(-1).tolist()
                inside = {int(t): int(v) for t, v in zip(ids[a:b], values[a:b], strict=True) if v != base.get(t, 0)}
                if inside:
                    found.setdefault(key, []).append([*ends, sorted([t, v] for t, v in inside.items())])
        self._check_token_values(context, found)
        return found

    def _check_token_values(self, context: Mapping[str, tuple[str, str]], found: Mapping[str, list[list[Any]]]) -> None:
        """Refuse the processor unless its per-token outputs on a sample of one item of every kind (the chat
        template's text for it, else each item in its marks) are what the trainer half derives from the token
        ids with ``token_inputs`` and the ``found`` regions."""
        import torch

        items = {kind: [self._blank(kind, self._shape(kind, _PROBE_SHAPE[kind]))] for kind in context}
        text = self._template_text(list(context)) or "".join(
            o + self.template_blocks[kind][0] + c for kind, (o, c) in context.items()
        )
        out = self.processor(text=[text], return_tensors=self._tensors, **self._media(items), **self.processor_kwargs)
        out = {k: v.numpy() if hasattr(v, "numpy") else v for k, v in out.items()}
        tokens = torch.as_tensor(np.asarray(out["input_ids"]))
        for key in self._per_token_keys(out):
            values = tokens.new_zeros(tokens.shape)
            for token_id, value in self.token_inputs.get(key, []):
                values[tokens == token_id] = value
            derived = with_token_regions(tokens, values, [tuple(r) for r in found.get(key, [])]).numpy()
            if not np.array_equal(derived, np.asarray(out[key])):
                raise ValueError(
                    f"profile hf: {type(self.processor).__name__} of {self.model_dir} gives per-token {key!r} that "
                    "is no function of the token ids and the media marks right around the placeholders (a sample "
                    "of every kind as the chat template writes it)"
                )

    def _template_text(self, kinds: list[str]) -> str | None:
        """The chat template's text for a user turn of one item of each kind, None where it renders none or
        not exactly one placeholder per item."""
        content = [{"type": kind, kind: "omnipack"} for kind in kinds] + [{"type": "text", "text": "q"}]
        try:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False)
        except Exception:  # a template that renders no such items: the items in their marks instead
            return None
        placeholders = [self.template_blocks[kind][0] for kind in kinds]
        if len(set(placeholders)) != len(placeholders) or any(text.count(p) != 1 for p in placeholders):
            return None
        return str(text)

    @staticmethod
    def _per_token_keys(out: Mapping[str, Any]) -> list[str]:
        """The keys of a processor output that are per-token (shaped like the token ids, integer)."""
        ids = np.asarray(out["input_ids"])
        return [
            k for k, v in out.items()
            if k not in ("input_ids", "attention_mask") and np.shape(v) == ids.shape and np.asarray(v).dtype.kind in "iub"
        ]  # fmt: skip

    def _shape(self, kind: str, shape: tuple[float, ...]) -> tuple[Any, ...]:
        """A probe shape in the kind's units: (height, width) pixels; (seconds,) as samples at the rate;
        (frames, height, width, fps)."""
        if kind == "video":
            return (*(int(x) for x in shape[:3]), float(shape[3]))
        return tuple(int(x) for x in shape) if kind == "image" else (int(shape[0] * (self.sampling_rate or 0)),)

    def _content(self, kind: str, shape: tuple[int, ...]) -> Any:
        """A non-blank item of ``shape`` (a fixed noise image, a tone): padding shows unlike content."""
        if kind == "image":
            from PIL import Image

            return Image.fromarray(np.random.default_rng(0).integers(0, 255, (*shape, 3), dtype=np.uint8))
        if kind == "video":
            frames = np.random.default_rng(0).integers(0, 255, (*shape[:3], 3), dtype=np.uint8)
            return frames, self._video_metadata(shape)
        t = np.arange(shape[0], dtype=np.float32) / np.float32(self.sampling_rate or 1)
        return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)

    def _check_items_independent(self, kind: str, axes: Mapping[str, int]) -> None:
        """Refuse a processor whose outputs for an item depend on the sample's other items (e.g. one that
        pads every clip's waveform to the longest before computing features): stored per item, they could
        not be the processor's for the sample. Its outputs for a probe item and a smaller one together must
        be its outputs for each alone, joined as the loader joins them, its other axes padded with one value
        (the processor's, the same for blank items: a value that depends on the items is no pad value)."""
        name = type(self.processor).__name__
        big, small = (self._content(kind, self._shape(kind, s[kind])) for s in (_PROBE_SHAPE, _SMALL_SHAPE))
        blank = [self._blank(kind, self._shape(kind, s[kind])) for s in (_PROBE_SHAPE, _SMALL_SHAPE)]
        try:
            pair, *alone = (self._call(kind, items) for items in ([big, small], [big], [small]))
            blank_pair, *blank_alone = (self._call(kind, items) for items in (blank, blank[:1], blank[1:]))
        except Exception as e:
            raise ValueError(f"profile hf: {name} of {self.model_dir} cannot process a sample's {kind}s offline ({e})") from None
        for k, axis in axes.items():
            got = np.asarray(pair[k])
            parts = [np.asarray(a[k]) for a in alone]
            fill = self._pad_value(got, parts, axis)
            if fill != self._pad_value(np.asarray(blank_pair[k]), [np.asarray(a[k]) for a in blank_alone], axis):
                fill = 0  # padding that varies with the items' content: not the processor's pad value
            if fill:
                self.media_pad_values[k] = fill
            want = join_into_batch_tensor(parts, axis, fill=fill).numpy()
            if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
                raise _SampleDependent(
                    f"profile hf: {name} of {self.model_dir} gives an item other {k!r} beside a second {kind} "
                    f"than alone ({got.shape} together, {want.shape} alone, joined): its {kind} outputs depend on "
                    f"the sample's other items (padded before they are computed), so they cannot be stored per "
                    f"item as the processor's"
                )

    @staticmethod
    def _pad_value(batch: np.ndarray, parts: list[np.ndarray], axis: int) -> float:
        """The value the processor filled ``batch`` with where the joined ``parts`` leave padding (0 when it
        leaves none, or fills it with no single value)."""
        covered = [np.ones(p.shape, bool) for p in parts]
        if batch.shape != tuple(join_into_batch_tensor(covered, axis).shape):
            return 0
        padding = batch[~join_into_batch_tensor(covered, axis).numpy()]
        return float(padding.flat[0]) if padding.size and (padding == padding.flat[0]).all() else 0

    def _find_media_layout(self, kind: str) -> dict[str, int]:
        """{key: item axis} of the processor's ``kind`` outputs: stored per item where each item's outputs
        are its own alone (``_find_item_axes``), else stored from each sample's media set
        (``_find_joint_layout``) where that layout holds (images and audio); refused otherwise, with both
        reasons."""
        try:
            return self._find_item_axes(kind)
        except _SampleDependent as alone:
            if kind == "video":  # the per-sample layout plans images and audio only (``_item_plan``)
                raise ValueError(f"{alone}; nor per sample's media set: not supported for videos") from None
            try:
                return self._find_joint_layout(kind)
            except ValueError as joint:
                raise ValueError(f"{alone}; nor per sample's media set: {joint}") from None

    def _find_joint_layout(self, kind: str) -> dict[str, int]:
        """{key: item axis} of the outputs of a processor whose item outputs change with the sample's other
        items (Phi-4-multimodal and Gemma3n pad every clip's waveform to the longest before computing
        features; LLaVA-OneVision tiles an image alone, not one of several): each sample's items of the kind
        are processed together, as a user's call processes them, and each item stores its slice. Every key
        must be one of (read off one, two and three probe items, and two unlike ones):
        - per item: a fixed number of rows per item along one axis (sliced per item; the sample's slices
          joined are the processor's output, its padding included);
        - per sample: one row per text whatever its items (LLaVA-OneVision's ``batch_num_images``), stored
          with the sample's first item;
        - a mask the processor gives for several items only (Phi-4-multimodal's ``audio_attention_mask``):
          true exactly where another key's items extend alone; the trainer half builds it for items whose
          sample had one, when a micro-batch joins several.
        Records the layout in ``media_joint``; ValueError with the reason otherwise."""
        blank = self._blank(kind, self._shape(kind, _PROBE_SHAPE[kind]))
        big, small = (self._content(kind, self._shape(kind, s[kind])) for s in (_PROBE_SHAPE, _SMALL_SHAPE))
        try:
            one, two, three = (self._call(kind, [blank] * n) for n in (1, 2, 3))
            pair, *alone = (self._call(kind, items) for items in ([big, small], [big], [small]))
            text_keys = set(self.processor(text=["omnipack"], return_tensors=self._tensors))
        except Exception as e:
            raise ValueError(f"it cannot process them together ({e})") from None
        axes: dict[str, int] = {}
        rows, per_sample, masks = {}, [], {}
        for k in sorted(set(three) - text_keys - {"text_replacement_offsets"}):
            b, c = np.asarray(two[k]), np.asarray(three[k])
            if c.shape == np.shape(three["input_ids"]):
                continue  # per token, not per item
            diff = [d for d in range(c.ndim) if b.ndim == c.ndim and b.shape[d] != c.shape[d]]
            d = diff[0] if len(diff) == 1 else -1
            if b.shape == c.shape and c.shape[:1] == (1,) and np.shape(one.get(k)) == c.shape:
                axes[k] = 0
                per_sample.append(k)
            elif d >= 0 and 2 * c.shape[d] == 3 * b.shape[d] == 3 * np.shape(pair[k])[d]:
                axes[k], rows[k] = d, b.shape[d] // 2  # the same rows per item, whatever its size
            else:
                raise ValueError(
                    f"{k!r} is {b.shape} for two {kind}s and {c.shape} for three: neither per item nor per "
                    "sample"
                )
        only_one = sorted(set(one) - set(three) - text_keys - {"text_replacement_offsets"})
        if only_one:
            raise ValueError(f"it gives {only_one} for one {kind}, not for several")
        for k in [k for k in axes if k not in one]:
            masked = self._masked_key(k, axes, pair, alone)
            if masked is None:
                raise ValueError(f"it gives {k!r} for several {kind}s only, no mask of its other outputs")
            masks[k] = [masked, np.asarray(pair[k]).dtype.str, np.ndim(pair[k])]
        if not axes:
            raise ValueError(f"it returns no {kind} inputs")
        for k, axis in axes.items():  # what a micro-batch pads other samples' items with: the processor's
            self.media_pad_values.pop(k, None)
            if k in rows and k not in masks:
                fill = self._pad_value(np.asarray(pair[k]), [np.asarray(a[k]) for a in alone], axis)
                if fill:
                    self.media_pad_values[k] = fill
        self.media_joint[kind] = {"per_sample": per_sample, "masks": masks}
        self._joint_rows[kind] = rows
        return axes

    @staticmethod
    def _masked_key(
        mask: str, axes: Mapping[str, int], pair: Mapping[str, Any], alone: list[Mapping[str, Any]]
    ) -> str | None:
        """The key whose items' extent alone ``pair[mask]`` marks (true inside an item's own extent, false in
        the padding up to the longest), None when it marks none."""
        got = np.asarray(pair[mask])
        for k, axis in axes.items():
            if k == mask or axis != axes[mask] or axis >= got.ndim or any(k not in a for a in alone):
                continue
            covered = [np.ones(np.shape(a[k])[: got.ndim], got.dtype) for a in alone]
            if covered[0].ndim > 1 and np.array_equal(join_into_batch_tensor(covered, axis).numpy(), got):
                return k
        return None

    def _find_turn_end(self) -> str:
        """The first special token the chat template writes after an assistant's text (its end of turn)."""
        messages = [
            {"role": "user", "content": [{"type": "text", "text": "q"}]},
            {"role": "assistant", "content": [{"type": "text", "text": _ANSWER}]},
        ]
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False)
        except Exception as e:
            raise ValueError(f"profile hf: the chat template of {self.model_dir} cannot render a turn ({e})") from None
        after = text[text.index(_ANSWER) + len(_ANSWER) :]
        specials = set(self.tokenizer.all_special_ids) | {
            int(i) for i, t in self.tokenizer.added_tokens_decoder.items() if t.special
        }
        for tid in self.tokenizer(after, add_special_tokens=False)["input_ids"]:
            if tid in specials:
                return str(self.tokenizer.convert_ids_to_tokens(tid))
        if self.tokenizer.eos_token is None:
            raise ValueError(f"profile hf: the chat template of {self.model_dir} ends an assistant turn with no special token")
        return str(self.tokenizer.eos_token)

    @property
    def placeholder_tokens(self) -> dict[str, tuple[str, ...]]:
        return {kind: (token,) for kind, token in self.feature_tokens.items()}

    # ---- counts: the processor on the item's shape, once per shape ----

    def plan(self, meta: MediaMeta) -> MediaPlan:
        if meta.kind in self.unplanned:  # a kind the processor takes but this profile cannot plan: say why
            raise MediaRejected(f"profile hf cannot plan {meta.kind} inputs: {self.unplanned[meta.kind]}")
        if meta.kind in self.media_joint:  # an item alone: a media set of one
            return self.plan_sample([meta])[0]
        return super().plan(meta)

    def plan_image(self, meta: MediaMeta) -> MediaPlan:
        return self._item_plan(meta, self._expansion("image", self._item_shape(meta)))

    def plan_audio(self, meta: MediaMeta) -> MediaPlan:
        return self._item_plan(meta, self._expansion("audio", self._item_shape(meta)))

    def _item_shape(self, meta: MediaMeta) -> tuple[int, ...]:
        """What an item's count depends on: an image's (height, width); a clip's samples at the extractor's
        rate."""
        if meta.kind == "image":
            if not meta.height or not meta.width:
                raise MediaRejected("image size unknown or zero")
            return (meta.height, meta.width)
        return (audio_samples_at(meta, int(self.sampling_rate or 0)),)

    def _item_plan(self, meta: MediaMeta, counted: _Counted, **info: Any) -> MediaPlan:
        """The plan of an item the processor counted: its expansion and the arrays it gives for it
        (``{key: [shape, dtype]}``, what is stored), decoded as the processor takes it."""
        count, runs, arrays = counted
        info = {"expansion": runs, "stored_arrays": arrays, **info}
        if meta.kind == "image":
            return MediaPlan(
                kind="image",
                num_tokens=count,
                target_hw=(meta.height, meta.width),  # decoded at its own size: the processor's input
                vision_patches=count,  # the encoder's cost, in features (the processor names no patch count)
                info=info,
            )
        return MediaPlan(
            kind="audio",
            num_tokens=count,
            sample_rate=self.sampling_rate,  # decoded (resampled) at the processor's rate: its input
            num_audio_samples=self._item_shape(meta)[0],
            audio_frames=count,  # the encoder's cost, in features (the processor names no frame count)
            info=info,
        )

    def plan_video(self, meta: MediaMeta) -> MediaPlan:
        """The frames the processor samples from the file's metadata, decoded at the file's size (its input),
        and its expansion for them (frame timestamps included)."""
        if not meta.num_frames or not meta.fps or not meta.height or not meta.width:
            raise MediaRejected("video frame count, fps or size unknown or zero")
        shape = (int(meta.num_frames), int(meta.height), int(meta.width), float(meta.fps))
        count, runs, arrays = self._expansion("video", shape)
        return MediaPlan(
            kind="video",
            num_tokens=count,
            target_hw=(meta.height, meta.width),
            frame_indices=self._frame_indices[shape],  # the processor's choice, repeats included
            vision_patches=count,  # the encoder's cost, in features (the processor names no patch count)
            # the file's VideoMetadata, given to the processor at write time with the frames' indices set
            info={"expansion": runs, "stored_arrays": arrays, "video_metadata": self._video_metadata(shape, ())},
        )

    def _expansion(self, kind: str, shape: tuple[int, ...]) -> _Counted:
        return self._once(kind, (kind, *shape), lambda: self._run_processor(kind, shape))

    def _once(self, kind: str, key: tuple[Any, ...], run: Callable[[], Any]) -> Any:
        """``run()`` (a processor call) once per ``key`` in this process; its calls and hits counted per kind."""
        found = self._expansions.get(key)
        if found is not None:
            self.cache_hits[kind] += 1
            return found
        self.processor_calls[kind] += 1
        found = self._expansions[key] = run()
        return found

    def _run_processor(self, kind: str, shape: tuple[int, ...]) -> _Counted:
        """The processor on one blank item of ``shape``: (placeholder count, expansion runs, its stored
        arrays' ``{key: [shape, dtype]}``)."""
        token = self.feature_tokens[kind]
        sampled = {"return_metadata": True} if kind == "video" else {}  # the frames its sampling picks
        try:
            out = self._call(kind, [self._blank(kind, shape)], return_text_replacement_offsets=True, **sampled)
        except Exception as e:  # the processor refuses this shape: a reject with its reason
            raise MediaRejected(
                f"the {type(self.processor).__name__} refuses {self._describe(kind, shape)}: {e}"
            ) from None
        replacements = out.get("text_replacement_offsets") or [[]]
        if len(replacements[0]) != 1:
            raise ValueError(f"profile hf: {type(self.processor).__name__} reports no text replacement for an {kind}")
        runs = self._runs(replacements[0][0]["replacement"], token)
        count = sum(r[2] for r in runs if r[0] == "token" and r[3])
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if count != sum(int(i) == token_id for i in out["input_ids"][0]):  # the processor's own tokenization
            raise ValueError(f"profile hf: the {kind} replacement text and the processor's ids disagree")
        arrays = {k: [list(v.shape), v.dtype.str] for k, v in self._media_outputs(kind, out).items()}
        if kind == "video":
            self._frame_indices[shape] = self._sampled_frames(out, shape)
        return count, runs, arrays

    def _sampled_frames(self, out: Mapping[str, Any], shape: tuple[Any, ...]) -> tuple[int, ...]:
        """The indices of the frames the processor sampled from a video of ``shape`` (its ``return_metadata``
        output; all frames where it names none)."""
        try:
            frames = out["video_metadata"][0]["frames_indices"]
        except (KeyError, IndexError, TypeError):
            raise MediaRejected(
                f"the {type(self.processor).__name__} returns no video_metadata frames_indices for "
                f"{self._describe('video', shape)} (return_metadata=True): the frames it samples are unknown"
            ) from None
        return tuple(range(shape[0]) if frames is None else (int(i) for i in frames))

    def _media_outputs(self, kind: str, out: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The processor's outputs for the item (the keys found at start)."""
        missing = [k for k in self.media_arrays[kind] if k not in out]
        if missing:
            raise MediaRejected(f"the {type(self.processor).__name__} returns no {missing} for this {kind}")
        return {k: np.asarray(out[k]) for k in self.media_arrays[kind]}

    def store_media(self, plan: MediaPlan, decoded: Any) -> dict[str, np.ndarray]:
        """The processor's outputs for this decoded item alone: what the model's forward takes for it
        (``decoded``: an image's uint8 [H, W, 3]; a clip's stored waveform at the plan's rate)."""
        kind = plan.kind
        item = self._processor_item(plan, decoded)
        # a video's frames are the ones the processor sampled (``item``'s metadata says which)
        given: dict[str, Any] = {"do_sample_frames": False} if kind == "video" else {}
        token_id = self.tokenizer.convert_tokens_to_ids(self.feature_tokens[kind])
        try:
            out = self._call(kind, [item], **given)
        except Exception as e:
            raise MediaRejected(f"the {type(self.processor).__name__} refuses this {kind}: {e}") from None
        count = int((np.asarray(out["input_ids"]) == token_id).sum())
        if count != plan.num_tokens:  # the processor counts this item unlike a blank one of its shape
            raise MediaRejected(
                f"the processor gives {count} placeholders for this {kind}, the plan {plan.num_tokens}"
            )
        arrays = self._media_outputs(kind, out)
        planned = plan.info.get("stored_arrays") or {}
        for k, v in arrays.items():
            if k in planned and [list(v.shape), v.dtype.str] != list(planned[k]):
                raise MediaRejected(
                    f"the processor gives {k} {v.shape} {v.dtype} for this {kind}, the plan {planned[k]}"
                )
        return arrays

    def _processor_item(self, plan: MediaPlan, decoded: Any) -> Any:
        """A decoded item as the processor takes it: an image's uint8 [H, W, 3] as a PIL image; a video's
        sampled frames with the file's metadata; a clip's stored waveform as float32 at the processor's rate,
        checked against the plan."""
        if plan.kind not in self.template_blocks:
            raise MediaRejected(f"profile hf does not store {plan.kind} inputs")
        if plan.kind == "image":
            from PIL import Image

            return Image.fromarray(np.asarray(decoded, dtype=np.uint8))
        if plan.kind == "video":
            return self._planned_video(plan, decoded)
        item = audio_waveform(decoded)
        if plan.sample_rate != self.sampling_rate or item.shape != (plan.num_audio_samples,):
            raise MediaRejected(
                f"audio decoded to {item.shape[0]} samples at {plan.sample_rate} Hz, the processor takes "
                f"{self.sampling_rate} Hz and the plan {plan.num_audio_samples} samples"
            )
        return item

    @staticmethod
    def _planned_video(plan: MediaPlan, decoded: Any) -> tuple[np.ndarray, dict[str, Any]]:
        """(frames, metadata) of a decoded video (``decoded``: its stored npz, ``frames`` uint8 [T, H, W, 3]
        at the plan's indices): the file's metadata with ``frames_indices`` those indices."""
        frames = np.asarray(decoded["frames"] if isinstance(decoded, Mapping) else decoded, dtype=np.uint8)
        frames = np.require(frames, requirements="W")  # a copy of a read-only view: torch takes writable arrays
        indices = plan.frame_indices or ()
        if frames.ndim != 4 or frames.shape[0] != len(indices) or frames.shape[1:3] != tuple(plan.target_hw or ()):
            raise MediaRejected(
                f"video decoded to frames {frames.shape}, the plan samples {len(indices)} frames of {plan.target_hw}"
            )
        return frames, {**plan.info["video_metadata"], "frames_indices": list(indices)}

    def _runs(self, text: str, placeholder: str) -> list[list[Any]]:
        """``text`` as runs: ``["token", token, count, is_placeholder]`` for added tokens (where the tokenizer
        splits first), ``["text", literal]`` between them."""
        enc = self.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
        runs: list[list[Any]] = []
        at = 0
        for tid, (a, b) in zip(enc.ids, enc.offsets, strict=True):
            if tid not in self._added:
                continue
            if a > at:
                runs.append(["text", text[at:a]])
            tok = str(self.tokenizer.convert_ids_to_tokens(tid))
            if runs and runs[-1][0] == "token" and runs[-1][1] == tok:
                runs[-1][2] += 1
            else:
                runs.append(["token", tok, 1, tok == placeholder])
            at = b
        if at < len(text):
            runs.append(["text", text[at:]])
        return runs

    def expand(self, plan: MediaPlan) -> list[Segment]:
        runs = plan.info.get("expansion")
        if runs is None:
            raise MediaRejected(f"profile {self.name}: the plan of this {plan.kind} holds no expansion")
        return [
            Segment(token=r[1], count=int(r[2]), placeholder=bool(r[3])) if r[0] == "token" else Segment(text=r[1])
            for r in runs
        ]

    # ---- kinds processed per sample's media set (``media_joint``): counts and arrays of the set at once ----

    def plan_sample(self, metas: list[MediaMeta]) -> list[MediaPlan]:
        """Each item's plan: alone, or for a kind in ``media_joint`` from the processor on the sample's items
        of that kind together (once per distinct tuple of their shapes)."""
        plans: list[MediaPlan | None] = [None] * len(metas)
        joint: dict[str, list[int]] = {}
        for i, meta in enumerate(metas):
            if meta.kind in self.media_joint:
                joint.setdefault(meta.kind, []).append(i)
            else:
                plans[i] = self.plan(meta)
        for kind, at in joint.items():
            shapes = tuple(self._item_shape(metas[i]) for i in at)
            for n, (i, counted) in enumerate(zip(at, self._joint_expansion(kind, shapes), strict=True)):
                # its place in the set: the writer stores it with the others (never from the sample store)
                plans[i] = self._item_plan(metas[i], counted, sample_joint=[n, len(at)])
        done = [p for p in plans if p is not None]
        assert len(done) == len(plans), "profile hf: an item left unplanned"
        return done

    def _joint_expansion(self, kind: str, shapes: tuple[tuple[int, ...], ...]) -> list[_Counted]:
        return self._once(kind, (kind, shapes), lambda: self._run_processor_joint(kind, shapes))

    def _run_processor_joint(self, kind: str, shapes: tuple[tuple[int, ...], ...]) -> list[_Counted]:
        """The processor on blank items of ``shapes`` together: each one's (placeholder count, expansion runs,
        stored arrays' ``{key: [shape, dtype]}``)."""
        name = type(self.processor).__name__
        try:
            blanks = [self._blank(kind, s) for s in shapes]
            out = self._call(kind, blanks, return_text_replacement_offsets=True)
        except Exception as e:  # the processor refuses this set: a reject with its reason
            items = ", ".join(self._describe(kind, s) for s in shapes)
            raise MediaRejected(f"the {name} refuses {items} together: {e}") from None
        replacements = (out.get("text_replacement_offsets") or [[]])[0]
        if len(replacements) != len(shapes):
            raise ValueError(
                f"profile hf: {name} reports {len(replacements)} text replacements for {len(shapes)} {kind}s"
            )
        counted = []
        for replacement, arrays in zip(replacements, self._joint_outputs(kind, out, len(shapes)), strict=True):
            count, runs = self._placeholder_runs(replacement["replacement"], kind)
            counted.append((count, runs, {k: [list(v.shape), v.dtype.str] for k, v in arrays.items()}))
        token_id = self.tokenizer.convert_tokens_to_ids(self.feature_tokens[kind])
        if sum(c[0] for c in counted) != int((np.asarray(out["input_ids"]) == token_id).sum()):
            raise ValueError(f"profile hf: the {kind} replacement texts and the processor's ids disagree")
        return counted

    def _placeholder_runs(self, replacement: str, kind: str) -> tuple[int, list[list[Any]]]:
        """An item's replacement text as runs, and the placeholders among them."""
        runs = self._runs(replacement, self.feature_tokens[kind])
        return sum(r[2] for r in runs if r[0] == "token" and r[3]), runs

    def _joint_outputs(self, kind: str, out: Mapping[str, Any], n: int) -> list[dict[str, np.ndarray]]:
        """The processor's outputs for a sample's ``n`` items of ``kind`` as each item stores them: its rows
        of each per-item key, and the per-sample keys with the first item."""
        name = type(self.processor).__name__
        layout = self.media_joint[kind]
        items: list[dict[str, np.ndarray]] = [{} for _ in range(n)]
        for k, axis in self.media_arrays[kind].items():
            if k not in out:
                if k in layout["masks"] and n == 1:
                    continue  # a mask of several items' padding: none for one
                raise MediaRejected(f"the {name} returns no {k!r} for {n} {kind}s")
            v = np.asarray(out[k])
            if k in layout["per_sample"]:
                items[0][k] = v
                continue
            rows = self._joint_rows[kind][k]
            if v.shape[axis] != n * rows:
                raise MediaRejected(
                    f"the {name} gives {k!r} {v.shape} for {n} {kind}s, not {rows} per {kind} on axis {axis}"
                )
            for i, item in enumerate(items):
                item[k] = np.ascontiguousarray(np.take(v, np.arange(i * rows, (i + 1) * rows), axis=axis))
        return items

    def store_sample_media(self, plans: list[MediaPlan], decoded: list[Any]) -> list[dict[str, np.ndarray]]:
        """Each item's stored arrays: alone (``store_media``), or for a kind in ``media_joint`` its slice of
        the processor's outputs for the sample's items of that kind together."""
        stored: list[dict[str, np.ndarray] | None] = [None] * len(plans)
        joint: dict[str, list[int]] = {}
        for i, (plan, item) in enumerate(zip(plans, decoded, strict=True)):
            if plan.kind in self.media_joint:
                joint.setdefault(plan.kind, []).append(i)
            else:
                stored[i] = self.store_media(plan, item)
        for kind, at in joint.items():
            arrays = self._store_joint(kind, [plans[i] for i in at], [decoded[i] for i in at])
            for i, item_arrays in zip(at, arrays, strict=True):
                stored[i] = item_arrays
        done = [s for s in stored if s is not None]
        assert len(done) == len(stored), "profile hf: an item left unstored"
        return done

    def _store_joint(
        self, kind: str, plans: list[MediaPlan], decoded: list[Any]
    ) -> list[dict[str, np.ndarray]]:
        """The processor's outputs for a sample's decoded items of ``kind`` together, sliced per item, checked
        against each one's plan (its placeholders and its arrays' shapes)."""
        name = type(self.processor).__name__
        if [p.info.get("sample_joint") for p in plans] != [[n, len(plans)] for n in range(len(plans))]:
            raise MediaRejected(f"this sample's {kind} plans are not of its {len(plans)} {kind}s together")
        items = [self._processor_item(plan, item) for plan, item in zip(plans, decoded, strict=True)]
        try:
            out = self._call(kind, items, return_text_replacement_offsets=True)
        except Exception as e:
            raise MediaRejected(f"the {name} refuses this sample's {kind}s: {e}") from None
        replacements = (out.get("text_replacement_offsets") or [[]])[0]
        arrays = self._joint_outputs(kind, out, len(items))
        if len(replacements) != len(items):
            raise MediaRejected(
                f"the {name} reports {len(replacements)} text replacements for {len(items)} {kind}s"
            )
        for n, (plan, replacement, got) in enumerate(zip(plans, replacements, arrays, strict=True)):
            count, _ = self._placeholder_runs(replacement["replacement"], kind)
            shapes = {k: [list(v.shape), v.dtype.str] for k, v in got.items()}
            if count != plan.num_tokens or shapes != plan.info.get("stored_arrays"):
                raise MediaRejected(
                    f"the processor gives {kind} {n} of this sample {count} placeholders and {shapes}, its plan "
                    f"{plan.num_tokens} and {plan.info.get('stored_arrays')}"
                )
        return arrays

    def cache_stats(self) -> dict[str, dict[str, int]]:
        """Per media kind: processor calls and cache hits of this process so far."""
        return {
            kind: {"processor_calls": self.processor_calls[kind], "cache_hits": self.cache_hits[kind]}
            for kind in sorted(set(self.processor_calls) | set(self.cache_hits))
        }

    def settings(self) -> dict[str, Any]:
        return {
            "model_dir": self.model_dir,
            "processor_class": type(self.processor).__name__ if self.model_dir else None,
            "processor_kwargs": self.processor_kwargs,
            # the tokens the model's features replace; the text's (the chat template's) where they differ
            "placeholder_tokens": {k: [v] for k, v in self.feature_tokens.items()},
            "template_blocks": {k: list(v) for k, v in self.template_blocks.items()},
            "media_arrays": self.media_arrays,
            "media_pad_values": self.media_pad_values,  # {key: value} the trainer half pads with, where not 0
            "media_joint": self.media_joint,  # the kinds stored from each sample's media set, see there
            "image_backend": self.image_backend,
            "image_processor_class": (
                type(self.processor.image_processor).__name__ if "image" in self.template_blocks else None
            ),
            "token_inputs": self.token_inputs,  # per-token outputs: {key: [[token id, value], ...]}, 0 elsewhere
            "token_regions": self.token_regions,  # their values between a kind's marks, where they differ
            "sampling_rate": self.sampling_rate,  # audio's (None without audio): what clips were decoded at
            "unplanned": self.unplanned,  # {kind: why} the processor's kinds this profile rejects
            "turn_end": self.turn_end,
        }


PROFILE = HFProfile
