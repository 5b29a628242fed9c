"""Temporary first packer (replaced by the packing engine): best-fit decreasing over the whole dataset."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PackPlan:
    row_ptr: np.ndarray
    members: np.ndarray
    row_of: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.row_ptr) - 1

    def row(self, r: int) -> np.ndarray:
        return self.members[self.row_ptr[r] : self.row_ptr[r + 1]]


def pack(lengths: np.ndarray, capacity: int, *, shuffle: bool = True, seed: int = 0, **_: object) -> PackPlan:
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    free: list[int] = []
    row_of = np.empty(len(lengths), dtype=np.int32)
    for i in order:
        best = -1
        for r, f in enumerate(free):
            if lengths[i] <= f and (best < 0 or f < free[best]):
                best = r
        if best < 0:
            free.append(capacity)
            best = len(free) - 1
        free[best] -= lengths[i]
        row_of[i] = best
    n_rows = len(free)
    perm = np.random.default_rng(seed).permutation(n_rows) if shuffle else np.arange(n_rows)
    row_of = np.argsort(perm)[row_of].astype(np.int32)
    members = np.argsort(row_of, kind="stable").astype(np.int32)
    row_ptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(row_of, minlength=n_rows), out=row_ptr[1:])
    return PackPlan(row_ptr, members, row_of)


@dataclass(frozen=True)
class PackConstraints:
    max_samples_per_row: int | None = None
    resources: dict | None = None


def packing_stats(real: np.ndarray, padded: np.ndarray, plan: PackPlan, capacity: int) -> dict:
    rows = plan.num_rows
    return {
        "rows": rows,
        "l1": int(-(-int(padded.sum()) // capacity)),
        "real_efficiency": float(real.sum() / (rows * capacity)),
        "padded_efficiency": float(padded.sum() / (rows * capacity)),
    }
