"""The role spans a dataset publishes: where each packed sample's assistant turns are, recorded at measure
time from the chat template's own turn markers (``omnipack.text.labels``).

``.nv-meta/role_spans.parquet`` holds one entry per assistant turn of every packed sample, ordered by
``sample_index`` (the accounting ledger's input index) then ``start``: the turn's ``[start, end)`` in the
sample's tokens (the sample's first token is 0, as in its slot of the packed row). ``omnipack verify``
checks against it that no token outside an assistant turn is trained on: a label at sample position ``p``
(its target is token ``p + 1``) must target a token inside one of the sample's turns. The file sits in
``.nv-meta``, so the root digest (``omnipack.dataset.root``) covers it like every other dataset file, and
the shards are the same bytes with or without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from .accounting import read_ledger

ROLE_SPANS_FILE = "role_spans.parquet"
ROLE_SPANS_SCHEMA = pa.schema(
    [
        ("sample_index", pa.int64()),
        ("start", pa.int32()),  # the turn's first token in the sample
        ("end", pa.int32()),  # one past its last
    ]
)


@dataclass(frozen=True)
class RoleSpans:
    """The published spans as arrays, ordered by sample index."""

    sample_index: np.ndarray  # int64 [S]
    start: np.ndarray  # int32 [S]
    end: np.ndarray  # int32 [S]

    def of(self, sample_index: int) -> np.ndarray:
        """The assistant turns of one sample, ``int64 [K, 2]`` (none for a sample without entries)."""
        lo, hi = np.searchsorted(self.sample_index, [sample_index, sample_index + 1])
        return np.stack([self.start[lo:hi], self.end[lo:hi]], axis=1).astype(np.int64)


def read_role_spans(path: Path) -> RoleSpans:
    """The spans with their schema and order checked (``ValueError`` names what is wrong with the file,
    ``FileNotFoundError`` says it is not there)."""
    table = read_ledger(path, ROLE_SPANS_SCHEMA)
    if table.num_rows and any(table.column(c).null_count for c in ROLE_SPANS_SCHEMA.names):
        raise ValueError("null entries")
    index, start, end = (table.column(c).to_numpy() for c in ROLE_SPANS_SCHEMA.names)
    if len(index) and (np.diff(index) < 0).any():
        raise ValueError("entries not ordered by sample_index")
    if (start < 0).any() or (end <= start).any():
        raise ValueError("a span that is empty or starts before its sample")
    return RoleSpans(index, start, end)


def first_outside(supervised: np.ndarray, turns: np.ndarray) -> int | None:
    """The first supervised position of a sample whose target (the next token) lies outside every turn of
    ``turns`` (``[K, 2]``, token ranges); None when all are inside. ``supervised``: ``[start, end)`` runs of
    supervised positions, ``[R, 2]``."""
    for p0, p1 in supervised.tolist():
        t = p0 + 1  # the first target of the run, then the first past each turn that holds it
        while t <= p1:
            inside = (turns[:, 0] <= t) & (t < turns[:, 1])
            if not inside.any():
                return t - 1
            t = int(turns[inside, 1].max())
    return None


def true_runs(mask: np.ndarray) -> np.ndarray:
    """``[start, end)`` runs of the True positions of ``mask``, ``int32 [R, 2]``."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return np.stack([edges[0::2], edges[1::2]], axis=1).astype(np.int32)
