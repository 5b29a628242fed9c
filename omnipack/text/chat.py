"""Chat-template tokenization with exact media placeholder expansion and assistant-only labels.

The conversation is rendered once by the tokenizer's own chat template (so token ids are what the model
sees at inference), tokenized once, and every media block the template wrote is replaced by the
profile's expansion with the exact feature count. Supervised spans are what each assistant turn renders
after the generation prompt, up to and including the turn-end marker: found in that one render where the
generation prompt carries a special token (text can not forge it), else by rendering prefixes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from jinja2 import TemplateError

from ..dataset.contract import IGNORE_INDEX
from ..errors import SampleReject
from ..profiles.base import MediaPlan, MediaSpan, ModelProfile
from .hub_cache import NotCached, resolve_model_dir
from .token_starts import TokenByteStarts

TOKENIZE_BATCH_CHARS = 1 << 22  # characters tokenized in one call


class SampleRejected(SampleReject):
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


_TOOL_KEYS = ("tool_calls", "name", "tool_call_id")  # message keys templates read for tool use


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: media items keep only their type (no paths leak); an
    assistant's tool calls and a tool result's name/call id pass through."""
    out = []
    for m in messages:
        content = m["content"]
        if not isinstance(content, str):
            content = [
                {"type": "text", "text": part["text"]} if part["type"] == "text" else {"type": part["type"]}
                for part in content
            ]
        msg = {"role": m["role"], "content": content}
        if len(m) > 2:
            msg.update((k, m[k]) for k in _TOOL_KEYS if m.get(k) is not None)
        out.append(msg)
    return out


def uses_tools(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> tuple[bool, bool, bool]:
    """Whether a conversation offers tools, calls tools, and holds tool results."""
    return (
        bool(tools),
        any(m.get("tool_calls") for m in messages),
        any(m["role"] == "tool" for m in messages),
    )


# A conversation with one tool offered, called and answered, with names a template can only write if it
# renders each of them.
_TOOL_PROBE_TOOLS = [
    {"type": "function", "function": {"name": "omnipack_probe_tool", "description": "d",
                                      "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip
_TOOL_PROBE = [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "omnipack_probe_call",
                                                      "arguments": {"omnipack_probe_arg": 1}}}]},
    {"role": "tool", "content": "omnipack_probe_result"},
    {"role": "assistant", "content": "a"},
]  # fmt: skip


def _memoized_sandbox(template: Any, source: str) -> Any:
    """``template`` (compiled from ``source``) compiled again in a copy of its sandbox whose attribute check is memoized per (object type,
    attribute, value type): jinja's check reads nothing else (underscore names, internal attributes of
    functions/frames/generators, methods that mutate known mutable types), and it ran for every
    ``loop.first`` of every message. The template stays sandboxed; transformers' own cached environment is
    not touched."""
    env = template.environment.overlay()
    check = env.is_safe_attribute
    memo: dict[tuple[type, str, type], bool] = {}

    def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr, type(value))
        safe = memo.get(key)
        if safe is None:
            safe = memo[key] = bool(check(obj, attr, value))
        return safe

    env.is_safe_attribute = is_safe_attribute
    return env.from_string(source)


class ChatTokenizer:
    """Turns a conversation plus its media plans into token ids and labels for one profile."""

    def __init__(self, tokenizer_dir: str | Path, profile: ModelProfile, *, mrope: bool = False) -> None:
        from transformers import AutoTokenizer

        try:  # a Hub id from the local cache, never downloaded
            tokenizer_dir = resolve_model_dir(tokenizer_dir)
        except NotCached as e:
            raise ValueError(f"tokenizer {str(tokenizer_dir)!r} {e}") from None
        self.tokenizer_dir = Path(tokenizer_dir)  # the folder read (a Hub id's snapshot in the cache)
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
        self._blocks_by_first: dict[int, list[tuple[str, list[int]]]] = {}  # one scan per first token
        for kind, block in self._blocks.items():
            self._blocks_by_first.setdefault(block[0], []).append((kind, block))
        # Strings a sample's text may not contain: they would tokenize as control or placeholder tokens.
        specials = {t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special}
        reserved = set(profile.special_tokens()) | set(self.tokenizer.all_special_tokens) | specials
        self._reserved = sorted(reserved, key=len, reverse=True)
        # A text holds a reserved token only if it holds that token's first character: one fast scan per
        # distinct first character (often just "<") rules out every token in the common case.
        self._reserved_firsts = sorted({t[:1] for t in self._reserved})
        self._text_joint = next((c for c in "\x00\x01\n" if not any(c in t for t in self._reserved)), None)
        # The Rust tokenizer, called directly (no per-call wrapper work); set not to truncate or pad, as the
        # wrapper itself sets it on every call without those options.
        self._encoder = self.tokenizer.backend_tokenizer
        if self._encoder.truncation is not None:
            self._encoder.no_truncation()
        if self._encoder.padding is not None:
            self._encoder.no_padding()
        # Token starts from the ids where that is exact: the batch encode then skips character offsets.
        self._byte_starts = TokenByteStarts.for_tokenizer(self._encoder)
        self._compiled, self._template_vars = None, None
        self._check_setup(tokenizer_dir)
        self._compiled, self._template_vars = self._direct_template()
        self._tool_support = self._find_tool_support()
        self._turn_prompt = self._find_turn_prompt()
        # the one-render spans for conversations with tool use too, where they hold on a tool-use probe
        self._turn_prompt_tools = (
            self._turn_prompt is not None
            and all(self._tool_support)
            and self._turn_prompt_holds(self._turn_prompt, [(_TOOL_PROBE, _TOOL_PROBE_TOOLS)])
        )
        self.max_chars_per_token = self._find_max_chars_per_token()

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
        h = hashlib.sha256()
        h.update(json.dumps(sorted(self.tokenizer.get_vocab().items())).encode())
        h.update(json.dumps(self.tokenizer.all_special_tokens).encode())
        h.update(self.tokenizer.chat_template.encode())
        return h.hexdigest()[:16]

    def _find_tool_support(self) -> tuple[bool, bool, bool]:
        """Whether the template writes the tools offered, an assistant's tool calls and tool results (as
        ``uses_tools``): a sample using what it does not write is rejected, not trained without it."""
        try:
            text = self.render(_TOOL_PROBE, tools=_TOOL_PROBE_TOOLS)
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

    def _find_turn_prompt(self) -> str | None:
        """The text the template writes before every assistant turn (its generation prompt), when one
        render can locate assistant turns by it: it holds a special token (so sample text, checked by
        ``_check_text``, can not contain it) and it gives the prefix-render spans on probe conversations."""
        user = {"role": "user", "content": "q"}
        bare = self.render([user])
        with_prompt = self.render([user], add_generation_prompt=True)
        if not with_prompt.startswith(bare) or len(with_prompt) == len(bare):
            return None
        prompt = with_prompt[len(bare) :]
        if not any(t in prompt for t in self._reserved):
            return None
        turn = {"role": "assistant", "content": "a"}
        probes = [
            [user, turn],
            [{"role": "system", "content": "s"}, user, turn, {"role": "user", "content": "r"}, turn],
            [user, turn, {"role": "user", "content": [{"type": "text", "text": "t"}]}, turn],
        ]
        return prompt if self._turn_prompt_holds(prompt, [(p, None) for p in probes]) else None

    def _turn_prompt_holds(self, prompt: str, probes: list[tuple[list[dict[str, Any]], Any]]) -> bool:
        """Whether the turn-prompt spans are the prefix-render spans on ``(messages, tools)`` probes."""
        try:
            for probe, tools in probes:
                full = self.render(probe, tools=tools)
                if self._spans_by_turn_prompt(probe, full, prompt) != self._spans_by_prefixes(probe, full, tools):
                    return False
        except SampleRejected:
            return False
        return True

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
        # A tokenizer with several named templates may pick another one when tools are given.
        if self._compiled is not None and (tools is None or not isinstance(self.tokenizer.chat_template, dict)):
            return self._compiled.render(
                messages=messages,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._template_vars,
            )
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _direct_template(self) -> tuple[Any, dict[str, Any]] | tuple[None, None]:
        """transformers' compiled template and the variables ``apply_chat_template`` gives it, to render
        plain messages without its per-call copying (a third of a sample's non-tokenizer time). Used only
        when it renders probe conversations exactly as ``apply_chat_template`` does."""
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template, _plain_template_data

            source = self.tokenizer.get_chat_template()
            compiled = _memoized_sandbox(_compile_jinja_template(source), source)
            variables = _plain_template_data(dict(self.tokenizer.special_tokens_map))
        except Exception:  # another transformers version: its public path is always right
            return None, None
        probes = [
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            [
                {"role": "system", "content": "s"},
                {
                    "role": "user",
                    "content": [{"type": k} for k in self.profile.kinds] + [{"type": "text", "text": "t"}],
                },
                {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
                {"role": "user", "content": "r"},
            ],
        ]
        cases = [(p, None) for p in probes]
        try:  # tool use as transformers renders it, where the template takes it (and ``render`` uses this one)
            if not isinstance(self.tokenizer.chat_template, dict):
                self.tokenizer.apply_chat_template(_TOOL_PROBE, tools=_TOOL_PROBE_TOOLS, tokenize=False)
                cases.append((_TOOL_PROBE, _TOOL_PROBE_TOOLS))
        except Exception:
            pass
        for probe, tools in cases:
            for gen in (False, True):
                try:
                    direct = compiled.render(
                        messages=probe, tools=tools, documents=None, add_generation_prompt=gen, **variables
                    )
                except Exception:
                    return None, None
                if direct != self.tokenizer.apply_chat_template(
                    probe, tools=tools, tokenize=False, add_generation_prompt=gen
                ):
                    return None, None
        return compiled, variables

    def supervised_char_spans(
        self, messages: list[dict[str, Any]], full: str, tools: list[dict[str, Any]] | None = None
    ) -> list[tuple[int, int]]:
        """Character spans of ``full`` to supervise: each assistant turn's text through its turn-end marker.

        From the one render ``full`` when the template's generation prompt marks every assistant turn
        there; otherwise by rendering prefixes (exact, for templates where earlier turns render the same
        once later turns follow); templates that rewrite earlier turns (e.g. dropping reasoning from all but
        the last assistant turn) fall back to locating each turn with a sentinel. An assistant turn's tool
        calls are part of its text (supervised); tool results are not assistant turns.
        """
        plain = tools is None and not any(len(m) > 2 or m["role"] == "tool" for m in messages)
        if self._turn_prompt is not None and (plain or self._turn_prompt_tools):
            spans = self._spans_by_turn_prompt(messages, full, self._turn_prompt)
            if spans is not None:
                return spans
        return self._spans_by_prefixes(messages, full, tools)

    def _spans_by_turn_prompt(
        self, messages: list[dict[str, Any]], full: str, prompt: str
    ) -> list[tuple[int, int]] | None:
        """Each assistant turn starts after an occurrence of the generation ``prompt``; None unless there is
        exactly one occurrence per assistant turn."""
        starts = []
        at = full.find(prompt)
        while at >= 0:
            starts.append(at + len(prompt))
            at = full.find(prompt, at + len(prompt))
        if len(starts) != sum(m["role"] == "assistant" for m in messages):
            return None
        return [(a, self._through_turn_end(full, a)) for a in starts]

    def _spans_by_prefixes(
        self, messages: list[dict[str, Any]], full: str, tools: list[dict[str, Any]] | None = None
    ) -> list[tuple[int, int]]:
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            prefix = self.render(messages[:i], add_generation_prompt=True, tools=tools)
            through = self.render(messages[: i + 1], tools=tools)
            if not (through.startswith(prefix) and full.startswith(through)):
                return self._spans_by_search(messages, full, tools)
            spans.append((len(prefix), self._through_turn_end(through, len(prefix))))
        return spans

    def _through_turn_end(self, text: str, start: int) -> int:
        cut = text.find(self.profile.turn_end, start)
        return cut + len(self.profile.turn_end) if cut >= 0 else len(text)

    def _spans_by_search(
        self, messages: list[dict[str, Any]], full: str, tools: list[dict[str, Any]] | None = None
    ) -> list[tuple[int, int]]:
        """Locate each assistant turn by rendering the conversation with that turn's content replaced by a
        sentinel: everything else renders the same, so the turn's rendered text is where the sentinel is,
        and its length is what ``full`` has beyond the sentinel rendering."""
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            sentinel = f"OMNIPACKTURN{i}SENTINEL"
            marked = self.render([*messages[:i], {**m, "content": sentinel}, *messages[i + 1 :]], tools=tools)
            at = marked.find(sentinel)
            if at < 0 or marked.count(sentinel) != 1 or full[:at] != marked[:at]:
                raise SampleRejected(
                    f"cannot locate assistant turn messages/{i} in the rendered chat template"
                )
            end = at + len(full) - len(marked) + len(sentinel)
            spans.append((at, self._through_turn_end(full, end)))
        return spans

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
                self._check_text(messages, tools)
                if tools is not None or any(len(m) > 2 or m["role"] == "tool" for m in messages):
                    self._check_tool_use(messages, tools)
                msgs = template_messages(messages)
                try:
                    full = self.render(msgs, tools=tools)
                except TemplateError as e:  # the template's raise_exception(): it refuses this conversation
                    raise SampleRejected(f"the chat template refused the conversation: {e}") from None
                if max_tokens is not None and self.max_chars_per_token is not None:
                    self._check_length(full, plans, max_tokens)
                pending.append((k, self.supervised_char_spans(msgs, full, tools), plans))
                texts.append(full)
            except Exception as e:
                results[k] = e
        for enc, full, (k, char_spans, plans) in zip(self._tokenize_many(texts), texts, pending, strict=True):
            try:
                results[k] = self._finish(enc, char_spans, plans, full)
            except Exception as e:
                results[k] = e
        return results  # type: ignore[return-value]

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
            assistant = self._assistant_mask_from_starts(byte_starts, char_spans, full)
        else:
            assistant = self._assistant_mask(enc, char_spans, len(ids))
        blocks = self._find_blocks(ids)
        spans: list[MediaSpan] = []
        if blocks and len(blocks) == len(plans) and self._edge_text(blocks, plans):
            if byte_starts is not None:
                enc = self._tokenize(full)  # the in-context expansion reads character offsets
            input_ids, mask, spans = self._expand_in_context(enc, full, ids, assistant, char_spans, blocks, plans)
        elif blocks or plans:
            pieces_ids: list[np.ndarray] = []
            pieces_mask: list[np.ndarray] = []
            cursor = 0
            out_len = 0
            for k, (pos, kind) in enumerate(blocks):
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
            input_ids = np.concatenate(pieces_ids)
            mask = np.concatenate(pieces_mask)
        else:  # text only: the tokens as they are
            input_ids, mask = ids, assistant
        if not mask.any():
            raise SampleRejected("no supervised tokens (no assistant turn with content)")
        labels = np.full(len(input_ids), IGNORE_INDEX, dtype=np.int32)
        # Position p predicts token p+1; the last token never predicts (the next sample in a pack).
        labels[:-1] = np.where(mask[1:], input_ids[1:], IGNORE_INDEX)
        mrope = self.profile.mrope_position_ids(input_ids, spans) if self.mrope else None
        if self.mrope and mrope is None:
            raise ValueError(f"profile {self.profile.name} has no mRoPE position ids")
        return EncodedSample(input_ids, labels, spans, mrope)

    def _edge_text(self, blocks: list[tuple[int, str]], plans: Sequence[MediaPlan]) -> bool:
        """Whether an expansion begins or ends with literal text (which then joins the text beside it)."""
        for (_, kind), plan in zip(blocks, plans, strict=True):
            if plan.kind != kind:
                return False  # the plain path names the mismatch
            segs = self.profile.expand(plan)
            if segs and (segs[0].text is not None or segs[-1].text is not None):
                return True
        return False

    def _added_ids(self) -> set[int]:
        """Ids of the tokenizer's added tokens: the tokenizer splits text at them before anything else."""
        cached = self.__dict__.get("_added_ids_cache")
        if cached is None:
            cached = self.__dict__["_added_ids_cache"] = {
                int(i) for i in self._encoder.get_added_tokens_decoder()
            }
        return cached

    def _expand_in_context(
        self,
        enc: Any,
        full: str,
        ids: np.ndarray,
        assistant: np.ndarray,
        char_spans: list[tuple[int, int]],
        blocks: list[tuple[int, str]],
        plans: Sequence[MediaPlan],
    ) -> tuple[np.ndarray, np.ndarray, list[MediaSpan]]:
        """Blocks expanded as a processor does it: the expansion's text replaces the block in the rendered
        string, so literal text at an expansion's edge is tokenized together with the template text beside it
        (the tokenizer splits only at added tokens; e.g. the template's "\n" and a block's leading "\n\n"
        become one "\n\n\n" token in a vocabulary that has it). Text runs away from expansion edges keep
        their tokens from the one tokenization.

        Returns the ids, the supervised mask and the spans (a span covers every token that holds a character
        of its expansion)."""
        added = self._added_ids()
        n = len(ids)

        def run_chars(i0: int, i1: int) -> tuple[int, int]:
            """Characters of the text tokens ids[i0:i1], bounded by the added tokens around them."""
            a = enc.offsets[i0 - 1][1] if i0 > 0 else 0
            b = enc.offsets[i1][0] if i1 < n else len(full)
            return a, b

        # chunks: ("ids", ids, mask, block, placeholder) or ("text", text, origin char | None, block, placeholder)
        chunks: list[tuple[Any, ...]] = []

        def template(i0: int, i1: int, join_left: bool, join_right: bool) -> None:
            """Template tokens ids[i0:i1]; the text run touching a joining expansion edge becomes text."""
            lo, hi = i0, i1
            if join_left:
                while lo < i1 and int(ids[lo]) not in added:
                    lo += 1
                a, b = run_chars(i0, lo)
                chunks.append(("text", full[a:b], a, -1, False))
            if join_right and not (join_left and lo == i1):  # else the left run already holds it all
                while hi > lo and int(ids[hi - 1]) not in added:
                    hi -= 1
            if hi > lo:
                chunks.append(("ids", ids[lo:hi], assistant[lo:hi], -1, False))
            if join_right and not (join_left and lo == i1):
                a, b = run_chars(hi, i1)
                chunks.append(("text", full[a:b], a, -1, False))

        cursor, trailing = 0, False
        for k, ((pos, kind), plan) in enumerate(zip(blocks, plans, strict=True)):
            segs = self.profile.expand(plan)
            leading = segs[0].text is not None
            template(cursor, pos, trailing, leading)
            for seg in segs:
                if seg.text is not None:
                    chunks.append(("text", seg.text, None, k, seg.placeholder))
                else:
                    tok = np.full(seg.count, self._token_id(seg.token), dtype=np.int32)
                    chunks.append(("ids", tok, np.zeros(seg.count, dtype=bool), k, seg.placeholder))
            trailing = segs[-1].text is not None
            cursor = pos + len(self._blocks[kind])
        template(cursor, n, trailing, False)

        out_ids: list[np.ndarray] = []
        out_mask: list[np.ndarray] = []
        out_block: list[np.ndarray] = []
        out_ph: list[np.ndarray] = []
        at = 0
        while at < len(chunks):
            if chunks[at][0] == "ids":
                _, c_ids, c_mask, c_block, c_ph = chunks[at]
                out_ids.append(np.asarray(c_ids, dtype=np.int32))
                out_mask.append(np.asarray(c_mask, dtype=bool))
                out_block.append(np.full(len(c_ids), c_block, dtype=np.int64))
                out_ph.append(np.full(len(c_ids), c_ph, dtype=bool))
                at += 1
                continue
            pieces = []  # (start in the joined text, end, origin char | None, block, placeholder)
            text = ""
            while at < len(chunks) and chunks[at][0] == "text":
                _, t, origin, c_block, c_ph = chunks[at]
                pieces.append((len(text), len(text) + len(t), origin, c_block, c_ph))
                text += t
                at += 1
            if not text:
                continue
            t_enc = self._tokenize(text)
            m = len(t_enc.ids)
            mask = np.zeros(m, dtype=bool)
            block = np.full(m, -1, dtype=np.int64)
            ph = np.zeros(m, dtype=bool)
            for j, (a, b) in enumerate(t_enc.offsets):
                for p0, p1, origin, c_block, c_ph in pieces:
                    overlaps = p0 < max(b, a + 1) and a < p1
                    if c_block >= 0 and overlaps:
                        block[j] = c_block
                    if p0 <= a < p1:
                        ph[j] = c_ph
                        if origin is not None:
                            c = origin + a - p0
                            mask[j] = any(s0 <= c < s1 for s0, s1 in char_spans)
            out_ids.append(np.asarray(t_enc.ids, dtype=np.int32))
            out_mask.append(mask)
            out_block.append(block)
            out_ph.append(ph)
        input_ids = np.concatenate(out_ids)
        mask = np.concatenate(out_mask)
        block_of = np.concatenate(out_block)
        is_ph = np.concatenate(out_ph)
        mask &= block_of < 0  # media tokens are never targets
        spans = []
        for k, plan in enumerate(plans):
            where = np.flatnonzero(block_of == k)
            phs = np.flatnonzero((block_of == k) & is_ph)
            if len(phs) != plan.num_tokens:
                raise AssertionError(
                    f"profile {self.profile.name} expanded {len(phs)} placeholders for a plan of {plan.num_tokens}"
                )
            spans.append(MediaSpan(plan, int(where[0]), int(where[-1]) + 1, int(phs[0]), len(phs)))
        return input_ids, mask, spans

    def _check_length(self, full: str, plans: Sequence[MediaPlan], max_tokens: int) -> None:
        assert self.max_chars_per_token is not None
        text_tokens = -(-len(full) // self.max_chars_per_token)  # no fewer tokens than this
        # each media block becomes its expansion, which holds at least the plan's placeholders
        at_least = text_tokens + sum(p.num_tokens - len(self._blocks.get(p.kind, ())) for p in plans)
        if at_least > max_tokens:
            raise SampleRejected(
                f"over-length: the rendered text of {len(full)} characters is at least {at_least} tokens "
                f"(a token covers at most {self.max_chars_per_token} characters), over seq_length "
                f"{max_tokens}; rejected before tokenizing"
            )

    def _assistant_mask(self, enc: Any, char_spans: list[tuple[int, int]], n: int) -> np.ndarray:
        """True for the ``n`` tokens of ``enc`` whose first character lies in a supervised span."""
        mask = np.zeros(n, dtype=bool)
        try:
            for a, b in char_spans:
                mask[self._first_token_from(enc, a, n) : self._first_token_from(enc, b, n)] = True
        except LookupError:  # offsets out of text order, or a character no token covers: every token
            starts = np.fromiter((s for s, _ in enc.offsets), dtype=np.int64, count=n)
            mask[:] = False
            for a, b in char_spans:
                mask |= (starts >= a) & (starts < b)
        return mask

    @staticmethod
    def _assistant_mask_from_starts(
        byte_starts: np.ndarray, char_spans: list[tuple[int, int]], full: str
    ) -> np.ndarray:
        """``_assistant_mask`` from the tokens' byte starts in ``full`` (ascending): the tokens starting
        inside a span are one run of indices."""
        mask = np.zeros(len(byte_starts), dtype=bool)
        for a, b in char_spans:
            lo, hi = np.searchsorted(
                byte_starts, (TokenByteStarts.byte_index(full, a), TokenByteStarts.byte_index(full, b))
            )
            mask[lo:hi] = True
        return mask

    @staticmethod
    def _first_token_from(enc: Any, char: int, n: int) -> int:
        """The first token starting at or after ``char``, from the token that covers ``char`` and its
        neighbours (no per-token work in Python); LookupError where that does not decide it."""
        t = enc.char_to_token(char)
        if t is None:
            if n == 0 or char >= enc.token_to_chars(n - 1)[1]:
                return n
            raise LookupError(char)
        while t < n and enc.token_to_chars(t)[0] < char:
            t += 1
        if t > 0 and enc.token_to_chars(t - 1)[0] >= char:
            raise LookupError(char)
        return t

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
                texts += [json.dumps(m[k], ensure_ascii=False) for k in _TOOL_KEYS if m.get(k) is not None]
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

    def _find_blocks(self, ids: np.ndarray) -> list[tuple[int, str]]:
        """Start positions of every template media block, in order."""
        found = []
        for first, blocks in self._blocks_by_first.items():
            for p in np.flatnonzero(ids == first).tolist():
                for kind, block in blocks:
                    if p + len(block) <= len(ids) and ids[p : p + len(block)].tolist() == block:
                        found.append((p, kind))
        found.sort()
        return found

    def _expand(self, plan: MediaPlan) -> tuple[np.ndarray, int, int]:
        """Token ids of an expanded block, the offset of its first placeholder, and the placeholder count."""
        parts: list[list[int]] = []
        first, count, length = -1, 0, 0
        for seg in self.profile.expand(plan):
            if seg.text is not None:
                seg_ids = self._tokenize(seg.text).ids  # the Rust tokenizer directly (hot path)
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
        return np.asarray([t for p in parts for t in p], dtype=np.int32), first, count

    def _token_id(self, token: str) -> int:
        if token not in self._ids:
            tid = self.tokenizer.convert_tokens_to_ids(token)
            if tid is None or tid == self.tokenizer.unk_token_id:
                raise ValueError(f"tokenizer has no token {token!r}")
            self._ids[token] = int(tid)
        return self._ids[token]
