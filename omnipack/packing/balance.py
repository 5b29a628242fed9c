"""Compute balancing: make rows similar in attention cost without adding rows.

Attention cost of a row is the sum of squared sample lengths, so data-parallel ranks that each take a
row finish a step together only if those sums are close. Two steps, given BFD's row count R:

1. ``balanced_assign``: deal the large samples (which carry most of the cost) round by round, the
   largest remaining one to the currently cheapest row that fits, vectorised per round of R samples;
   then fill the gaps with the small samples by best-fit. Kept only if it needs no more rows than R.
2. ``rebalance_rows``: pair expensive with cheap rows and re-split each pair's samples greedily,
   keeping a split when it narrows the pair's cost gap. Preserves rows, capacity and constraints.
"""

from __future__ import annotations

import numpy as np

from .constraints import PackConstraints
from .greedy import bfd_classes


def attention_cost(row_of: np.ndarray, num_rows: int, lengths: np.ndarray) -> np.ndarray:
    """Per-row sum of squared lengths (float64)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return np.bincount(row_of, weights=lengths * lengths, minlength=num_rows)


def coefficient_of_variation(values: np.ndarray) -> float:
    mean = float(np.mean(values)) if len(values) else 0.0
    return float(np.std(values) / mean) if mean > 0 else 0.0


def rebalance_rows(
    row_of: np.ndarray,
    num_rows: int,
    lengths: np.ndarray,
    capacity: int,
    constraints: PackConstraints | None = None,
    rounds: int = 4,
) -> np.ndarray:
    """Return a new ``row_of`` with the same rows count and more even attention cost."""
    n = len(lengths)
    row_of = np.array(row_of, dtype=np.int32, copy=True)
    if num_rows < 2:
        return row_of
    if constraints is not None:
        amounts, budgets = constraints.amounts_matrix(n)
        max_samples = constraints.max_samples_per_row or n + 1
    else:
        amounts, budgets = np.zeros((n, 0), dtype=np.int64), np.zeros(0, dtype=np.int64)
        max_samples = n + 1
    has_resources = amounts.shape[1] > 0
    lengths_list = lengths.tolist()
    for round_index in range(rounds):
        cost = attention_cost(row_of, num_rows, lengths)
        by_cost = np.argsort(cost, kind="stable")
        members = np.argsort(row_of, kind="stable")
        row_ptr = np.concatenate(([0], np.cumsum(np.bincount(row_of, minlength=num_rows)))).tolist()
        half = num_rows // 2
        # Pair expensive with cheap rows; rotate the pairing each round so rows whose cost one big
        # sample dominates (nothing to move) do not keep blocking the same cheap partners.
        expensive = by_cost[::-1][:half]
        cheap = np.roll(by_cost[:half], round_index * max(1, half // rounds))
        improved = 0
        for a, b in zip(expensive.tolist(), cheap.tolist(), strict=True):
            old_gap = cost[a] - cost[b]
            if old_gap <= 0:
                continue
            items = np.concatenate(
                (members[row_ptr[a] : row_ptr[a + 1]], members[row_ptr[b] : row_ptr[b + 1]])
            )
            items = items[np.argsort(-lengths[items], kind="stable")].tolist()
            split = _split_pair(items, lengths_list, capacity, max_samples, amounts, budgets, has_resources)
            if split is None:
                continue
            side_a, cost_a, cost_b = split
            # The pair's total is fixed, so a smaller gap means a smaller variance over all rows.
            if abs(cost_a - cost_b) < old_gap * (1 - 1e-9):
                side = np.asarray(side_a, dtype=bool)
                row_of[np.asarray(items)] = np.where(side, a, b)
                improved += 1
        if not improved:
            break
    return row_of


def _split_pair(
    items: list[int],
    lengths: list[int],
    capacity: int,
    max_samples: int,
    amounts: np.ndarray,
    budgets: np.ndarray,
    has_resources: bool,
) -> tuple[list[bool], float, float] | None:
    """Greedy two-row split: each item (largest first) to the cheaper row that fits; None if stuck."""
    fill = [0, 0]
    cost = [0.0, 0.0]
    count = [0, 0]
    used = [np.zeros_like(budgets), np.zeros_like(budgets)]
    side_a: list[bool] = []
    for i in items:
        v = lengths[i]
        first = 0 if cost[0] <= cost[1] else 1
        for side in (first, 1 - first):
            if fill[side] + v > capacity or count[side] >= max_samples:
                continue
            if has_resources and np.any(used[side] + amounts[i] > budgets):
                continue
            fill[side] += v
            cost[side] += float(v) * v
            count[side] += 1
            if has_resources:
                used[side] = used[side] + amounts[i]
            side_a.append(side == 0)
            break
        else:
            return None
    return side_a, cost[0], cost[1]


def balanced_assign(
    lengths: np.ndarray, capacity: int, num_rows: int, extra_rows: int = 0
) -> tuple[np.ndarray, int] | None:
    """Deal large samples over ``num_rows`` rows by cost, then best-fit the small ones into the gaps.

    Returns ``(row_of, rows)``, or None if every small-sample threshold needs more than
    ``num_rows + extra_rows`` rows. Prefers no extra rows, then the most balanced (most samples dealt).
    """
    order = np.argsort(-lengths, kind="stable")
    sorted_lengths = lengths[order]
    for limit in dict.fromkeys((num_rows, num_rows + extra_rows)):
        for divisor in (64, 32, 16, 8, 4):
            num_dealt = int(np.searchsorted(-sorted_lengths, -(capacity // divisor), side="left"))
            result = _deal_then_fill(lengths, capacity, order[:num_dealt], num_rows)
            if result[1] <= limit:
                return result
    return None


def _deal_then_fill(
    lengths: np.ndarray, capacity: int, dealt: np.ndarray, num_rows: int
) -> tuple[np.ndarray, int]:
    """Deal ``dealt`` (descending) in rounds of ``num_rows``, then BFD the rest into the remaining gaps."""
    row_of = np.full(len(lengths), -1, dtype=np.int32)
    space = np.full(num_rows, capacity, dtype=np.int64)
    cost = np.zeros(num_rows, dtype=np.float64)
    for start in range(0, len(dealt), num_rows):
        items = dealt[start : start + num_rows]
        rows = np.argsort(cost, kind="stable")[: len(items)]  # cheapest rows get the largest items
        fits = lengths[items] <= space[rows]  # the rest waits for the best-fit phase
        items, rows = items[fits], rows[fits]
        row_of[items] = rows
        space[rows] -= lengths[items]
        cost[rows] += lengths[items].astype(np.float64) ** 2
    rest = np.flatnonzero(row_of < 0)
    rest_lengths = lengths[rest]
    count_at = np.bincount(rest_lengths, minlength=capacity + 1)
    values = np.flatnonzero(count_at)[::-1]
    slot_rows, total_rows = bfd_classes(values, count_at[values], capacity, open_space=space)
    row_of[rest[np.argsort(-rest_lengths, kind="stable")]] = slot_rows
    # A dealt row that received nothing would be empty: renumber the used rows densely.
    used = np.zeros(total_rows, dtype=bool)
    used[row_of] = True
    new_id = (np.cumsum(used) - 1).astype(np.int32)
    return new_id[row_of], int(used.sum())
