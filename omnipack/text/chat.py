"""Chat-template tokenization with exact media placeholder expansion and assistant-only labels.

The conversation is rendered by the tokenizer's own chat template (so token ids are what the model sees
at inference), tokenized once with character offsets, and every media block the template wrote is
replaced by the profile's expansion with the exact feature count. Supervised spans are found by
rendering conversation prefixes: the text an assistant turn adds after the generation prompt, up to and
including the turn-end marker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..contract import IGNORE_INDEX
from ..profiles.base import MediaPlan, MediaSpan, ModelProfile


class SampleRejected(ValueError):
    """The sample cannot be encoded; the message is the reject reason."""


@dataclass
class EncodedSample:
    input_ids: np.ndarray  # int32 [L]
    labels: np.ndarray  # int32 [L], next-token targets on assistant turns, IGNORE_INDEX elsewhere
    spans: list[MediaSpan]
    mrope_position_ids: np.ndarray | None = None  # int32 [3, L]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: media items keep only their type (no paths leak)."""
    out = []
    for m in messages:
        content = m["content"]
        if not isinstance(content, str):
            content = [
                {"type": "text", "text": part["text"]} if part["type"] == "text" else {"type": part["type"]}
                for part in content
            ]
        out.append({"role": m["role"], "content": content})
    return out


class ChatTokenizer:
    """Turns a conversation plus its media plans into token ids and labels for one profile."""

    def __init__(self, tokenizer_dir: str | Path, profile: ModelProfile, *, mrope: bool = False) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"tokenizer at {tokenizer_dir} carries no chat template")
        self.profile = profile
        self.mrope = mrope
        self._ids: dict[str, int] = {}
        for tok in profile.special_tokens():
            tid = self.tokenizer.convert_tokens_to_ids(tok)
            if tid is None or tid == self.tokenizer.unk_token_id:
                raise ValueError(
                    f"tokenizer at {tokenizer_dir} has no token {tok!r} needed by profile {profile.name}"
                )
            self._ids[tok] = int(tid)
        self._blocks = {
            kind: [self._ids[t] for t in block] for kind, block in profile.template_blocks.items()
        }
        # Strings a sample's text may not contain: they would tokenize as control or placeholder tokens.
        specials = {t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special}
        reserved = set(profile.special_tokens()) | set(self.tokenizer.all_special_tokens) | specials
        self._reserved = sorted(reserved, key=len, reverse=True)
        self._check_setup(tokenizer_dir)

    def _check_setup(self, tokenizer_dir: str | Path) -> None:
        """Fail once, at start-up, on a setup that would reject every sample."""
        if not self.tokenizer.is_fast:
            raise ValueError(
                f"tokenizer at {tokenizer_dir} is not a fast tokenizer (character offsets are needed)"
            )
        if self.mrope and type(self.profile).mrope_position_ids is ModelProfile.mrope_position_ids:
            raise ValueError(f"profile {self.profile.name} has no mRoPE position ids (drop --mrope)")
        probe = [
            {
                "role": "user",
                "content": [{"type": k} for k in self.profile.kinds] + [{"type": "text", "text": "x"}],
            },
            {"role": "assistant", "content": "y"},
        ]
        ids = np.asarray(self.tokenizer(self.render(probe), add_special_tokens=False)["input_ids"])
        found = [kind for _, kind in self._find_blocks(ids)]
        if found != list(self.profile.kinds):
            raise ValueError(
                f"the chat template of {tokenizer_dir} does not write profile {self.profile.name}'s media blocks "
                f"{ {k: ''.join(v) for k, v in self.profile.template_blocks.items()} } (found {found}): "
                "wrong tokenizer for this profile?"
            )

    def fingerprint(self) -> str:
        """A stable hash of the vocabulary, special tokens and chat template."""
        import hashlib
        import json

        h = hashlib.sha256()
        h.update(json.dumps(sorted(self.tokenizer.get_vocab().items())).encode())
        h.update(json.dumps(self.tokenizer.all_special_tokens).encode())
        h.update(self.tokenizer.chat_template.encode())
        return h.hexdigest()[:16]

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def supervised_char_spans(self, messages: list[dict[str, Any]], full: str) -> list[tuple[int, int]]:
        """Character spans of ``full`` to supervise: each assistant turn's text through its turn-end marker.

        Found by rendering prefixes (exact, for templates where earlier turns render the same once later
        turns follow); templates that rewrite earlier turns (e.g. dropping reasoning from all but the last
        assistant turn) fall back to locating each turn with a sentinel.
        """
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            prefix = self.render(messages[:i], add_generation_prompt=True)
            through = self.render(messages[: i + 1])
            if not (through.startswith(prefix) and full.startswith(through)):
                return self._spans_by_search(messages, full)
            spans.append((len(prefix), self._through_turn_end(through, len(prefix))))
        return spans

    def _through_turn_end(self, text: str, start: int) -> int:
        cut = text.find(self.profile.turn_end, start)
        return cut + len(self.profile.turn_end) if cut >= 0 else len(text)

    def _spans_by_search(self, messages: list[dict[str, Any]], full: str) -> list[tuple[int, int]]:
        """Locate each assistant turn by rendering the conversation with that turn's content replaced by a
        sentinel: everything else renders the same, so the turn's rendered text is where the sentinel is,
        and its length is what ``full`` has beyond the sentinel rendering."""
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            sentinel = f"OMNIPACKTURN{i}SENTINEL"
            marked = self.render([*messages[:i], {**m, "content": sentinel}, *messages[i + 1 :]])
            at = marked.find(sentinel)
            if at < 0 or marked.count(sentinel) != 1 or full[:at] != marked[:at]:
                raise SampleRejected(
                    f"cannot locate assistant turn messages/{i} in the rendered chat template"
                )
            end = at + len(full) - len(marked) + len(sentinel)
            spans.append((at, self._through_turn_end(full, end)))
        return spans

    def encode(self, messages: Sequence[dict[str, Any]], plans: Sequence[MediaPlan]) -> EncodedSample:
        self._check_text(messages)
        msgs = template_messages(messages)
        full = self.render(msgs)
        char_spans = self.supervised_char_spans(msgs, full)
        enc = self.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        ids = np.asarray(enc["input_ids"], dtype=np.int64)
        starts = np.asarray([o[0] for o in enc["offset_mapping"]], dtype=np.int64)
        assistant = np.zeros(len(ids), dtype=bool)
        for a, b in char_spans:
            assistant |= (starts >= a) & (starts < b)

        pieces_ids: list[np.ndarray] = []
        pieces_mask: list[np.ndarray] = []
        spans: list[MediaSpan] = []
        cursor = 0
        out_len = 0
        for k, (pos, kind) in enumerate(self._find_blocks(ids)):
            if k >= len(plans):
                raise SampleRejected(
                    f"chat template wrote more media blocks than the sample references ({len(plans)})"
                )
            plan = plans[k]
            if plan.kind != kind:
                raise SampleRejected(
                    f"media item {k} is {plan.kind} but the template wrote a {kind} block there"
                )
            pieces_ids.append(ids[cursor:pos])
            pieces_mask.append(assistant[cursor:pos])
            out_len += pos - cursor
            block, first_ph, n_ph = self._expand(plan)
            spans.append(MediaSpan(plan, out_len, out_len + len(block), out_len + first_ph, n_ph))
            pieces_ids.append(block)
            pieces_mask.append(np.zeros(len(block), dtype=bool))  # media tokens are never targets
            out_len += len(block)
            cursor = pos + len(self._blocks[kind])
        if len(spans) != len(plans):
            raise SampleRejected(
                f"sample references {len(plans)} media items but the chat template wrote {len(spans)} media blocks"
            )
        pieces_ids.append(ids[cursor:])
        pieces_mask.append(assistant[cursor:])
        input_ids = np.concatenate(pieces_ids).astype(np.int32)
        mask = np.concatenate(pieces_mask)
        if not mask.any():
            raise SampleRejected("no supervised tokens (no assistant turn with content)")
        labels = np.full(len(input_ids), IGNORE_INDEX, dtype=np.int32)
        # Position p predicts token p+1; the last token never predicts (the next sample in a pack).
        labels[:-1] = np.where(mask[1:], input_ids[1:], IGNORE_INDEX)
        mrope = self.profile.mrope_position_ids(input_ids, spans) if self.mrope else None
        if self.mrope and mrope is None:
            raise ValueError(f"profile {self.profile.name} has no mRoPE position ids")
        return EncodedSample(input_ids, labels, spans, mrope)

    def _check_text(self, messages: Sequence[dict[str, Any]]) -> None:
        """Reject text that contains special tokens: a typed ``<|image_pad|>`` would become a placeholder
        without features, a typed ``<|im_end|>`` would end a turn early."""
        for i, m in enumerate(messages):
            c = m["content"]
            texts = [c] if isinstance(c, str) else [p["text"] for p in c if p["type"] == "text"]
            for text in texts:
                hit = next((t for t in self._reserved if t in text), None)
                if hit is not None:
                    raise SampleRejected(f"text of messages/{i} contains the special token {hit!r}")

    def _find_blocks(self, ids: np.ndarray) -> list[tuple[int, str]]:
        """Start positions of every template media block, in order."""
        found = []
        for kind, block in self._blocks.items():
            first = np.flatnonzero(ids == block[0])
            for p in first:
                if p + len(block) <= len(ids) and ids[p : p + len(block)].tolist() == block:
                    found.append((int(p), kind))
        found.sort()
        return found

    def _expand(self, plan: MediaPlan) -> tuple[np.ndarray, int, int]:
        """Token ids of an expanded block, the offset of its first placeholder, and the placeholder count."""
        parts: list[list[int]] = []
        first, count, length = -1, 0, 0
        for seg in self.profile.expand(plan):
            if seg.text is not None:
                seg_ids = self.tokenizer.encode(seg.text, add_special_tokens=False)
            else:
                seg_ids = [self._token_id(seg.token)] * seg.count
            if seg.placeholder:
                if first < 0:
                    first = length
                count += len(seg_ids)
            parts.append(seg_ids)
            length += len(seg_ids)
        if count != plan.num_tokens:
            raise AssertionError(
                f"profile {self.profile.name} expanded {count} placeholders for a plan of {plan.num_tokens}"
            )
        return np.asarray([t for p in parts for t in p], dtype=np.int64), first, count

    def _token_id(self, token: str) -> int:
        if token not in self._ids:
            tid = self.tokenizer.convert_tokens_to_ids(token)
            if tid is None or tid == self.tokenizer.unk_token_id:
                raise ValueError(f"tokenizer has no token {token!r}")
            self._ids[token] = int(tid)
        return self._ids[token]
