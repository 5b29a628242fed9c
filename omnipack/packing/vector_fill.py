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

Items are grouped by amount vector where those are few (counts of media items); in each group the
candidates are the lengths next to the one that would level the row, found by bisection over the group's
available lengths. Where they are many (patch counts), ``bucketed`` groups them into quantile buckets, each
checked by its largest amounts. ``level`` picks what is levelled: the budgets, the cap, every one, or the
binding ones (``fill_levels``). Without resource budgets a sample cap is levelled the same way, as one
unit per sample: text under a cap of 12 samples a row (benchmarks/README.md) ends within 0.5% of the bound,
where the best fit by tokens ends 20-33% over.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from .constraints import PackConstraints

MAX_AMOUNT_VECTORS = 64  # distinct resource-amount vectors up to which the fill runs (groups when bucketed)
BALANCE_TOLERANCE = 0.02  # spreads of the remaining shares below this count as level
# Which budgets a fill keeps level with the tokens (the others are limits only):
LEVEL_BUDGETS = "budgets"  # the resource budgets; without any, the sample cap
LEVEL_CAP = "cap"  # the sample cap
LEVEL_ALL = "all"  # every resource budget and the sample cap
LEVEL_BINDING = "binding"  # those whose demand (sum / budget) is BINDING_SHARE of the largest, tokens' too
LEVELS = (LEVEL_BUDGETS, LEVEL_CAP, LEVEL_ALL, LEVEL_BINDING)
BINDING_SHARE = 0.8
# Bucketed amounts: a budget of at most this many distinct amounts (media counts) keeps them exact; the others
# (patch counts) go into buckets by quantile, 0 a bucket of its own.
EXACT_AMOUNT_VALUES = 8


def _levelled_budgets(
    constraints: PackConstraints, num_samples: int, level: str = LEVEL_BUDGETS, token_rows: float = 0.0
) -> tuple[np.ndarray, np.ndarray, list[int]] | None:
    """The amounts (int [n, K]) and budgets (int [K]) the fill holds, and the dimensions among them it keeps
    level with the tokens (``level``, one of LEVELS; ``token_rows``: the tokens' demand, sum / W, which
    LEVEL_BINDING compares with). Without resource budgets the sample cap is levelled, as a budget of one per
    sample (text under a cap of 12 samples a row: each row needs ~12 samples and ~W tokens at once, which a
    best fit by tokens misses by 20-33%). LEVEL_CAP with resource budgets levels the cap, the budgets limits
    only (mostly text with a few images under a cap: levelling a budget that does not bind would spend the
    images early). None where there is nothing to level."""
    cap = constraints.max_samples_per_row
    amounts, budgets = constraints.amounts_matrix(num_samples)
    levelled = list(range(len(budgets)))
    if cap is not None and (level != LEVEL_BUDGETS or not constraints.resources):
        amounts = np.column_stack([amounts, np.ones(num_samples, dtype=np.int64)])
        budgets = np.append(budgets, cap)
        every = level in (LEVEL_ALL, LEVEL_BINDING)
        levelled = list(range(len(budgets))) if every else [len(budgets) - 1]
    if level == LEVEL_BINDING and len(budgets):
        demand = amounts.sum(axis=0) / np.maximum(budgets, 1)
        top = max(float(demand.max()), token_rows)
        levelled = [d for d in levelled if demand[d] >= BINDING_SHARE * top]
    return (amounts, budgets, levelled) if len(budgets) and levelled else None


def fill_levels(lengths: np.ndarray, capacity: int, constraints: PackConstraints) -> list[str]:
    """The LEVELS that give distinct fills (levelled dimensions) on this input, in LEVELS' order."""
    seen, levels = set(), []
    token_rows = float(np.sum(lengths)) / capacity
    for level in LEVELS:
        held = _levelled_budgets(constraints, len(lengths), level, token_rows)
        if held is not None:
            key = (held[0].shape[1], tuple(held[2]))
            if key not in seen:
                seen.add(key)
                levels.append(level)
    return levels


def _amount_groups(amounts: np.ndarray, bucketed: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each item's group, each group's largest amounts (int [G, K]: what a row must hold for any member, and
    what the row's levelling counts) and mean amounts (float [G, K]: the seed's spread and the size that
    breaks ties). Groups are the distinct amount vectors where they are at most MAX_AMOUNT_VECTORS; else,
    with ``bucketed``, buckets of them (``_amount_buckets``); else, or where no bucketing keeps that few
    (more than log2(MAX_AMOUNT_VECTORS) budgets), None."""
    vectors, group_of = np.unique(amounts, axis=0, return_inverse=True)
    group_of = group_of.reshape(-1)
    if len(vectors) <= MAX_AMOUNT_VECTORS:
        return group_of, vectors, vectors.astype(np.float64)
    keys = _amount_buckets(amounts) if bucketed else None
    if keys is None:
        return None
    _, group_of = np.unique(keys, axis=0, return_inverse=True)
    group_of = group_of.reshape(-1)
    num_groups = int(group_of.max()) + 1
    upper = np.zeros((num_groups, amounts.shape[1]), dtype=np.int64)
    np.maximum.at(upper, group_of, amounts)
    mean = np.zeros((num_groups, amounts.shape[1]))
    np.add.at(mean, group_of, amounts)
    return group_of, upper, mean / np.bincount(group_of, minlength=num_groups)[:, None]


def _amount_buckets(amounts: np.ndarray) -> np.ndarray | None:
    """Bucket keys (int [n, K]) taking at most MAX_AMOUNT_VECTORS distinct vectors: budgets of at most
    EXACT_AMOUNT_VALUES distinct amounts exact, the others 0 or one of the most quantile buckets of their
    non-zero amounts that keep the count, found by bisection (every budget by quantile where the exact ones
    alone exceed it); None where one bucket a budget exceeds it too."""
    columns = range(amounts.shape[1])
    exact = [d for d in columns if len(np.unique(amounts[:, d])) <= EXACT_AMOUNT_VALUES]

    def keys_of(kept_exact: list[int], buckets: int) -> np.ndarray:
        keys = amounts.copy()
        for d in columns:
            if d not in kept_exact:
                keys[:, d] = _quantile_buckets(amounts[:, d], buckets)
        return keys

    def fits(keys: np.ndarray) -> bool:
        return len(np.unique(keys, axis=0)) <= MAX_AMOUNT_VECTORS

    for kept_exact in (exact, []):
        if not fits(keys_of(kept_exact, 1)):
            continue
        low, high = 1, MAX_AMOUNT_VECTORS  # the most buckets that fit: fits(low) holds throughout
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fits(keys_of(kept_exact, middle)) else (low, middle - 1)
        return keys_of(kept_exact, low)
    return None


def _quantile_buckets(values: np.ndarray, buckets: int) -> np.ndarray:
    """0 for 0, else 1 + the index of the value's bucket among ``buckets`` quantiles of the non-zeros."""
    non_zero = values[values > 0]
    if not len(non_zero):
        return np.zeros_like(values)
    edges = np.unique(np.quantile(non_zero, np.linspace(0, 1, buckets + 1)[1:-1], method="lower"))
    return np.where(values > 0, 1 + np.searchsorted(edges, values, side="left"), 0)


def fits_balanced_fill(constraints: PackConstraints, num_samples: int) -> bool:
    """Whether there are budgets to level (``_levelled_budgets``) and their amounts take at most
    MAX_AMOUNT_VECTORS distinct vectors (cheap pre-check)."""
    held = _levelled_budgets(constraints, num_samples)
    return held is not None and len(np.unique(held[0], axis=0)) <= MAX_AMOUNT_VECTORS


def balanced_fill(
    lengths: np.ndarray,
    capacity: int,
    constraints: PackConstraints,
    level: str = LEVEL_BUDGETS,
    bucketed: bool = False,
) -> tuple[np.ndarray, int] | None:
    """Return ``(row_of, num_rows)``, or None when there is no budget to level (``_levelled_budgets``;
    ``level``: one of LEVELS) or, unless ``bucketed``, the amounts take more than MAX_AMOUNT_VECTORS vectors
    (``fits_balanced_fill``). ``bucketed``: many amount vectors (patch counts) go into buckets
    (``_amount_groups``); a row takes an item only where its bucket's largest amounts fit, levels by them,
    and has left what the item's own amounts leave. None too where no bucketing keeps MAX_AMOUNT_VECTORS.

    Deterministic: ties go to the lower group (amount vectors in ascending order), the shorter candidate
    length, and among equal items to the lower sample index. Every budget and the sample cap hold exactly.
    """
    n = len(lengths)
    held = _levelled_budgets(constraints, n, level, float(np.sum(lengths)) / capacity)
    groups = None if held is None else _amount_groups(held[0], bucketed)
    if groups is None:
        return None
    amounts, budgets, levelled = held
    group_of, upper, mean = groups
    max_samples = constraints.max_samples_per_row or n + 1
    budget_list = [int(b) for b in budgets]
    inverse = [1.0 / max(b, 1) for b in budget_list]
    dims = range(len(budget_list))
    group_lengths, queues = _length_queues(lengths, group_of, len(upper))
    group_amounts = [[int(x) for x in vec] for vec in upper]
    group_shares = [[float(vec[d]) * inverse[d] for d in levelled] for vec in mean]
    item_amounts = amounts.tolist()
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
            item = queue.pop()
            row_of[item] = num_rows
            if not queue:
                avail = group_lengths[best_group]
                avail.pop(bisect_right(avail, best_length) - 1)
            space -= best_length
            for d in dims:
                left[d] -= item_amounts[item][d]
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
