"""Random valid packed rows (per ``omnipack.dataset.contract``) for the loader tests."""

from __future__ import annotations

import numpy as np

from omnipack.dataset.contract import IGNORE_INDEX, PackedRowArrays, row_invariant_errors


def make_row(
    rng: np.random.Generator,
    width: int,
    align: int,
    *,
    max_seqs: int = 4,
    mrope: bool = False,
    vocab: int = 1000,
) -> dict[str, np.ndarray]:
    """A random row of width ``width`` (a multiple of ``align``) as the stored part dict."""
    assert width % align == 0
    lens: list[int] = []
    used = 0
    for _ in range(int(rng.integers(1, max_seqs + 1))):
        room = width - used
        if room < 1:
            break
        length = int(rng.integers(1, min(room, max(1, width // 2)) + 1))
        lens.append(length)
        used += -(-length // align) * align
        if used > width:  # padding pushed it over: drop this one
            lens.pop()
            break
    plens = [-(-n // align) * align for n in lens]
    plens[-1] += width - sum(plens)  # the last sequence absorbs the tail up to W
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    cup = np.concatenate([[0], np.cumsum(plens)]).astype(np.int32)

    tokens = np.zeros(width, np.int32)
    labels = np.full(width, IGNORE_INDEX, np.int32)
    pos = np.empty(width, np.int32)
    pad = np.ones(width, bool)
    mrope_ids = np.empty((3, width), np.int32)
    for s, n, p in zip(cup[:-1], lens, plens, strict=True):
        seq = rng.integers(1, vocab, n).astype(np.int32)
        tokens[s : s + n] = seq
        pad[s : s + n] = False
        pos[s : s + p] = np.arange(p)  # gaps continue last+1
        # a random assistant span; label = next token inside it; the last token never has a label
        a = int(rng.integers(0, n))
        b = int(rng.integers(a, n))
        idx = np.arange(a, b)
        labels[s + idx] = seq[idx + 1]
        # distinct rows so slicing mistakes between T/H/W show up
        mrope_ids[:, s : s + p] = np.arange(p) + np.array([[0], [1000], [2000]])
    loss_mask = (labels != IGNORE_INDEX).astype(np.int32)
    row = PackedRowArrays(
        tokens=tokens,
        labels=labels,
        loss_mask=loss_mask,
        position_ids=pos,
        padding_mask=pad,
        cu_seqlens=cu,
        cu_seqlens_padded=cup,
        sample_ids=[f"s{i}" for i in range(len(lens))],
        mrope_position_ids=mrope_ids if mrope else None,
    )
    errs = row_invariant_errors(row, align)
    assert not errs, errs
    return row.arrays()
