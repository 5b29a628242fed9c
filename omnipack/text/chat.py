"""Chat-template tokenization with exact media placeholder expansion and assistant-only labels.

The conversation is rendered once by the tokenizer's own chat template (``render.py``; so token ids are
what the model sees at inference), tokenized once (many samples in one batch call), the supervised tokens
found from character spans of that render (``labels.py``), and every media block the template wrote
replaced by the profile's expansion with the exact feature count (``expand.py``). Each of these fast paths
is tested against the one reference path in ``reference.py``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from jinja2 import TemplateError

from ..dataset.contract import IGNORE_INDEX
from ..profiles.base import MediaPlan, ModelProfile
from . import labels
from .encoded import EncodedSample, SampleRejected
from .expand import Expanded, MediaExpander, RenderedTokens
from .hub_cache import NotCached, resolve_model_dir
from .render import (
    TOOL_KEYS,
    TOOL_PROBE,
    TOOL_PROBE_TOOLS,
    TemplateRenderer,
    is_plain,
    template_messages,
    uses_tools,
)
from .token_count import LONG_TEXT_CHARS, count_tokens_over
from .token_starts import TokenByteStarts

__all__ = [
    "ChatTokenizer", "EncodedSample", "SampleRejected", "load_tokenizer", "template_messages", "uses_tools"
]

TOKENIZE_BATCH_CHARS = 1 << 22  # characters tokenized in one call


def tokenizer_folder(tokenizer_dir: str | Path) -> Path:
    """The folder a tokenizer name reads: itself, or a Hub id's snapshot in the local cache (never
    downloaded)."""
    try:
        return Path(resolve_model_dir(tokenizer_dir))
    except NotCached as e:
        raise ValueError(f"tokenizer {str(tokenizer_dir)!r} {e}") from None


def load_tokenizer(tokenizer_dir: str | Path) -> Any:
    """The tokenizer of ``tokenizer_dir`` (a folder or a cached Hub id), loaded as the model's users load it
    (``AutoTokenizer``, which picks the class; importing it imports torch)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_folder(tokenizer_dir)))


class ChatTokenizer:
    """Turns a conversation plus its media plans into token ids and labels for one profile."""

    def __init__(
        self, tokenizer_dir: str | Path, profile: ModelProfile, *, mrope: bool = False, tokenizer: Any = None
    ) -> None:
        """``tokenizer``: the one ``load_tokenizer(tokenizer_dir)`` gives, already loaded (e.g. by the run's
        driver, sent to this worker), so it is not loaded again."""
        self.tokenizer_dir = tokenizer_dir = tokenizer_folder(tokenizer_dir)  # a Hub id's: its cached snapshot
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(tokenizer_dir)
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
        self._setup_reserved(profile)
        self._setup_encoder()
        self._expander = MediaExpander(profile, self._blocks, self._token_id, self._tokenize, self._added_ids)
        self._renderer: TemplateRenderer | None = None
        self._check_setup(tokenizer_dir)
        self._renderer = TemplateRenderer(self.tokenizer, profile.kinds)
        self._tool_support = self._find_tool_support()
        self._setup_turn_prompt()
        self.max_chars_per_token = self._find_max_chars_per_token()

    def _setup_reserved(self, profile: ModelProfile) -> None:
        """Strings a sample's text may not contain: they would tokenize as control or placeholder tokens."""
        specials = {t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special}
        reserved = set(profile.special_tokens()) | set(self.tokenizer.all_special_tokens) | specials
        self._reserved = sorted(reserved, key=len, reverse=True)
        # A text holds a reserved token only if it holds that token's first character: one fast scan per
        # distinct first character (often just "<") rules out every token in the common case.
        self._reserved_firsts = sorted({t[:1] for t in self._reserved})
        self._text_joint = next((c for c in "\x00\x01\n" if not any(c in t for t in self._reserved)), None)

    def _setup_encoder(self) -> None:
        """The Rust tokenizer, called directly (no per-call wrapper work); set not to truncate or pad, as the
        wrapper itself sets it on every call without those options."""
        self._encoder = self.tokenizer.backend_tokenizer
        if self._encoder.truncation is not None:
            self._encoder.no_truncation()
        if self._encoder.padding is not None:
            self._encoder.no_padding()
        # Token starts from the ids where that is exact: the batch encode then skips character offsets.
        self._byte_starts = TokenByteStarts.for_tokenizer(self._encoder)

    def _setup_turn_prompt(self) -> None:
        """The generation prompt that locates assistant turns in one render, where it does; and whether
        it does for conversations with tool use too (where it holds on a tool-use probe)."""
        turn_end = self.profile.turn_end
        self._turn_prompt = labels.find_turn_prompt(self._render_late, self._reserved, turn_end)
        self._turn_prompt_tools = (
            self._turn_prompt is not None
            and all(self._tool_support)
            and labels.turn_prompt_holds(
                self._render_late, self._turn_prompt, [(TOOL_PROBE, TOOL_PROBE_TOOLS)], turn_end
            )
        )

    @property
    def _compiled(self) -> Any:
        """The directly rendered compiled template (None where ``apply_chat_template`` is used)."""
        return None if self._renderer is None else self._renderer.compiled

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
        found = [b.kind for b in self._expander.find_blocks(ids)]
        if found != list(self.profile.kinds):
            raise ValueError(
                f"the chat template of {tokenizer_dir} does not write profile {self.profile.name}'s media blocks "
                f"{ {k: ''.join(v) for k, v in self.profile.template_blocks.items()} } (found {found}): "
                "wrong tokenizer for this profile?"
            )

    def fingerprint(self) -> str:
        """A stable hash of the vocabulary, special tokens and chat template."""
        h = hashlib.sha256()
        h.update(json.dumps(sorted(self.tokenizer.get_vocab().items())).encode())
        h.update(json.dumps(self.tokenizer.all_special_tokens).encode())
        h.update(self.tokenizer.chat_template.encode())
        return h.hexdigest()[:16]

    def _find_tool_support(self) -> tuple[bool, bool, bool]:
        """Whether the template writes the tools offered, an assistant's tool calls and tool results (as
        ``uses_tools``): a sample using what it does not write is rejected, not trained without it."""
        try:
            text = self.render(TOOL_PROBE, tools=TOOL_PROBE_TOOLS)
        except Exception:  # a template that refuses the tool role or tool calls
            return False, False, False
        return (
            "omnipack_probe_tool" in text,
            "omnipack_probe_call" in text and "omnipack_probe_arg" in text,
            "omnipack_probe_result" in text,
        )

    def _check_tool_use(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> None:
        used = uses_tools(messages, tools)
        for what, use, supported in zip(("tools", "tool calls", "tool results"), used, self._tool_support, strict=True):
            if use and not supported:
                raise SampleRejected(
                    f"the tokenizer's chat template does not render {what} (the sample has them): use a "
                    "tokenizer whose chat template supports tool use"
                )

    def _find_max_chars_per_token(self) -> int | None:
        """An upper bound on the characters one token covers, so a rendered text longer than
        ``seq_length`` times it certainly can not fit and is rejected before tokenizing. None (no bound)
        when the tokenizer may drop characters (a whitespace-splitting pre-tokenizer, a cleaning
        normalizer): then the text length says nothing about the token count."""
        probe = "a  b\t\n\n c\u00e9e\u0301 \u4e2d\u6587 \U0001f600!!  \x07x   "
        enc = self._tokenize(probe)
        covered = np.zeros(len(probe), dtype=bool)
        for a, b in enc.offsets:
            covered[a:b] = True
        if not covered.all():
            return None
        longest = max(
            max(map(len, self._encoder.get_vocab(with_added_tokens=True))),
            max((len(t.content) for t in self._encoder.get_added_tokens_decoder().values()), default=1),
        )
        # A normalizer may compose characters (NFC / NFKC): at most 4 code points become one.
        return longest * (4 if self._encoder.normalizer is not None else 1)

    def _tokenize(self, text: str) -> Any:
        """The tokenizer's encoding of ``text`` (ids and offsets stay in Rust until asked for)."""
        return self._encoder.encode(text, add_special_tokens=False)

    def _tokenize_many(self, texts: list[str]) -> list[Any]:
        """Encodings of ``texts``, in calls of at most ``TOKENIZE_BATCH_CHARS`` characters (one longer text
        alone), so the tokenizer's working memory has a fixed cap. Without character offsets where token
        starts come from the ids (``_byte_starts``)."""
        encode = self._encoder.encode_batch if self._byte_starts is None else self._encoder.encode_batch_fast
        out: list[Any] = []
        start, size = 0, 0
        for k, text in enumerate(texts):
            if size and size + len(text) > TOKENIZE_BATCH_CHARS:
                out += encode(texts[start:k], add_special_tokens=False)
                start, size = k, 0
            size += len(text)
        if start < len(texts):
            out += encode(texts[start:], add_special_tokens=False)
        return out

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The chat template's text for ``messages`` (plain dicts, see ``template_messages``) offering
        ``tools`` (function schemas)."""
        if self._renderer is None:  # during setup checks: transformers' own path
            return self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        return self._renderer.render(messages, add_generation_prompt, tools)

    def _render_late(self, *args: Any, **kwargs: Any) -> str:
        """``render`` looked up at call time (a wrapped ``render`` sees every call the label code makes)."""
        return self.render(*args, **kwargs)

    def supervised_char_spans(
        self, messages: list[dict[str, Any]], full: str, tools: list[dict[str, Any]] | None = None
    ) -> list[tuple[int, int]]:
        """Character spans of ``full`` to supervise: each assistant turn's text through its turn-end marker
        (see ``labels``): from the one render where the turn prompt marks the turns, else by prefixes."""
        if self._turn_prompt is not None and (is_plain(messages, tools) or self._turn_prompt_tools):
            spans = labels.spans_by_turn_prompt(messages, full, self._turn_prompt, self.profile.turn_end)
            if spans is not None:
                return spans
        return self._spans_by_prefixes(messages, full, tools)

    def _spans_by_prefixes(
        self, messages: list[dict[str, Any]], full: str, tools: list[dict[str, Any]] | None = None
    ) -> list[tuple[int, int]]:
        return labels.spans_by_prefixes(self._render_late, messages, full, tools, self.profile.turn_end)

    def encode(
        self,
        messages: Sequence[dict[str, Any]],
        plans: Sequence[MediaPlan],
        max_tokens: int | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> EncodedSample:
        """Token ids, labels and media spans of one conversation (offering ``tools``, function schemas).

        With ``max_tokens``, a sample whose rendered text certainly expands to more tokens is rejected
        before it is tokenized, so one huge sample costs no more than reading it."""
        out = self.encode_many([(messages, plans, tools)], max_tokens)[0]
        if isinstance(out, Exception):
            raise out
        return out

    def encode_many(
        self,
        samples: Sequence[tuple[Sequence[dict[str, Any]], Sequence[MediaPlan]] | tuple[Any, Any, Any]],
        max_tokens: int | None = None,
    ) -> list[EncodedSample | Exception]:
        """``encode`` for many (messages, plans) or (messages, plans, tools) at once, tokenized in one call
        (the tokenizer's batch path, as fast as its own batch encode); a sample that fails gets its
        exception in its place (``SampleRejected`` for a data problem, any other for a bug)."""
        results: list[EncodedSample | Exception | None] = [None] * len(samples)
        texts, pending = [], []
        for k, (messages, plans, *rest) in enumerate(samples):
            try:
                tools = list(rest[0]) if rest and rest[0] else None
                full, char_spans = self._render_and_label(messages, plans, tools, max_tokens)
                pending.append((k, char_spans, plans))
                texts.append(full)
            except Exception as e:
                results[k] = e
        for enc, full, (k, char_spans, plans) in zip(self._tokenize_many(texts), texts, pending, strict=True):
            try:
                results[k] = self._finish(enc, char_spans, plans, full)
            except Exception as e:
                results[k] = e
        return results  # type: ignore[return-value]

    def _render_and_label(
        self,
        messages: Sequence[dict[str, Any]],
        plans: Sequence[MediaPlan],
        tools: list[dict[str, Any]] | None,
        max_tokens: int | None,
    ) -> tuple[str, list[tuple[int, int]]]:
        """The checked conversation's rendered text and its supervised character spans."""
        self._check_text(messages, tools)
        if not is_plain(messages, tools):
            self._check_tool_use(messages, tools)
        msgs = template_messages(messages)
        try:
            full = self.render(msgs, tools=tools)
        except TemplateError as e:  # the template's raise_exception(): it refuses this conversation
            raise SampleRejected(f"the chat template refused the conversation: {e}") from None
        if max_tokens is not None and self.max_chars_per_token is not None:
            self._check_length(full, plans, max_tokens)
        if max_tokens is not None and len(full) > LONG_TEXT_CHARS:
            self._check_length_by_windows(full, plans, max_tokens)
        return full, self.supervised_char_spans(msgs, full, tools)

    def _finish(
        self, enc: Any, char_spans: list[tuple[int, int]], plans: Sequence[MediaPlan], full: str
    ) -> EncodedSample:
        """Labels from the supervised spans, media blocks expanded to their plans."""
        ids = np.array(enc.ids, dtype=np.int32)
        byte_starts = None
        if self._byte_starts is not None:  # ``enc`` has no offsets
            byte_starts = self._byte_starts.starts(ids, full)
            if byte_starts is None:  # a text the ids alone do not place: tokenize it again, with offsets
                enc = self._tokenize(full)
        if byte_starts is not None:
            supervised = labels.mask_from_byte_starts(byte_starts, char_spans, full)
        else:
            supervised = labels.mask_from_offsets(enc, char_spans, len(ids))
        blocks = self._expander.find_blocks(ids)
        if blocks and len(blocks) == len(plans) and self._expander.has_edge_text(blocks, plans):
            if byte_starts is not None:
                enc = self._tokenize(full)  # the in-context expansion reads character offsets
            out = self._expander.in_context(RenderedTokens(enc, full, ids, supervised), char_spans, blocks, plans)
        elif blocks or plans:
            out = self._expander.splice(ids, supervised, blocks, plans)
        else:  # text only: the tokens as they are
            out = Expanded(ids, supervised, [])
        if not out.supervised.any():
            raise SampleRejected("no supervised tokens (no assistant turn with content)")
        input_ids = out.input_ids
        labels_ = np.full(len(input_ids), IGNORE_INDEX, dtype=np.int32)
        # Position p predicts token p+1; the last token never predicts (the next sample in a pack).
        labels_[:-1] = np.where(out.supervised[1:], input_ids[1:], IGNORE_INDEX)
        mrope = self.profile.mrope_position_ids(input_ids, out.spans) if self.mrope else None
        if self.mrope and mrope is None:
            raise ValueError(f"profile {self.profile.name} has no mRoPE position ids")
        turns = labels.assistant_token_spans(out.supervised, [(s.start, s.end) for s in out.spans])
        return EncodedSample(input_ids, labels_, out.spans, mrope, turns)

    def _added_ids(self) -> set[int]:
        """Ids of the tokenizer's added tokens: the tokenizer splits text at them before anything else."""
        cached = self.__dict__.get("_added_ids_cache")
        if cached is None:
            cached = self.__dict__["_added_ids_cache"] = {
                int(i) for i in self._encoder.get_added_tokens_decoder()
            }
        return cached

    def _check_length(self, full: str, plans: Sequence[MediaPlan], max_tokens: int) -> None:
        assert self.max_chars_per_token is not None
        text_tokens = -(-len(full) // self.max_chars_per_token)  # no fewer tokens than this
        at_least = text_tokens + self._media_extra_tokens(plans)
        if at_least > max_tokens:
            raise SampleRejected(
                f"over-length: the rendered text of {len(full)} characters is at least {at_least} tokens "
                f"(a token covers at most {self.max_chars_per_token} characters), over seq_length "
                f"{max_tokens}; rejected before tokenizing"
            )

    def _media_extra_tokens(self, plans: Sequence[MediaPlan]) -> int:
        """Tokens the media blocks add to the rendered text's: each block becomes its expansion, which holds
        at least the plan's placeholders."""
        return sum(p.num_tokens - len(self._blocks.get(p.kind, ())) for p in plans)

    def _check_length_by_windows(self, full: str, plans: Sequence[MediaPlan], max_tokens: int) -> None:
        """Reject a long text that is over ``max_tokens`` counted window by window (``token_count``), before
        the whole text meets the tokenizer and its memory grows with every token."""
        over = count_tokens_over(self._tokenize, full, max_tokens - self._media_extra_tokens(plans))
        if over is not None:
            tokens, chars = over
            raise SampleRejected(
                f"over-length: the rendered text of {len(full)} characters is more than {tokens} tokens "
                f"(counted over its first {chars} characters), over seq_length {max_tokens}; rejected "
                "before tokenizing it whole"
            )

    def _check_text(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> None:
        """Reject text that contains special tokens: a typed ``<|image_pad|>`` would become a placeholder
        without features, a typed ``<|im_end|>`` would end a turn early. Tool calls and tools are checked
        as the JSON a template writes of them."""
        texts_of = [
            [c] if isinstance(c, str) else [p["text"] for p in c if p["type"] == "text"]
            for c in (m["content"] for m in messages)
        ]
        for texts, m in zip(texts_of, messages, strict=True):
            if len(m) > 2:
                texts += [json.dumps(m[k], ensure_ascii=False) for k in TOOL_KEYS if m.get(k) is not None]
        if tools:
            texts_of.append([json.dumps(list(tools), ensure_ascii=False)])
        if self._text_joint is not None:
            # all texts joined by a character no reserved token holds, so no match spans two texts
            joined = self._text_joint.join([t for texts in texts_of for t in texts])
            if not any(c in joined for c in self._reserved_firsts):
                return
        for i, texts in enumerate(texts_of):
            for text in texts:
                hit = next((t for t in self._reserved if t in text), None)
                if hit is not None:
                    where = f"messages/{i}" if i < len(messages) else "tools"
                    raise SampleRejected(f"text of {where} contains the special token {hit!r}")

    def _token_id(self, token: str) -> int:
        if token not in self._ids:
            tid = self.tokenizer.convert_tokens_to_ids(token)
            if tid is None or tid == self.tokenizer.unk_token_id:
                raise ValueError(f"tokenizer has no token {token!r}")
            self._ids[token] = int(tid)
        return self._ids[token]
