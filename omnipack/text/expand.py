"""Media expansion: every media block the chat template wrote (a fixed run of special tokens) becomes the
profile's expansion of its media plan, with the exact placeholder count, and the ``MediaSpan`` that locates
it in the sample's token ids.

Two paths, both equal to the processor's way (``reference.py``): where no expansion begins or ends with
literal text, the block's tokens are replaced by the expansion's tokens (``splice``); otherwise the
expansion's text replaces the block in the rendered string, so literal text at an expansion's edge is
tokenized together with the template text beside it (``in_context``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import numpy as np

from ..profiles.base import MediaPlan, MediaSpan, ModelProfile, Segment
from .encoded import SampleRejected
from .labels import CharSpans


@dataclass(frozen=True)
class TemplateBlock:
    """A media block the template wrote: its first token's index in the rendered ids, and its kind."""

    start: int
    kind: str


@dataclass(slots=True)
class TokenChunk:
    """Token ids kept as they are: template tokens (``item`` -1) or an expansion's special tokens."""

    ids: np.ndarray  # int32
    supervised: np.ndarray  # bool per token
    item: int = -1  # the media item (plan index) these tokens belong to, -1 for template tokens
    placeholder: bool = False


@dataclass(slots=True)
class TextChunk:
    """Text tokenized together with the text chunks beside it: template text at a joining expansion edge
    (``origin``: its first character in the rendered text) or an expansion's literal text (origin None)."""

    text: str
    origin: int | None
    item: int = -1
    placeholder: bool = False


@dataclass(frozen=True)
class RenderedTokens:
    """One tokenization (with character offsets) of the rendered text, and its supervised mask."""

    enc: Any
    full: str
    ids: np.ndarray
    supervised: np.ndarray

    def run_chars(self, i0: int, i1: int) -> tuple[int, int]:
        """Characters of the text tokens ids[i0:i1], bounded by the added tokens around them."""
        a = self.enc.offsets[i0 - 1][1] if i0 > 0 else 0
        b = self.enc.offsets[i1][0] if i1 < len(self.ids) else len(self.full)
        return a, b


@dataclass
class TokenColumns:
    """Per-token columns built chunk by chunk: ids, supervised, media item (-1 none), placeholder."""

    ids: list[np.ndarray] = field(default_factory=list)
    supervised: list[np.ndarray] = field(default_factory=list)
    item: list[np.ndarray] = field(default_factory=list)
    placeholder: list[np.ndarray] = field(default_factory=list)

    def add(self, ids: Any, supervised: np.ndarray, item: Any, placeholder: Any) -> None:
        """Append tokens; ``item`` and ``placeholder`` are per-token arrays or one value for all."""
        n = len(ids)
        self.ids.append(np.asarray(ids, dtype=np.int32))
        self.supervised.append(np.asarray(supervised, dtype=bool))
        self.item.append(item if isinstance(item, np.ndarray) else np.full(n, item, dtype=np.int64))
        self.placeholder.append(
            placeholder if isinstance(placeholder, np.ndarray) else np.full(n, placeholder, dtype=bool)
        )


@dataclass(frozen=True)
class Expanded:
    """A sample's token ids after media expansion, its supervised mask and its media spans."""

    input_ids: np.ndarray
    supervised: np.ndarray
    spans: list[MediaSpan]


class MediaExpander:
    """Finds a profile's media blocks in rendered token ids and expands them to their plans."""

    def __init__(
        self,
        profile: ModelProfile,
        blocks: dict[str, list[int]],
        token_id: Callable[[str], int],
        tokenize: Callable[[str], Any],
        added_ids: Callable[[], set[int]],
    ) -> None:
        self.profile = profile
        self.blocks = blocks  # kind -> the template's block token ids
        self.token_id = token_id
        self.tokenize = tokenize  # text -> encoding with ids and offsets
        self.added_ids = added_ids  # the tokenizer splits text at these tokens before anything else
        self._by_first: dict[int, list[tuple[str, list[int]]]] = {}  # one scan per first token
        for kind, block in blocks.items():
            self._by_first.setdefault(block[0], []).append((kind, block))

    def find_blocks(self, ids: np.ndarray) -> list[TemplateBlock]:
        """Every template media block in ``ids``, in order."""
        found = []
        for first, blocks in self._by_first.items():
            for p in np.flatnonzero(ids == first).tolist():
                for kind, block in blocks:
                    if p + len(block) <= len(ids) and ids[p : p + len(block)].tolist() == block:
                        found.append(TemplateBlock(p, kind))
        found.sort(key=lambda b: (b.start, b.kind))
        return found

    def has_edge_text(self, blocks: list[TemplateBlock], plans: Sequence[MediaPlan]) -> bool:
        """Whether an expansion begins or ends with literal text (which then joins the text beside it)."""
        for block, plan in zip(blocks, plans, strict=True):
            if plan.kind != block.kind:
                return False  # the splice path names the mismatch
            segs = self.profile.expand(plan)
            if segs and (segs[0].text is not None or segs[-1].text is not None):
                return True
        return False

    def expand_block(self, plan: MediaPlan) -> tuple[np.ndarray, int, int]:
        """Token ids of an expanded block, the offset of its first placeholder, and the placeholder count."""
        parts: list[list[int]] = []
        first, count, length = -1, 0, 0
        for seg in self.profile.expand(plan):
            if seg.text is not None:
                seg_ids = self.tokenize(seg.text).ids
            else:
                seg_ids = [self.token_id(seg.token)] * seg.count
            if seg.placeholder:
                if first < 0:
                    first = length
                count += len(seg_ids)
            parts.append(seg_ids)
            length += len(seg_ids)
        self._check_count(count, plan)
        return np.asarray([t for p in parts for t in p], dtype=np.int32), first, count

    def _check_count(self, count: int, plan: MediaPlan) -> None:
        if count != plan.num_tokens:
            raise AssertionError(
                f"profile {self.profile.name} expanded {count} placeholders for a plan of {plan.num_tokens}"
            )

    def splice(
        self, ids: np.ndarray, supervised: np.ndarray, blocks: list[TemplateBlock], plans: Sequence[MediaPlan]
    ) -> Expanded:
        """Each block's tokens replaced by its expansion's tokens (no expansion text joins the template's)."""
        out_ids: list[np.ndarray] = []
        out_supervised: list[np.ndarray] = []
        spans: list[MediaSpan] = []
        cursor, out_len = 0, 0
        for k, block in enumerate(blocks):
            if k >= len(plans):
                raise SampleRejected(
                    f"chat template wrote more media blocks than the sample references ({len(plans)})"
                )
            plan = plans[k]
            if plan.kind != block.kind:
                raise SampleRejected(f"media item {k} is {plan.kind} but the template wrote a {block.kind} block there")
            out_ids.append(ids[cursor : block.start])
            out_supervised.append(supervised[cursor : block.start])
            out_len += block.start - cursor
            tokens, first_ph, n_ph = self.expand_block(plan)
            spans.append(MediaSpan(plan, out_len, out_len + len(tokens), out_len + first_ph, n_ph))
            out_ids.append(tokens)
            out_supervised.append(np.zeros(len(tokens), dtype=bool))  # media tokens are never targets
            out_len += len(tokens)
            cursor = block.start + len(self.blocks[block.kind])
        if len(spans) != len(plans):
            raise SampleRejected(
                f"sample references {len(plans)} media items but the chat template wrote {len(spans)} media blocks"
            )
        out_ids.append(ids[cursor:])
        out_supervised.append(supervised[cursor:])
        return Expanded(np.concatenate(out_ids), np.concatenate(out_supervised), spans)

    def in_context(
        self, rendered: RenderedTokens, char_spans: CharSpans, blocks: list[TemplateBlock], plans: Sequence[MediaPlan]
    ) -> Expanded:
        """Blocks expanded as a processor does it: the expansion's text replaces the block in the rendered
        string, so literal text at an expansion's edge is tokenized together with the template text beside
        it (the tokenizer splits only at added tokens; e.g. the template's "\\n" and a block's leading
        "\\n\\n" become one "\\n\\n\\n" token in a vocabulary that has it). Text runs away from expansion
        edges keep their tokens from the one tokenization. A span covers every token that holds a character
        of its expansion."""
        chunks: list[TokenChunk | TextChunk] = []
        cursor, trailing = 0, False
        for k, (block, plan) in enumerate(zip(blocks, plans, strict=True)):
            segs = self.profile.expand(plan)
            chunks += self._template_chunks(rendered, cursor, block.start, trailing, segs[0].text is not None)
            chunks += [self._expansion_chunk(k, seg) for seg in segs]
            trailing = segs[-1].text is not None
            cursor = block.start + len(self.blocks[block.kind])
        chunks += self._template_chunks(rendered, cursor, len(rendered.ids), trailing, False)
        cols = self._columns(chunks, char_spans)
        input_ids = np.concatenate(cols.ids)
        item = np.concatenate(cols.item)
        supervised = np.concatenate(cols.supervised) & (item < 0)  # media tokens are never targets
        return Expanded(input_ids, supervised, self._spans(item, np.concatenate(cols.placeholder), plans))

    def _template_chunks(
        self, r: RenderedTokens, i0: int, i1: int, join_left: bool, join_right: bool
    ) -> list[TokenChunk | TextChunk]:
        """Template tokens ids[i0:i1]; the text run touching a joining expansion edge becomes text."""
        added = self.added_ids()
        chunks: list[TokenChunk | TextChunk] = []
        lo, hi = i0, i1
        if join_left:
            while lo < i1 and int(r.ids[lo]) not in added:
                lo += 1
            a, b = r.run_chars(i0, lo)
            chunks.append(TextChunk(r.full[a:b], a))
        join_right = join_right and not (join_left and lo == i1)  # else the left run already holds it all
        if join_right:
            while hi > lo and int(r.ids[hi - 1]) not in added:
                hi -= 1
        if hi > lo:
            chunks.append(TokenChunk(r.ids[lo:hi], r.supervised[lo:hi]))
        if join_right:
            a, b = r.run_chars(hi, i1)
            chunks.append(TextChunk(r.full[a:b], a))
        return chunks

    def _expansion_chunk(self, item: int, seg: Segment) -> TokenChunk | TextChunk:
        if seg.text is not None:
            return TextChunk(seg.text, None, item, seg.placeholder)
        ids = np.full(seg.count, self.token_id(seg.token), dtype=np.int32)
        return TokenChunk(ids, np.zeros(seg.count, dtype=bool), item, seg.placeholder)

    def _columns(self, chunks: list[TokenChunk | TextChunk], char_spans: CharSpans) -> TokenColumns:
        """Token chunks as they are; each run of adjacent text chunks tokenized as one text."""
        cols = TokenColumns()
        at = 0
        while at < len(chunks):
            chunk = chunks[at]
            if isinstance(chunk, TokenChunk):  # its arrays are int32 / bool already
                n = len(chunk.ids)
                cols.ids.append(chunk.ids)
                cols.supervised.append(chunk.supervised)
                cols.item.append(np.full(n, chunk.item, dtype=np.int64))
                cols.placeholder.append(np.full(n, chunk.placeholder, dtype=bool))
                at += 1
                continue
            run: list[TextChunk] = []
            while at < len(chunks) and isinstance(chunks[at], TextChunk):
                run.append(chunks[at])  # type: ignore[arg-type]
                at += 1
            self._tokenize_run(run, char_spans, cols)
        return cols

    def _tokenize_run(self, run: list[TextChunk], char_spans: CharSpans, cols: TokenColumns) -> None:
        """Tokenize the joined text of ``run``: a token belongs to every expansion it overlaps, is a
        placeholder and supervised as the chunk its first character is in."""
        text = "".join(c.text for c in run)
        if not text:
            return
        bounds = list(accumulate((len(c.text) for c in run), initial=0))
        enc = self.tokenize(text)
        m = len(enc.ids)
        supervised = np.zeros(m, dtype=bool)
        item = np.full(m, -1, dtype=np.int64)
        placeholder = np.zeros(m, dtype=bool)
        pieces = [(p0, p1, c.origin, c.item, c.placeholder) for c, p0, p1 in zip(run, bounds[:-1], bounds[1:], strict=True)]
        for j, (a, b) in enumerate(enc.offsets):
            for p0, p1, origin, c_item, c_placeholder in pieces:
                if c_item >= 0 and p0 < max(b, a + 1) and a < p1:
                    item[j] = c_item
                if p0 <= a < p1:
                    placeholder[j] = c_placeholder
                    if origin is not None:
                        char = origin + a - p0
                        supervised[j] = any(s0 <= char < s1 for s0, s1 in char_spans)
        cols.add(enc.ids, supervised, item, placeholder)

    def _spans(self, item: np.ndarray, placeholder: np.ndarray, plans: Sequence[MediaPlan]) -> list[MediaSpan]:
        spans = []
        for k, plan in enumerate(plans):
            where = np.flatnonzero(item == k)
            phs = np.flatnonzero((item == k) & placeholder)
            self._check_count(len(phs), plan)
            spans.append(MediaSpan(plan, int(where[0]), int(where[-1]) + 1, int(phs[0]), len(phs)))
        return spans
