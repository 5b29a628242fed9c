"""Compute balancing: make rows similar in attention cost without adding rows.

Attention cost of a row is the sum of squared sample lengths, so data-parallel ranks that each take a
row finish a step together only if those sums are close. The packer fixes the row count; this pass
then repeatedly pairs the most expensive rows with the cheapest ones and re-splits each pair's samples
greedily (largest first, into the cheaper side that still fits), keeping a split only if it lowers
the pair's maximum cost. Row count, capacity and constraints are preserved by construction.
"""

from __future__ import annotations

import numpy as np

from .constraints import PackConstraints


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
    for _ in range(rounds):
        cost = attention_cost(row_of, num_rows, lengths)
        by_cost = np.argsort(cost, kind="stable")
        members = np.argsort(row_of, kind="stable")
        row_ptr = np.concatenate(([0], np.cumsum(np.bincount(row_of, minlength=num_rows)))).tolist()
        half = num_rows // 2
        improved = 0
        for a, b in zip(by_cost[::-1][:half].tolist(), by_cost[:half].tolist(), strict=True):
            old_max = cost[a]
            if old_max - cost[b] <= 1e-9 * old_max:
                break  # pairs only get closer from here on
            items = np.concatenate(
                (members[row_ptr[a] : row_ptr[a + 1]], members[row_ptr[b] : row_ptr[b + 1]])
            )
            items = items[np.argsort(-lengths[items], kind="stable")].tolist()
            split = _split_pair(items, lengths_list, capacity, max_samples, amounts, budgets, has_resources)
            if split is None:
                continue
            side_a, cost_a, cost_b = split
            if max(cost_a, cost_b) < old_max * (1 - 1e-12):
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
