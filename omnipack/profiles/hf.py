"""hf: any Hugging Face multimodal model, its own processor deciding every count (``--profile hf``).

The model folder's ``AutoProcessor`` is run on each media item's shape: the text it substitutes for the item's
placeholder token (``return_text_replacement_offsets``) is the item's expansion, exactly as the processor
writes it, and its placeholder tokens are the item's feature count. A count depends on the item's shape only
(an image's size), so the processor runs once per distinct shape (``cache_stats``), on a blank image of that
size: a corpus of 10k images of 50 sizes calls it 50 times per process.

Text is the checkpoint's chat template with the processor's replacement: runs of added tokens become token
segments, the text between them literal text (tokenized as the processor's one tokenization splits it, at
the added tokens). Labels come from the template's assistant turns as for every profile; a turn ends at the
first special token the template writes after an assistant's text.

So far: images. The stored payload is the upright source image at its own size (the trainer half reads the
recorded counts); storing the processor's own tensors, and video and audio, are still to come.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ..media.errors import MediaRejected
from ..media.meta import MediaMeta
from .base import MediaPlan, ModelProfile, Segment
from .inputs import EncoderInputs, MediaInputOptions

# A sentinel assistant answer: what the template writes right after it ends the turn.
_ANSWER = "omnipack probe answer"


class HFInputs(EncoderInputs):
    """Trainer half: placeholder tokens as the processor named them; feature counts as recorded (the
    stored payload is the source image, which only the processor could count)."""

    name = "hf"

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.placeholder_tokens = {k: tuple(v) for k, v in settings["placeholder_tokens"].items()}

    def feature_count(self, item: Any, payload: Any) -> int:
        return int(item["num_tokens"] if isinstance(item, Mapping) else item.num_tokens)

    def media_inputs(self, item: Any, payload: Any, options: MediaInputOptions) -> dict[str, Any]:
        # The processor's own tensors are not stored yet (the payload is the source image): the base names
        # the gap (load with decode_media=False) instead of handing the trainer unprocessed pixels.
        return super().media_inputs(item, payload, options)


class HFProfile(ModelProfile):
    """The model's own processor as the profile.

    Options: ``model_dir`` (the model folder holding the processor; a run sets it from ``--model`` / the
    tokenizer folder; without it the profile has no media kinds), ``processor_kwargs`` (a mapping passed to every processor call, e.g. ``{"do_image_splitting":
    false}``; part of the cache key by being the profile's).
    """

    name = "hf"
    inputs_class = HFInputs
    processor_backed = True
    template_blocks: ClassVar[dict[str, tuple[str, ...]]] = {}  # per model: the processor's tokens

    def __init__(self, *, model_dir: str | Path | None = None, processor_kwargs: Mapping[str, Any] | None = None):
        self.model_dir = None if model_dir is None else str(model_dir)
        self.processor_kwargs = dict(processor_kwargs or {})
        self._expansions: dict[tuple[Any, ...], tuple[int, list[list[Any]]]] = {}
        self.processor_calls: Counter[str] = Counter()
        self.cache_hits: Counter[str] = Counter()
        self.template_blocks = {}
        if self.model_dir is None:  # no model: no media kinds (a run always passes the model folder)
            return
        from transformers import AutoProcessor

        try:
            self.processor = AutoProcessor.from_pretrained(self.model_dir, local_files_only=True)
        except Exception as e:  # a processor that can not be built here can not count anything
            raise ValueError(
                f"profile hf: the processor of {self.model_dir} cannot be loaded offline "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            ) from None
        tokenizer = getattr(self.processor, "tokenizer", None)
        if tokenizer is None or not hasattr(self.processor, "replace_image_token"):
            raise ValueError(f"profile hf: {type(self.processor).__name__} of {self.model_dir} is no multimodal processor")
        self.tokenizer = tokenizer
        image_token = getattr(self.processor, "image_token", None)
        if image_token is None or not hasattr(self.processor, "image_processor"):
            raise ValueError(
                f"profile hf: {type(self.processor).__name__} of {self.model_dir} takes no images (video and audio "
                "processors are not supported yet)"
            )
        self.template_blocks = {"image": (image_token,)}
        self.turn_end = self._find_turn_end()
        self._added = {int(i) for i in tokenizer.backend_tokenizer.get_added_tokens_decoder()}

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
        return dict(self.template_blocks)

    # ---- counts: the processor on the item's shape, once per shape ----

    def plan_image(self, meta: MediaMeta) -> MediaPlan:
        if not meta.height or not meta.width:
            raise MediaRejected("image size unknown or zero")
        count, runs = self._expansion("image", (meta.height, meta.width))
        return MediaPlan(
            kind="image",
            num_tokens=count,
            target_hw=(meta.height, meta.width),  # stored as it is: the processor resizes at train time
            vision_patches=count,  # the encoder's cost, in features (the processor names no patch count)
            info={"expansion": runs},
        )

    def _expansion(self, kind: str, shape: tuple[int, ...]) -> tuple[int, list[list[Any]]]:
        key = (kind, *shape)
        found = self._expansions.get(key)
        if found is not None:
            self.cache_hits[kind] += 1
            return found
        self.processor_calls[kind] += 1
        found = self._expansions[key] = self._run_processor(kind, shape)
        return found

    def _run_processor(self, kind: str, shape: tuple[int, ...]) -> tuple[int, list[list[Any]]]:
        """The processor on one blank item of ``shape``: (placeholder count, expansion runs)."""
        from PIL import Image

        token = self.template_blocks[kind][0]
        height, width = shape
        try:
            out = self.processor(
                text=[token],
                images=[Image.new("RGB", (width, height))],
                return_text_replacement_offsets=True,
                **self.processor_kwargs,
            )
        except Exception as e:  # the processor refuses this shape: a reject with its reason
            raise MediaRejected(f"the {type(self.processor).__name__} refuses a {height}x{width} image: {e}") from None
        replacements = out.get("text_replacement_offsets") or [[]]
        if len(replacements[0]) != 1:
            raise ValueError(f"profile hf: {type(self.processor).__name__} reports no text replacement for an {kind}")
        runs = self._runs(replacements[0][0]["replacement"], token)
        count = sum(r[2] for r in runs if r[0] == "token" and r[3])
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if count != sum(int(i) == token_id for i in out["input_ids"][0]):  # the processor's own tokenization
            raise ValueError(f"profile hf: the {kind} replacement text and the processor's ids disagree")
        return count, runs

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
            "placeholder_tokens": {k: list(v) for k, v in self.template_blocks.items()},
            "turn_end": self.turn_end,
        }


PROFILE = HFProfile
