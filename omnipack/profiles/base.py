"""What a model profile is: the model-specific rules as pure functions of media metadata.

A family has two halves, both in its one module ``omnipack/profiles/<name>.py``:

- the offline planner, :class:`ModelProfile` (this module): for one media item, how it is materialised
  (target size, sampled frames, sample rate), how many placeholder tokens it expands to, which tokens the
  chat template writes for it, mRoPE positions and training cost. Used by ``omnipack prepare``/``verify``.
- the trainer side, :class:`omnipack.profiles.model_inputs.EncoderInputs`: stored payloads -> encoder inputs,
  built from the settings the planner recorded in ``omnipack.json``. The loader uses only this half.

Nothing outside ``omnipack/profiles`` knows which model it serves; the registry
(``omnipack.profiles.get_profile``) finds a family by importing the module of that name.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..media.errors import MediaRejected
from ..media.meta import MediaMeta
from ..media.storage_plan import StoragePlan
from .cost import CostModel, TransformerShape, build_cost_model
from .model_inputs import EncoderInputs


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
    # Image storage beyond one whole-image resize (None: the whole image at ``target_hw``, stored [H, W, 3]):
    # (top, left, bottom, right) boxes of the decoded upright image, each resized to ``target_hw`` and stored
    # as one view of a [V, H, W, 3] payload (e.g. a fixed-size whole view plus crops of the original).
    image_views: tuple[tuple[int, int, int, int], ...] | None = None
    # The resize filter, a PIL resampling name ("bilinear", ...); None: ``omnipack.media.image.RESAMPLE``.
    resample: str | None = None
    # Audio under a profile's length cap (e.g. Nemotron's 30 s): whether the clip is longer and cut to
    # ``num_audio_samples``; None: the profile caps no length. The row's media info records it as "truncated".
    truncate: bool | None = None

    # Optional storage fields, left out of the JSON when unset (plans without them record what they did).
    _OPTIONAL: ClassVar[dict[str, Any]] = {"image_views": None, "resample": None, "truncate": None}

    @property
    def storage(self) -> StoragePlan:
        """What the writer decodes and stores for this item (the media decoders' typed input)."""
        return StoragePlan(
            kind=self.kind,
            target_hw=self.target_hw,
            frame_indices=self.frame_indices,
            sample_rate=self.sample_rate,
            # a video stores its own audio track only when its block interleaves that audio
            num_audio_samples=self.num_audio_samples if self.kind != "video" or self.audio_num_tokens else None,
            image_views=self.image_views,
            resample=self.resample,
            truncate=bool(self.truncate),
        )

    @property
    def recorded_info(self) -> dict[str, Any]:
        """The profile's ``info`` as a row's media info records it: with "truncated" under a length cap."""
        return self.info if self.truncate is None else {**self.info, "truncated": self.truncate}

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if d["image_views"] is not None:
            d["image_views"] = [list(b) for b in d["image_views"]]
        return {
            k: (list(v) if isinstance(v, tuple) else v)
            for k, v in d.items()
            if not (k in self._OPTIONAL and v == self._OPTIONAL[k])
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MediaPlan:
        kw = dict(d)
        for k in ("grid_thw", "target_hw", "frame_indices"):
            if kw.get(k) is not None:
                kw[k] = tuple(kw[k])
        if kw.get("image_views") is not None:
            kw["image_views"] = tuple(tuple(int(x) for x in b) for b in kw["image_views"])
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
    """The offline planner of a model family.

    A family module ``omnipack/profiles/<name>.py`` defines a subclass with ``name = "<name>"`` and its
    trainer half ``inputs_class`` (an ``EncoderInputs`` subclass, whose members ``omnipack.profiles.model_inputs``
    documents), and registers the planner as the module attribute ``PROFILE``. Nothing else names the
    family. The interface, member by member ("must" = no default); ``tests/test_family_conformance.py``
    checks every registered family against it:

    Class attributes
        ``name`` (must): the profile name, the module's name. ``inputs_class`` (must): the trainer half.
        ``template_blocks`` (must): ``{kind: tokens}`` the chat template writes for one media item; its
        keys are the kinds the family takes (``kinds``). ``turn_start`` / ``turn_end`` (default ChatML
        ``<|im_start|>`` / ``<|im_end|>``): turn markers; ``turn_end`` is the last supervised token of an
        assistant turn. ``expansion_tokens`` (default none): special tokens an expansion writes beyond the
        template blocks. ``chat_template`` (default None: ChatML with ``template_blocks``): the demo
        tokenizer's template when the family's turns are not ChatML.

    Construction
        ``__init__(**options)``: the family's options (``prepare --profile-option``); ValueError for a
        bad one.

    Per media item, in measure (prepare) and verify
        ``plan(meta) -> MediaPlan`` (inherited): dispatches to ``plan_<kind>(meta)``, which the family must
        define for every kind of ``template_blocks`` (default: ``MediaRejected``); it decides the stored
        form (target size, frames, sample rate, views) and ``num_tokens``; ``MediaRejected`` with the
        reason for an item it cannot take.
        ``expand(plan) -> list[Segment]`` (abstract): the tokens that replace ``template_blocks[kind]``;
        the placeholder segments' counts add up to ``plan.num_tokens``.
        ``media_cost(plan, shapes) -> float`` and ``cost_shapes()`` (default: ValueError, no cost model):
        encoder forward FLOPs for balanced packing.

    Per sample, in measure: ``plan_sample(metas) -> list[MediaPlan]`` (default: ``plan`` of each item): the
        plans of a sample's media items together, for a family whose counts depend on the sample's media set
        (a processor that treats an image alone unlike one of several).

    Per media item, in write
        ``store_media(plan, decoded) -> {name: array}`` (default: none, the decoded media are stored): the
        arrays a family stores instead, e.g. its processor's own tensors.
        ``store_sample_media(plans, decoded) -> [{name: array}]`` (default: ``store_media`` of each item):
        the same for a sample's items at once (the writer calls this one). A plan whose ``info`` holds
        ``"sample_joint"`` is stored from its sample's whole media set: the writer never reuses it from the
        sample store (its arrays may depend on the sample's other items).

    Per sample
        ``mrope_position_ids(input_ids, spans)`` (default None: 1-D positions): ``int32 [3, L]`` mRoPE ids.

    Once per dataset
        ``settings() -> dict`` (abstract): JSON-able settings recorded in ``omnipack.json``, everything
        ``inputs_class.from_settings`` reads (the trainer half is rebuilt from them).
    """

    name: ClassVar[str]
    # The trainer half: rebuilt from ``settings()`` (as recorded in omnipack.json) by the loader.
    inputs_class: ClassVar[type[EncoderInputs]]
    # Text the chat template emits for one media item of each kind (a run of special tokens).
    template_blocks: ClassVar[dict[str, tuple[str, ...]]]
    # Start-of-turn marker, followed by the role (``omnipack inspect`` finds turns by it).
    turn_start: ClassVar[str] = "<|im_start|>"
    # End-of-turn marker: the last supervised token of an assistant turn.
    turn_end: ClassVar[str] = "<|im_end|>"
    # Special tokens an expansion writes beyond the template blocks (e.g. Nemotron's <img>, </img>).
    expansion_tokens: ClassVar[tuple[str, ...]] = ()
    # The family's own chat template when its turns are not ChatML (demo tokenizers are built with it; a
    # real checkpoint's tokenizer carries its own). None: the demo's ChatML template with ``template_blocks``.
    chat_template: ClassVar[str | None] = None
    # The ``model_type`` values (a checkpoint's config.json) this family serves: a model folder picks it by them.
    model_types: ClassVar[tuple[str, ...]] = ()
    # True for a profile that runs a checkpoint's own HF processor (it needs a model folder to plan anything);
    # False for a native family, whose rules are pure functions of media metadata.
    processor_backed: ClassVar[bool] = False
    # Options a checkpoint's config.json sets when the profile is chosen from it (not over options given):
    # option -> the keys leading to its value there (e.g. Qwen2.5-VL's vision_config.tokens_per_second).
    model_config_options: ClassVar[dict[str, tuple[str, ...]]] = {}

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

    def plan_sample(self, metas: list[MediaMeta]) -> list[MediaPlan]:
        """The plans of one sample's media items, in order (default: each item's ``plan`` alone)."""
        return [self.plan(meta) for meta in metas]

    def mrope_position_ids(self, input_ids: Any, spans: list[MediaSpan]) -> Any | None:
        """Per-sample 3-D rotary position ids ``int32 [3, L]`` for mRoPE models; None if not used."""
        return None

    @classmethod
    def uses_mrope(cls) -> bool:
        """Whether the family writes mRoPE position ids (it overrides ``mrope_position_ids``)."""
        return cls.mrope_position_ids is not ModelProfile.mrope_position_ids

    def store_media(self, plan: MediaPlan, decoded: Any) -> dict[str, np.ndarray]:
        """The named arrays the write stage stores for one item instead of its decoded media (``decoded``:
        the array(s) the plan's storage gives, e.g. uint8 [H, W, 3] for an image). Default: not overridden,
        the decoded media are stored as they are (``stores_own_media``). ``MediaRejected`` rejects the
        sample with its reason."""
        raise NotImplementedError(f"profile {self.name} stores its media as decoded")

    def store_sample_media(self, plans: list[MediaPlan], decoded: list[Any]) -> list[dict[str, np.ndarray]]:
        """The named arrays stored for each of a sample's items (``plans`` and their ``decoded`` media, in
        order). Default: ``store_media`` of each item alone."""
        return [self.store_media(plan, item) for plan, item in zip(plans, decoded, strict=True)]

    @classmethod
    def stores_own_media(cls) -> bool:
        """Whether the family stores arrays of its own per item (it overrides ``store_media``)."""
        return cls.store_media is not ModelProfile.store_media

    @property
    def placeholder_tokens(self) -> dict[str, tuple[str, ...]]:
        """Placeholder tokens of a block of each kind (the trainer half's, which counts the features)."""
        return self.inputs_class.placeholder_tokens

    def inputs(self) -> EncoderInputs:
        """The trainer half for this planner's settings (what a loader builds from omnipack.json)."""
        cached = self.__dict__.get("_inputs")
        if cached is None:
            cached = self.__dict__["_inputs"] = self.inputs_class.from_settings(
                json.loads(json.dumps(self.settings()))
            )
        return cached

    def special_tokens(self) -> list[str]:
        """Every special token the profile emits (the demo tokenizer registers them)."""
        toks: list[str] = [self.turn_end]
        for tok in [t for block in self.template_blocks.values() for t in block] + list(
            self.expansion_tokens
        ):
            if tok not in toks:
                toks.append(tok)
        return toks

    @abstractmethod
    def settings(self) -> dict[str, Any]:
        """JSON-able settings recorded in the dataset metadata; the trainer half is built from them, so
        they hold everything ``inputs_class.from_settings`` reads."""

    # ---- training cost model (profiles.cost): new methods, used by balanced packing ----

    def cost_shapes(self) -> dict[str, TransformerShape]:
        """Default shapes of the LM (``"lm"``) and each media encoder (``"vision"``, ``"audio"``)."""
        raise ValueError(f"profile {self.name} has no cost model")

    def media_cost(self, plan: MediaPlan, shapes: dict[str, TransformerShape]) -> float:
        """Forward FLOPs of the encoder(s) for one media item (``shapes`` holds the LM's too)."""
        raise ValueError(f"profile {self.name} has no cost model for {plan.kind} inputs")

    def cost_model(self, overrides: dict[str, Any] | None = None) -> CostModel:
        """The profile's cost model with a config's ``cost`` overrides applied."""
        return build_cost_model(self.cost_shapes(), overrides)
