"""Row-by-row balanced fill for packing under several binding budgets (vector bin packing).

An item-by-item best fit decides by token space alone, so when a second budget binds as hard (media
items per row) it ends with rows full in one dimension and loose in the other: token-full rows with 8-9
media, then media-full rows with tokens to spare. This packer builds one row at a time and keeps the
row's remaining shares (space / W, budget_k left / budget_k) level, so that every dimension runs out
together:

- a row starts with the most unbalanced item left (largest spread between its shares; larger first),
  the one that is hardest to place later;
- then it adds the item after which the remaining shares are most level (smallest max - min); spreads
  below BALANCE_TOLERANCE count as equal and the larger item wins, so the flexible small items (one
  medium, text only) are not spent early: the last rows need them to close their gaps.

On the tokens+media benchmark this ends within 0.04% of the vector bound, which equals the
Gilmore–Gomory LP bound there (column generation on a 2k instance), where a norm-based rule (Panigrahy
et al., "Heuristics for vector bin packing") stays 1.0-1.4% over.

It needs the resource amounts to take few distinct vectors (counts of media items, not patch counts):
items are grouped by amount vector; in each group the candidates are the lengths next to the one that
would level the row, found by bisection over the group's available lengths. Without resource budgets a
sample cap is levelled the same way, as one unit per sample: text under a cap of 12 samples a row
(benchmarks/README.md) ends within 0.5% of the bound, where the best fit by tokens ends 20-33% over.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from .constraints import PackConstraints

MAX_AMOUNT_VECTORS = 64  # distinct resource-amount vectors up to which the fill runs
BALANCE_TOLERANCE = 0.02  # spreads of the remaining shares below this count as level


def _levelled_budgets(
    constraints: PackConstraints, num_samples: int, level_cap: bool = False
) -> tuple[np.ndarray, np.ndarray, list[int]] | None:
    """The amounts (int [n, K]) and budgets (int [K]) the fill holds, and the dimensions among them it keeps
    level with the tokens: the resource budgets; without any, the sample cap as a budget of one per sample
    (text under a cap of 12 samples a row: each row needs ~12 samples and ~W tokens at once, which a best fit
    by tokens misses by 20-33%). With ``level_cap`` and resource budgets the cap is the one levelled and the
    budgets are limits only (mostly text with a few images under a cap: levelling a budget that does not
    bind would spend the images early). None where there is nothing to level."""
    cap = constraints.max_samples_per_row
    amounts, budgets = constraints.amounts_matrix(num_samples)
    levelled = list(range(len(budgets)))
    if cap is not None and (level_cap or not constraints.resources):
        amounts = np.column_stack([amounts, np.ones(num_samples, dtype=np.int64)])
        budgets = np.append(budgets, cap)
        levelled = [len(budgets) - 1]
    return (amounts, budgets, levelled) if len(budgets) else None


def fits_balanced_fill(constraints: PackConstraints, num_samples: int) -> bool:
    """Whether there are budgets to level (``_levelled_budgets``) and their amounts take at most
    MAX_AMOUNT_VECTORS distinct vectors (cheap pre-check)."""
    held = _levelled_budgets(constraints, num_samples)
    return held is not None and len(np.unique(held[0], axis=0)) <= MAX_AMOUNT_VECTORS


def balanced_fill(
    lengths: np.ndarray, capacity: int, constraints: PackConstraints, level_cap: bool = False
) -> tuple[np.ndarray, int] | None:
    """Return ``(row_of, num_rows)``, or None when the amounts take more than MAX_AMOUNT_VECTORS vectors or
    there is no budget to level (``fits_balanced_fill``). ``level_cap``: the sample cap is levelled beside
    the resource budgets too (without resource budgets it always is).

    Deterministic: ties go to the lower group (amount vectors in ascending order), the shorter candidate
    length, and among equal items to the lower sample index. Every budget and the sample cap hold exactly.
    """
    n = len(lengths)
    held = _levelled_budgets(constraints, n, level_cap)
    if held is None:
        return None
    amounts, budgets, levelled = held
    vectors, group_of = np.unique(amounts, axis=0, return_inverse=True)
    group_of = group_of.reshape(-1)
    if len(vectors) > MAX_AMOUNT_VECTORS:
        return None
    max_samples = constraints.max_samples_per_row or n + 1
    budget_list = [int(b) for b in budgets]
    inverse = [1.0 / max(b, 1) for b in budget_list]
    dims = range(len(budget_list))
    group_lengths, queues = _length_queues(lengths, group_of, len(vectors))
    group_amounts = [[int(x) for x in vec] for vec in vectors]
    group_shares = [[vec[d] * inverse[d] for d in levelled] for vec in group_amounts]
    row_of = np.empty(n, dtype=np.int32)
    placed = 0
    num_rows = 0
    while placed < n:
        space = capacity
        left = list(budget_list)
        count = 0
        while count < max_samples:
            best_group, best_length = _best_item(
                group_amounts, group_lengths, group_shares, left, inverse, levelled, space, capacity,
                seed=count == 0,
            )  # fmt: skip
            if best_group < 0:
                break
            queue = queues[best_group][best_length]
            row_of[queue.pop()] = num_rows
            if not queue:
                avail = group_lengths[best_group]
                avail.pop(bisect_right(avail, best_length) - 1)
            space -= best_length
            for d in dims:
                left[d] -= group_amounts[best_group][d]
            count += 1
            placed += 1
        num_rows += 1
    return row_of, num_rows


def _length_queues(
    lengths: np.ndarray, group_of: np.ndarray, num_groups: int
) -> tuple[list[list[int]], list[dict[int, list[int]]]]:
    """Per group: sorted distinct lengths still available, and per length the samples left (popped from the
    end in index order)."""
    n = len(lengths)
    order = np.lexsort((np.arange(n), lengths, group_of))
    starts_of_group = np.searchsorted(group_of[order], np.arange(num_groups + 1))
    group_lengths: list[list[int]] = []
    queues: list[dict[int, list[int]]] = []
    for g in range(num_groups):
        members = order[starts_of_group[g] : starts_of_group[g + 1]]
        distinct, starts = np.unique(lengths[members], return_index=True)
        ends = np.append(starts[1:], len(members))
        group_lengths.append(distinct.tolist())
        queues.append(
            {int(v): members[s:e].tolist()[::-1] for v, s, e in zip(distinct, starts, ends, strict=True)}
        )
    return group_lengths, queues


def _best_item(
    group_amounts: list[list[int]],
    group_lengths: list[list[int]],
    group_shares: list[list[float]],
    left: list[int],
    inverse: list[float],
    levelled: list[int],
    space: int,
    capacity: int,
    seed: bool,
) -> tuple[int, int]:
    """(group, length) of the item to add to a row with ``space`` tokens and ``left`` budgets left: the
    most unbalanced item when it ``seed``s an empty row, else the one after which the row's remaining shares
    (the tokens' and the ``levelled`` budgets') are most level; (-1, -1) when none fits every budget."""
    dims = range(len(left))
    w_inv = 1.0 / capacity
    best_score: tuple[float, float] | None = None
    best_group, best_length = -1, -1
    for g, vec in enumerate(group_amounts):
        avail = group_lengths[g]
        if not avail or any(vec[d] > left[d] for d in dims):
            continue
        k = bisect_right(avail, space) - 1
        if k < 0:
            continue
        shares = group_shares[g]
        size = sum(shares)
        if seed:
            # Seed: the most unbalanced item, the longest or the shortest of its group.
            for length in (avail[0], avail[k]):
                x = length * w_inv
                score = (max(x, *shares) - min(x, *shares), x + size)
                if best_score is None or score > best_score:
                    best_score, best_group, best_length = score, g, length
            continue
        after = [(left[d] - vec[d]) * inverse[d] for d in levelled]
        hi, lo = max(after), min(after)
        # The length that puts the row's token share in the middle of its resource shares.
        target = space - capacity * (hi + lo) / 2
        j = bisect_right(avail, target)
        for kk in (j - 1, j):
            if 0 <= kk <= k:
                length = avail[kk]
                token_share = (space - length) * w_inv
                spread = max(hi, token_share) - min(lo, token_share)
                score = (-max(spread, BALANCE_TOLERANCE), length * w_inv + size)
                if best_score is None or score > best_score:
                    best_score, best_group, best_length = score, g, length
    return best_group, best_length
