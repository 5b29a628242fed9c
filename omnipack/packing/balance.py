"""Compute balancing: make rows similar in modeled training cost without giving up packing density.

``balance_costs`` (the general form, used by ``plan.run_pack`` with ``cost.CostModel`` sample costs:
LM attention, media encoders) starts from the dense plan, optionally deals the long samples over the
rows by cost, then narrows cost gaps between expensive and cheap rows by moving, swapping or re-splitting
their samples; every step keeps capacity and constraints, and the row count never exceeds ``max_rows``.

``engine.pack(balance=True)`` uses the same path with the attention-only cost (squared lengths).
"""

from __future__ import annotations

from bisect import bisect_left

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


def row_limits(constraints: PackConstraints | None, n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-sample resource amounts [n, k], per-row budgets [k] and the sample cap (n + 1: none) of
    ``constraints`` (k = 0 without resource budgets)."""
    if constraints is None:
        return np.zeros((n, 0), dtype=np.int64), np.zeros(0, dtype=np.int64), n + 1
    amounts, budgets = constraints.amounts_matrix(n)
    return amounts, budgets, constraints.max_samples_per_row or n + 1


def _fill_rest(
    row_of: np.ndarray, lengths: np.ndarray, capacity: int, space: np.ndarray
) -> tuple[np.ndarray, int]:
    """Best-fit the samples not yet placed (``row_of < 0``) into the rows' free ``space``, opening rows as
    needed; rows renumbered densely (a dealt row that received nothing would be empty)."""
    rest = np.flatnonzero(row_of < 0)
    rest_lengths = lengths[rest]
    count_at = np.bincount(rest_lengths, minlength=capacity + 1)
    values = np.flatnonzero(count_at)[::-1]
    slot_rows, total_rows = bfd_classes(values, count_at[values], capacity, open_space=space)
    row_of[rest[np.argsort(-rest_lengths, kind="stable")]] = slot_rows
    used = np.zeros(total_rows, dtype=bool)
    used[row_of] = True
    new_id = (np.cumsum(used) - 1).astype(np.int32)
    return new_id[row_of], int(used.sum())


# ---- balancing any additive per-sample cost (LM attention + encoders, see cost.py) ----

BALANCE_TOLERANCE = 0.005  # pairs whose gap is below this fraction of the mean row cost are left alone
BALANCE_ROUNDS = 60
PARTNER_TRIES = 3  # cheap rows a dear row tries per round
MAX_FAILURES = 8  # rounds without any exchange after which a row is left as it is


def balance_costs(
    lengths: np.ndarray,
    costs: np.ndarray,
    capacity: int,
    row_of: np.ndarray,
    num_rows: int,
    *,
    constraints: PackConstraints | None = None,
    max_rows: int | None = None,
    row_constant: float = 0.0,
    rounds: int = BALANCE_ROUNDS,
    tolerance: float = BALANCE_TOLERANCE,
) -> tuple[np.ndarray, int]:
    """Rows of near-equal ``row_constant + sum(costs)`` from a dense plan ``row_of`` of ``num_rows`` rows.

    Without constraints the long samples are first dealt by cost (kept if it needs at most ``max_rows``
    rows and gives a smaller maximum row cost); then ``refine_costs`` narrows the remaining gaps. The
    result is deterministic, uses at most ``max(num_rows, max_rows)`` rows and respects every limit.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    costs = np.asarray(costs, dtype=np.float64)
    row_of = np.asarray(row_of, dtype=np.int32)
    max_rows = num_rows if max_rows is None else max(max_rows, num_rows)
    if num_rows < 2:
        return row_of, num_rows
    if constraints is None:
        dealt = _deal_by_cost(lengths, costs, capacity, num_rows, max_rows)
        if dealt is not None and _spread(*dealt, costs) < _spread(row_of, num_rows, costs):
            row_of, num_rows = dealt
    row_of = refine_costs(
        row_of, num_rows, lengths, costs, capacity, constraints, row_constant, rounds, tolerance
    )
    return row_of, num_rows


def _spread(row_of: np.ndarray, num_rows: int, costs: np.ndarray) -> tuple[float, float]:
    """(maximum, standard deviation) of the row costs: the slowest rank first; when one unsplittable
    sample sets the maximum either way, the spread of the rest decides."""
    row_cost = np.bincount(row_of, weights=costs, minlength=num_rows)
    return float(row_cost.max()), float(row_cost.std())


def _deal_by_cost(
    lengths: np.ndarray, costs: np.ndarray, capacity: int, num_rows: int, max_rows: int
) -> tuple[np.ndarray, int] | None:
    """Deal samples longer than W/divisor (longest first, in rounds of one per row, the costliest of a
    round to the cheapest row), then best-fit the rest; the largest dealt set that fits ``max_rows``."""
    order = np.argsort(-lengths, kind="stable")
    sorted_lengths = lengths[order]
    for divisor in (64, 32, 16, 8, 4):
        num_dealt = int(np.searchsorted(-sorted_lengths, -(capacity // divisor), side="left"))
        if num_dealt == 0:
            continue
        row_of = np.full(len(lengths), -1, dtype=np.int32)
        space = np.full(num_rows, capacity, dtype=np.int64)
        cost = np.zeros(num_rows, dtype=np.float64)
        dealt = order[:num_dealt]
        # Each row's free space will end up holding average-density samples: rank rows by the cost they
        # are heading for, and items by their cost above that average density.
        density = float(costs.sum() / max(lengths.sum(), 1))
        excess = costs - density * lengths
        for start in range(0, num_dealt, num_rows):
            items = dealt[start : start + num_rows]
            items = items[np.argsort(-excess[items], kind="stable")]
            rows = np.argsort(cost + density * space, kind="stable")[: len(items)]
            fits = lengths[items] <= space[rows]
            items, rows = items[fits], rows[fits]
            row_of[items] = rows
            space[rows] -= lengths[items]
            cost[rows] += costs[items]
        filled = _fill_rest(row_of, lengths, capacity, space)
        if filled[1] <= max_rows:
            return filled
    return None


def refine_costs(
    row_of: np.ndarray,
    num_rows: int,
    lengths: np.ndarray,
    costs: np.ndarray,
    capacity: int,
    constraints: PackConstraints | None = None,
    row_constant: float = 0.0,
    rounds: int = BALANCE_ROUNDS,
    tolerance: float = BALANCE_TOLERANCE,
) -> np.ndarray:
    """Pair expensive with cheap rows and narrow each pair's cost gap: the best of moving one sample,
    swapping two, or re-splitting both rows greedily. Row count, capacity and constraints are kept;
    stops after ``rounds`` rounds, when no pair improves, or when every row is within ``tolerance``."""
    n = len(lengths)
    row_of = np.array(row_of, dtype=np.int32, copy=True)
    if num_rows < 2:
        return row_of
    state = _PairState.of_assignment(row_of, num_rows, lengths, costs, capacity, constraints)
    total_mean = row_constant + float(np.mean(state.cost))
    slack = tolerance * total_mean
    half = num_rows // 2
    failures = [0] * num_rows
    for round_index in range(rounds):
        cost_np = np.asarray(state.cost)
        by_cost = np.argsort(cost_np, kind="stable")
        mean = float(cost_np.mean())
        if cost_np[by_cost[-1]] - mean <= slack and mean - cost_np[by_cost[0]] <= slack:
            break
        # The slowest rank sets the step time: work on the rows above the band (and rows far below it),
        # each trying a few partners from the cheap end, which rotates so a row that cannot be helped does
        # not block the same partner every round.
        hot = num_rows - int(np.searchsorted(cost_np[by_cost], mean + slack, side="right"))
        cold = int(np.searchsorted(cost_np[by_cost], mean - 4 * slack, side="left"))
        count = min(half, max(hot, cold))
        expensive = by_cost[::-1][:count].tolist()
        cheap = np.roll(by_cost[:half], (round_index * 7919) % max(half, 1)).tolist()
        improved = _improve_pairs(state, expensive, cheap, failures, slack)
        if not improved:
            break
    out = np.empty(n, dtype=np.int32)
    for r, items in enumerate(state.members):
        out[items] = r
    return out


def _improve_pairs(
    state: _PairState, expensive: list[int], cheap: list[int], failures: list[int], slack: float
) -> int:
    """One round: each expensive row tries a few cheap partners (in turn) until a change narrows their gap;
    returns how many rows improved. ``failures`` counts, per row, the rounds in which nothing helped it."""
    improved = 0
    k = 0
    for a in expensive:
        if failures[a] >= MAX_FAILURES:
            continue  # nothing it holds could be exchanged in earlier rounds: stop trying
        for _ in range(PARTNER_TRIES):
            b = cheap[k % len(cheap)]
            k += 1
            gap = state.cost[a] - state.cost[b]
            if gap > slack and state.improve(a, b, gap, slack):
                improved += 1
                failures[b] = 0
                break
        else:
            failures[a] += 1
    return improved


class _PairState:
    """Rows as Python lists (fast for the small per-pair searches) and the pair operations."""

    def __init__(self, members, fill, cost, used, length, value, amounts, budgets, capacity, max_samples):
        self.members, self.fill, self.cost, self.used = members, fill, cost, used
        self.length, self.value, self.amounts, self.budgets = length, value, amounts, budgets
        self.capacity, self.max_samples = capacity, max_samples

    @classmethod
    def of_assignment(
        cls,
        row_of: np.ndarray,
        num_rows: int,
        lengths: np.ndarray,
        costs: np.ndarray,
        capacity: int,
        constraints: PackConstraints | None,
    ) -> _PairState:
        """The rows of assignment ``row_of`` (sample -> row) with their fill, cost and resource use."""
        amounts_np, budgets_np, max_samples = row_limits(constraints, len(lengths))
        resources = amounts_np.shape[1] > 0
        amounts = [tuple(a) for a in amounts_np.tolist()] if resources else None
        budgets = tuple(budgets_np.tolist())
        members: list[list[int]] = [[] for _ in range(num_rows)]
        for i, r in enumerate(row_of.tolist()):
            members[r].append(i)
        fill = np.bincount(row_of, weights=lengths, minlength=num_rows).astype(np.int64).tolist()
        cost = np.bincount(row_of, weights=costs, minlength=num_rows).tolist()
        used = None
        if resources:
            per_row = np.zeros((num_rows, len(budgets)), dtype=np.int64)
            np.add.at(per_row, row_of, amounts_np)
            used = [tuple(x) for x in per_row.tolist()]
        length, value = lengths.tolist(), costs.tolist()
        return cls(members, fill, cost, used, length, value, amounts, budgets, capacity, max_samples)

    def _fits_resources(self, row: int, add: int | None, remove: int | None) -> bool:
        if self.used is None:
            return True
        use = self.used[row]
        add_a = self.amounts[add] if add is not None else None
        rem_a = self.amounts[remove] if remove is not None else None
        for k, budget in enumerate(self.budgets):
            u = use[k] + (add_a[k] if add_a else 0) - (rem_a[k] if rem_a else 0)
            if u > budget:
                return False
        return True

    def improve(self, a: int, b: int, gap: float, good_enough: float = 0.0) -> int:
        """Apply the best gap-narrowing change between rows a (dearer) and b; 1 if one was applied."""
        length, value, cap = self.length, self.value, self.capacity
        space_a, space_b = cap - self.fill[a], cap - self.fill[b]
        best_gap, best = gap, None
        row_a, row_b = self.members[a], self.members[b]
        room_b = len(row_b) < self.max_samples
        # Move one sample a -> b.
        if room_b:
            for x in row_a:
                d = value[x]
                if d <= 0 or length[x] > space_b:
                    continue
                g = abs(gap - 2 * d)
                if g < best_gap and self._fits_resources(b, x, None):
                    best_gap, best = g, ("move", x, None)
        # Swap x (from a) with y (from b): the cost moved is v_x - v_y; look near v_y = v_x - gap / 2.
        by_value = sorted(row_b, key=value.__getitem__)
        keys = [value[y] for y in by_value]
        for x in row_a:
            vx, lx = value[x], length[x]
            k = bisect_left(keys, vx - gap / 2)
            for j in range(max(0, k - 3), min(len(keys), k + 3)):
                y = by_value[j]
                d = vx - keys[j]
                if d <= 0:
                    continue
                g = abs(gap - 2 * d)
                if g >= best_gap:
                    continue
                ly = length[y]
                if lx - ly > space_b or ly - lx > space_a:
                    continue
                if self._fits_resources(b, x, y) and self._fits_resources(a, y, x):
                    best_gap, best = g, ("swap", x, y)
        # Greedy re-split of both rows (costliest first to the cheaper side that fits).
        if len(row_a) + len(row_b) <= 48 and best_gap > max(0.05 * gap, good_enough):
            both = row_a + row_b
            # Two orders: costliest first balances best, longest first fits best when both rows are full.
            for key in (lambda i: (-self.value[i], -length[i], i), lambda i: (-length[i], -self.value[i], i)):
                split = self._resplit(sorted(both, key=key))
                if split is not None and split[0] < best_gap:
                    best_gap, best = split[0], ("split", split[1], split[2])
        if best is None:
            return 0
        self._apply(a, b, *best)
        return 1

    def _apply(self, a: int, b: int, kind: str, x: int | list[int], y: int | list[int] | None) -> None:
        """Apply a change between rows a and b: move x a -> b, swap x (of a) with y (of b), or set both rows
        to a re-split (x, y)."""
        length, value = self.length, self.value
        row_a, row_b = self.members[a], self.members[b]
        if kind == "split":
            self._set_row(a, x)
            self._set_row(b, y)
            return
        row_a.remove(x)
        row_b.append(x)
        moved = [(x, a, b)]
        if kind == "swap":
            row_b.remove(y)
            row_a.append(y)
            moved.append((y, b, a))
        for i, src, dst in moved:
            self.fill[src] -= length[i]
            self.fill[dst] += length[i]
            self.cost[src] -= value[i]
            self.cost[dst] += value[i]
            if self.used is not None:
                amt = self.amounts[i]
                self.used[src] = tuple(u - q for u, q in zip(self.used[src], amt, strict=True))
                self.used[dst] = tuple(u + q for u, q in zip(self.used[dst], amt, strict=True))

    def _set_row(self, row: int, items: list[int]) -> None:
        self.members[row] = items
        self.fill[row] = sum(self.length[i] for i in items)
        self.cost[row] = sum(self.value[i] for i in items)
        if self.used is not None:
            self.used[row] = tuple(sum(self.amounts[i][k] for i in items) for k in range(len(self.budgets)))

    def _resplit(self, items: list[int]) -> tuple[float, list[int], list[int]] | None:
        """Greedy two-row split of ``items`` in the given order, each to the cheaper side that fits."""
        length, value, cap = self.length, self.value, self.capacity
        sides: tuple[list[int], list[int]] = ([], [])
        fill, cost = [0, 0], [0.0, 0.0]
        use = [[0] * len(self.budgets), [0] * len(self.budgets)]
        for i in items:
            first = 0 if cost[0] <= cost[1] else 1  # the cheaper side first
            for side in (first, 1 - first):
                if fill[side] + length[i] > cap or len(sides[side]) >= self.max_samples:
                    continue
                if self.amounts is not None and any(
                    u + q > bud for u, q, bud in zip(use[side], self.amounts[i], self.budgets, strict=True)
                ):
                    continue
                sides[side].append(i)
                fill[side] += length[i]
                cost[side] += value[i]
                if self.amounts is not None:
                    use[side] = [u + q for u, q in zip(use[side], self.amounts[i], strict=True)]
                break
            else:
                return None
        return abs(cost[0] - cost[1]), sides[0], sides[1]
