"""Which tokens are trained on: the supervised character spans of a rendered conversation (each assistant
turn's text through its turn-end marker) and the tokens whose first character lies in one of them.

Spans come from the one render where the template's generation prompt marks every assistant turn with a
special token (text can not forge it); otherwise by rendering prefixes, which is exact for templates where
earlier turns render the same once later turns follow; templates that rewrite earlier turns (e.g. dropping
reasoning from all but the last assistant turn) fall back to locating each turn with a sentinel. An
assistant turn's tool calls are part of its text (supervised); tool results are not assistant turns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..dataset.role_spans import true_runs
from .encoded import SampleRejected
from .token_starts import TokenByteStarts

CharSpans = list[tuple[int, int]]  # [start, end) character ranges of a rendered text
Render = Callable[..., str]  # (messages, add_generation_prompt=False, tools=None) -> the template's text


def through_turn_end(text: str, start: int, turn_end: str) -> int:
    """The end of the turn starting at ``start``: just past its turn-end marker (or the text's end)."""
    cut = text.find(turn_end, start)
    return cut + len(turn_end) if cut >= 0 else len(text)


def spans_by_turn_prompt(
    messages: Sequence[dict[str, Any]], full: str, prompt: str, turn_end: str
) -> CharSpans | None:
    """Each assistant turn starts after an occurrence of the generation ``prompt``; None unless there is
    exactly one occurrence per assistant turn."""
    starts = []
    at = full.find(prompt)
    while at >= 0:
        starts.append(at + len(prompt))
        at = full.find(prompt, at + len(prompt))
    if len(starts) != sum(m["role"] == "assistant" for m in messages):
        return None
    return [(a, through_turn_end(full, a, turn_end)) for a in starts]


def spans_by_prefixes(
    render: Render, messages: list[dict[str, Any]], full: str, tools: Any, turn_end: str
) -> CharSpans:
    """The reference spans: each assistant turn is what rendering through it adds to rendering the turns
    before it with the generation prompt; by sentinel search where earlier turns render differently."""
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prefix = render(messages[:i], add_generation_prompt=True, tools=tools)
        through = render(messages[: i + 1], tools=tools)
        if not (through.startswith(prefix) and full.startswith(through)):
            return spans_by_search(render, messages, full, tools, turn_end)
        spans.append((len(prefix), through_turn_end(through, len(prefix), turn_end)))
    return spans


def spans_by_search(
    render: Render, messages: list[dict[str, Any]], full: str, tools: Any, turn_end: str
) -> CharSpans:
    """Locate each assistant turn by rendering the conversation with that turn's content replaced by a
    sentinel: everything else renders the same, so the turn's rendered text is where the sentinel is,
    and its length is what ``full`` has beyond the sentinel rendering."""
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        sentinel = f"OMNIPACKTURN{i}SENTINEL"
        marked = render([*messages[:i], {**m, "content": sentinel}, *messages[i + 1 :]], tools=tools)
        at = marked.find(sentinel)
        if at < 0 or marked.count(sentinel) != 1 or full[:at] != marked[:at]:
            raise SampleRejected(f"cannot locate assistant turn messages/{i} in the rendered chat template")
        end = at + len(full) - len(marked) + len(sentinel)
        spans.append((at, through_turn_end(full, end, turn_end)))
    return spans


def turn_prompt_holds(
    render: Render, prompt: str, probes: list[tuple[list[dict[str, Any]], Any]], turn_end: str
) -> bool:
    """Whether the turn-prompt spans are the prefix-render spans on ``(messages, tools)`` probes."""
    try:
        for probe, tools in probes:
            full = render(probe, tools=tools)
            by_prompt = spans_by_turn_prompt(probe, full, prompt, turn_end)
            if by_prompt != spans_by_prefixes(render, probe, full, tools, turn_end):
                return False
    except SampleRejected:
        return False
    return True


def find_turn_prompt(render: Render, reserved: Sequence[str], turn_end: str) -> str | None:
    """The text the template writes before every assistant turn (its generation prompt), when one
    render can locate assistant turns by it: it holds a reserved (special) token, so checked sample text
    can not contain it, and it gives the prefix-render spans on probe conversations."""
    user = {"role": "user", "content": "q"}
    bare = render([user])
    with_prompt = render([user], add_generation_prompt=True)
    if not with_prompt.startswith(bare) or len(with_prompt) == len(bare):
        return None
    prompt = with_prompt[len(bare) :]
    if not any(t in prompt for t in reserved):
        return None
    turn = {"role": "assistant", "content": "a"}
    probes = [
        [user, turn],
        [{"role": "system", "content": "s"}, user, turn, {"role": "user", "content": "r"}, turn],
        [user, turn, {"role": "user", "content": [{"type": "text", "text": "t"}]}, turn],
    ]
    return prompt if turn_prompt_holds(render, prompt, [(p, None) for p in probes], turn_end) else None


def mask_from_offsets(enc: Any, char_spans: CharSpans, n: int) -> np.ndarray:
    """True for the ``n`` tokens of ``enc`` whose first character lies in a supervised span."""
    mask = np.zeros(n, dtype=bool)
    try:
        for a, b in char_spans:
            mask[first_token_from(enc, a, n) : first_token_from(enc, b, n)] = True
    except LookupError:  # offsets out of text order, or a character no token covers: every token
        starts = np.fromiter((s for s, _ in enc.offsets), dtype=np.int64, count=n)
        mask[:] = False
        for a, b in char_spans:
            mask |= (starts >= a) & (starts < b)
    return mask


def mask_from_byte_starts(byte_starts: np.ndarray, char_spans: CharSpans, full: str) -> np.ndarray:
    """``mask_from_offsets`` from the tokens' byte starts in ``full`` (ascending): the tokens starting
    inside a span are one run of indices."""
    mask = np.zeros(len(byte_starts), dtype=bool)
    for a, b in char_spans:
        lo, hi = np.searchsorted(
            byte_starts, (TokenByteStarts.byte_index(full, a), TokenByteStarts.byte_index(full, b))
        )
        mask[lo:hi] = True
    return mask


def first_token_from(enc: Any, char: int, n: int) -> int:
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


def assistant_token_spans(supervised: np.ndarray, media: Sequence[tuple[int, int]]) -> np.ndarray:
    """The assistant turns as ``[start, end)`` token ranges ``int32 [K, 2]`` of a sample's final (expanded)
    tokens: the runs of its supervised tokens, two runs joined where only media blocks (``media``: their
    ``[start, end)``; never supervised) lie between them, as a block inside one assistant turn does. The
    turn prompt between two turns is never supervised, so turns do not merge."""
    runs = true_runs(supervised)
    starts, ends = runs[:, 0], runs[:, 1]
    if len(starts) > 1 and len(media):
        in_media = np.zeros(len(supervised) + 1, dtype=np.int64)
        for a, b in media:
            in_media[a:b] = 1
        covered = np.concatenate([[0], np.cumsum(in_media)])  # media tokens before each position
        gap_media = covered[starts[1:]] - covered[ends[:-1]]
        joined = gap_media == starts[1:] - ends[:-1]  # every token between two runs is a media token
        starts = np.concatenate([starts[:1], starts[1:][~joined]])
        ends = np.concatenate([ends[:-1][~joined], ends[-1:]])
    return np.stack([starts, ends], axis=1)
