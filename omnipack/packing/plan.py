"""The packing result: which samples go into which fixed-width row, as flat numpy arrays."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class PackPlan:
    """Rows of a packing in CSR form; no Python object per sample.

    Samples of row ``r`` are ``members[row_ptr[r]:row_ptr[r + 1]]`` in ascending sample index;
    ``row_of[i]`` is the row of sample ``i`` and ``row_fill[r]`` the summed (padded) length of row ``r``.
    """

    row_ptr: np.ndarray  # int64 [R + 1]
    members: np.ndarray  # int32 [n]
    row_of: np.ndarray  # int32 [n]
    row_fill: np.ndarray  # int64 [R]
    capacity: int
    algorithm: str

    @property
    def num_rows(self) -> int:
        return len(self.row_ptr) - 1

    @property
    def num_samples(self) -> int:
        return len(self.row_of)

    def row(self, r: int) -> np.ndarray:
        """Sample indices of row ``r`` (ascending)."""
        return self.members[self.row_ptr[r] : self.row_ptr[r + 1]]

    def rows(self) -> Iterator[np.ndarray]:
        """Sample indices of every row, in row order."""
        for r in range(self.num_rows):
            yield self.row(r)

    def samples_per_row(self) -> np.ndarray:
        return np.diff(self.row_ptr)


def build_plan(
    row_of: np.ndarray,
    num_rows: int,
    lengths: np.ndarray,
    capacity: int,
    algorithm: str,
    shuffle: bool,
    seed: int,
) -> PackPlan:
    """Turn a per-sample row assignment into a (optionally row-shuffled) CSR plan."""
    row_of = np.asarray(row_of, dtype=np.int32)
    if shuffle and num_rows > 1:
        # Shuffle rows so shards are not ordered by length (algorithms emit long rows first).
        new_id = np.random.default_rng(seed).permutation(num_rows).astype(np.int32)
        row_of = new_id[row_of]
    members = group_by_row(row_of, num_rows)
    counts = np.bincount(row_of, minlength=num_rows)
    row_ptr = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(counts, out=row_ptr[1:])
    row_fill = np.bincount(row_of, weights=lengths, minlength=num_rows).astype(np.int64)
    return PackPlan(
        row_ptr=row_ptr,
        members=members,
        row_of=row_of,
        row_fill=row_fill,
        capacity=int(capacity),
        algorithm=algorithm,
    )


def group_by_row(row_of: np.ndarray, num_rows: int) -> np.ndarray:
    """Sample indices grouped by row, ascending inside each row: a stable sort by row id.

    Row ids are bounded ints, so this is a two-pass LSD radix sort over 16-bit digits (numpy's stable
    sort of uint16 keys is a counting sort), several times faster than a general argsort at millions.
    """
    row_of = np.asarray(row_of)
    if num_rows <= 2**16:
        return np.argsort(row_of.astype(np.uint16), kind="stable").astype(np.int32)
    by_low = np.argsort((row_of & 0xFFFF).astype(np.uint16), kind="stable")
    by_high = np.argsort((row_of[by_low] >> 16).astype(np.uint16), kind="stable")
    return by_low[by_high].astype(np.int32)
