"""Per-row limits beyond the token width (media items, encoder patches, audio frames) and the
best-fit-decreasing variant that respects them."""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class PackConstraints:
    """Extra per-row limits, respected exactly.

    ``max_samples_per_row`` caps the samples in a row; each ``resources[name] = (amounts, budget)`` gives a
    per-sample integer amount (e.g. media items, vision patches, audio frames) and the per-row budget.
    """

    max_samples_per_row: int | None = None
    resources: dict[str, tuple[np.ndarray, int]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self.max_samples_per_row is None and not self.resources

    def validate(self, num_samples: int) -> None:
        """Raise ValueError for malformed constraints or a sample that alone breaks a budget."""
        if self.max_samples_per_row is not None and self.max_samples_per_row < 1:
            raise ValueError(f"max_samples_per_row must be >= 1, got {self.max_samples_per_row}")
        for name, (amounts, budget) in self.resources.items():
            amounts = np.asarray(amounts)
            if amounts.shape != (num_samples,):
                raise ValueError(f"resource {name!r}: expected shape ({num_samples},), got {amounts.shape}")
            if not np.issubdtype(amounts.dtype, np.integer):
                raise ValueError(f"resource {name!r}: amounts must be integers, got {amounts.dtype}")
            bad = np.flatnonzero((amounts < 0) | (amounts > budget))
            if bad.size:
                i = int(bad[0])
                raise ValueError(
                    f"resource {name!r}: sample {i} needs {int(amounts[i])}, outside [0, budget {budget}]"
                )

    def amounts_matrix(self, num_samples: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-sample amounts as int64 [n, K] and budgets as int64 [K]."""
        if not self.resources:
            return np.zeros((num_samples, 0), dtype=np.int64), np.zeros(0, dtype=np.int64)
        amounts = np.stack([np.asarray(a, dtype=np.int64) for a, _ in self.resources.values()], axis=1)
        budgets = np.array([b for _, b in self.resources.values()], dtype=np.int64)
        return amounts, budgets


def constrained_bfd(
    lengths: np.ndarray, capacity: int, constraints: PackConstraints
) -> tuple[np.ndarray, int]:
    """Item-by-item best-fit decreasing with sample-count and resource limits.

    Returns ``(row_of, num_rows)``. Among rows with enough space it picks the one with the least space
    that also satisfies every limit (ties: oldest row). Rows that reach a limit on count are closed.
    """
    n = len(lengths)
    amounts, budgets = constraints.amounts_matrix(n)
    num_resources = len(budgets)
    max_samples = constraints.max_samples_per_row or n + 1
    budget_list = budgets.tolist()
    min_length = int(lengths.min())
    order = np.argsort(-lengths.astype(np.int64), kind="stable")
    row_of = np.empty(n, dtype=np.int32)
    # Per-row state as Python lists: space, sample count, remaining resource budgets.
    row_space: list[int] = []
    row_count: list[int] = []
    row_left: list[list[int]] = []
    buckets: dict[int, dict[int, None]] = {}  # space -> insertion-ordered set of open rows
    nonempty: list[int] = []

    def add(space: int, row: int) -> None:
        bucket = buckets.setdefault(space, {})
        if not bucket:
            insort(nonempty, space)
        bucket[row] = None

    def remove(space: int, row: int) -> None:
        bucket = buckets[space]
        del bucket[row]
        if not bucket:
            nonempty.pop(bisect_left(nonempty, space))

    order_list = order.tolist()
    lengths_list = lengths.tolist()
    needs_rows = amounts[order].tolist() if num_resources else None
    for pos, i in enumerate(order_list):
        v = lengths_list[i]
        need = needs_rows[pos] if needs_rows is not None else ()
        chosen = -1
        for space in nonempty[bisect_left(nonempty, v) :]:
            for row in buckets[space]:
                left = row_left[row]
                if all(need[k] <= left[k] for k in range(num_resources)):
                    chosen = row
                    break
            if chosen >= 0:
                remove(space, chosen)
                break
        if chosen < 0:
            chosen = len(row_space)
            row_space.append(capacity)
            row_count.append(0)
            row_left.append(list(budget_list))
        row_of[i] = chosen
        space = row_space[chosen] - v
        row_space[chosen] = space
        row_count[chosen] += 1
        left = row_left[chosen]
        for k in range(num_resources):
            left[k] -= need[k]
        if space >= min_length and row_count[chosen] < max_samples:
            add(space, chosen)
    return row_of, len(row_space)
