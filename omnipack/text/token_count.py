"""Counting a long text's tokens in fixed-size windows, so that a text far over the row length is rejected
without tokenizing it whole.

The tokenizer's working memory is about 300 bytes per token (the encoding's ids, offsets, token strings and
word ids, and its pre-tokenizer's pieces): one 10 MB manifest line of text becomes millions of tokens and
gigabytes of memory before the length check can see them. Here the text is tokenized a window at a time;
each window counts the tokens of its pre-tokenizer words (``word_ids``) that end at least ``margin``
characters before the window's end, and the next window starts at the last counted word, whose tokens it
skips (a tokenizer may prefix a text's first word with a space or a Metaspace mark that the whole text does not
have there). A word that ends that far from the cut is split the same way in the whole text (the tokenizer
splits at added tokens, then its pre-tokenizer's pattern, whose decisions look a few characters ahead, not
``margin``), so the count so far is the whole text's tokens up to there: once it passes the limit, the sample
certainly does not fit. Windows that disagree on where a word ends stop the count.

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
    counted, pos, seen = 0, 0, 0  # seen: where the counted words end, relative to ``pos``
    while pos < len(text):
        piece = text[pos : pos + window]
        starts, ends, words = _token_arrays(tokenize(piece))
        # A window after the first starts at the last word the one before it counted: that word is tokenized
        # again but not counted, since a tokenizer may prefix a window's first word (a prefix space, a
        # Metaspace "first" prepend) where the whole text has none.
        first = int(np.searchsorted(ends, seen, side="right")) if pos else 0
        if first < len(starts) and starts[first] < seen:
            return None  # the windows disagree on where that word ends
        at_end = pos + len(piece) == len(text)
        done = len(words) if at_end else _complete_words(ends, words, len(piece) - margin)
        if done <= first:
            return None
        counted += done - first
        if counted > limit:
            return counted, pos + int(ends[done - 1])
        if at_end:
            return None
        if words[done - 1] < 0:  # an added token: its own word
            step = int(starts[done - 1])
        else:
            before_it = np.flatnonzero(words[:done] != words[done - 1])
            step = int(starts[before_it[-1] + 1 if len(before_it) else 0])
        if step <= 0:
            return None
        pos, seen = pos + step, int(ends[done - 1]) - step
    return None


def _token_arrays(enc: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each token's start and end character and word id (-1 for an added token) in an encoding."""
    n = len(enc.ids)
    offsets = np.fromiter((x for pair in enc.offsets for x in pair), dtype=np.int64, count=2 * n).reshape(n, 2)
    words = np.fromiter((-1 if w is None else w for w in enc.word_ids), dtype=np.int64, count=n)
    return offsets[:, 0], offsets[:, 1], words


def _complete_words(ends: np.ndarray, words: np.ndarray, before: int) -> int:
    """How many of the first tokens make up whole words ending at or before character ``before``."""
    if len(ends) < 2:
        return 0
    # token k ends a counted run when it ends in time and the next token starts another word (or is an
    # added token, whose word id is None)
    word_end = (words[1:] != words[:-1]) | (words[1:] < 0) | (words[:-1] < 0)
    ok = np.flatnonzero(word_end & (ends[:-1] <= before))
    return int(ok[-1]) + 1 if len(ok) else 0
