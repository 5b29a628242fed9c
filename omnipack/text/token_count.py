"""Counting a long text's tokens in fixed-size windows, so that a text far over the row length is rejected
without tokenizing it whole.

The tokenizer's working memory is about 300 bytes per token (the encoding's ids, offsets, token strings and
word ids, and its pre-tokenizer's pieces): one 10 MB manifest line of text becomes millions of tokens and
gigabytes of memory before the length check can see them. Here the text is tokenized a window at a time;
each window counts the tokens of its pre-tokenizer words (``word_ids``) that end at least ``margin``
characters before the window's end, and the next window starts where the last counted word ends. A word that
ends that far from the cut is split the same way in the whole text (the tokenizer splits at added tokens,
then its pre-tokenizer's pattern, whose decisions look a few characters ahead, not ``margin``), so the count
so far never exceeds the whole text's count: once it passes the limit, the sample certainly does not fit.

A sample that fits is still tokenized whole by the caller (the count only decides rejection), so its token
ids never depend on this module. A window without a word that ends before its margin (one word longer than the
window, or a tokenizer without a pre-tokenizer) stops the count: the caller then tokenizes the text whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

WINDOW_CHARS = 1 << 16  # characters tokenized at once: a few MiB of tokenizer memory
MARGIN_CHARS = 1 << 10  # words ending this close to a window's cut are counted in the next window
LONG_TEXT_CHARS = 1 << 18  # texts longer than this are counted in windows before being tokenized whole


def count_tokens_over(
    tokenize: Callable[[str], Any],
    text: str,
    limit: int,
    window: int = WINDOW_CHARS,
    margin: int = MARGIN_CHARS,
) -> tuple[int, int] | None:
    """``(tokens, characters)`` once the tokens counted over the first ``characters`` of ``text`` are
    over ``limit`` (the whole text then has at least that many); None when the whole text has at most
    ``limit`` tokens, or the count stopped (see the module docstring). ``tokenize`` is the tokenizer's
    ``encode`` without special tokens (its encodings carry ``word_ids`` and character ``offsets``)."""
    counted, pos = 0, 0
    while pos < len(text):
        piece = text[pos : pos + window]
        enc = tokenize(piece)
        if pos + len(piece) == len(text):  # the last window: every token counts
            counted += len(enc.ids)
            return (counted, len(text)) if counted > limit else None
        done = _complete_words(enc, len(piece) - margin)
        if done == 0:
            return None
        counted, step = counted + done, int(enc.offsets[done - 1][1])
        if counted > limit:
            return counted, pos + step
        if step <= 0:
            return None
        pos += step
    return None


def _complete_words(enc: Any, before: int) -> int:
    """How many of ``enc``'s first tokens make up whole words ending at or before character ``before``."""
    ends = np.fromiter((b for _, b in enc.offsets), dtype=np.int64, count=len(enc.ids))
    words = np.fromiter((-1 if w is None else w for w in enc.word_ids), dtype=np.int64, count=len(enc.ids))
    if len(ends) < 2:
        return 0
    # token k ends a counted run when it ends in time and the next token starts another word (or is an
    # added token, whose word id is None)
    word_end = (words[1:] != words[:-1]) | (words[1:] < 0) | (words[:-1] < 0)
    ok = np.flatnonzero(word_end & (ends[:-1] <= before))
    return int(ok[-1]) + 1 if len(ok) else 0
