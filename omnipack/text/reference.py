"""The reference encoding: the simple, obviously-correct way to render, tokenize and label a conversation,
as a HF processor does it. ``ChatTokenizer.encode`` (one direct render, batch tokenization, spans from one
render, byte starts instead of offsets, spliced expansions) must give exactly these ids, labels and spans;
the tests hold it to that on varied conversations of every family.

1. Render with ``apply_chat_template``.
2. Supervised character spans by rendering prefixes (each assistant turn is what rendering through it adds
   to the turns before it with the generation prompt; a sentinel search where earlier turns change).
3. Replace every media block the template wrote by its expansion's text (placeholders as their token text).
4. Tokenize that text once, with character offsets.
5. A token is supervised if its first character is in a supervised span and it holds no media character; a
   media span covers every token holding a character of its expansion, its placeholders are the tokens
   starting in a placeholder segment; label p is token p+1 where p+1 is supervised.
6. An assistant turn's token span runs from its first supervised token through its last.

Slow (renders every prefix, tokenizes every expansion); for tests and debugging only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dataset.contract import IGNORE_INDEX
from ..profiles.base import MediaPlan, MediaSpan, ModelProfile
from .encoded import EncodedSample, SampleRejected
from .labels import spans_by_prefixes
from .render import template_messages


@dataclass(frozen=True)
class ExpansionText:
    """Where one media item's expansion sits in the expanded text: the whole and its placeholder parts."""

    start: int
    end: int
    placeholders: list[tuple[int, int]]


def expanded_text(
    full: str, profile: ModelProfile, plans: Sequence[MediaPlan]
) -> tuple[str, list[ExpansionText], list[tuple[int, int]]]:
    """``full`` with each media block replaced by its plan's expansion text; the expansions, and each
    block's (end in ``full``, shift of text after it) to map positions of ``full`` into the new text."""
    blocks = {"".join(tokens): kind for kind, tokens in profile.template_blocks.items()}
    pattern = re.compile("|".join(re.escape(b) for b in sorted(blocks, key=len, reverse=True)))
    found = list(pattern.finditer(full)) if blocks else []
    if len(found) != len(plans):
        raise SampleRejected(
            f"sample references {len(plans)} media items but the chat template wrote {len(found)} media blocks"
        )
    out, items, shifts, cursor = [], [], [], 0
    size = 0
    for k, (m, plan) in enumerate(zip(found, plans, strict=True)):
        if blocks[m.group()] != plan.kind:
            raise SampleRejected(f"media item {k} is {plan.kind} but the template wrote a {blocks[m.group()]} block there")
        out.append(full[cursor : m.start()])
        size += m.start() - cursor
        start, placeholders = size, []
        for seg in profile.expand(plan):
            piece = seg.text if seg.text is not None else seg.token * seg.count
            if seg.placeholder:
                placeholders.append((size, size + len(piece)))
            out.append(piece)
            size += len(piece)
        items.append(ExpansionText(start, size, placeholders))
        shifts.append((m.end(), size - m.end()))
        cursor = m.end()
    out.append(full[cursor:])
    return "".join(out), items, shifts


def _moved(char: int, shifts: list[tuple[int, int]]) -> int:
    """Position ``char`` of the rendered text in the expanded text."""
    shift = 0
    for end, after in shifts:
        if end <= char:
            shift = after
    return char + shift


def reference_encode(
    tokenizer: Any,
    profile: ModelProfile,
    messages: Sequence[dict[str, Any]],
    plans: Sequence[MediaPlan],
    tools: Sequence[dict[str, Any]] | None = None,
    mrope: bool = False,
) -> EncodedSample:
    """Ids, labels and media spans of one conversation, the reference way (see the module docstring)."""
    msgs = template_messages(messages)
    tools = list(tools) if tools else None

    def render(m: list[dict[str, Any]], add_generation_prompt: bool = False, tools: Any = None) -> str:
        return tokenizer.apply_chat_template(
            m, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    full = render(msgs, tools=tools)
    char_spans = spans_by_prefixes(render, msgs, full, tools, profile.turn_end)
    text, items, shifts = expanded_text(full, profile, plans)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int32)
    offsets = enc["offset_mapping"]
    starts = np.asarray([a for a, _ in offsets], dtype=np.int64)
    ends = np.maximum(np.asarray([b for _, b in offsets], dtype=np.int64), starts + 1)
    supervised = np.zeros(len(ids), dtype=bool)
    for a, b in char_spans:
        supervised |= (starts >= _moved(a, shifts)) & (starts < _moved(b, shifts))
    spans = []
    for item, plan in zip(items, plans, strict=True):
        inside = (starts < item.end) & (ends > item.start)
        supervised &= ~inside
        ph = np.zeros(len(ids), dtype=bool)
        for p0, p1 in item.placeholders:
            ph |= (starts >= p0) & (starts < p1)
        where, phs = np.flatnonzero(inside), np.flatnonzero(ph)
        spans.append(MediaSpan(plan, int(where[0]), int(where[-1]) + 1, int(phs[0]), len(phs)))
    if not supervised.any():
        raise SampleRejected("no supervised tokens (no assistant turn with content)")
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int32)
    labels[:-1] = np.where(supervised[1:], ids[1:], IGNORE_INDEX)
    # each assistant turn: from its first supervised token through its last
    turns = []
    for a, b in char_spans:
        where = np.flatnonzero(supervised & (starts >= _moved(a, shifts)) & (starts < _moved(b, shifts)))
        if len(where):
            turns.append((int(where[0]), int(where[-1]) + 1))
    turns_array = np.asarray(turns, dtype=np.int32).reshape(-1, 2)
    return EncodedSample(
        ids, labels, spans, profile.mrope_position_ids(ids, spans) if mrope else None, turns_array
    )
