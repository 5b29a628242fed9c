"""Row assembly: measured sequences placed side by side into one fixed-width THD row.

Each sequence is padded to a multiple of the alignment; the row tail joins the last sequence's padding
so ``cu_seqlens_padded[-1] == W`` (TE's CP partitioning needs the boundaries to cover the row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .alignment import pad_to_multiple
from .dataset.contract import IGNORE_INDEX, MediaItem, PackedRowArrays
from .profiles.base import MediaPlan


@dataclass
class SequenceInput:
    """One measured sample as the row assembler needs it."""

    sample_id: str
    input_ids: np.ndarray  # int32 [L]
    labels: np.ndarray  # int32 [L]
    media: list[tuple[MediaPlan, tuple[int, int, int, int], str]] = field(default_factory=list)
    # (plan, span (start, end, placeholder_start, num_placeholders), tar part name)
    mrope_position_ids: np.ndarray | None = None  # int32 [3, L]


def assemble_row(
    seqs: Sequence[SequenceInput], seq_length: int, align: int, pad_token_id: int
) -> PackedRowArrays:
    if not seqs:
        raise ValueError("a row needs at least one sequence")
    lengths = np.array([len(s.input_ids) for s in seqs], dtype=np.int64)
    padded = np.array([pad_to_multiple(int(n), align) for n in lengths], dtype=np.int64)
    if padded.sum() > seq_length:
        raise ValueError(f"sequences need {int(padded.sum())} positions, row has {seq_length}")
    padded[-1] += seq_length - padded.sum()
    cu = np.zeros(len(seqs) + 1, dtype=np.int32)
    cup = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    np.cumsum(padded, out=cup[1:])

    tokens = np.full(seq_length, pad_token_id, dtype=np.int32)
    labels = np.full(seq_length, IGNORE_INDEX, dtype=np.int32)
    padding_mask = np.ones(seq_length, dtype=bool)
    position_ids = np.empty(seq_length, dtype=np.int32)
    with_mrope = all(s.mrope_position_ids is not None for s in seqs)
    mrope = np.empty((3, seq_length), dtype=np.int32) if with_mrope else None
    media: list[MediaItem] = []
    for i, s in enumerate(seqs):
        a, n, p = int(cup[i]), int(lengths[i]), int(padded[i])
        tokens[a : a + n] = s.input_ids
        labels[a : a + n] = s.labels
        padding_mask[a : a + n] = False
        # Gap positions continue last+1 so rotary embeddings stay monotone inside the padded sequence.
        position_ids[a : a + p] = np.arange(p, dtype=np.int32)
        if mrope is not None:
            mrope[:, a : a + n] = s.mrope_position_ids
            nxt = int(s.mrope_position_ids.max()) + 1 if n else 0
            mrope[:, a + n : a + p] = np.arange(nxt, nxt + p - n, dtype=np.int32)
        for plan, (start, end, ph_start, n_ph), part in s.media:
            # (``truncate`` is the writer's instruction; a family records it in its own ``info`` if at all)
            info = {k: v for k, v in plan.to_json().items() if k not in ("kind", "num_tokens", "grid_thw", "truncate")}
            media.append(
                MediaItem(
                    kind=plan.kind,
                    part=part,
                    sample_index=i,
                    token_start=a + ph_start,
                    num_tokens=n_ph,
                    block_start=a + start,
                    block_end=a + end,
                    grid_thw=None if plan.grid_thw is None else list(plan.grid_thw),
                    info={k: v for k, v in info.items() if v not in (None, 0, {})},
                )
            )
    loss_mask = (labels != IGNORE_INDEX).astype(np.int32)
    return PackedRowArrays(
        tokens=tokens,
        labels=labels,
        loss_mask=loss_mask,
        position_ids=position_ids,
        padding_mask=padding_mask,
        cu_seqlens=cu,
        cu_seqlens_padded=cup,
        sample_ids=[s.sample_id for s in seqs],
        media=media,
        mrope_position_ids=mrope,
    )
