"""A start for constrained plans from their scarcest budget alone (``budget_first_pack``).

Where one budget binds (vision patches on image-text mixes: its own row bound is the vector bound, the
tokens' ~87% of it), the greedy constrained packers fill rows by every limit at once, and the swap search
from their plans can stay a row above a bound that the binding budget alone reaches (benchmarks/README.md,
"budget-first start"). This start packs the items that use that budget with the 1-D packer (their amounts as
lengths, the budget as the width), then restores the other limits:

- each row over one (tokens, another budget, the sample cap) gives up its items with the most tokens per
  unit of the binding budget (the ones that crowd a row's text) until it holds;
- the given-up items and those that use none of the budget (text) go, largest amount then longest first,
  by best fit on token room into the rows (every limit checked) or new rows.

Its row count is above the greedy plans' (the 1-D rows are full of the budget and keep no room to take a
given-up item back), but the swap search from it reaches the bound where the search from the greedy plans
does not. The engine runs both and keeps the plan with fewer rows. Every limit holds exactly; deterministic
(stable orders, ties to the lower index).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# The 1-D packer: (lengths, width) -> (row_of, num_rows)
PackOneBudget = Callable[[np.ndarray, int], tuple[np.ndarray, int]]


def budget_first_pack(
    dims: np.ndarray, caps: np.ndarray, budget: int, pack_budget: PackOneBudget
) -> tuple[np.ndarray, int]:
    """``(row_of, num_rows)`` of items ``dims`` (int [n, K]: tokens, each budget's amount, 1 per sample) in
    rows of ``caps`` (int [K]), started from ``pack_budget``'s rows of dimension ``budget`` alone. Every item
    must fit an empty row (``dims <= caps``)."""
    dims = np.asarray(dims, dtype=np.int64)
    caps = np.asarray(caps, dtype=np.int64)
    n = len(dims)
    row_of = np.full(n, -1, dtype=np.int64)
    users = np.flatnonzero(dims[:, budget] > 0)
    num_rows = 0
    if len(users):
        user_rows, num_rows = pack_budget(dims[users, budget], int(caps[budget]))
        row_of[users] = user_rows
    loads = np.zeros((num_rows + n, dims.shape[1]), dtype=np.int64)  # room for a new row per item placed
    np.add.at(loads, row_of[users], dims[users])
    given_up = _give_up_over_limits(dims, caps, row_of, loads[:num_rows], budget)
    rest = np.concatenate([given_up, np.flatnonzero(dims[:, budget] == 0)])
    order = rest[np.lexsort((rest, -dims[rest, 0], -dims[rest, budget]))]
    num_rows = _best_fit(dims, caps, row_of, loads, num_rows, order)
    return row_of, num_rows


def _give_up_over_limits(
    dims: np.ndarray, caps: np.ndarray, row_of: np.ndarray, loads: np.ndarray, budget: int
) -> np.ndarray:
    """Take out of each row over a limit its items with the most tokens per unit of ``budget`` (ties: the
    lower index first) until it holds; ``row_of`` (-1) and ``loads`` updated. The items taken out."""
    over = np.flatnonzero((loads > caps).any(axis=1))
    if not len(over):
        return np.zeros(0, dtype=np.int64)
    members = np.flatnonzero(np.isin(row_of, over))
    per_unit = dims[members, 0] / np.maximum(dims[members, budget], 1)
    members = members[np.lexsort((members, -per_unit, row_of[members]))]  # by row, then most tokens per unit
    taken: list[int] = []
    for i in members.tolist():
        r = row_of[i]
        if (loads[r] > caps).any():
            loads[r] -= dims[i]
            row_of[i] = -1
            taken.append(i)
    return np.array(taken, dtype=np.int64)


def _best_fit(
    dims: np.ndarray,
    caps: np.ndarray,
    row_of: np.ndarray,
    loads: np.ndarray,
    num_rows: int,
    order: np.ndarray,
) -> int:
    """Place the items of ``order`` one by one in the row (of the first ``num_rows`` of ``loads``) where every
    limit holds and the least token room is left (ties: the lower row), else in a new row; the row count."""
    for i in order.tolist():
        after = loads[:num_rows] + dims[i]
        fits = np.flatnonzero((after <= caps).all(axis=1))
        if len(fits):
            r = int(fits[np.argmax(after[fits, 0])])  # the fullest in tokens: the least room left
        else:
            r = num_rows
            num_rows += 1
        loads[r] += dims[i]
        row_of[i] = r
    return num_rows
