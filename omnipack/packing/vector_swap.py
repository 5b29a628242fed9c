"""Swap local search for rows under several budgets (vector bin packing).

The search of ``swap.py`` (Levine and Ducatelle), with every budget checked: it frees a few rows (the least
filled, and one more that changes every round), walks every other row and exchanges up to two of its items for up to two free items whenever that
fills the row more while every budget of the row still holds (so the free items get smaller), then places
the free items first fit, largest first, into the rows' room and new rows. The plan with the fewest rows
over the rounds is returned; the search stops at the target, after MAX_ROUNDS rounds, or once its work
passes MAX_WORK (checked between rounds). Each round starts from the last one's plan, which may be a row
or so above the best: that lets it leave a local optimum.

"Filled" is measured by the scarcest budget. A dimension's weight is its total demand over its budget (its
share), raised to the power SCARCITY_POWER relative to the largest share: the budget that binds decides, the
others (a share of 0.87 weighs 1e-4 as much) only break ties, and budgets that bind together (shares within
~1%) weigh alike. On the media mixes of ``benchmarks/bench_packing.py`` the vision-patch budget binds and
the tokens have ~13% to spare: plans of 2,000 samples 1-4 rows over the vector bound end at it
(benchmarks/README.md), where a weighting that counts the token fill too (powers 2-4) leaves them 1-2 over.

Works row by row in Python with numpy per row, so it runs on small plans whole and on large plans over a pool
of their rows (``pooled_vector_swap``; the engine runs pools one after another). Limits are counts, so the
plan is deterministic.

Under a sample cap alone (tokens and a count per item) a row's best exchange is found by bisection over the
offers sorted by tokens, per offer size, not by checking every removal against every offer: the same
exchange (``_best_count_exchange``), ~10-15x faster on text of ~11 samples a row, whose rows give 67
removals against ~1,000 offers. The work limit counts the bisections, so within it the search walks ~10x
more rows there, and rows of up to MAX_BISECTED_ROW_ITEMS samples give up items too (benchmarks/README.md:
short text under a cap of 12 or 24, 1.3-2.6% over the bound before, within 0.05% at 20,000 samples).
"""

from __future__ import annotations

import functools

import numpy as np

SCARCITY_POWER = 64
MAX_ROW_ITEMS = 16  # rows with more items only take free items (no swaps)
# The same where each row's exchange is found by bisection (a sample cap alone): a removal costs two
# bisections there, not a check per offer, so rows of up to a cap of 64 samples still give up items.
MAX_BISECTED_ROW_ITEMS = 64
# Rows whose removals x offers come to fewer checks than this take the full comparison even there: the
# bisection's numpy calls (~30 us a row) cost more than checking a few hundred exchanges at once (rows of
# ~3 samples: 7 removals x ~80 offers).
BISECT_MIN_CHECKS = 4096
MAX_PAIRED_FREE = 60  # free items up to which pairs of them are offered as well
# Work: candidate exchanges checked, plus ROW_VISIT_WORK per row visited (its numpy calls cost as much as
# checking ~5,000 exchanges). A count, so the plan is deterministic; MAX_WORK is ~1-3 s.
MAX_WORK = 150_000_000
ROW_VISIT_WORK = 5_000
FREE_ROWS = 4  # rows freed at the start of each round
ROTATION_STRIDE = 7919  # a prime: the rotating freed row walks through all the others
MAX_ROUNDS = 120


def dimension_weights(dims: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Weight per unit of each dimension: 1/cap times (share / largest share) ** SCARCITY_POWER."""
    share = dims.sum(axis=0) / caps
    return (share / max(float(share.max()), 1e-300)) ** SCARCITY_POWER / caps


def vector_swap_search(
    dims: np.ndarray,
    caps: np.ndarray,
    row_of: np.ndarray,
    num_rows: int,
    target: int,
    max_rounds: int | None = None,
    max_work: int | None = None,
) -> tuple[np.ndarray, int]:
    """Improve a packing of items ``dims`` (int [n, K]: tokens, each budget's amount, 1 per sample) into rows
    of ``caps`` (int [K]); ``row_of[i]`` is item i's row. Returns (row_of, rows), never more rows. The round
    and work limits default to MAX_ROUNDS and MAX_WORK."""
    max_rounds = MAX_ROUNDS if max_rounds is None else max_rounds
    max_work = MAX_WORK if max_work is None else max_work
    weights = dimension_weights(dims, caps)
    by_count = _tokens_and_count_only(dims, caps, weights)  # once per search: the items never change
    value = dims @ weights
    rows: list[list[int]] = [[] for _ in range(num_rows)]
    for i in np.argsort(row_of, kind="stable").tolist():
        rows[int(row_of[i])].append(i)
    best_rows, best_row_of = num_rows, row_of
    work = 0
    loads = np.array([dims[r].sum(axis=0) for r in rows], dtype=np.int64)  # kept up to date by every move
    for round_ in range(max_rounds):
        if work > max_work or len(rows) <= target:
            break
        freed = _rows_to_free(loads @ weights, round_)
        free = [i for r in freed for i in rows[r]]
        kept = sorted(set(range(len(rows))).difference(freed))
        rows, loads = [rows[k] for k in kept], loads[kept]
        work += _exchange_pass(rows, loads, free, dims, caps, weights, by_count)
        loads = _first_fit(rows, loads, free, dims, caps, value)
        if len(rows) < best_rows:
            best_rows = len(rows)
            best_row_of = np.empty(len(dims), dtype=np.int64)
            for r, members in enumerate(rows):
                best_row_of[members] = r
    return best_row_of, best_rows


def _rows_to_free(fills: np.ndarray, round_: int) -> list[int]:
    """The FREE_ROWS - 1 least filled rows, and one of the others that changes every round (a stride through
    them), so that a round after one that changed nothing frees other items. On 44 media sets of 500-50,000
    samples (bench_packing's mixes) the plans end 103 rows over their vector bounds in all, against 110 with
    the least filled rows alone."""
    order = np.lexsort((np.arange(len(fills)), fills))
    if len(order) <= FREE_ROWS:  # a few rows: free all but the fullest, which the exchanges then walk
        return order[:-1].tolist()
    others = len(order) - (FREE_ROWS - 1)
    return [*order[: FREE_ROWS - 1].tolist(), int(order[FREE_ROWS - 1 + (round_ * ROTATION_STRIDE) % others])]


def _exchange_pass(
    rows: list[list[int]],
    loads: np.ndarray,
    free: list[int],
    dims: np.ndarray,
    caps: np.ndarray,
    weights: np.ndarray,
    by_count: bool,
) -> int:
    """One walk over the rows, each taking the exchange that fills it most (in place); ``by_count``: the items
    have tokens and a count alone (``_tokens_and_count_only``), so rows may bisect. Returns the work."""
    work = 0
    offers = None
    for r in range(len(rows)):
        if not free:
            break
        if offers is None:
            sets, sums = _offers(dims, free)
            offers = sets, sums, sums @ weights, _offers_by_count(sums) if by_count else None
        sets, sums, sum_values, classes = offers
        members = rows[r]
        max_items = MAX_ROW_ITEMS if classes is None else MAX_BISECTED_ROW_ITEMS
        outs, out_sums = _removals(dims[members], max_items)
        if classes is not None and len(outs) * len(sets) >= BISECT_MIN_CHECKS:  # a bisection per removal
            work += len(outs) * len(classes) + ROW_VISIT_WORK
            room = caps - loads[r]
            o, s, best = _best_count_exchange(out_sums, out_sums @ weights, classes, room, sum_values)
        else:
            work += len(outs) * len(sets) + ROW_VISIT_WORK
            fits = np.all(sums[None, :, :] - out_sums[:, None, :] <= caps - loads[r], axis=2)
            gain = np.where(fits, sum_values[None, :] - (out_sums @ weights)[:, None], -1.0)
            o, s = divmod(int(np.argmax(gain)), len(sets))
            best = float(gain[o, s])
        if best <= 1e-12:
            continue
        rows[r] = [i for x, i in enumerate(members) if x not in outs[o]] + [free[k] for k in sets[s]]
        loads[r] += sums[s] - out_sums[o]
        for k in sorted(sets[s], reverse=True):
            free.pop(k)
        free.extend(members[x] for x in outs[o])
        offers = None
    return work


def bisected_exchanges(dims: np.ndarray, caps: np.ndarray) -> bool:
    """Whether the search finds each row's exchange by bisection on these items (``_tokens_and_count_only``):
    a walk then costs per row what it does on media rows, however many samples a row holds."""
    return _tokens_and_count_only(dims, caps, dimension_weights(dims, caps))


def _tokens_and_count_only(dims: np.ndarray, caps: np.ndarray, weights: np.ndarray) -> bool:
    """Whether the items have tokens and the sample count alone (a sample cap, no resource budget), and a
    token weighs enough that offers of as many items never tie in value unless their tokens tie (a gain is
    a difference of values up to ~2(W w_t + w_c), rounded at ~1e-16 of that; integer tokens differ by
    w_t): then ``_best_count_exchange`` finds the exchange the full comparison finds."""
    if dims.shape[1] != 2 or not np.all(dims[:, 1] == 1):
        return False
    return bool(weights[0] > 1e-12 * (weights[0] * caps[0] + weights[1]))


def _offers_by_count(sums: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per item count of the offers (1 or 2): the count, the offers' tokens sorted, and the offers in that
    order (equal tokens by offer position)."""
    classes = []
    for count in (1, 2):
        (members,) = np.nonzero(sums[:, 1] == count)
        order = members[np.argsort(sums[members, 0], kind="stable")]
        if len(order):
            classes.append((count, sums[order, 0], order))
    return classes


def _best_count_exchange(
    out_sums: np.ndarray,
    out_values: np.ndarray,
    classes: list[tuple[int, np.ndarray, np.ndarray]],
    room: np.ndarray,
    sum_values: np.ndarray,
) -> tuple[int, int, float]:
    """``(removal, offer, gain)`` of the exchange that fills a row most, where items have tokens and a count
    only (``_tokens_and_count_only``): for each removal and each offer size, the offer with the most tokens
    that fit, found by bisection, not by checking every offer. Ties go where the full comparison's
    ``argmax`` sends them: the first removal, then the first offer. A gain of -1 where nothing fits."""
    best = np.full(len(out_sums), -1.0)
    best_offer = np.zeros(len(out_sums), dtype=np.int64)
    for count, tokens, order in classes:
        at = np.searchsorted(tokens, room[0] + out_sums[:, 0], side="right") - 1
        fits = (at >= 0) & (count - out_sums[:, 1] <= room[1])
        first = np.searchsorted(tokens, tokens[np.maximum(at, 0)], side="left")  # the first of equal tokens
        offer = order[first]
        gain = np.where(fits, sum_values[offer] - out_values, -1.0)
        better = fits & (gain > best)  # single items come first in the offers, so ties keep them
        best = np.where(better, gain, best)
        best_offer = np.where(better, offer, best_offer)
    o = int(np.argmax(best))
    return o, int(best_offer[o]), float(best[o])


@functools.cache  # built once per row size: a walk visits ~10^5 rows
def _removal_sets(m: int) -> tuple[list[tuple[int, ...]], np.ndarray, np.ndarray]:
    """For a row of m items: the position sets it may give up (none, one, or two of its items), and the
    pairs' positions as arrays."""
    a, b = np.triu_indices(m, 1)
    return [(), *((x,) for x in range(m)), *zip(a.tolist(), b.tolist(), strict=True)], a, b


def _removals(row_dims: np.ndarray, max_items: int) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """What a row may give up (``_removal_sets``; nothing in a row of more than ``max_items`` items) and
    their summed sizes."""
    m, k = row_dims.shape
    if m > max_items:
        return [()], np.zeros((1, k), dtype=np.int64)
    outs, a, b = _removal_sets(m)
    return outs, np.concatenate([np.zeros((1, k), dtype=np.int64), row_dims, row_dims[a] + row_dims[b]])


def _offers(dims: np.ndarray, free: list[int]) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The free items a row may take (positions in ``free``): each alone, and pairs while there are few."""
    ids = np.asarray(free, dtype=np.int64)
    sets: list[tuple[int, ...]] = [(k,) for k in range(len(ids))]
    sums = dims[ids]
    if len(ids) <= MAX_PAIRED_FREE:
        a, b = np.triu_indices(len(ids), 1)
        sets += list(zip(a.tolist(), b.tolist(), strict=True))
        sums = np.concatenate([sums, dims[ids[a]] + dims[ids[b]]])
    return sets, sums


def _first_fit(
    rows: list[list[int]],
    loads: np.ndarray,
    free: list[int],
    dims: np.ndarray,
    caps: np.ndarray,
    value: np.ndarray,
) -> np.ndarray:
    """Place the free items, largest value first, into the first row with room in every budget; new rows for
    the rest (``rows`` grows). Returns every row's load, the new rows' included."""
    added: list[np.ndarray] = []
    for i in sorted(free, key=lambda i: (-value[i], i)):
        fit = np.flatnonzero(np.all(loads + dims[i] <= caps, axis=1))
        if len(fit):
            rows[int(fit[0])].append(i)
            loads[int(fit[0])] += dims[i]
            continue
        for k, load in enumerate(added):  # the rows opened here
            if np.all(load + dims[i] <= caps):
                rows[len(loads) + k].append(i)
                load += dims[i]
                break
        else:
            rows.append([i])
            added.append(dims[i].copy())
    free.clear()
    return np.concatenate([loads, np.array(added, dtype=np.int64).reshape(-1, loads.shape[1])])


def pooled_vector_swap(
    dims: np.ndarray,
    caps: np.ndarray,
    row_of: np.ndarray,
    num_rows: int,
    target: int,
    pool_rows: int,
    spread_shift: float = 0.0,
    max_work: int | None = None,
) -> tuple[np.ndarray, int]:
    """``vector_swap_search`` on a pool of a plan's rows (all of a plan of at most ``pool_rows``): its least
    filled half, and the other half spread evenly over the rest, which the exchanges need (rows short of the
    scarcest budget are often full in another); ``spread_shift`` (in [0, 1)) moves that spread by that part
    of the gap between its rows, so that passes over an unchanged plan search other rows. The other rows
    are kept; the pool's target is its demand's bound, or its rows less the plan's excess over ``target``;
    ``max_work`` is the search's (MAX_WORK when None). Returns (row_of, rows), never more rows."""
    if num_rows <= pool_rows:
        return vector_swap_search(dims, caps, row_of, num_rows, target, max_work=max_work)
    loads = np.stack([np.bincount(row_of, weights=d, minlength=num_rows) for d in dims.T], axis=1)
    by_fill = np.lexsort((np.arange(num_rows), loads @ dimension_weights(dims, caps)))
    rest = by_fill[pool_rows // 2 :]
    spread_at = np.linspace(0, len(rest) - 1, pool_rows - pool_rows // 2)
    gap = spread_at[1] if len(spread_at) > 1 else len(rest)
    spread = rest[(spread_at.round().astype(np.int64) + round(spread_shift * gap)) % len(rest)]
    in_pool = np.zeros(num_rows, dtype=bool)
    in_pool[by_fill[: pool_rows // 2]] = True
    in_pool[spread] = True
    pool = np.flatnonzero(in_pool)
    items = np.flatnonzero(in_pool[row_of])
    pool_index = np.full(num_rows, -1, dtype=np.int64)
    pool_index[pool] = np.arange(len(pool))
    pool_dims = dims[items]
    pool_target = max(len(pool) - (num_rows - target), int(np.ceil(pool_dims.sum(axis=0) / caps).max()))
    sub_row_of, sub_rows = vector_swap_search(
        pool_dims, caps, pool_index[row_of[items]], len(pool), pool_target, max_work=max_work
    )
    if sub_rows >= len(pool):
        return row_of, num_rows
    kept = np.flatnonzero(~in_pool)
    new_index = np.full(num_rows, -1, dtype=np.int64)
    new_index[kept] = np.arange(len(kept))
    out = new_index[row_of]
    out[items] = len(kept) + sub_row_of
    return out, len(kept) + sub_rows
